"""Keras' backend distribution library, implemented with tf_dtensor.

These are the functions Keras 3 calls as `keras.src.backend.distribution_lib.<name>` (the
JAX backend's contract): `_hooks.install()` puts each name in `BACKEND_FUNCTIONS` into
TensorFlow's backend module. The helpers below them lay values out on a mesh and bring
them back to the host for Keras. Only Keras' public distribution API is used here.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from tf_dtensor import api, config
from tf_dtensor import _placement_api
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError
from tf_dtensor.layout import UNSHARDED, Layout
from tf_dtensor.mesh import Mesh

BACKEND_FUNCTIONS = ("list_devices", "get_device_count", "distribute_tensor",
                     "distribute_value", "distribute_data_input",
                     "initialize", "num_processes", "process_id", "_to_backend_mesh",
                     "_to_backend_layout")


class ReplicatedVariableWarning(UserWarning):
    """A large Keras variable that no LayoutMap rule matched is replicated on every device."""


# Bytes per device from which a variable no LayoutMap rule matched is reported.
_WARN = {"bytes": 1 << 20}


def set_replicated_warning_bytes(nbytes: Optional[int]) -> None:
    """Report unmatched variables of at least `nbytes` per device (None: never). 1 MiB first."""
    if nbytes is not None and (not isinstance(nbytes, int) or nbytes < 0):
        raise ValueError(f"`nbytes` must be a non-negative int or None; got {nbytes!r}.")
    _WARN["bytes"] = nbytes


def active_distribution():
    from keras import distribution  # public API; Keras is imported once this runs
    return distribution.distribution()


# ---- devices, meshes, layouts ----

def list_devices(device_type=None) -> List[str]:
    """Keras' device names (`"cpu:0"`, `"gpu:3"`): accelerators if any, else CPUs."""
    kind = device_type.upper() if device_type else None
    devices = tf.config.list_logical_devices(kind)
    if kind is None:
        accelerators = [d for d in devices if d.device_type != "CPU"]
        devices = accelerators or [d for d in devices if d.device_type == "CPU"]
    if config.num_clients() > 1:
        # Every client's devices, by full name: "cpu:0" would name one on each client.
        return [d.name for d in devices]
    return [f"{d.device_type.lower()}:{d.name.rsplit(':', 1)[-1]}" for d in devices]


def get_device_count(device_type=None) -> int:
    return len(list_devices(device_type))


_SHORT_DEVICE = re.compile(r"^([A-Za-z_]+):(\d+)$")


def _device_name(device: Any) -> str:
    name = str(device)
    short = _SHORT_DEVICE.match(name)
    return f"{short.group(1).upper()}:{short.group(2)}" if short else name


def _to_backend_mesh(device_mesh) -> Mesh:
    """A Keras `DeviceMesh` as a tf_dtensor `Mesh` (same axis names, shape, devices)."""
    devices = [_device_name(d) for d in np.asarray(device_mesh.devices).flatten()]
    dims = list(zip(device_mesh.axis_names, device_mesh.shape))
    if config.num_clients() > 1:
        names = [config._this_clients(d) for d in devices]  # pylint: disable=protected-access
        mine = f"/job:{config.full_job_name()}/"
        others = [name for name in names if not name.startswith(mine)]
        if others:
            raise NotImplementedError(
                f"A Keras DeviceMesh over several processes' devices ({others[0]} is another "
                f"client's) is not supported on tf_dtensor: Keras' TensorFlow trainer does not "
                f"assemble each process's batch into one global batch. Give the distribution "
                f"this process's devices (`keras.distribution.list_devices()` entries of "
                f"{mine[:-1]}), or shard across processes with tf_dtensor directly "
                f"(`dtensor.create_distributed_mesh`, a custom training loop).")
    return config.create_mesh(dims, devices=devices)


def _to_backend_layout(tensor_layout) -> Layout:
    """A Keras `TensorLayout` as a tf_dtensor `Layout` (None axes are unsharded)."""
    if tensor_layout.device_mesh is None:
        raise ValueError(
            f"Cannot lay out with {tensor_layout}: its `device_mesh` is not set. Give the "
            f"TensorLayout a DeviceMesh, or use it in a LayoutMap (which sets it).")
    specs = [axis if axis is not None else UNSHARDED for axis in tensor_layout.axes]
    return Layout(specs, tensor_layout.device_mesh.backend_mesh)


def as_layout(layout: Any) -> Layout:
    """A tf_dtensor `Layout` from a Keras `TensorLayout` or a `Layout`."""
    if isinstance(layout, Layout):
        return layout
    if hasattr(layout, "backend_layout"):
        return layout.backend_layout
    raise TypeError(f"Expected a keras.distribution.TensorLayout or a tf_dtensor Layout; "
                    f"got {type(layout).__name__}: {layout!r}.")


