"""PyTorch's DTensor functions (`distribute_tensor`, `from_local`, `redistribute`, ...) over
tf_dtensor's API; `tf_dtensor.placements` re-exports them (see its docstring). The placement
values are in `_placement_types`, their conversion to and from `Layout` in `layout`.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import api, config
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError, MeshError, PackError, RelayoutError
from tf_dtensor._placement_types import Placement, Placements, Replicate
from tf_dtensor.layout import (MULTI_DIM_SEPARATOR, UNSHARDED, Layout, _layout_for,
                               _placements_of_layout, format_placements)
from tf_dtensor.mesh import Mesh


# ---------------------------------------------------------------------------------------
# Meshes
# ---------------------------------------------------------------------------------------

_DEVICE_TYPES = {"cpu": "CPU", "gpu": "GPU", "cuda": "GPU", "tpu": "TPU"}


def init_device_mesh(device_type: str, mesh_shape: Sequence[int],
                     mesh_dim_names: Optional[Sequence[str]] = None) -> Mesh:
    """A mesh of `mesh_shape` over this client's devices of `device_type`, as PyTorch's
    `init_device_mesh`; in a multi-client run, over every client's devices
    (`create_distributed_mesh`).

    Args:
      device_type: `"cpu"`, `"gpu"` (or `"cuda"`), `"tpu"`; any case.
      mesh_shape: the size of each mesh dimension, outermost first. The mesh takes the
        first `prod(mesh_shape)` devices of that type.
      mesh_dim_names: one name per dimension. tf_dtensor's layouts name mesh dimensions,
        so when omitted they are `"dim_0"`, `"dim_1"`, ... (PyTorch leaves them unnamed).

    Raises:
      MeshError: too few devices, a name per dimension missing, duplicate names.

    Example:
      >>> init_device_mesh("cpu", (2, 2)).short()
      'mesh(dim_0=2,dim_1=2)'
    """
    if not isinstance(device_type, str):
        raise TypeError(f"init_device_mesh: `device_type` is a string such as 'cpu' or "
                        f"'gpu'; got {device_type!r}.")
    kind = _DEVICE_TYPES.get(device_type.lower(), device_type.upper())
    if isinstance(mesh_shape, (int, np.integer)):
        mesh_shape = (mesh_shape,)
    shape = [int(s) for s in mesh_shape]
    names = (list(mesh_dim_names) if mesh_dim_names is not None
             else [f"dim_{i}" for i in range(len(shape))])
    if len(names) != len(shape):
        raise MeshError(f"init_device_mesh: `mesh_dim_names` {names} has {len(names)} name(s) "
                        f"for the {len(shape)} dimension(s) of `mesh_shape` {shape}; give one "
                        f"name per dimension.")
    needed = int(np.prod(shape)) if shape else 1
    if config.num_clients() > 1:
        # Several clients (PyTorch's ranks): the mesh spans every client's devices, each
        # client holding its own share, as `init_device_mesh` spans the world.
        world = config.num_global_devices(kind)
        if needed != world:
            raise MeshError(f"init_device_mesh: `mesh_shape` {shape} holds {needed} devices "
                            f"but the {config.num_clients()} clients have {world} {kind} "
                            f"devices in all; a mesh over several clients takes them all.")
        return config.create_distributed_mesh(list(zip(names, shape)), device_type=kind)
    devices = config.local_devices(kind)
    if needed > len(devices):
        raise MeshError(f"init_device_mesh: `mesh_shape` {shape} needs {needed} {kind} "
                        f"devices but this client has {len(devices)}; use a smaller mesh or "
                        f"configure more (e.g. virtual CPUs with "
                        f"`tf.config.set_logical_device_configuration`).")
    return config.create_mesh(list(zip(names, shape)), devices=devices[:needed])


# ---------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------

def _rank_of(tensor, function: str) -> int:
    rank = tensor.shape.rank
    if rank is None:
        raise LayoutError(f"`{function}` needs the rank of its tensor; got a tensor of unknown "
                          f"rank. Give it a static rank (e.g. `tf.ensure_shape`).")
    return rank


def _first_device_layout(mesh: Mesh) -> Layout:
    return Layout.from_device(mesh.local_devices()[0])


def _to_plain(tensor, function: str = "full_tensor") -> tf.Tensor:
    """Eagerly: the whole value of a DTensor as a regular tensor on its mesh's first device."""
    layout = api.fetch_layout(tensor)
    try:
        single = api.relayout(tensor, _first_device_layout(layout.mesh))
    except RelayoutError as error:
        raise RelayoutError(f"`{function}` of a DTensor placed as {_describe(layout)}: "
                            f"{error.message}") from error
    (plain,) = api.unpack(single)
    return plain


