"""The one DTensor custom device of this process, and the scopes that steer it."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Dict, List, Optional

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context
from tensorflow.python.eager import core
from tensorflow.python.framework import device as tf_device
from tensorflow.python.framework import ops

from tf_dtensor import _core
from tf_dtensor._errors import LayoutError, MeshError

# TF's own DTensor takes device type CUSTOM; a distinct type lets both run side by side.
DEVICE_NAME = "/job:localhost/replica:0/task:0/device:TFDTENSOR:0"


class UnsupportedOpWarning(UserWarning):
    """An op with no sharding rule ran replicated (see `set_strict_mode`)."""


_lock = threading.Lock()
_device: Optional[_core.Device] = None
_strict_from_environment = False
# The scopes open in Python, outermost first, per thread (a scope in one thread must not
# place or lay out another's ops). The C++ device keeps its own copy, per thread too; a
# device registered on a new context (after a context reset) is given the registering
# thread's, so scopes that enclose a reset stay balanced.
class _Scopes(threading.local):
    def __init__(self):
        super().__init__()
        self.meshes: List[object] = []
        self.layouts: List[object] = []


_scopes = _Scopes()


def _warn(message: str) -> None:
    warnings.warn(message, UnsupportedOpWarning, stacklevel=3)


def _current_context_address(ctx) -> int:
    ctx.ensure_initialized()
    return _core.context_address(ctx._handle)  # pylint: disable=protected-access


def get() -> _core.Device:
    """The DTensor device of the current eager context, registered on first use.

    A device belongs to the context it was registered with: TensorFlow deletes it with
    that context (`context._reset_context()`, `ensure_uninitialized()`, test bases that
    reset between cases). The next call here then registers a new device on the current
    context and gives it the scopes open in Python; nothing touches the deleted one.
    """
    global _device, _strict_from_environment
    ctx = context.context()
    address = _current_context_address(ctx)
    device = _device
    if device is not None and device.alive and device.context_address == address:
        return device
    with _lock:
        device = _device
        if device is not None and device.alive and device.context_address == address:
            return device
        device = _core.Device.register(ctx._handle, DEVICE_NAME)  # pylint: disable=protected-access
        device.set_warning_handler(_warn)
        # A new context may have fewer logical devices: meshes are checked again.
        _checked_meshes.clear()
        _existing_devices.clear()
        if not _strict_from_environment:
            _strict_from_environment = True
            if os.environ.get("TF_DTENSOR_STRICT", "0") not in ("", "0", "false"):
                device.strict = True
        for mesh in _scopes.meshes:
            device.push_default_mesh(mesh._mesh if mesh is not None else None)  # pylint: disable=protected-access
        for layout in _scopes.layouts:
            device.push_default_layout(layout._layout if layout is not None else None)  # pylint: disable=protected-access
        _device = device
    return device


def live() -> Optional[_core.Device]:
    """The device of the current eager context if one is registered; registers none."""
    ctx = context.context()
    device = _device
    if device is None or not device.alive or not ctx._initialized:  # pylint: disable=protected-access
        return None
    return device if device.context_address == _core.context_address(ctx._handle) else None  # pylint: disable=protected-access


def run(op_name: str, inputs, attrs, num_outputs: int = 1):
    """Runs one of tf_dtensor's ops (or any op) on the DTensor device."""
    get()
    if not context.executing_eagerly():
        raise RuntimeError(
            f"`{op_name}` moves tensors between the host and the mesh and runs eagerly only; "
            f"it was called while tracing a tf.function. Call pack, unpack and fetch_layout "
            f"outside the function and pass DTensors in.")
    # Straight to the device by name: what `with ops.device(DEVICE_NAME)` around
    # `execute.execute` does, without entering a device scope each time (about 2 us).
    ctx = context.context()
    ctx.ensure_initialized()
    try:
        return pywrap_tfe.TFE_Py_Execute(ctx._handle, DEVICE_NAME, op_name, inputs, attrs,
                                         num_outputs)
    except core._NotOkStatusException as error:  # pylint: disable=protected-access
        raise core._status_to_exception(error) from None  # pylint: disable=protected-access


