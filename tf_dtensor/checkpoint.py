"""Checkpoint glue: `tf.train.Checkpoint` saves and restores DVariables as global values.

A DVariable is written under the ordinary checkpoint key (`v/.ATTRIBUTES/VARIABLE_VALUE`)
as one tensor with its global shape, assembled on the host CPU from its components. So
the checkpoint does not depend on the layout or the mesh: a plain `tf.Variable` of the same
shape and dtype reads it, and a DVariable restores from a plain variable's checkpoint.

    save:    [x,*] @ mesh(x=2): CPU:0 holds rows 0-3, CPU:1 rows 4-7 -> concat -> [8,4]
    restore: [8,4] on the host -> copy_to_mesh -> [*,x] @ mesh(x=4): each device its columns

Save and restore run eagerly (as `tf.train.Checkpoint` does by default). When TensorFlow
runs them inside a `tf.function` (for example an asynchronous checkpoint copying values to
the host), the host-side work runs in a `tf.py_function`, eagerly, each time the
function runs.
"""

from __future__ import annotations

from typing import Dict, Tuple

import tensorflow as tf
from tensorflow.python.checkpoint import tensor_callable
from tensorflow.python.framework import device as device_lib
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable

from tf_dtensor import _device
from tf_dtensor import api
from tf_dtensor.layout import UNSHARDED

__all__ = ["DTensorCheckpoint"]

# The CPU of this host: checkpoint values are assembled and read here, and the saver
# groups them with the object graph and `save_counter`, so a save needs no cross-task
# function.
HOST_DEVICE = device_lib.DeviceSpec.from_string(_device.DEVICE_NAME).replace(
    device_type="CPU", device_index=0).to_string()


