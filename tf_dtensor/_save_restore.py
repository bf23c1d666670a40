"""Name-based checkpoints of DTensors: `sharded_save`, `name_based_save`, `name_based_restore`,
and `enable_save_as_bf16`, with the names and signatures of `tf.experimental.dtensor`.

Files are TensorFlow's ordinary checkpoint bundles. A sharded DTensor is written as one slice
per distinct block (as TensorFlow's DTensor writes it), a replicated one as one full tensor:

    [x,*] @ mesh(x=2) of [8,4], name "w":  "w" slice "8 4 0,4:-" (CPU:0), "8 4 4,4:-" (CPU:1)
    [*,*] @ mesh(x=2):                      "w" full [8,4] (from CPU:0 only)

so `tf.train.load_checkpoint(prefix).get_tensor("w")` reads the global value, and restoring
reads each device's slice of the target layout, whatever layout the file was written from.
"""

from __future__ import annotations

import collections
from typing import Dict, List, Sequence

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_io_ops
from tensorflow.python.ops import io_ops

from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor import checkpoint
from tf_dtensor import config
from tf_dtensor.layout import Layout
from tf_dtensor.mesh import Mesh
from tf_dtensor.variable import DVariable

__all__ = ["enable_save_as_bf16", "name_based_restore", "name_based_save", "sharded_save"]


def _host_strings(value, what: str) -> List[str]:
    """Python strings from a str, bytes, list of them, a string tensor or a replicated
    string DTensor (TensorFlow's `name_based_save` passes packed DTensors)."""
    if _tensors.is_dtensor_value(value):
        value = api.unpack(value)[0]
    if isinstance(value, (tf.Tensor, tf.Variable)):
        value = value.numpy()
        value = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(value, (str, bytes)):
        value = [value]
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in value]
    except TypeError:
        raise TypeError(f"`{what}` must be a string, a list of strings or a string tensor; got "
                        f"{type(value).__name__}.") from None


def _layout_of(tensor, what: str) -> Layout:
    if isinstance(tensor, DVariable):
        return tensor.layout
    if not _tensors.is_dtensor_value(tensor):
        raise ValueError(
            f"Saving/Restoring tensor must be a DTensor: {what} is a regular "
            f"{type(tensor).__name__}. Lay it out with `copy_to_mesh(value, layout)` first.")
    return api.fetch_layout(tensor)


def _require_eager(name: str) -> None:
    if not context.executing_eagerly():
        raise ValueError(
            f"`{name}` must run eagerly (it reads and writes each device's shard on the host); "
            f"it was called while tracing a tf.function. Call it outside the function.")


