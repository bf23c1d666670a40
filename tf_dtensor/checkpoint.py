"""Checkpoint glue: `tf.train.Checkpoint` saves and restores DVariables shard by shard.

A DVariable is written under the ordinary checkpoint key (`v/.ATTRIBUTES/VARIABLE_VALUE`)
as TensorFlow's DTensor writes it: a replicated variable as one full tensor, a sharded one
as one *slice* per distinct shard (bundle entries with shape-and-slice specs such as
`"8 4 0,4:-"`: rows 0-3 of an [8,4] tensor). No device gathers the global value to save it.

    save:    [x,*] @ mesh(x=2) of [8,4]: CPU:0 writes slice "8 4 0,4:-", CPU:1 "8 4 4,4:-"
    restore: [*,x] @ mesh(x=4): device i reads slice "8 4 -:i,1" (RestoreV2 assembles it
             from whatever slices, or full tensor, the checkpoint holds) -> pack

The checkpoint does not depend on the layout or the mesh: a plain `tf.Variable` reads it
(the reader assembles the slices), TensorFlow's DTensor reads it, and a DVariable restores
from a plain variable's or TensorFlow's DTensor's checkpoint into its own layout.

On a mesh that spans several clients (processes), each client writes the blocks whose
lowest device id it holds (client 0 also the full values, plain variables and the object
graph) to its own part, and client 0 merges the parts into one ordinary checkpoint
(`write_parts`); each client restores its own devices' slices. Checkpoints written by N
clients restore on M clients or on one process, in any layout.

Save and restore run eagerly (as `tf.train.Checkpoint` does by default). When TensorFlow
runs them inside a `tf.function` (an asynchronous checkpoint copying values to the host,
a `write` inside a function), the host-side work runs in a `tf.py_function`, eagerly, each
time the function runs.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint as tf_checkpoint
from tensorflow.python.checkpoint import tensor_callable
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import errors
from tensorflow.python.framework import ops
from tensorflow.python.ops import array_ops
from tensorflow.python.ops import gen_io_ops
from tensorflow.python.ops import io_ops
from tensorflow.python.ops import math_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object

from tf_dtensor import _cluster
from tf_dtensor import _device
from tf_dtensor import api
from tf_dtensor import config
from tf_dtensor.layout import UNSHARDED, Layout

__all__ = ["DTensorCheckpoint"]



def host_device() -> str:
    """The CPU of this client's host (`/job:localhost/replica:0/task:0/device:CPU:0` with
    one client, `/job:worker/replica:0/task:<k>/device:CPU:0` for client k of several):
    checkpoint values are written and read here, and the saver groups them with the object
    graph and `save_counter`, so a save needs no cross-task function."""
    return f"/job:{config.full_job_name()}/device:CPU:0"

Block = Tuple[int, ...]


# --- shard geometry ---------------------------------------------------------------------------

def block_of(layout: Layout, device_id: int) -> Block:
    """The block a device holds: along each tensor axis, its mesh coordinate on the mesh
    dimension sharding that axis (`[x,*]` on `x=2`: device 1 -> block (1, 0)); over
    several mesh dimensions, the piece they number together (`[x+y]`: 2x + y)."""
    return tuple(layout._layout.shard_index_of_device(int(device_id)))


def local_blocks(layout: Layout) -> List[Block]:
    """The block of each local device, in local device order (the order of `unpack`)."""
    return [block_of(layout, device_id) for device_id in layout.mesh.local_device_ids()]


def distinct_blocks(layout: Layout, owned_only: bool = False) -> Dict[Block, int]:
    """Each distinct block this client holds, mapped to the local position of one device
    holding it (the first one).

    With `owned_only`, only the blocks whose lowest global device id is local: across the
    clients of a multi-client mesh, every block is then written by exactly one client.
    """
    mesh = layout.mesh
    local_ids = mesh.local_device_ids()
    owners: Dict[Block, int] = {}
    device_ids = sorted(int(d) for d in mesh.global_device_ids().flat) if owned_only else local_ids
    for device_id in device_ids:
        owners.setdefault(block_of(layout, device_id), device_id)
    return {block: local_ids.index(device_id) for block, device_id in owners.items()
            if device_id in local_ids}


def slice_spec(layout: Layout, global_shape: Sequence[int], block: Block) -> str:
    """The shape-and-slice spec of `block` of a tensor of `global_shape`, as `SaveV2` and
    `RestoreV2` take it: `""` for a replicated layout (the full tensor), else the global
    shape then `start,length` (or `-` for a whole axis) per axis.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> slice_spec(Layout(["x", UNSHARDED], mesh), [8, 4], (1, 0))
      '8 4 4,4:-'
    """
    if layout.is_fully_replicated():
        return ""
    global_shape = [int(d) for d in global_shape]
    sizes, offsets = layout.shard_geometry(global_shape, block)
    axes = [f"{offset},{size}" if layout.num_shards(axis) > 1 else "-"
            for axis, (offset, size) in enumerate(zip(offsets, sizes))]
    return " ".join(str(d) for d in global_shape) + " " + ":".join(axes)


def components_of(tensor) -> List[tf.Tensor]:
    """The components of a DTensor or DVariable, one per local device, read eagerly."""
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        # Read on the DTensor device whatever the caller's device scope (the saver reads
        # under the host CPU); `unpack` of the variable itself would give its handles.
        with ops.device(_device.DEVICE_NAME):
            tensor = tensor.read_value()
    return list(api.unpack(tensor))


def global_value(tensor) -> tf.Tensor:
    """The global value of a DTensor or DVariable, as one regular tensor on the host CPU.

    A replicated value is component 0; a sharded one is concatenated from one component
    per block (`[x,*]` on `x=2`: CPU:0 -> block (0,0), CPU:1 -> block (1,0)). Checkpoints
    do not use it (they write the blocks as slices); it is for reading a value whole.

    Args:
      tensor: a DTensor or a DVariable.

    Returns:
      A `tf.Tensor` on the host CPU with the global shape and the same dtype.

    When other clients hold some blocks (a mesh spanning clients), the value is gathered
    across the clients: every client of the mesh must then call this, in the same order.

    Raises:
      LayoutError: `tensor` is not a DTensor.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = dtensor.copy_to_mesh(tf.reshape(tf.range(8), [4, 2]), Layout(["x", UNSHARDED], mesh))
      >>> global_value(t).numpy().tolist()
      [[0, 1], [2, 3], [4, 5], [6, 7]]
    """
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        layout = tensor.layout
    else:
        layout = api.fetch_layout(tensor)
        if layout.partial:  # components are partial sums: reduce them first
            layout = Layout.replicated(layout.mesh, layout.rank)
            tensor = api.relayout(tensor, layout)
    components = components_of(tensor)
    with ops.device(host_device()):
        if layout.is_fully_replicated():
            return array_ops.identity(components[0])
        blocks = {block: components[position]
                  for block, position in distinct_blocks(layout).items()}
        pieces = [layout.num_shards(axis) for axis in range(layout.rank)]
        expected = 1
        for count in pieces:
            expected *= count
        if len(blocks) == expected:
            return _concat_blocks(blocks, pieces, ())
    # Some blocks live on other clients: gather them (an all-gather across the clients, so
    # every client of the mesh must ask for the value, in the same order).
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        with ops.device(_device.DEVICE_NAME):
            tensor = tensor.read_value()
    whole = api.relayout(tensor, Layout.replicated(layout.mesh, layout.rank))
    with ops.device(host_device()):
        return array_ops.identity(api.unpack(whole)[0])


def _concat_blocks(blocks, pieces, prefix):
    """Concatenates `blocks` (keyed by block index) along the axes from `len(prefix)` on."""
    axis = len(prefix)
    if axis == len(pieces):
        return array_ops.identity(blocks[prefix])
    parts = [_concat_blocks(blocks, pieces, prefix + (i,)) for i in range(pieces[axis])]
    return parts[0] if len(parts) == 1 else array_ops.concat(parts, axis)


# --- DVariable save hooks ---------------------------------------------------------------------

# Dtypes whose bundle entries TensorFlow reads slice by slice (or reads slices of a full
# entry). Others (float16, uint16/32/64, string) fail in RestoreV2's slice path, so a
# variable of those dtypes is written whole ("") and read whole.
SLICEABLE_DTYPES = frozenset([
    dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.complex64, dtypes.complex128,
    dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.bool])


def saves_as_bf16(variable) -> bool:
    """Whether `variable` (float32) is written as bfloat16 (`enable_save_as_bf16`)."""
    return getattr(variable, "_save_as_bf16", False)


def saved_dtype(variable) -> tf.DType:
    return dtypes.bfloat16 if saves_as_bf16(variable) else variable.dtype


def saved_slices(layout: Layout, global_shape, dtype: tf.DType) -> Dict[str, Optional[Block]]:
    """The slice specs a tensor is saved and restored as, each mapped to its block: one per
    distinct block when sharded, else `{"": None}` (the full value). Uneven shards are saved
    whole too: TensorFlow's slice readers (and TF's DTensor) expect one block shape per
    tensor, and a full value restores into any layout."""
    if (layout.is_fully_replicated() or dtype not in SLICEABLE_DTYPES
            or not layout.is_even(global_shape)):
        return {"": None}
    return {slice_spec(layout, global_shape, block): block for block in distinct_blocks(layout)}


def _saved_value(variable, block: Optional[Block]) -> tf.Tensor:
    """The saved value of one block of `variable` (`None`: the whole value); inside a
    function, read each time the function runs (it is traced once and run at every save)."""
    layout = variable.layout

    def read():
        if block is None:
            value = global_value(variable)
        else:
            value = components_of(variable)[distinct_blocks(layout)[block]]
        with ops.device(host_device()):
            return math_ops.cast(value, dtypes.bfloat16) if saves_as_bf16(variable) else value

    if not ops.inside_function():
        return read()
    with ops.device(host_device()):
        value = tf.py_function(read, [], saved_dtype(variable))
    value.set_shape(variable.shape if block is None else layout.local_shape(variable.shape))
    return value


class DVariableSaveable(saveable_object.SaveableObject):
    """How a DVariable is saved: one spec per distinct block, keyed by its slice spec (a
    replicated variable: one spec `""`, the full value), each read lazily at save time.

    A `SaveableObject` (as TensorFlow's DTensor uses) rather than `_serialize_to_tensors`:
    TensorFlow hands every restored slice of a saveable to `restore`, but only the first
    slice of a key to `_restore_from_tensors` on some restore paths.
    """

    def __init__(self, variable, name: str):
        self._variable = variable
        specs = [saveable_object.SaveSpec(
            tensor=functools.partial(_saved_value, variable, block), slice_spec=spec,
            name=name, dtype=saved_dtype(variable), device=host_device())
            for spec, block in saved_slices(variable.layout, variable.shape,
                                            saved_dtype(variable)).items()]
        super().__init__(variable, specs, name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes  # The variable's layout and global shape say what was read.
        specs = [spec.slice_spec for spec in self.specs]
        value = restored_tensors[0] if specs == [""] else dict(zip(specs, restored_tensors))
        return restore_from_tensors(self._variable, {trackable.VARIABLE_VALUE_KEY: value})


# --- DVariable restore hooks ------------------------------------------------------------------

def _from_saved(variable, value: tf.Tensor) -> tf.Tensor:
    if saves_as_bf16(variable):
        with ops.device(host_device()):
            return math_ops.cast(value, variable.dtype)
    return value


def restore_global_value(variable, value) -> None:
    """Assigns a checkpoint's global `value` to a DVariable, laid out as the variable.

    Raises:
      InvalidArgumentError: `value`'s shape is not the variable's global shape.
    """
    _check_shape(variable, value.shape)
    variable.assign(api.copy_to_mesh(_from_saved(variable, value), variable.layout))


def restore_slices(variable, slices: Dict[str, tf.Tensor]) -> None:
    """Assigns the restored slices (keyed by slice spec) to the devices holding them."""
    layout = variable.layout
    specs = {block: spec for spec, block in
             saved_slices(layout, variable.shape, saved_dtype(variable)).items()}
    values = {spec: _from_saved(variable, slices[spec]) for spec in specs.values()}
    variable.assign(api.pack([values[specs[block]] for block in local_blocks(layout)], layout))


def _check_shape(variable, shape: tf.TensorShape) -> None:
    # The saver reads a full value of whatever shape the checkpoint holds (a sliced read
    # checks the shape in RestoreV2); say which variable and what to do.
    if not variable.shape.is_compatible_with(shape):
        raise errors.InvalidArgumentError(
            None, None,
            f"Cannot restore DVariable `{variable.name}` ({variable.layout.short()}): the "
            f"checkpoint holds a value of shape {shape.as_list()} but the variable's "
            f"global shape is {variable.shape.as_list()}. Create the variable with shape "
            f"{shape.as_list()} (in any layout), or read the saved value with "
            f"`tf.train.load_checkpoint(path).get_tensor(key)` and reshape it.")


def restore_from_tensors(variable, restored_tensors):
    """Restores a DVariable from `{"VARIABLE_VALUE": value}`: a full value (slice spec `""`)
    or a dict of slices keyed by slice spec, as `DVariableSaveable` asked for."""
    value = restored_tensors[trackable.VARIABLE_VALUE_KEY]
    sliced = isinstance(value, dict)
    if not ops.inside_function():
        if sliced:
            restore_slices(variable, value)
        else:
            restore_global_value(variable, value)
        return None
    # Inside a function (TensorFlow restores in one when a checkpoint spans several
    # tasks) the values exist only when the function runs: assign them then.
    specs = list(value) if sliced else None
    inputs = [value[spec] for spec in specs] if sliced else [value]
    if not sliced:
        _check_shape(variable, value.shape)

    def assign(*restored):
        if sliced:
            restore_slices(variable, dict(zip(specs, restored)))
        else:
            restore_global_value(variable, restored[0])
        return []

    return tf.py_function(assign, inputs, [])


# --- asynchronous checkpoints -----------------------------------------------------------------

class _HostCopy(trackable.Trackable):
    """A DVariable's host copy for an asynchronous checkpoint: one host variable per saved
    slice, saved under the DVariable's key and slice specs (TensorFlow saves it in the
    DVariable's place)."""

    def __init__(self, variable):
        layout = variable.layout
        self.blocks: Dict[str, Optional[Block]] = saved_slices(
            layout, variable.shape, saved_dtype(variable))
        self.copies: Dict[str, tf.Variable] = {}
        with ops.init_scope(), ops.device(host_device()):
            for spec, block in self.blocks.items():
                self.copies[spec] = resource_variable_ops.UninitializedVariable(
                    trainable=False, dtype=saved_dtype(variable),
                    shape=variable.shape if block is None else layout.local_shape(variable.shape),
                    name=variable._shared_name)  # pylint: disable=protected-access

    def _serialize_to_tensors(self):
        slices = {spec: tensor_callable.Callable(copy.read_value, dtype=copy.dtype,
                                                 device=host_device())
                  for spec, copy in self.copies.items()}
        return {trackable.VARIABLE_VALUE_KEY: slices[""] if list(slices) == [""] else slices}


def copy_trackable_to_cpu(variable, object_map) -> None:
    """`Trackable._copy_trackable_to_cpu` for a DVariable (asynchronous checkpoints): copies
    each saved slice to its host variable, without assembling the global value."""
    if variable not in object_map:
        object_map[variable] = _HostCopy(variable)
    host_copy = object_map[variable]
    with ops.device(host_device()):
        for spec, block in host_copy.blocks.items():
            host_copy.copies[spec].assign(_saved_value(variable, block))


# --- saves by several clients ------------------------------------------------------------------

def write_parts(prefix: str, names: List[str], specs: List[str], tensors: List) -> None:
    """Writes this client's entries as one part of checkpoint `prefix` and, on client 0,
    merges every client's part into `prefix` (the parts directory is then removed). With
    several clients, everyone meets at a coordination-service barrier after writing and
    after the merge, so no client reads or overwrites `prefix` half-written."""
    client, clients = config.client_id(), config.num_clients()
    part = f"{prefix}_temp/part-{client:05d}-of-{clients:05d}"
    tf.io.gfile.makedirs(f"{prefix}_temp")  # Removed by the merge.
    with ops.device(host_device()):
        io_ops.save_v2(part, names, specs, tensors)
    if clients > 1:
        _cluster.barrier(f"tf_dtensor save {prefix}: parts written", _BARRIER_MS)
    if client == 0:
        parts = [f"{prefix}_temp/part-{i:05d}-of-{clients:05d}" for i in range(clients)]
        with ops.device(host_device()):
            gen_io_ops.merge_v2_checkpoints(parts, prefix, delete_old_dirs=True)
    if clients > 1:
        _cluster.barrier(f"tf_dtensor save {prefix}: merged", _BARRIER_MS)


# How long a client waits for the others at a save's barriers.
_BARRIER_MS = 3600 * 1000


def _saved_entries(serialized_tensors) -> Tuple[List[str], List[str], List]:
    """This client's share of what `tf.train.Checkpoint` saves: the blocks of DVariables
    whose lowest device id is local; on client 0 also full values and everything else."""
    client = config.client_id()
    names: List[str] = []
    specs: List[str] = []
    tensors: List = []
    for owner, entries in serialized_tensors.items():
        variable = getattr(owner, "obj", owner)  # SaveableCompatibilityConverter wraps it
        layout = getattr(variable, "layout", None) if isinstance(
            variable, resource_variable_ops.BaseResourceVariable) else None
        owned = saved = None
        if isinstance(layout, Layout):
            saved = saved_slices(layout, variable.shape, saved_dtype(variable))
            owned = distinct_blocks(layout, owned_only=True)
        for key, value in entries.items():
            for spec, tensor in (value.items() if isinstance(value, dict) else [("", value)]):
                block = saved.get(spec) if saved is not None else None
                mine = client == 0 if block is None else block in owned
                # A DVariable's full value may need every client (an all-gather).
                if not mine and not (saved is not None and block is None):
                    continue
                if isinstance(tensor, saveable_object.SaveSpec):
                    tensor = tensor.tensor
                elif isinstance(tensor, tensor_callable.Callable):
                    tensor = tensor.get_tensor()
                if not mine:
                    continue
                names.append(key)
                specs.append(spec)
                tensors.append(tensor)
    return names, specs, tensors


_single_client_save = tf_checkpoint.TrackableSaver._save_cached_when_graph_building


def _save_cached_when_graph_building(self, file_prefix, object_graph_tensor, options):
    """`TrackableSaver`'s save, when this process is one client of several: every client
    runs the same save, each writing its own part (`write_parts`). TensorFlow's own saver
    would have every client write, and merge, the whole checkpoint at the same path."""
    if not _cluster.started() or not context.executing_eagerly() or ops.inside_function():
        return _single_client_save(self, file_prefix, object_graph_tensor, options)
    if options is not None and options.experimental_io_device:
        raise ValueError(
            "tf.train.Checkpoint on several clients writes each client's part on its own "
            "host CPU; `CheckpointOptions(experimental_io_device=...)` is not supported. "
            "Drop the option.")
    serialized, feed_additions, registered, _ = self._gather_serialized_tensors(
        object_graph_tensor)
    if registered:
        raise ValueError(
            f"tf.train.Checkpoint on several clients cannot run registered savers "
            f"({sorted(registered)}); save those objects from a single-client program.")
    prefix = file_prefix.numpy().decode() if hasattr(file_prefix, "numpy") else str(file_prefix)
    write_parts(prefix, *_saved_entries(serialized))
    with ops.device("/cpu:0"):
        return array_ops.identity(file_prefix), feed_additions


tf_checkpoint.TrackableSaver._save_cached_when_graph_building = _save_cached_when_graph_building


class DTensorCheckpoint(tf.train.Checkpoint):
    """`tf.train.Checkpoint`, with the signature of `tf.experimental.dtensor.DTensorCheckpoint`.

    Kept so that code written for TensorFlow's DTensor runs unchanged; prefer
    `tf.train.Checkpoint`, which saves and restores DVariables directly, shard by shard.
    `mesh` is not needed: each variable's layout says which slices to write and read.

    Args:
      mesh: ignored.
      root: as for `tf.train.Checkpoint`.
      **kwargs: the objects to track, as for `tf.train.Checkpoint`.

    Example:
      >>> import os, tempfile
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> v = dtensor.DVariable(tf.zeros([4]), layout=Layout(["x"], mesh))
      >>> path = DTensorCheckpoint(mesh, v=v).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
      >>> os.path.basename(path)
      'ckpt-1'
    """

    def __init__(self, mesh, root=None, **kwargs):
        del mesh
        super().__init__(root=root, **kwargs)