def to_layout(layout: Any, rank: int) -> Layout:
    """A tf_dtensor `Layout` from a Keras `TensorLayout` or a `Layout`, checked against `rank`.

    Raises:
      LayoutError (also a ValueError): the ranks differ. Where Keras is laying out a
        layer's output by the `LayoutMap` (a key whose regex also matches
        `{layer path}/output`), the message names that path and the key.
    """
    result = as_layout(layout)
    if result.rank != rank:
        output = _layer_output_key(layout)
        if output is not None:
            path, key = output
            raise LayoutError(
                f"Cannot lay out the output of Keras layer `{path[:-len('/output')]}` (rank "
                f"{rank}) as {result.short()}: LayoutMap[{key!r}] matches `{path}` and gives "
                f"a layout of rank {result.rank}, and a layout needs one entry per axis of "
                f"the output. Give the output its own key of rank {rank} (e.g. "
                f"`layout_map[{path!r}] = {(None,) * rank}`), or narrow the regex so that "
                f"it does not match `{path}`.")
        raise LayoutError(f"Layout {result.short()} has rank {result.rank} but the value has "
                          f"rank {rank}; give one sharding spec per axis.")
    return result


def layout_map_key(layout_map, path: str) -> Optional[str]:
    """The key of `layout_map` that gives `path` its layout, as Keras' `LayoutMap.__getitem__`
    picks it: the path itself, else the key that `re.fullmatch`es it; None if none does."""
    keys = list(layout_map)  # (`in` would match by regex and never fail)
    if path in keys:
        return path
    for pattern in keys:
        if re.fullmatch(pattern, path):
            return pattern
    return None


def _layer_output_key(layout) -> Optional[tuple]:
    """(`{layer path}/output`, its LayoutMap key) where a Keras layer's call is laying out
    its output as `layout` by the active distribution's LayoutMap, else None."""
    try:
        from keras.src.backend.common.name_scope import current_path
    except ImportError:  # another Keras: the plain message
        return None
    distribution = active_distribution()
    layout_map = getattr(distribution, "_layout_map", None)
    scope = current_path()
    if layout_map is None or not scope:
        return None
    path = f"{scope}/output"
    key = layout_map_key(layout_map, path)
    if key is None or layout_map[key] is not layout:
        return None
    return path, key


# ---- values ----

def _is_keras_tensor(value) -> bool:
    from keras import KerasTensor
    return isinstance(value, KerasTensor)


def distribute_tensor(tensor, layout):
    """`tensor` laid out as `layout` (a TensorLayout or Layout), eagerly or while tracing.

    A regular tensor is sliced on each device (no device receives the whole value); a
    DTensor is relayouted, and returned as is when it already has the layout. A nest (the
    outputs of a layer that returns several, such as an LSTM's `(output, h, c)`, which
    Keras lays out by one `{layer path}/output` key) is laid out value by value, as JAX
    lays out each leaf of a pytree; each value must have the layout's rank.
    """
    if tf.nest.is_nested(tensor):
        _check_one_rank(tensor, layout)
        return tf.nest.map_structure(
            lambda value: value if value is None else distribute_tensor(value, layout), tensor)
    if _is_keras_tensor(tensor):
        return tensor  # symbolic (functional model construction): nothing to place
    if isinstance(tensor, tf.Variable) and not _tensors.is_dtensor_value(tensor):
        tensor = tensor.value()
    rank = len(tensor.shape)
    layout = to_layout(layout, rank)
    if not context.executing_eagerly():
        return api.relayout(tensor, layout)
    if _tensors.is_dtensor_value(tensor):
        if isinstance(tensor, tf.Variable):
            tensor = tensor.read_value()
        return tensor if api.fetch_layout(tensor) == layout else api.relayout(tensor, layout)
    return api.copy_to_mesh(tensor, layout)


def _check_one_rank(values, layout) -> None:
    """Raises LayoutError when the values of a nest that one layout is to lay out have
    several ranks (`MultiHeadAttention(return_attention_scores=True)`: ranks 3 and 4)."""
    ranks = [len(v.shape) for v in tf.nest.flatten(values) if v is not None]
    if len(set(ranks)) < 2:
        return
    output = _layer_output_key(layout)
    what = (f"the outputs of Keras layer `{output[0][:-len('/output')]}`, which "
            f"LayoutMap[{output[1]!r}] lays out (it matches `{output[0]}`)" if output
            else "a nest of values")
    raise LayoutError(
        f"Cannot lay out {what} as {as_layout(layout).short()}: one layout lays out every "
        f"value of the nest, and these have ranks {ranks}. Narrow the key so that it does "
        f"not match this layer, and lay out a layer's output downstream instead, or lay "
        f"out each value in the layer's `call` with `keras.distribution.distribute_tensor`.")