def _mesh_arg(mesh: Optional[Mesh], device_mesh: Optional[Mesh], name: str) -> Mesh:
    """`mesh`, or PyTorch's keyword for it, `device_mesh`; else, as PyTorch takes the mesh
    of the enclosing `with device_mesh:`, the innermost `dtensor.default_mesh`."""
    if mesh is not None and device_mesh is not None and mesh != device_mesh:
        raise TypeError(f"`{name}` got both `mesh` and `device_mesh` (PyTorch's name for it), "
                        f"and they differ; give one.")
    mesh = mesh if mesh is not None else device_mesh
    if mesh is None:
        mesh = api.get_default_mesh()
    if mesh is None:
        raise TypeError(f"`{name}` needs a mesh (`mesh=`, or PyTorch's `device_mesh=`), or a "
                        f"call under `dtensor.default_mesh(mesh)`.")
    return mesh


def _placements_arg(placements: Optional[Placements], mesh: Mesh) -> Placements:
    """`placements`, or as PyTorch defaults them, `Replicate()` on every mesh dimension."""
    if placements is None:
        return [Replicate()] * len(mesh.dim_names)
    return placements


def distribute_tensor(tensor, mesh: Optional[Mesh] = None, placements: Placements = None, *,
                      device_mesh: Optional[Mesh] = None):
    """`tensor` laid out on `mesh` as `placements`: a DTensor with the same global value.

    A regular tensor is sliced on each device (no device sees more than its block); a
    DTensor is redistributed. With no `mesh`, the innermost `dtensor.default_mesh`; with no
    `placements`, `Replicate()` on every mesh dimension (as PyTorch's defaults). `Partial`
    placements give terms whose reduction is `tensor`,
    as recent PyTorch does: for `sum` the first device along the dimension holds the value
    and the others zeros; for `mean`/`max`/`min` every device holds the value. Works
    eagerly and inside `tf.function`, also in one called with regular tensors alone
    outside `run_on` (the function then runs on the DTensor device, as under
    `run_on(mesh)`). Eagerly, the gradient with respect to a regular `tensor` is a
    regular tensor; inside a function it is a DTensor.

    Args:
      tensor: a regular tensor (or a value convertible to one) or a DTensor.
      mesh: the mesh (default: the innermost `dtensor.default_mesh`).
      placements: one placement per mesh dimension (default: `Replicate()` on each).
      device_mesh: PyTorch's name for `mesh`.

    Returns:
      The DTensor.

    Raises:
      TypeError: no mesh given and no default mesh.
      LayoutError: placements that do not fit the tensor or the mesh.

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (4,))
      >>> t = distribute_tensor(tf.ones([5, 2]), mesh, [Shard(0)])
      >>> [block.shape[0] for block in to_local(t)]   # cut as torch.chunk cuts
      [2, 2, 1, 0]
    """
    mesh = _mesh_arg(mesh, device_mesh, "distribute_tensor")
    placements = _placements_arg(placements, mesh)
    source_is_dtensor = _tensors.is_dtensor_value(tensor)
    if not source_is_dtensor:
        tensor = tf.convert_to_tensor(tensor)
    layout = _layout_for(mesh, placements, _rank_of(tensor, "distribute_tensor"),
                         "distribute_tensor")
    try:
        if not context.executing_eagerly():
            return _runs_on_mesh(api.relayout(tensor, layout), layout)
        if source_is_dtensor:
            return api.relayout(tensor, layout)

        @tf.custom_gradient
        def _distribute(x):
            def grad(dy):
                return _to_plain(dy) if _tensors.is_dtensor_value(dy) else dy
            return api.copy_to_mesh(x, layout), grad

        return _distribute(tensor)
    except RelayoutError as error:
        raise RelayoutError(f"`distribute_tensor` to placements {_describe(layout)}: "
                            f"{error.message}") from error


