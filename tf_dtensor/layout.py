"""`Layout`: which mesh dimension shards each axis of a tensor."""

from __future__ import annotations

from typing import List, Union

from tf_dtensor import _core
from tf_dtensor.mesh import Mesh

UNSHARDED = "unsharded"
MATCH = "match"


class Layout:
    """How a tensor is laid out on a mesh; the same signature as TF DTensor's `Layout`.

    Args:
      sharding_specs: one entry per tensor axis: a mesh dimension name or `UNSHARDED`.
      mesh: the mesh.

    Raises:
      LayoutError: an unknown mesh dimension, or one that shards two axes.

    Example:
      >>> import numpy as np
      >>> mesh = Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
      >>> Layout(["x", UNSHARDED], mesh).short()
      '[x,*] @ mesh(x=2)'
    """

    __slots__ = ("_layout", "_mesh")

    def __init__(self, sharding_specs: List[str], mesh: Mesh):
        self._layout = _core.Layout.create(list(sharding_specs), mesh._mesh)
        self._mesh = mesh

    @classmethod
    def _wrap(cls, core_layout: _core.Layout) -> "Layout":
        layout = cls.__new__(cls)
        layout._layout = core_layout
        layout._mesh = Mesh._wrap(core_layout.mesh)
        return layout

    @staticmethod
    def from_string(layout_str: str) -> "Layout":
        """Parses `sharding_specs:x,unsharded, mesh:|x=2|...` (TF DTensor's form)."""
        return Layout._wrap(_core.Layout.from_string(layout_str))

    @staticmethod
    def replicated(mesh: Mesh, rank: int) -> "Layout":
        return Layout([UNSHARDED] * rank, mesh)

    @staticmethod
    def batch_sharded(mesh: Mesh, batch_dim: str, rank: int, axis: int = 0) -> "Layout":
        specs = [UNSHARDED] * rank
        specs[axis] = batch_dim
        return Layout(specs, mesh)

    @staticmethod
    def inner_sharded(mesh: Mesh, inner_dim: str, rank: int) -> "Layout":
        return Layout.batch_sharded(mesh, inner_dim, rank, axis=rank - 1)

    def to_string(self) -> str:
        return self._layout.to_string()

    def short(self) -> str:
        """The short form used in messages and test ids: `[x,*] @ mesh(x=2,y=4)`."""
        return self._layout.short_string()

    @property
    def sharding_specs(self) -> List[str]:
        return list(self._layout.sharding_specs)

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def rank(self) -> int:
        return self._layout.rank

    def num_shards(self, idx: int) -> int:
        return self._layout.num_shards(idx)

    def is_fully_replicated(self) -> bool:
        return self._layout.is_fully_replicated()

    def delete(self, dims: Union[int, List[int]]) -> "Layout":
        """This layout without the tensor axes `dims` (an index or a list), as in TF.

        The guide derives a bias layout from its weight's: `[*,*] -> delete([0]) -> [*]`.

        Example:
          >>> Layout(["x", UNSHARDED], mesh).delete([0]).short()
          '[*] @ mesh(x=2)'
        """
        dropped = dims if isinstance(dims, list) else [dims]
        specs = [spec for i, spec in enumerate(self.sharding_specs) if i not in dropped]
        return Layout(specs, self._mesh)

    def local_shape(self, global_shape) -> List[int]:
        """The shape of one component for a tensor of `global_shape`."""
        return list(self._layout.local_shape([int(d) for d in global_shape]))

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and self._layout == other._layout

    def __hash__(self) -> int:
        return hash(self._layout)

    def __repr__(self) -> str:
        return f"Layout(sharding_specs={self.sharding_specs}, mesh={self.mesh!r})"