def scatter_host_value(array: np.ndarray, layout: Layout):
    """A host array as a DTensor laid out as `layout`, each device given only its block.

    No device ever holds the whole array (a weights file loading into a sharded model).
    """
    components = []
    for (shape, offset), device in zip(layout.device_blocks(array.shape),
                                       layout.mesh.local_devices()):
        block = array[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
        with tf.device(device):
            components.append(tf.constant(block))
    return api.pack(components, layout)


def distribute_value(value, tensor_layout):
    """A host value (numpy array, tensor) laid out as `tensor_layout`."""
    return distribute_tensor(tf.convert_to_tensor(value), tensor_layout)


def distribute_data_input(per_process_batch, layout, batch_dim_name):
    """This process's batch as the global batch laid out as `layout`.

    One process holds every device of the mesh, so its batch is the global batch.
    """
    del batch_dim_name  # the layout names it
    if config.num_clients() > 1:
        raise NotImplementedError(
            "distribute_data_input across several processes needs tf_dtensor's multi-client "
            "runtime, which this build does not have yet; run one process that holds the mesh.")
    return distribute_value(per_process_batch, layout)


def lay_out_batch(batch, mesh: Mesh):
    """A host batch (any nest) on `mesh`: as the active distribution says when `mesh` is its
    mesh, else replicated (a model whose layer arguments keep it on its own mesh)."""
    distribution = active_distribution()
    if distribution is not None and distribution.device_mesh.backend_mesh != mesh:
        distribution = None

    def place(value):
        if value is None or _tensors.is_dtensor_value(value):
            return value
        value = tf.convert_to_tensor(value)
        rank = len(value.shape)
        if distribution is not None and rank > 0:
            layout = to_layout(distribution.get_data_layout(value.shape), rank)
        else:
            layout = Layout.replicated(mesh, rank)
        return api.copy_to_mesh(value, layout)

    return tf.nest.map_structure(place, batch)


def _plain(value):
    if not _tensors.is_dtensor_value(value):
        return value
    if isinstance(value, tf.Variable):
        value = value.read_value()
    if api.fetch_layout(value).is_fully_replicated():
        return api.unpack(value)[0]  # every device holds the whole value: take one
    return _placement_api.full_tensor(value)


def to_host(outputs):
    """Every DTensor in `outputs` (any nest) as a regular tensor holding its whole value."""
    return tf.nest.map_structure(_plain, outputs)


def to_numpy(value) -> np.ndarray:
    """The whole value of a tensor or variable as a numpy array (shards gathered)."""
    return np.asarray(_plain(value).numpy())


def bytes_per_device(shape, dtype, layout: Optional[Layout]) -> int:
    """Bytes of the largest block of a `shape` tensor laid out as `layout` (None: whole)."""
    block = layout.local_shape(list(shape)) if layout is not None and len(shape) else shape
    return int(np.prod(block, dtype=np.int64)) * tf.as_dtype(dtype).size


def human_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def warn_if_replicated(variable, layout: Layout, rule: Optional[str], tried: List[str]) -> None:
    """Warns when a large variable that no LayoutMap rule matched ends up replicated."""
    threshold = _WARN["bytes"]
    if threshold is None or not rule or not rule.startswith("no LayoutMap rule"):
        return
    if not layout.is_fully_replicated() or layout.mesh.size <= 1:
        return
    nbytes = bytes_per_device(variable.shape, variable.dtype, layout)
    if nbytes < threshold:
        return
    warnings.warn(
        f"Keras variable `{variable.path}` (shape {tuple(variable.shape)}, {variable.dtype}, "
        f"{human_bytes(nbytes)}) matched no LayoutMap rule, so every one of the "
        f"{layout.mesh.size} devices of {layout.mesh} holds all of it. Rules tried: "
        f"{tried or 'none'}. Add a key that `re.fullmatch`es {variable.path!r} to shard it, "
        f"or raise the threshold with `tf_dtensor.keras.set_replicated_warning_bytes(n)`.",
        ReplicatedVariableWarning, stacklevel=4)


# ---- processes ----

def initialize(job_addresses=None, num_processes=None, process_id=None):
    """Brings up the accelerator system, with TensorFlow's DTENSOR_* conventions."""
    if job_addresses:
        os.environ["DTENSOR_JOBS"] = job_addresses
    if num_processes is not None:
        os.environ["DTENSOR_NUM_CLIENTS"] = str(num_processes)
    if process_id is not None:
        os.environ["DTENSOR_CLIENT_ID"] = str(process_id)
    config.initialize_accelerator_system()


def num_processes() -> int:
    return config.num_clients()


def process_id() -> int:
    return config.client_id()