def _runs_on_mesh(traced, layout: Layout):
    """`traced` (a relayout to `layout` inside a tf.function being traced), in a function
    that runs on the DTensor device also when called with regular tensors alone.

    A tf.function reaches the DTensor device when it is called with a DTensor or under
    `run_on(mesh)`; one called with regular tensors alone outside any mesh scope runs on a
    regular device, which cannot lay anything out. So the function captures a replicated
    scalar DTensor on `layout.mesh` (made now, eagerly): a DTensor input routes every call
    to the device, where the function runs as under `run_on(mesh)`. Nothing reads it.
    """
    if api.get_default_mesh() is not None:
        return traced  # the call runs on the device already: nothing to add
    with tf.init_scope():
        token = api.pack([tf.zeros([])] * layout.mesh.num_local_devices(),
                         Layout.replicated(layout.mesh, 0))
    ops.get_default_graph().capture(token)
    return traced


def _local_list(local) -> Optional[List[Any]]:
    if isinstance(local, (list, tuple)):
        return [tf.convert_to_tensor(t) for t in local]
    return None


def from_local(local, mesh: Optional[Mesh] = None, placements: Placements = None,
               shape: Optional[Sequence[int]] = None, *, run_check: bool = False,
               device_mesh: Optional[Mesh] = None, stride: Optional[Sequence[int]] = None):
    """A DTensor from blocks that devices already hold, as PyTorch's `DTensor.from_local`.

    Args:
      local: a list with one block per local device of `mesh` (mesh order, first dim
        outermost; uneven blocks as `torch.chunk` cuts them), or one tensor that is every
        device's block (what each PyTorch rank passes). With `Partial` placements the
        blocks are the pending terms.
      mesh: the mesh (default: the innermost `dtensor.default_mesh`).
      placements: one placement per mesh dimension (default: `Replicate()` on each, as
        PyTorch's).
      shape: the global shape, checked against the blocks (required by nothing: the
        blocks determine it; give it to catch a wrong split).
      stride: PyTorch's global stride, checked: TensorFlow tensors are row-major, so it
        can only be the row-major stride of the global shape (`(3, 1)` for `[2, 3]`).
      run_check: compare the blocks that the placements make replicas (those of devices
        that differ only along `Replicate()` dimensions) and raise if they differ; off by
        default (it reads every block). PyTorch's `run_check=True` instead overwrites the
        replicas with the first one's data; here replicas that differ are an error, never
        silently replaced.
      device_mesh: PyTorch's name for `mesh`.

    Returns:
      The DTensor.

    Gradients (eager): with a list, each block gets its device's gradient block, as each
    PyTorch rank does (`Partial` terms get the gradient of the reduced value). With one
    tensor, the gradient is the true derivative: the sum of the block gradients over the
    devices that hold distinct blocks or terms.

    Raises:
      LayoutError: placements that do not fit the blocks or the mesh, or a `shape` the
        blocks do not make.
      PackError: blocks of the wrong count, shape or dtype; with `run_check`, replicas that
        differ.
      RuntimeError: called while tracing a `tf.function` (build DTensors outside).

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (4,))
      >>> t = from_local([tf.ones([2, 3])] * 4, mesh, [Shard(0)])
      >>> full_tensor(t).shape
      TensorShape([8, 3])
    """
    if not context.executing_eagerly():
        raise RuntimeError("`from_local` places blocks on devices, which happens eagerly "
                           "only; it was called while tracing a tf.function. Call it outside "
                           "and pass the DTensor in (inside, use `distribute_tensor` or "
                           "`redistribute`).")
    mesh = _mesh_arg(mesh, device_mesh, "from_local")
    placements = _placements_arg(placements, mesh)
    blocks = _local_list(local)
    single = blocks is None
    if single:
        local = tf.convert_to_tensor(local)
    elif not blocks:
        raise LayoutError("`from_local` got an empty list of blocks; give one block per local "
                          "device of the mesh, or one tensor for every device.")
    layout = _layout_for(mesh, placements, _rank_of(local if single else blocks[0],
                                                    "from_local"), "from_local")
    if single:
        blocks = [local] * mesh.num_local_devices()
    grad_layout = layout.without_partial()

    def grad_blocks(dy):
        dy = api.relayout(dy, grad_layout)
        parts = list(api.unpack(dy))
        for name, op in layout.partial.items():
            if op == "mean":
                parts = [p / mesh.dim_size(name) for p in parts]
        return parts

    def pack(parts):
        try:
            return api.pack(parts, layout, run_check=run_check)
        except PackError as error:
            raise PackError(f"`from_local` with {format_placements(placements, mesh)}: "
                            f"{error.message}") from error

    if single:
        @tf.custom_gradient
        def _pack_one(x):
            def grad(dy):
                parts = grad_blocks(dy)
                keep = _distinct_holders(layout)
                return tf.add_n([tf.identity(p) for p, k in zip(parts, keep) if k])
            return pack([x] * len(blocks)), grad
        result = _pack_one(local)
    else:
        @tf.custom_gradient
        def _pack_all(*xs):
            def grad(dy):
                return [tf.identity(p) for p in grad_blocks(dy)]
            return pack(list(xs)), grad
        result = _pack_all(*blocks)
    if shape is not None and list(result.shape) != [int(s) for s in shape]:
        raise LayoutError(
            f"`from_local`: the blocks make a tensor of shape {list(result.shape)} for "
            f"{format_placements(_placements_of_layout(layout), mesh)}, but `shape` is "
            f"{list(shape)}. Blocks are cut like torch.chunk (ceil(n / k) first, the last "
            f"ones smaller or empty); check the split.")
    if stride is not None:
        row_major = _row_major_stride(list(result.shape))
        if [int(s) for s in stride] != row_major:
            raise LayoutError(
                f"`from_local`: `stride` {list(stride)} is not the row-major stride "
                f"{row_major} of the global shape {list(result.shape)} that the blocks make "
                f"for {format_placements(_placements_of_layout(layout), mesh)}. TensorFlow "
                f"tensors are always row-major (contiguous): pass {tuple(row_major)} or no "
                f"`stride`.")
    return result


