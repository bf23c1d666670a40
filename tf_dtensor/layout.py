"""`Layout`: which mesh dimension shards each axis of a tensor."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from tensorflow.dtensor.proto import layout_pb2

import tensorflow as tf

from tf_dtensor import _args, _core
from tf_dtensor._errors import LayoutError, MeshError
from tf_dtensor._placement_types import Partial, Placement, Placements, Replicate, Shard
from tf_dtensor.mesh import Mesh, _serialized

UNSHARDED = "unsharded"
MATCH = "match"

# TF DTensor's layout kinds, with its member names and values: STATIC (1),
# SINGLE_DEVICE (2), PARTED (3).
LayoutType = _core.LayoutType


def _shape_list(shape, what: str = "the shape") -> List[int]:
    """A shape as ints; unknown dimensions (None) become -1."""
    if isinstance(shape, (tf.TensorShape,)):
        shape = shape.as_list()
    return _args.integers(shape, what, unknown_as=-1)


def _partial_items(partial) -> List[Tuple[str, str]]:
    """{'y': 'sum'} or [('y', 'sum')] -> [('y', 'sum')]; the C++ layout checks the values."""
    items = partial.items() if isinstance(partial, Mapping) else partial
    try:
        return [(str(dim), str(op)) for dim, op in items]
    except (TypeError, ValueError):
        raise TypeError(f"`partial` must map mesh dimension names to reductions, e.g. "
                        f"{{'y': 'sum'}}; got {partial!r}.") from None


def _rank(rank, where: str) -> int:
    # A rank of another type (2.0, "2") is a TypeError, as in TensorFlow's DTensor; a
    # negative one a LayoutError (a ValueError).
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{where}: `rank` must be a non-negative integer; got {rank!r} "
                        f"({type(rank).__name__}).")
    if rank < 0:
        raise LayoutError(f"{where}: `rank` must be a non-negative integer; got {rank!r}.")
    return int(rank)


class Layout:
    """How a tensor is laid out on a mesh; the same signature as TF DTensor's `Layout`.

    Args:
      sharding_specs: one entry per tensor axis: a mesh dimension name or `UNSHARDED`;
        or several names joined by `+` (`"x+y"`) for an axis sharded over x and then each
        piece over y, as PyTorch's `[Shard(0), Shard(0)]` does. Such an axis is a storage
        layout: relayouts, pack/unpack, DVariables and checkpoints keep it, and other ops
        see the axis over its first mesh dimension (they relayout it first).
      mesh: the mesh.
      partial: pending reductions, mesh dimension name -> `"sum"`, `"mean"`, `"max"`,
        `"min"` or `"prod"` (see below).

    Raises:
      LayoutError: an unknown mesh dimension, one that shards two axes, or one both
        sharding an axis and partial.

    A static layout may also carry pending reductions (`partial`): per mesh dimension a
    reduction (`"sum"`, `"mean"`, `"max"`, `"min"`, `"prod"`) that combines the values the
    devices along it hold, as a PyTorch `Partial` placement does. Its short form is
    `[x,*] +partial(y:sum) @ mesh(x=2,y=2)`. A mesh dimension shards an axis or is partial,
    never both. Axes need not divide evenly: a size-n axis over k devices is cut like
    `torch.chunk` (ceil(n / k)-sized blocks, the last ones smaller or empty); see
    `shard_geometry`.

    Besides these static layouts there are single-device layouts (`from_device`,
    `from_single_device_mesh`: no specs, the whole tensor on one device) and parted layouts
    (`to_parted`); `type` tells them apart.

    Example:
      >>> import numpy as np
      >>> mesh = Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
      >>> Layout(["x", UNSHARDED], mesh).short()
      '[x,*] @ mesh(x=2)'
    """

    __slots__ = ("_layout", "_mesh", "_match")

    def __init__(self, sharding_specs: List[str], mesh: Mesh, *,
                 partial: Optional[Mapping[str, str]] = None):
        if isinstance(sharding_specs, (str, bytes)):
            raise TypeError(f"`sharding_specs` must be a list with one mesh dimension name (or "
                            f"UNSHARDED) per tensor axis; got the string {sharding_specs!r}. "
                            f"Did you mean [{sharding_specs!r}]?")
        if not isinstance(mesh, Mesh):
            raise LayoutError(f"`mesh` must be a Mesh, got {type(mesh).__name__} (mesh is not "
                              f"a valid Mesh object); build one with `dtensor.create_mesh`.")
        specs = _args.strings(sharding_specs, "`sharding_specs` (one mesh dimension name or "
                              "UNSHARDED per tensor axis)")
        # MATCH ("keep this axis as it is") is for `relayout` targets only: the layout
        # holds the axes it names apart, and every other use refuses it.
        self._match = tuple(i for i, spec in enumerate(specs) if spec == MATCH)
        if self._match:
            specs = [UNSHARDED if spec == MATCH else spec for spec in specs]
        self._layout = _core.Layout.create(specs, mesh._mesh)
        if partial:
            self._layout = self._layout.with_partial(_partial_items(partial))
        self._mesh = mesh

    @classmethod
    def _wrap(cls, core_layout: _core.Layout) -> "Layout":
        layout = cls.__new__(cls)
        layout._match = ()  # the axes given as MATCH (relayout targets only)
        layout._layout = core_layout
        layout._mesh = Mesh._wrap(core_layout.mesh)
        return layout

    @staticmethod
    def from_string(layout_str: str) -> "Layout":
        """Parses `sharding_specs:x,unsharded, mesh:|x=2|...` (TF DTensor's form)."""
        return Layout._wrap(_core.Layout.from_string(_args.string(layout_str, "`layout_str`")))

    @staticmethod
    def from_proto(layout_proto: layout_pb2.LayoutProto) -> "Layout":
        """Builds a layout from TF DTensor's `LayoutProto` (see `as_proto`).

        Raises:
          LayoutError: the proto has no mesh, an unknown type, or specs the mesh lacks.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> layout = Layout(["x"], mesh)
          >>> Layout.from_proto(layout.as_proto()) == layout
          True
        """
        return Layout._wrap(_core.Layout.from_proto(
            _serialized(layout_proto, layout_pb2.LayoutProto)))

    @staticmethod
    def from_placements(mesh: Mesh, placements, rank: int) -> "Layout":
        """The layout of a rank-`rank` tensor placed on `mesh` as PyTorch `placements`, one
        per mesh dimension (`Shard(dim)`, `Replicate()`, `Partial(op)`); see
        `tf_dtensor.placements`. The inverse of `placements`.

        Raises:
          LayoutError: not one placement per mesh dimension, an axis outside `rank`, or
            placements that make no valid layout (messages show the placements).

        Example:
          >>> mesh2x2 = dtensor.create_mesh([("x", 2), ("y", 2)],
          ...                               devices=[f"CPU:{i}" for i in range(4)])
          >>> from tf_dtensor.placements import Shard, Replicate
          >>> Layout.from_placements(mesh2x2, [Shard(0), Replicate()], 2).short()
          '[x,*] @ mesh(x=2,y=2)'
        """
        return _layout_for(mesh, placements, rank)

    @property
    def placements(self) -> tuple:
        """This layout as PyTorch placements, one per mesh dimension (see `from_placements`).

        Raises:
          LayoutError: a parted or single-device layout, or an axis sharded over several
            mesh dimensions minor first (`"y+x"` on mesh (x, y)), which placements cannot say.

        Example:
          >>> mesh2x2 = dtensor.create_mesh([("x", 2), ("y", 2)],
          ...                               devices=[f"CPU:{i}" for i in range(4)])
          >>> Layout([UNSHARDED, "x"], mesh2x2).placements
          (Shard(dim=1), Replicate())
        """
        return _placements_of_layout(self)

    @staticmethod
    def from_single_device_mesh(mesh: Mesh) -> "Layout":
        """The layout of a tensor held whole by the one device of `mesh`.

        Raises:
          LayoutError: `mesh` is not a single-device mesh (see `Mesh.from_device`).

        Example:
          >>> Layout.from_single_device_mesh(Mesh.from_device("CPU:0")).type
          <LayoutType.SINGLE_DEVICE: 2>
        """
        return Layout._wrap(_core.Layout.from_single_device_mesh(mesh._mesh))

    @staticmethod
    def from_device(device: str) -> "Layout":
        """The single-device layout on `device`, e.g. `"CPU:0"`.

        Example:
          >>> Layout.from_device("CPU:0").to_string()
          'maximal:true, mesh:/job:localhost/replica:0/task:0/device:CPU:0'
        """
        return Layout.from_single_device_mesh(Mesh.from_device(device))

    def as_proto(self) -> layout_pb2.LayoutProto:
        """This layout as TensorFlow's own `tensorflow.dtensor.LayoutProto` message.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x"], mesh).as_proto().sharding_specs[0].sharding_spec
          'x'
        """
        return layout_pb2.LayoutProto.FromString(self._layout.to_proto())

    def to_parted(self) -> "Layout":
        """This layout as a parted layout: the same specs, shards treated as independent.

        Raises:
          LayoutError: on a single-device layout, which has no shards to part.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x"], mesh).to_parted().to_string().split(" mesh:")[0]
          'parted:x,'
        """
        return Layout._wrap(self._layout.to_parted())

    @property
    def type(self) -> LayoutType:
        """`LayoutType.STATIC`, `PARTED` or `SINGLE_DEVICE`."""
        return self._layout.type

    def is_single_device(self) -> bool:
        """Whether this is a single-device layout (`Layout.from_device`): the value lives on
        one device, not sharded over a mesh."""
        return self._layout.is_single_device

    @staticmethod
    def replicated(mesh: Mesh, rank: int) -> "Layout":
        """The layout of `rank` axes, none sharded: every device of `mesh` holds the whole value.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout.replicated(mesh, rank=2).short()
          '[*,*] @ mesh(x=2)'
        """
        return Layout([UNSHARDED] * _rank(rank, "Layout.replicated"), mesh)

    @staticmethod
    def batch_sharded(mesh: Mesh, batch_dim: str, rank: int, axis: int = 0) -> "Layout":
        """The layout of `rank` axes with axis `axis` (the batch) sharded over `batch_dim`.

        Example:
          >>> mesh = dtensor.create_mesh([("batch", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout.batch_sharded(mesh, "batch", rank=3).short()
          '[batch,*,*] @ mesh(batch=2)'
        """
        specs = [UNSHARDED] * _rank(rank, "Layout.batch_sharded")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -rank <= axis < rank:
            raise LayoutError(f"Layout.batch_sharded: `axis={axis!r}` is out of range for a "
                              f"rank-{rank} layout; give an axis in [0, {rank}).")
        specs[axis] = batch_dim
        return Layout(specs, mesh)

    @staticmethod
    def inner_sharded(mesh: Mesh, inner_dim: str, rank: int) -> "Layout":
        """The layout of `rank` axes with the last (innermost) axis sharded over `inner_dim`.

        Example:
          >>> mesh = dtensor.create_mesh([("model", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout.inner_sharded(mesh, "model", rank=2).short()
          '[*,model] @ mesh(model=2)'
        """
        if _rank(rank, "Layout.inner_sharded") == 0:
            raise LayoutError(f"Layout.inner_sharded: a rank-0 layout has no inner axis to "
                              f"shard over `{inner_dim}`; give `rank` >= 1, or use "
                              f"`Layout.replicated(mesh, 0)` for a scalar.")
        return Layout.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

    def to_string(self) -> str:
        """The serialized form TensorFlow's DTensor uses (`Layout.from_string` reads it back)."""
        text = self._layout.to_string()
        if not self._match:
            return text
        mesh_part = text.split(", mesh:", 1)[1]
        return "sharding_specs:" + ",".join(self.sharding_specs) + ", mesh:" + mesh_part

    def short(self) -> str:
        """The short form used in messages and test ids: `[x,*] @ mesh(x=2,y=4)`."""
        if self._match:
            return f"[{','.join(self.sharding_specs)}] @ {self._mesh.short()}"
        return self._layout.short_string()

    @property
    def sharding_specs(self) -> List[str]:
        """Per axis, the mesh dimension sharding it, or `UNSHARDED` (`MATCH` where unset)."""
        specs = list(self._layout.sharding_specs)
        for i in self._match:
            specs[i] = MATCH
        return specs

    @property
    def has_match(self) -> bool:
        """Whether some axis is MATCH (keep the input's sharding): a `relayout` target."""
        return bool(self._match)

    @property
    def mesh(self) -> Mesh:
        """The mesh this layout places its value on."""
        return self._mesh

    @property
    def rank(self) -> int:
        """The number of axes of the values this layout describes."""
        return self._layout.rank

    @property
    def shape(self) -> List[int]:
        """The shape of the mesh (as in TF DTensor, not of any tensor)."""
        return self._mesh.shape()

    def num_shards(self, idx: int) -> int:
        """How many pieces tensor axis `idx` is cut into.

        Raises:
          LayoutError: `idx` is not an axis of this layout.
        """
        return self._layout.num_shards(_args.integer(idx, "`idx`"))

    def is_fully_replicated(self) -> bool:
        """No axis sharded; False for a single-device layout, as in TF DTensor."""
        return self._layout.is_fully_replicated()

    def is_batch_parallel(self) -> bool:
        """Axis 0 sharded and all other axes replicated.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x", UNSHARDED], mesh).is_batch_parallel()
          True
        """
        return self._layout.is_batch_parallel()

    def offset_to_shard(self) -> List[Tuple[int, ...]]:
        """For each device offset of the mesh, the shard index it holds along each axis.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout([UNSHARDED, "x"], mesh).offset_to_shard()
          [(0, 0), (0, 1)]
        """
        return [tuple(shard) for shard in self._layout.offset_to_shard()]

    def offset_tuple_to_global_index(self, offset_tuple: Sequence[int]) -> int:
        """The row-major position of a shard index among all shards of this layout.

        Raises:
          LayoutError: not one index per axis, or an index outside its axis's shard count.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x"], mesh).offset_tuple_to_global_index((1,))
          1
        """
        return self._layout.offset_tuple_to_global_index(
            _args.integers(offset_tuple, "`offset_tuple`"))

    def local_shape_from_global_shape(self, global_shape: Sequence[int]) -> Tuple[int, ...]:
        """The shape of one shard of a tensor of `global_shape` (unknown sizes stay -1).

        Raises:
          LayoutError: a rank other than the layout's, or a size the shards do not divide.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x", UNSHARDED], mesh).local_shape_from_global_shape([4, 3])
          (2, 3)
        """
        return tuple(self._layout.uniform_local_shape(_shape_list(global_shape)))

    def global_shape_from_local_shape(self, local_shape: Sequence[int]) -> Tuple[int, ...]:
        """The global shape of a tensor whose shards have `local_shape`.

        Raises:
          LayoutError: a rank other than the layout's.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x", UNSHARDED], mesh).global_shape_from_local_shape([2, 3])
          (4, 3)
        """
        return tuple(self._layout.global_shape(_shape_list(local_shape)))

    def delete(self, dims: Union[int, List[int]]) -> "Layout":
        """This layout without the tensor axes `dims` (an index or a list), as in TF.

        The guide derives a bias layout from its weight's: `[*,*] -> delete([0]) -> [*]`.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x", UNSHARDED], mesh).delete([0]).short()
          '[*] @ mesh(x=2)'
        """
        dropped = dims if isinstance(dims, list) else [dims]
        specs = [spec for i, spec in enumerate(self.sharding_specs) if i not in dropped]
        return Layout(specs, self._mesh)

    def local_shape(self, global_shape) -> List[int]:
        """The shape of the first (largest) block of a tensor of `global_shape`."""
        return list(self._layout.local_shape([int(d) for d in global_shape]))

    @property
    def partial(self) -> Dict[str, str]:
        """Pending reductions: mesh dimension name -> `"sum"`/`"mean"`/`"max"`/`"min"`/`"prod"`.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout([UNSHARDED], mesh, partial={"x": "sum"}).partial
          {'x': 'sum'}
        """
        return dict(self._layout.partial)

    @property
    def is_partial(self) -> bool:
        """Whether the layout carries pending reductions."""
        return bool(self._layout.partial)

    def with_partial(self, partial: Mapping[str, str]) -> "Layout":
        """This layout with more pending reductions (checked as at construction)."""
        return Layout._wrap(self._layout.with_partial(_partial_items(partial)))

    def without_partial(self) -> "Layout":
        """The same sharding with nothing pending: the layout after the reductions."""
        return Layout._wrap(self._layout.without_partial())

    def shard_geometry(self, global_shape: Sequence[int],
                       shard_index: Sequence[int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """(block shape, block offset) of the block at `shard_index` of `global_shape`.

        The one shard-geometry function: checkpoints, debug printing and pack/unpack use it.
        A size-n axis over k shards is cut in ceil(n / k)-sized pieces, the last ones
        smaller or empty.

        Example:
          >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
          >>> Layout(["x"], mesh).shard_geometry([3], [1])
          ((1,), (2,))
        """
        shape, offset = self._layout.shard_geometry(
            _shape_list(global_shape, "`global_shape`"),
            _args.integers(shard_index, "`shard_index`"))
        return tuple(shape), tuple(offset)

    def device_blocks(self, global_shape: Sequence[int]
                      ) -> List[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
        """(block shape, block offset) of each device of the mesh, in device-offset order."""
        return [self.shard_geometry(global_shape, shard) for shard in self.offset_to_shard()]

    def is_even(self, global_shape: Sequence[int]) -> bool:
        """Whether every sharded axis of `global_shape` divides evenly."""
        return self._layout.is_even(_shape_list(global_shape))

    def __eq__(self, other) -> bool:
        return (isinstance(other, Layout) and self._layout == other._layout
                and self._match == other._match)

    def __hash__(self) -> int:
        return hash((self._layout, self._match))

    def __reduce__(self):
        if self._match:
            return Layout, (self.sharding_specs, self._mesh)
        return Layout.from_string, (self.to_string(),)

    def __repr__(self) -> str:
        # A static layout prints as in the DTensor overview guide; parted and single-device
        # layouts, which that form cannot show, as TF DTensor 2.21 prints every layout.
        if self.type != LayoutType.STATIC:
            return f"Layout.from_string({self.to_string()})"
        if self.is_partial:
            return (f"Layout(sharding_specs={self.sharding_specs}, mesh={self.mesh!r}, "
                    f"partial={self.partial!r})")
        return f"Layout(sharding_specs={self.sharding_specs}, mesh={self.mesh!r})"


# ---------------------------------------------------------------------------------------
# Placements (PyTorch's per-mesh-dimension description) <-> Layout (per tensor axis).
# Python only converts; the layout checks stay in C++. Errors show layouts as placements:
# `[S(0), R] @ mesh(x=2,y=2)`.
# ---------------------------------------------------------------------------------------

# The separator of the mesh dims that shard one tensor axis together, major first.
MULTI_DIM_SEPARATOR = "+"


def format_placements(placements: Placements, mesh: Optional[Mesh] = None) -> str:
    """`[S(0), R] @ mesh(x=2,y=2)`: the short form used in messages.

    Example:
      >>> format_placements([Shard(0), Replicate()])
      '[S(0), R]'
    """
    text = "[" + ", ".join(str(p) for p in placements) + "]"
    return f"{text} @ {mesh.short()}" if mesh is not None else text


def _placement_list(placements: Any, mesh: Mesh, function: str) -> Tuple[Placement, ...]:
    """The placements as a tuple, one per mesh dim (a conversion check, not a layout one)."""
    if isinstance(placements, Placement):
        placements = [placements]
    try:
        items = tuple(placements)
    except TypeError:
        raise TypeError(f"`{function}` takes `placements`, a list with one Shard(dim), "
                        f"Replicate() or Partial() per mesh dimension; got {placements!r}."
                        ) from None
    for item in items:
        if not isinstance(item, Placement):
            raise TypeError(f"`{function}`: {item!r} in `placements` is not a placement; use "
                            f"Shard(dim), Replicate() or Partial(reduce_op).")
    if len(items) != len(mesh.dim_names):
        raise LayoutError(
            f"`{function}`: {format_placements(items)} has {len(items)} placement(s) but "
            f"{mesh.short()} has {len(mesh.dim_names)} dimension(s); give one placement per "
            f"mesh dimension (Replicate() for a dimension that does not cut the tensor).")
    return items


def _layout_for(mesh: Mesh, placements: Placements, rank: int,
                function: str = "Layout.from_placements") -> Layout:
    """The layout of a rank-`rank` tensor placed as `placements` on `mesh`.

    Shared by every placements entry point (and by `distribute_module`-style helpers):
    errors name `function` and show the placements.
    """
    if not isinstance(mesh, Mesh):
        raise MeshError(f"`{function}` takes a `Mesh` as `mesh`; got {type(mesh).__name__}. "
                        f"Build one with `init_device_mesh` or `dtensor.create_mesh`.")
    items = _placement_list(placements, mesh, function)
    rank = _rank(rank, f"`{function}`")
    axes: List[List[str]] = [[] for _ in range(rank)]
    partial = {}
    for name, placement in zip(mesh.dim_names, items):
        if isinstance(placement, Shard):
            if not -rank <= placement.dim < rank:
                raise LayoutError(
                    f"`{function}`: {placement} on mesh dimension `{name}` of "
                    f"{format_placements(items, mesh)} names axis {placement.dim}, but the "
                    f"tensor has rank {rank}; use an axis in [{-rank}, {rank}).")
            axes[placement.dim % rank].append(name)
        elif isinstance(placement, Partial):
            partial[name] = placement.reduce_op
    specs = [MULTI_DIM_SEPARATOR.join(names) if names else UNSHARDED for names in axes]
    try:
        return Layout(specs, mesh, partial=partial or None)
    except LayoutError as error:
        raise LayoutError(f"`{function}`: {format_placements(items, mesh)} for a rank-{rank} "
                          f"tensor is not a valid layout: {error.message}") from error


def _placements_of_layout(layout: Layout) -> Tuple[Placement, ...]:
    """The placements of `layout`, one per mesh dimension (see `Layout.placements`)."""
    if layout.type != LayoutType.STATIC:
        raise LayoutError(
            f"Layout.placements: {layout.short()} is a {layout.type.name.lower()} layout; only "
            f"static layouts (one spec per axis on a mesh) have placements. Relayout the "
            f"tensor to a static layout first.")
    mesh = layout.mesh
    position = {name: i for i, name in enumerate(mesh.dim_names)}
    found = {}
    for axis, spec in enumerate(layout.sharding_specs):
        if spec == UNSHARDED:
            continue
        names = spec.split(MULTI_DIM_SEPARATOR)
        order = [position[n] for n in names]
        if order != sorted(order):
            raise LayoutError(
                f"Layout.placements: {layout.short()} shards axis {axis} over "
                f"{' then '.join(f'`{n}`' for n in names)}, minor mesh dimension first; "
                f"placements always make the earlier mesh dimension the major one, so this "
                f"layout has no placements. Use the spec "
                f"{MULTI_DIM_SEPARATOR.join(sorted(names, key=position.get))!r} instead.")
        for name in names:
            found[name] = Shard(axis)
    partial = layout.partial
    out = []
    for name in mesh.dim_names:
        if name in found:
            out.append(found[name])
        elif name in partial:
            out.append(Partial(partial[name]))
        else:
            out.append(Replicate())
    return tuple(out)