# Local device names found to exist, and the meshes last checked (a hash lookup per use).
# The meshes are forgotten now and then: a program that made a new mesh per step kept every
# one here, about 3 KB each; the device names stay as few as the host's devices.
_existing_devices: set = set()
_checked_meshes: set = set()
_MAX_CHECKED_MESHES = 256


def _num_devices(device_type: str) -> int:
    """How many logical devices of `device_type` this host has, without starting
    TensorFlow's runtime (which would fix the logical device configuration)."""
    if context.context()._context_handle is not None:  # pylint: disable=protected-access
        return len(tf.config.list_logical_devices(device_type))
    count = 0
    for physical in tf.config.list_physical_devices(device_type):
        configured = tf.config.get_logical_device_configuration(physical)
        count += len(configured) if configured else 1
    return count


def check_mesh(mesh) -> None:
    """Refuses a mesh over a local CPU or GPU this host lacks (`CPU:99` on 8 CPUs).

    Checked when a mesh is first used, not when it is built: programs (TensorFlow's tests
    among them) build meshes first and split the host into logical devices afterwards.
    """
    if mesh is None:
        return
    # The device of the current context first: after a context reset (with fewer logical
    # devices, say) it clears what was checked against the old context.
    get()
    if mesh in _checked_meshes:
        return
    devices = mesh.local_devices()
    if not _existing_devices.issuperset(devices):
        _check_devices(mesh, devices)
        _existing_devices.update(devices)
    if len(_checked_meshes) >= _MAX_CHECKED_MESHES:
        _checked_meshes.clear()
    _checked_meshes.add(mesh)


def _check_devices(mesh, devices: List[str]) -> None:
    counts: Dict[str, int] = {}
    for name in devices:
        spec = tf_device.DeviceSpec.from_string(name)
        device_type = (spec.device_type or "").upper()
        if device_type not in ("CPU", "GPU") or spec.device_index is None:
            continue
        if spec.job not in (None, "localhost") or spec.task not in (None, 0):
            continue  # another client's device
        if device_type not in counts:
            counts[device_type] = _num_devices(device_type)
        if spec.device_index >= counts[device_type]:
            raise MeshError(
                f"Device `{name}` of {mesh.short()} does not exist: this host has "
                f"{counts[device_type]} logical {device_type} device(s). Split the host into "
                f"more logical devices before using the mesh "
                f"(`tf.config.set_logical_device_configuration`, or "
                f"`initialize_accelerator_system(num_logical_cpu_devices=...)`), or build the "
                f"mesh from existing devices.")


@contextlib.contextmanager
def mesh_scope(mesh, place_ops: bool = True):
    """Places ops on the DTensor device with `mesh` as the default mesh (`place_ops=False`:
    only sets the mesh of ops placed there otherwise)."""
    check_mesh(mesh)
    get().push_default_mesh(mesh._mesh if mesh is not None else None)
    _scopes.meshes.append(mesh)
    try:
        with ops.device(DEVICE_NAME) if place_ops else contextlib.nullcontext():
            yield
    finally:
        _scopes.meshes.pop()
        # The device of the current context: a reset inside the scope replaced the one
        # that the push went to, and gave the new one this scope's entry.
        get().pop_default_mesh()


@contextlib.contextmanager
def layout_scope(layout):
    """Gives the outputs of ops run inside (creation ops, variables) `layout`."""
    if layout is not None and layout.has_match:
        raise LayoutError(f"{layout.short()} cannot be the layout of new values: MATCH (keep "
                        f"the input's sharding of an axis) is for `relayout` targets only.")
    get().push_default_layout(layout._layout if layout is not None else None)
    _scopes.layouts.append(layout)
    try:
        yield
    finally:
        _scopes.layouts.pop()
        get().pop_default_layout()


def default_mesh():
    for mesh in reversed(_scopes.meshes):
        if mesh is not None:
            return mesh
    return None