def global_value(tensor) -> tf.Tensor:
    """The global value of a DTensor or DVariable, as one regular tensor on the host CPU.

    A replicated value is component 0; a sharded one is concatenated from one component
    per block, where a device's block index along each tensor axis is its mesh coordinate
    along the mesh dimension sharding that axis (`[x,*]` on `x=2`: CPU:0 -> block (0,0),
    CPU:1 -> block (1,0)).

    Args:
      tensor: a DTensor or a DVariable.

    Returns:
      A `tf.Tensor` on the host CPU with the global shape and the same dtype.

    Raises:
      LayoutError: `tensor` is not a DTensor.
      ValueError: this client's devices do not hold every block (a multi-client mesh).

    Example:
      >>> mesh = create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = copy_to_mesh(tf.reshape(tf.range(8), [4, 2]), Layout(["x", UNSHARDED], mesh))
      >>> global_value(t).numpy().tolist()
      [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        # Read on the DTensor device whatever the caller's device scope (the saver reads
        # under the host CPU); `unpack` of the variable itself would give its handles.
        with ops.device(_device.DEVICE_NAME):
            tensor = tensor.read_value()
    layout = api.fetch_layout(tensor)
    components = api.unpack(tensor)
    with ops.device(HOST_DEVICE):
        if layout.is_fully_replicated():
            return array_ops.identity(components[0])
        mesh = layout.mesh
        specs = layout.sharding_specs
        blocks: Dict[Tuple[int, ...], tf.Tensor] = {}
        for device_id, component in zip(mesh.local_device_ids(), components):
            coords = mesh.coords(device_id)
            index = tuple(0 if s == UNSHARDED else coords[mesh.dim_names.index(s)]
                          for s in specs)
            blocks.setdefault(index, component)
        pieces = [layout.num_shards(axis) for axis in range(layout.rank)]
        expected = 1
        for count in pieces:
            expected *= count
        if len(blocks) != expected:
            raise ValueError(
                f"Cannot assemble the global value of a {layout.short()} tensor: this "
                f"client's devices hold {len(blocks)} of its {expected} blocks. Save from a "
                f"mesh whose devices are all local, or relayout to replicated first.")
        return _concat_blocks(blocks, pieces, ())


def _concat_blocks(blocks, pieces, prefix):
    """Concatenates `blocks` (keyed by block index) along the axes from `len(prefix)` on."""
    axis = len(prefix)
    if axis == len(pieces):
        return array_ops.identity(blocks[prefix])
    parts = [_concat_blocks(blocks, pieces, prefix + (i,)) for i in range(pieces[axis])]
    return parts[0] if len(parts) == 1 else array_ops.concat(parts, axis)


def restore_global_value(variable, value) -> None:
    """Assigns a checkpoint's global `value` to a DVariable, laid out as the variable.

    The value is copied onto the variable's mesh in the variable's own layout, whatever
    mesh or layout it was saved from.

    Raises:
      ValueError: `value`'s shape is not the variable's global shape.
    """
    _check_shape(variable, value.shape)
    variable.assign(api.copy_to_mesh(value, variable.layout))


def _check_shape(variable, shape: tf.TensorShape) -> None:
    # The saver reads a value of whatever shape the checkpoint holds; the variable's
    # assignment would fail later, or in the relayout, without naming the checkpoint.
    if not variable.shape.is_compatible_with(shape):
        raise ValueError(
            f"Cannot restore DVariable `{variable.name}` ({variable.layout.short()}): the "
            f"checkpoint holds a value of shape {shape.as_list()} but the variable's "
            f"global shape is {variable.shape.as_list()}. Create the variable with shape "
            f"{shape.as_list()} (in any layout), or read the saved value with "
            f"`tf.train.load_checkpoint(path).get_tensor(key)` and reshape it.")


def _host_value(variable) -> tf.Tensor:
    """The global value on the host; inside a function, read each time the function runs
    (a function is traced once and run at every save)."""
    if not ops.inside_function():
        return global_value(variable)
    with ops.device(HOST_DEVICE):
        value = tf.py_function(lambda: global_value(variable), [], variable.dtype)
    value.set_shape(variable.shape)
    return value


def serialize_to_tensors(variable) -> dict:
    """`Trackable._serialize_to_tensors` for a DVariable: its global value, read lazily."""
    return {trackable.VARIABLE_VALUE_KEY: tensor_callable.Callable(
        lambda: _host_value(variable), dtype=variable.dtype, device=HOST_DEVICE)}


def restore_from_tensors(variable, restored_tensors):
    """`Trackable._restore_from_tensors` for a DVariable."""
    value = restored_tensors[trackable.VARIABLE_VALUE_KEY]
    if not ops.inside_function():
        restore_global_value(variable, value)
        return None
    # Inside a function (TensorFlow restores in one when a checkpoint spans several
    # tasks) the value exists only when the function runs: assign it then.
    _check_shape(variable, value.shape)

    def assign(restored):
        restore_global_value(variable, restored)
        return []

    return tf.py_function(assign, [value], [])


def copy_trackable_to_cpu(variable, object_map) -> None:
    """`Trackable._copy_trackable_to_cpu` for a DVariable (asynchronous checkpoints).

    The host copy is a plain variable holding the global value; TensorFlow saves it in the
    DVariable's place, under the same key.
    """
    if variable not in object_map:
        with ops.init_scope(), ops.device(HOST_DEVICE):
            object_map[variable] = resource_variable_ops.UninitializedVariable(
                trainable=variable.trainable, shape=variable.shape, dtype=variable.dtype,
                name=variable._shared_name)  # pylint: disable=protected-access
    copy = object_map[variable]
    value = _host_value(variable)
    with ops.device(HOST_DEVICE):
        copy.assign(value)


class DTensorCheckpoint(tf.train.Checkpoint):
    """`tf.train.Checkpoint`, with the signature of `tf.experimental.dtensor.DTensorCheckpoint`.

    Kept so that code written for TensorFlow's DTensor runs unchanged; prefer
    `tf.train.Checkpoint`, which saves and restores DVariables directly. `mesh` is not
    needed: the checkpoint holds global values, independent of any mesh.

    Args:
      mesh: ignored.
      root: as for `tf.train.Checkpoint`.
      **kwargs: the objects to track, as for `tf.train.Checkpoint`.

    Example:
      >>> mesh = create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> v = DVariable(tf.zeros([4]), layout=Layout(["x"], mesh))
      >>> path = DTensorCheckpoint(mesh, v=v).save("/tmp/ckpt")
    """

    def __init__(self, mesh, root=None, **kwargs):
        del mesh
        super().__init__(root=root, **kwargs)