def sharded_save(mesh: Mesh, file_prefix, tensor_names, shape_and_slices, tensors) -> None:
    """Saves named tensors to a checkpoint, writing each distinct shard of a DTensor once.

    A sharded DTensor (or DVariable) is written as one slice per distinct block, so no device
    gathers the global value; a replicated one is written once, in full. On a multi-client
    mesh each client writes the blocks whose lowest device id it holds, then client 0 merges
    the parts (the clients meet at a barrier before and after the merge). The result is an ordinary
    checkpoint: `tf.train.load_checkpoint(file_prefix).get_tensor(name)` reads global values.

    Args:
      mesh: kept for TensorFlow's signature; each tensor's own layout (and mesh) says
        what to write, so tensors on several meshes may be saved together.
      file_prefix: the checkpoint prefix (a string or a scalar string tensor).
      tensor_names: one name per tensor (a list of strings or a string tensor).
      shape_and_slices: one spec per tensor; `""` for a DTensor (its layout gives the
        slices). A regular tensor may carry a `SaveV2` shape-and-slice spec.
      tensors: DTensors, DVariables or regular tensors, in the order of `tensor_names`.

    Returns:
      None (TensorFlow's DTensor returns the merge op, which is None when run eagerly).

    Raises:
      ValueError: called inside a `tf.function`, the three lists differ in length, or a
        DTensor has a non-empty shape-and-slice spec.

    Example:
      >>> import os, tempfile
      >>> prefix = os.path.join(tempfile.mkdtemp(), "named")
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> w = dtensor.copy_to_mesh(tf.reshape(tf.range(8.0), [4, 2]),
      ...                          Layout(["x", dtensor.UNSHARDED], mesh))
      >>> sharded_save(mesh, prefix, ["w"], [""], [w])
      >>> tf.train.load_checkpoint(prefix).get_tensor("w").shape
      (4, 2)
    """
    _require_eager("sharded_save")
    prefix = _host_strings(file_prefix, "file_prefix")[0]
    names = _host_strings(tensor_names, "tensor_names")
    specs = _host_strings(shape_and_slices, "shape_and_slices")
    tensors = list(tensors)
    if not len(names) == len(specs) == len(tensors):
        raise ValueError(f"sharded_save needs one name and one shape-and-slice spec per tensor; "
                         f"got {len(names)} names, {len(specs)} specs and {len(tensors)} "
                         f"tensors.")
    client, clients = config.client_id(), config.num_clients()
    save_names: List[str] = []
    save_specs: List[str] = []
    save_tensors: List[tf.Tensor] = []
    for name, spec, tensor in zip(names, specs, tensors):
        if not (isinstance(tensor, DVariable) or _tensors.is_dtensor_value(tensor)):
            if client == 0:
                save_names.append(name)
                save_specs.append(spec)
                save_tensors.append(tensor)
            continue
        layout = _layout_of(tensor, f"tensor `{name}`")
        if spec:
            raise ValueError(
                f"sharded_save got shape-and-slice spec `{spec}` for DTensor `{name}` "
                f"({layout.short()}); a DTensor's layout gives its slices. Pass \"\".")
        slices = checkpoint.saved_slices(layout, tensor.shape, tensor.dtype)
        owned = checkpoint.distinct_blocks(layout, owned_only=True)
        components = None
        for slice_spec, block in slices.items():
            if block is None:
                # Every client asks: blocks on other clients are gathered collectively.
                value = checkpoint.global_value(tensor)
                if client != 0:
                    continue
            elif block not in owned:
                continue
            else:
                if components is None:
                    components = checkpoint.components_of(tensor)
                value = components[owned[block]]
            save_names.append(name)
            save_specs.append(slice_spec)
            save_tensors.append(value)
    checkpoint.write_parts(prefix, save_names, save_specs, save_tensors)
    return None


def _ordered(name_tensor_dict) -> "collections.OrderedDict":
    if isinstance(name_tensor_dict, collections.OrderedDict):
        return name_tensor_dict
    return collections.OrderedDict(name_tensor_dict)


def name_based_save(mesh: Mesh, checkpoint_prefix, name_tensor_dict: Dict[str, object]) -> None:
    """Saves DTensors (or DVariables) under the given names, each distinct shard once.

    Args:
      mesh: the mesh of the tensors.
      checkpoint_prefix: the checkpoint prefix.
      name_tensor_dict: names mapped to DTensors or DVariables (insertion order is kept).

    Raises:
      ValueError: called inside a `tf.function`.

    Example:
      >>> import os, tempfile
      >>> prefix = os.path.join(tempfile.mkdtemp(), "named")
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> w = dtensor.copy_to_mesh(tf.ones([4, 2]), Layout(["x", dtensor.UNSHARDED], mesh))
      >>> name_based_save(mesh, prefix, {"w": w})
      >>> tf.train.load_checkpoint(prefix).get_tensor("w").tolist()
      [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """
    _require_eager("name_based_save")
    ordered = _ordered(name_tensor_dict)
    sharded_save(mesh, checkpoint_prefix, list(ordered), [""] * len(ordered),
                 list(ordered.values()))


