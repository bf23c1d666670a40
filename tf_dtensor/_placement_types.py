"""The placement values: `Shard(dim)`, `Replicate()`, `Partial(reduce_op)`.

PyTorch's DTensor describes a layout per *mesh* dimension with these; `Layout` converts them
(`Layout.from_placements`, `Layout.placements`) and `tf_dtensor.placements` offers PyTorch's
functions over them. They are plain values at the bottom of the package, so code that only
needs a `Shard` loads nothing of the runtime above `layout`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np


class Placement:
    """How a tensor is placed along one mesh dimension (base of the three placements)."""

    def is_shard(self, dim: Optional[int] = None) -> bool:
        """Whether this is `Shard` (of tensor axis `dim`, when given)."""
        return False

    def is_replicate(self) -> bool:
        """Whether this is `Replicate`."""
        return False

    def is_partial(self, reduce_op: Optional[str] = None) -> bool:
        """Whether this is `Partial` (with reduction `reduce_op`, when given)."""
        return False


@dataclasses.dataclass(frozen=True)
class Shard(Placement):
    """The mesh dimension cuts tensor axis `dim` (negative counts from the end) like
    `torch.chunk`: ceil(n / k)-sized blocks, the last ones smaller or empty.

    Example:
      >>> str(Shard(0)), Shard(0) == Shard(0)
      ('S(0)', True)
    """

    dim: int

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)):
            raise TypeError(f"Shard(dim) takes a tensor axis (an int); got {self.dim!r}.")
        object.__setattr__(self, "dim", int(self.dim))

    def is_shard(self, dim: Optional[int] = None) -> bool:
        """Whether this shards tensor axis `dim` (any axis when `dim` is None)."""
        return dim is None or dim == self.dim

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclasses.dataclass(frozen=True)
class Replicate(Placement):
    """Every device along the mesh dimension holds the same data.

    Example:
      >>> str(Replicate())
      'R'
    """

    def is_replicate(self) -> bool:
        """True: the value is whole on every device along this mesh dimension."""
        return True

    def __str__(self) -> str:
        return "R"


# PyTorch's names ("avg", "product") and TensorFlow's ("mean", "prod") for one reduction.
_REDUCTIONS = {"sum": "sum", "mean": "mean", "avg": "mean", "max": "max", "min": "min",
               "prod": "prod", "product": "prod"}


@dataclasses.dataclass(frozen=True)
class Partial(Placement):
    """The devices along the mesh dimension hold terms whose reduction (`"sum"`, `"mean"`
    (PyTorch's `"avg"`), `"max"`, `"min"`, `"prod"` (PyTorch's `"product"`)) is the value;
    the reduction happens when a later op or a `redistribute` needs it.

    Example:
      >>> str(Partial()), str(Partial("max")), Partial("avg") == Partial("mean")
      ('P(sum)', 'P(max)', True)
      >>> Partial("avg").is_partial("avg"), Partial().is_partial("max")
      (True, False)
    """

    reduce_op: str = "sum"

    def __post_init__(self):
        op = self.reduce_op
        if not isinstance(op, str):
            raise TypeError(f"Partial(reduce_op) takes a reduction name; got {op!r}.")
        # PyTorch's name for the mean is "avg"; "mean" is TensorFlow's (and the layout's).
        op = _REDUCTIONS.get(op.lower())
        if op is None:
            raise ValueError(f"Partial(reduce_op): {self.reduce_op!r} is not one of "
                             f"{', '.join(sorted(_REDUCTIONS))}.")
        object.__setattr__(self, "reduce_op", op)

    def is_partial(self, reduce_op: Optional[str] = None) -> bool:
        """Whether this is a pending reduction (`reduce_op`, by either of its names, when given)."""
        # As PyTorch's: with a reduction, whether it is this one (by either of its names).
        return reduce_op is None or _REDUCTIONS.get(str(reduce_op).lower()) == self.reduce_op

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


Placements = Sequence[Placement]
