"""The one DTensor custom device of this process, and the scopes that steer it."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import List, Optional

from tensorflow.python.eager import context
from tensorflow.python.eager import execute
from tensorflow.python.framework import ops

from tf_dtensor import _core

# TF's own DTensor takes device type CUSTOM; a distinct type lets both run side by side.
DEVICE_NAME = "/job:localhost/replica:0/task:0/device:TFDTENSOR:0"


class UnsupportedOpWarning(UserWarning):
    """An op with no sharding rule ran replicated (see `set_strict_mode`)."""


_lock = threading.Lock()
_device: Optional[_core.Device] = None
_mesh_stack: List[object] = []


def _warn(message: str) -> None:
    warnings.warn(message, UnsupportedOpWarning, stacklevel=3)


def get() -> _core.Device:
    """Registers the device with the eager context on first use."""
    global _device
    if _device is None:
        with _lock:
            if _device is None:
                ctx = context.context()
                ctx.ensure_initialized()
                device = _core.Device.register(ctx._handle, DEVICE_NAME)  # pylint: disable=protected-access
                device.set_warning_handler(_warn)
                device.strict = os.environ.get("TF_DTENSOR_STRICT", "0") not in ("", "0", "false")
                _device = device
    return _device


def run(op_name: str, inputs, attrs, num_outputs: int = 1):
    """Runs one of tf_dtensor's ops (or any op) on the DTensor device."""
    get()
    if not context.executing_eagerly():
        raise RuntimeError(
            f"`{op_name}` moves tensors between the host and the mesh and runs eagerly only; "
            f"it was called while tracing a tf.function. Call pack, unpack and fetch_layout "
            f"outside the function and pass DTensors in.")
    with ops.device(DEVICE_NAME):
        return execute.execute(op_name, num_outputs, inputs, attrs, context.context())


@contextlib.contextmanager
def mesh_scope(mesh):
    """Places ops on the DTensor device with `mesh` as the default mesh."""
    device = get()
    device.push_default_mesh(mesh._mesh if mesh is not None else None)
    _mesh_stack.append(mesh)
    try:
        with ops.device(DEVICE_NAME):
            yield
    finally:
        _mesh_stack.pop()
        device.pop_default_mesh()


@contextlib.contextmanager
def layout_scope(layout):
    """Gives the outputs of ops run inside (creation ops, variables) `layout`."""
    device = get()
    device.push_default_layout(layout._layout if layout is not None else None)
    try:
        yield
    finally:
        device.pop_default_layout()


def default_mesh():
    for mesh in reversed(_mesh_stack):
        if mesh is not None:
            return mesh
    return None
