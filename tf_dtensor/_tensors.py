"""Which tensors are DTensors, and their layouts: `is_dtensor`, `fetch_layout`,
`check_layout`, and the argument checks the API modules share (`layout_arg`,
`refuse_while_tracing`).

Python only normalises arguments and forwards them: every check of a layout against a mesh
or a value is made in C++.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import _core
from tf_dtensor import _device
from tf_dtensor._errors import LayoutError
from tf_dtensor.layout import Layout
from tf_dtensor.mesh import Mesh


def is_dtensor(tensor) -> bool:
    """Whether `tensor` is a DTensor (or a DVariable). Eagerly only, as in TensorFlow.

    Raises:
      RuntimeError: called while tracing a `tf.function` (a traced tensor's layout is
        decided when the function runs).
    """
    if not context.executing_eagerly():
        raise RuntimeError(
            "`is_dtensor` must be called eagerly: while tracing a tf.function, tensors are "
            "symbolic and whether one is a DTensor is decided when the function runs. Call "
            "it outside the function.")
    return is_dtensor_value(tensor)


def is_dtensor_value(tensor) -> bool:
    """`is_dtensor` for tf_dtensor's own code: False (no error) for a traced tensor."""
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        tensor = tensor.handle
    if not isinstance(tensor, ops.EagerTensor):
        return False
    return tensor.device == _device.DEVICE_NAME


def refuse_while_tracing(name: str) -> None:
    if not context.executing_eagerly():
        raise RuntimeError(
            f"`{name}` must be called eagerly: it reads the components of a DTensor, which "
            f"exist only when it runs, and it was called while tracing a tf.function. Call "
            f"`{name}` outside the function on its result (inside, use `relayout` to change "
            f"a layout).")


@functools.lru_cache(maxsize=1024)
def _parse_layout(text: str) -> Layout:
    return Layout.from_string(text)


def fetch_layout(tensor) -> Optional[Layout]:
    """The layout of a DTensor or DVariable; `None` for what is not a tensor.

    As in `tf.experimental.dtensor`, a Python value, a NumPy array or `None` has no layout
    (`None` is returned), while a regular `tf.Tensor` or `tf.Variable` is an error.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=(4,))
      >>> fetch_layout(t) == Layout(["x"], mesh), fetch_layout([1.0, 2.0])
      (True, None)

    Raises:
      LayoutError: `tensor` is a regular tensor (also a `tf.errors.InvalidArgumentError`).
      RuntimeError: called while tracing a `tf.function`.
    """
    layout = getattr(tensor, "layout", None)
    if isinstance(layout, Layout):
        return layout
    refuse_while_tracing("fetch_layout")
    if not tf.is_tensor(tensor) and not isinstance(tensor, tf.Variable):
        return None
    if not is_dtensor_value(tensor):
        raise LayoutError(f"fetch_layout expects a DTensor (FetchLayout expects a tensor placed "
                          f"on the layout device.); got a regular tensor on "
                          f"`{getattr(tensor, 'device', '?')}`. Create one with `pack`, "
                          f"`copy_to_mesh` or `call_with_layout`.")
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        # A plain tf.Variable made on the DTensor device: its handle carries the value's
        # layout.
        tensor = tensor.handle
    (text,) = _device.run(_core.FETCH_LAYOUT_OP, [tensor], ("T", tensor.dtype.as_datatype_enum))
    return _parse_layout(text.numpy().decode())


def check_layout(tensor, layout: Layout) -> None:
    """Raises ValueError if `tensor`'s layout is not `layout`.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> check_layout(dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=(4,)),
      ...                          Layout(["x"], mesh))

    Raises:
      ValueError: the layouts differ.
      TypeError: `tensor` is not a tensor (TensorFlow's DTensor raises TypeError too).
      LayoutError: `tensor` is a regular tensor.
    """
    layout_arg(layout, "check_layout")
    actual = fetch_layout(tensor)
    if actual is None:
        raise TypeError(f"check_layout expects a DTensor; got a `{type(tensor).__name__}`. "
                        f"Create one with `copy_to_mesh` or `call_with_layout`.")
    if actual != layout:
        raise ValueError(f"Layout of tensor: {actual.short()}, did not match expected layout: "
                         f"{layout.short()}.")


def layout_arg(layout: Any, function: str, allow_match: bool = False) -> Layout:
    """`layout`, checked as the `layout` argument of `function` (named in the errors)."""
    if not isinstance(layout, Layout):
        raise TypeError(f"`{function}` takes a `Layout` as `layout`; got {layout!r} "
                        f"({type(layout).__name__}). Build one with `Layout(specs, mesh)`.")
    if layout.has_match and not allow_match:
        raise LayoutError(f"`{function}` got {layout.short()}: MATCH (keep the input's "
                          f"sharding of an axis) is for `relayout` targets only. Name a mesh "
                          f"dimension or UNSHARDED for every axis.")
    _device.check_mesh(layout.mesh)
    return layout


def spans_clients(mesh: Mesh) -> bool:
    """Whether `mesh` has devices in other processes (a mesh of several clients)."""
    return mesh._mesh.spans_processes()  # pylint: disable=protected-access