def _row_major_stride(shape: List[int]) -> List[int]:
    """The stride of a contiguous tensor of `shape`, as PyTorch counts it (elements)."""
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return stride[::-1]


def _distinct_holders(layout: Layout) -> List[bool]:
    """Per local device: whether its block or term counts in the derivative of one tensor
    standing for every block: each distinct block once, each `sum`/`mean` term once (the
    value adds them), and along a replicated or `max`/`min` dimension only the first device
    (equal copies, whose reduction is one of them)."""
    mesh = layout.mesh
    used = {name for name, op in layout.partial.items() if op in ("sum", "mean")}
    for spec in layout.sharding_specs:
        if spec != UNSHARDED:
            used.update(spec.split(MULTI_DIM_SEPARATOR))
    replicated = [i for i, name in enumerate(mesh.dim_names) if name not in used]
    keep = []
    for device_id in mesh.local_device_ids():
        coords = mesh._mesh.coords(device_id)  # pylint: disable=protected-access
        keep.append(all(int(coords[i]) == 0 for i in replicated))
    return keep


def to_local(tensor) -> List[tf.Tensor]:
    """This client's blocks of a DTensor: one regular tensor per local device, in mesh
    order (first dimension outermost). PyTorch returns one rank's block; one tf_dtensor
    client drives all its devices, so it gets all of their blocks (`Partial` terms
    unreduced). Eager only.

    Raises:
      LayoutError: `tensor` is not a DTensor.
      RuntimeError: called while tracing a `tf.function`.

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (4,))
      >>> [b.shape[0] for b in to_local(distribute_tensor(tf.ones([5]), mesh, [Shard(0)]))]
      [2, 2, 1, 0]
    """
    _eager_only("to_local", "reads the blocks, which exist only when it runs")
    if not _tensors.is_dtensor_value(tensor):
        raise LayoutError(f"`to_local` takes a DTensor; got a `{type(tensor).__name__}`. "
                          f"Make one with `distribute_tensor` or `from_local`.")
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        tensor = tensor.read_value()  # a DVariable's blocks, as full_tensor takes it
    return list(api.unpack(tensor))