def name_based_restore(mesh: Mesh, checkpoint_prefix,
                       name_tensor_dict: Dict[str, object]) -> "collections.OrderedDict":
    """Reads named tensors from a checkpoint into the layouts of the given DTensors.

    Each device reads only its own slice of the saved tensor (`RestoreV2` with a
    shape-and-slice spec), whatever layout, mesh or library wrote it; a replicated target
    reads the full value once. The given tensors provide layout, global shape and dtype;
    their values are not changed.

    Args:
      mesh: the mesh of the tensors (each is restored in its own layout).
      checkpoint_prefix: the checkpoint prefix.
      name_tensor_dict: names mapped to DTensors or DVariables with the target layouts.

    Returns:
      An `OrderedDict` of the names mapped to restored DTensors, in the given layouts.

    Raises:
      ValueError: called inside a `tf.function`, or a value is not a DTensor.
      tf.errors.NotFoundError: a name is not in the checkpoint.
      tf.errors.InvalidArgumentError: a saved tensor's shape or dtype differs.

    Example:
      >>> import os, tempfile
      >>> prefix = os.path.join(tempfile.mkdtemp(), "named")
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> saved = dtensor.copy_to_mesh(tf.reshape(tf.range(8.0), [4, 2]),
      ...                              Layout(["x", dtensor.UNSHARDED], mesh))
      >>> name_based_save(mesh, prefix, {"w": saved})
      >>> target = dtensor.copy_to_mesh(tf.zeros([4, 2]), Layout([dtensor.UNSHARDED, "x"], mesh))
      >>> w = name_based_restore(mesh, prefix, {"w": target})["w"]
      >>> dtensor.fetch_layout(w).short(), [c.numpy().tolist() for c in dtensor.unpack(w)]
      ('[*,x] @ mesh(x=2)', [[[0.0], [2.0], [4.0], [6.0]], [[1.0], [3.0], [5.0], [7.0]]])
    """
    del mesh  # Each tensor's own layout says where its slices go.
    _require_eager("name_based_restore")
    ordered = _ordered(name_tensor_dict)
    plans = []
    names: List[str] = []
    specs: List[str] = []
    dtypes: List[tf.DType] = []
    for name, tensor in ordered.items():
        layout = _layout_of(tensor, f"the value of `{name}`")
        slices = checkpoint.saved_slices(layout, tensor.shape, tensor.dtype)
        plans.append((name, layout, tensor.shape, slices, len(names)))
        names.extend([name] * len(slices))
        specs.extend(slices)
        dtypes.extend([tensor.dtype] * len(slices))
    prefix = _host_strings(checkpoint_prefix, "checkpoint_prefix")[0]
    with ops.device(checkpoint.host_device()):
        restored = io_ops.restore_v2(prefix, names, specs, dtypes) if names else []
    result = collections.OrderedDict()
    for name, layout, shape, slices, start in plans:
        values = dict(zip(slices, restored[start:start + len(slices)]))
        if list(slices) == [""]:
            value = values[""]
            if not shape.is_compatible_with(value.shape):
                raise tf.errors.InvalidArgumentError(
                    None, None,
                    f"name_based_restore: `{name}` in {prefix} has shape "
                    f"{value.shape.as_list()} but its target ({layout.short()}) has global "
                    f"shape {shape.as_list()}. Pass a target of the saved shape.")
            result[name] = api.copy_to_mesh(value, layout)
        else:
            by_block = {block: values[spec] for spec, block in slices.items()}
            result[name] = api.pack([by_block[b] for b in checkpoint.local_blocks(layout)], layout)
    return result


def enable_save_as_bf16(variables: Sequence[object]) -> None:
    """Makes checkpoints hold these float32 DVariables as bfloat16.

    Saving casts each shard to bfloat16; restoring reads bfloat16 and casts back to
    float32 (so a variable enabled here reads only bfloat16 checkpoints, as in
    TensorFlow's DTensor). Other variables and dtypes are left alone.

    Args:
      variables: variables; only float32 `DVariable`s are affected.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> v = DVariable(tf.ones([4]), layout=Layout(["x"], mesh))
      >>> enable_save_as_bf16([v]); v.save_as_bf16
      True
    """
    for variable in variables:
        if isinstance(variable, DVariable):
            variable.save_as_bf16 = True

