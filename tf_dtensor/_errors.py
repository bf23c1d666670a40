"""The exceptions tf_dtensor raises for bad input.

Every check is made once, in C++; the binding maps the failure to one of these classes.
Errors raised while an op runs reach Python through TensorFlow's own error classes
(`tf.errors.InvalidArgumentError`, `tf.errors.UnimplementedError`), as they do for any op.

Each class is also the class TensorFlow's DTensor raises for the same mistake, so that
`except` clauses written for `tf.experimental.dtensor` still catch:

- `MeshError`, `LayoutError`: `ValueError` (what TF raises for a bad `Mesh`/`Layout`) and
  `tf.errors.InvalidArgumentError` (what TF raises when `fetch_layout`/`unpack` get a
  regular tensor).
- `UnsupportedOpError`: `NotImplementedError` and `tf.errors.UnimplementedError` (what the
  device raises for such an op in strict mode).
- `RelayoutError`: `ValueError`, `tf.errors.InvalidArgumentError` and
  `tf.errors.UnknownError`: TF's DTensor reports a relayout it cannot do (rank mismatch,
  indivisible axis, another mesh) as `UnknownError`, because its MLIR pass drops the code.
- `PackError`: `tf.errors.InvalidArgumentError`, and TF's classes for components that
  disagree: `UnimplementedError` (shapes) and `InternalError` (dtypes).

Example:
  >>> issubclass(LayoutError, ValueError), issubclass(LayoutError, tf.errors.InvalidArgumentError)
  (True, True)
"""

from __future__ import annotations

from typing import Any, Optional

from tensorflow.python.framework import errors_impl


class _OpErrorFromMessage(errors_impl.OpError):
    """An `OpError` built from a message alone, as `raise LayoutError("...")` does.

    TensorFlow's `OpError(node_def, op, message, error_code)` needs four arguments; the C++
    binding raises these classes with the message only.
    """

    _CODE = errors_impl.INVALID_ARGUMENT

    # Raised while AutoGraph runs a traced function, an error is rebuilt with the user's
    # source lines, and a class whose constructor AutoGraph does not know became a bare
    # `StagingError`: `except LayoutError` around a tf.function call missed it. AutoGraph
    # lets errors marked so through as they are (TensorFlow marks its `UnliftableError`).
    ag_pass_through = True

    # Code that rebuilds an error with another message calls the class as TensorFlow's:
    # `cls(node_def, op, message, error_code)` (Keras does, around an error in a layer's
    # call); that form is taken too, keeping the class's own code.
    def __init__(self, message: Any, node_def: Optional[Any] = None, op: Optional[Any] = None,
                 *error_code: Any):
        del error_code  # the class's own
        if not isinstance(message, str) and isinstance(op, str):
            node_def, op, message = message, node_def, op
        errors_impl.OpError.__init__(self, node_def, op, message, self._CODE)
        self.args = (message,)


class MeshError(_OpErrorFromMessage, errors_impl.InvalidArgumentError, ValueError):
    """An invalid mesh: duplicate or reserved dimension names, wrong device counts."""


class LayoutError(_OpErrorFromMessage, errors_impl.InvalidArgumentError, ValueError):
    """An invalid layout, or a regular tensor where a DTensor is needed."""


class UnsupportedOpError(_OpErrorFromMessage, errors_impl.UnimplementedError,
                         NotImplementedError):
    """An op that tf_dtensor cannot run sharded (raised in strict mode)."""

    _CODE = errors_impl.UNIMPLEMENTED


class RelayoutError(_OpErrorFromMessage, errors_impl.InvalidArgumentError,
                    errors_impl.UnknownError, ValueError):
    """A relayout that cannot be done: another mesh, another rank, an indivisible axis."""


class PackError(_OpErrorFromMessage, errors_impl.InvalidArgumentError,
                errors_impl.UnimplementedError, errors_impl.InternalError):
    """Components that `pack` cannot assemble: wrong count, rank, shape or dtype."""


__all__ = ["MeshError", "LayoutError", "UnsupportedOpError", "RelayoutError", "PackError"]