def full_tensor(tensor, mesh: Optional[Mesh] = None):
    """The whole value of a DTensor (shards gathered, `Partial` terms reduced).

    Eagerly a regular `tf.Tensor` on the mesh's first device, as PyTorch's `full_tensor`.
    Inside a `tf.function` a DTensor replicated on `mesh` (default: the innermost
    `default_mesh`; layouts are not known while tracing), whose `.numpy()` is the value.
    The gradient flows back to the DTensor's layout. A regular tensor is returned as it is.

    Args:
      tensor: a DTensor or DVariable.
      mesh: inside a `tf.function`, the mesh to replicate the value on.

    Returns:
      Eagerly a regular `tf.Tensor`; inside a `tf.function` a replicated DTensor.

    Raises:
      RuntimeError: inside a tf.function with no `mesh` and no default mesh.

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (2,))
      >>> t = distribute_tensor(tf.reshape(tf.range(4), [2, 2]), mesh, [Shard(1)])
      >>> full_tensor(t).numpy().tolist()
      [[0, 1], [2, 3]]
    """
    if not context.executing_eagerly():
        mesh = _traced_mesh(mesh, "full_tensor")
        layout = Layout.replicated(mesh, _rank_of(tensor, "full_tensor"))
        return api.relayout(tensor, layout)
    if not _tensors.is_dtensor_value(tensor):
        return tf.convert_to_tensor(tensor)
    if isinstance(tensor, tf.Variable):
        tensor = tensor.read_value()  # a DVariable: its value (a tape still sees the read)
    layout = api.fetch_layout(tensor)

    @tf.custom_gradient
    def _full(x):
        def grad(dy):
            return api.relayout(dy, layout)
        return _to_plain(x), grad

    return _full(tensor)


def _traced_mesh(mesh: Optional[Mesh], function: str) -> Mesh:
    mesh = mesh if mesh is not None else api.get_default_mesh()
    if mesh is None:
        raise RuntimeError(
            f"`{function}` was called while tracing a tf.function without `mesh`: layouts are "
            f"known only when the function runs. Pass `mesh=` or call it under "
            f"`dtensor.default_mesh(mesh)`.")
    return mesh


