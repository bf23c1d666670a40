"""The exceptions tf_dtensor raises for bad input.

Every check is made once, in C++; the binding maps the failure to one of these classes.
Errors raised while an op runs reach Python through TensorFlow's own error classes
(`tf.errors.InvalidArgumentError`, `tf.errors.UnimplementedError`), as they do for any op.
"""

from __future__ import annotations


class MeshError(ValueError):
    """An invalid mesh: duplicate or reserved dimension names, wrong device counts."""


class LayoutError(ValueError):
    """An invalid layout: unknown or repeated mesh dimensions, rank or shape mismatch."""


class UnsupportedOpError(NotImplementedError):
    """An op that tf_dtensor cannot run sharded (raised in strict mode)."""


class RelayoutError(ValueError):
    """A relayout that cannot be done, e.g. across meshes."""


__all__ = ["MeshError", "LayoutError", "UnsupportedOpError", "RelayoutError"]