def redistribute(tensor, placements: Placements = None, mesh: Optional[Mesh] = None, *,
                 device_mesh: Optional[Mesh] = None):
    """The DTensor `tensor` laid out as `placements` (on `mesh`, default its own mesh):
    the all-gathers, slices, all-to-alls and reductions of `relayout`. `Partial` targets
    keep the value (see `distribute_tensor`). Gradients flow back to the source layout.

    PyTorch's method order, `redistribute(t, mesh, placements)` (from
    `t.redistribute(device_mesh, placements)`), and its keyword `device_mesh=` work too.
    Inside a `tf.function` the tensor's mesh is not known while tracing: pass `mesh` or
    use `dtensor.default_mesh`.

    Args:
      tensor: a DTensor (or DVariable).
      placements: one placement per mesh dimension (default: `Replicate()` on each).
      mesh: the target mesh (default: `tensor`'s own; inside a `tf.function`, required
        unless a `default_mesh` is set).
      device_mesh: PyTorch's name for `mesh`.

    Returns:
      The DTensor laid out as `placements`.

    Raises:
      LayoutError: eagerly, a regular tensor and no `mesh`; placements that do not fit
        the tensor or the mesh.
      RelayoutError: the relayout to `placements` cannot be made.
      RuntimeError: inside a tf.function with no `mesh` and no default mesh.

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (2, 2))
      >>> t = distribute_tensor(tf.ones([4, 4]), mesh, [Shard(0), Replicate()])
      >>> placements_of(redistribute(t, [Replicate(), Shard(1)]))
      (Replicate(), Shard(dim=1))
    """
    if isinstance(placements, Mesh) and not isinstance(mesh, Mesh):
        placements, mesh = mesh, placements  # PyTorch's order: (device_mesh, placements)
    if mesh is not None or device_mesh is not None:
        mesh = _mesh_arg(mesh, device_mesh, "redistribute")
    if context.executing_eagerly():
        if mesh is None:
            if not _tensors.is_dtensor_value(tensor):
                raise LayoutError("`redistribute` takes a DTensor; got a regular tensor. Use "
                                  "`distribute_tensor(tensor, mesh, placements)`.")
            mesh = api.fetch_layout(tensor).mesh
    else:
        mesh = _traced_mesh(mesh, "redistribute")
    layout = _layout_for(mesh, placements, _rank_of(tensor, "redistribute"), "redistribute")
    try:
        return api.relayout(tensor, layout)
    except RelayoutError as error:
        source = _describe(api.fetch_layout(tensor))
        raise RelayoutError(f"`redistribute` from {source} to "
                            f"{format_placements(placements, mesh)}: {error.message}") from error


def _describe(layout: Layout) -> str:
    """A layout as placements where it has them (`[S(0), R] @ mesh(x=2,y=2)`), else short."""
    try:
        return format_placements(_placements_of_layout(layout), layout.mesh)
    except LayoutError:
        return layout.short()


def placements_of(tensor) -> Tuple[Placement, ...]:
    """The placements of a DTensor, one per mesh dimension (eager only).

    Raises:
      LayoutError: `tensor` is not a DTensor, or its layout has no placements (an axis
        sharded by several mesh dimensions, minor first).
      RuntimeError: called while tracing a `tf.function`.

    Example:
      >>> from tf_dtensor.placements import Shard
      >>> mesh = init_device_mesh("cpu", (2, 2))
      >>> placements_of(distribute_tensor(tf.ones([4, 4]), mesh, [Shard(1), Replicate()]))
      (Shard(dim=1), Replicate())
    """
    _eager_only("placements_of", "reads a layout, which is known only when it runs")
    if not _tensors.is_dtensor_value(tensor):
        raise LayoutError(f"`placements_of` takes a DTensor; got a `{type(tensor).__name__}`. "
                          f"Make one with `distribute_tensor` or `from_local`.")
    return _placements_of_layout(api.fetch_layout(tensor))


def _eager_only(function: str, why: str) -> None:
    """Refuses a call made while tracing a tf.function, naming the function the user called."""
    if not context.executing_eagerly():
        raise RuntimeError(f"`{function}` {why}, and it was called while tracing a "
                           f"tf.function. Call it outside the function on its result (inside, "
                           f"`redistribute(..., mesh=mesh)` changes placements).")


__all__ = ["init_device_mesh", "distribute_tensor", "from_local", "to_local", "full_tensor",
           "redistribute", "placements_of"]
