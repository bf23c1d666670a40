"""`pack` and `unpack`: a DTensor from one component per local device, and back."""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import _core
from tf_dtensor import _device
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError, PackError
from tf_dtensor.layout import Layout


def pack(tensors: Sequence[Any], layout: Layout, *, run_check: bool = False) -> Any:
    """Packs one component per local device into a DTensor with `layout`.

    Components are copied to their devices (on virtual CPUs the buffer is shared, not
    copied). They must share rank, dtype and shape.

    The layout says which devices hold the same block: those that agree on every mesh
    dimension it shards or leaves partial (a replicated layout: all of them). Like
    TensorFlow's DTensor, `pack` takes the components as given and does not compare such
    replicas; if they differ, later results depend on which device computes them.
    `run_check=True` (as PyTorch's `DTensor.from_local(run_check=True)`) compares them
    first, at the cost of reading every component, and raises if replicas differ.

    Args:
      tensors: a list with one component per local device of `layout.mesh`, in mesh order
        (first dimension outermost): tensors, arrays or Python values (`SparseTensor`s
        make a sparse DTensor).
      layout: the DTensor's layout; the components' shape is its block shape.
      run_check: compare the components that `layout` makes replicas first.

    Returns:
      The DTensor.

    Raises:
      TypeError: `layout` is not a `Layout`.
      RuntimeError: called while tracing a `tf.function`.
      PackError: wrong component count, rank, shape or dtype; with `run_check`, replicas
        that differ (a `tf.errors.InvalidArgumentError`, and the classes TensorFlow's
        DTensor raises).
      LayoutError: no components.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = pack([[0, 1]] * mesh.num_local_devices(), Layout.replicated(mesh, 1))
      >>> [c.numpy().tolist() for c in unpack(t)]
      [[0, 1], [0, 1]]
    """
    _tensors.layout_arg(layout, "pack")
    _tensors.refuse_while_tracing("pack")
    if tf.is_tensor(tensors) or isinstance(tensors, np.ndarray):
        # Iterated, one tensor would be its rows, each taken for a device's component.
        raise PackError(f"pack takes a list of tensors, one per local device of "
                        f"{layout.mesh.short()}; got one tensor of shape "
                        f"{list(tensors.shape)}. Pass `[component_0, component_1, ...]`, or "
                        f"`copy_to_mesh(tensor, layout)` to lay out one whole value.")
    if not isinstance(tensors, (list, tuple)):
        tensors = list(tensors)  # a generator is read once, here
    if any(isinstance(t, tf.SparseTensor) for t in tensors):
        return _pack_sparse(tensors, layout, run_check)
    if any(isinstance(t, tf.Variable) for t in tensors):
        raise PackError("pack takes tensors, one per device, not variables (Variable input is "
                        "not supported.). Pack their values (`v.read_value()`), or make a "
                        "DVariable from a packed DTensor: `DVariable(pack(values, layout))`.")
    components = [tf.convert_to_tensor(t) for t in tensors]
    if not components:
        raise LayoutError(f"pack needs one component per local device of {layout.mesh.short()}; "
                          f"got none.")
    if run_check:
        _check_replicas(components, layout)
    if _tensors.spans_clients(layout.mesh) and components[0].shape.rank == layout.rank:
        # Even blocks across clients: every local block has one shape.
        for i, component in enumerate(components[1:], 1):
            if component.shape != components[0].shape:
                raise PackError(
                    f"pack component {i} has shape {component.shape.as_list()} but component "
                    f"0 has {components[0].shape.as_list()}; on {layout.mesh.short()}, which "
                    f"spans several clients, every block of {layout.short()} has one shape "
                    f"(uneven blocks work on meshes within one client only).")
    dtype = components[0].dtype
    attrs = ("T", dtype.as_datatype_enum, "N", len(components), "layout", layout.to_string())
    try:
        (out,) = _device.run(_core.PACK_OP, components, attrs)
    except tf.errors.InvalidArgumentError as error:
        raise PackError(error.message) from error
    return out


# id of a DTensor packed from SparseTensors -> (a weak reference to it, its components);
# unpack returns them. Tensors are unhashable, so keys are ids checked through the reference.
_SPARSE_COMPONENTS: dict = {}


def _pack_sparse(tensors: Sequence[Any], layout: Layout, run_check: bool) -> Any:
    """pack for `tf.SparseTensor` components, as TensorFlow's DTensor takes them.

    Every op sees the DTensor's dense value (TensorFlow's DTensor also turns sparse inputs
    dense before its op rules run): each component is made dense and packed, and `unpack`
    of this DTensor gives back the SparseTensors given here.
    """
    if not all(isinstance(t, tf.SparseTensor) for t in tensors):
        raise TypeError("Cannot Pack SparseTensors with Tensors: pack takes SparseTensor "
                        "components or dense ones, not a mix. Make them all sparse "
                        "(`tf.sparse.from_dense`) or all dense (`tf.sparse.to_dense`).")
    shapes = [tuple(t.shape) for t in tensors]
    if any(shape != shapes[0] for shape in shapes):
        raise TypeError(f"All input SparseTensors to Pack must be same shape; got "
                        f"{sorted(set(shapes))}. Each component is one device's block, so "
                        f"the blocks' dense shapes must agree.")
    devices = layout.mesh.local_devices()
    if len(devices) != len(tensors):
        raise PackError(f"pack needs one component per local device of {layout.mesh.short()} "
                        f"({len(devices)}); got {len(tensors)} SparseTensors.")
    sparse, dense = [], []
    for device, t in zip(devices, tensors):
        # Each component on its device, as TensorFlow's DTensor keeps them (also under a
        # device scope that would place these ops on the DTensor device).
        with tf.device(device):
            local = tf.SparseTensor(tf.identity(t.indices), tf.identity(t.values),
                                    tf.identity(t.dense_shape))
            sparse.append(local)
            dense.append(tf.sparse.to_dense(local))
    out = pack(dense, layout, run_check=run_check)
    key = id(out)
    _SPARSE_COMPONENTS[key] = (weakref.ref(out, lambda _: _SPARSE_COMPONENTS.pop(key, None)),
                               sparse)
    return out


def _check_replicas(components: Sequence[tf.Tensor], layout: Layout) -> None:
    """Raises PackError when two components the layout calls replicas differ."""
    mesh = layout.mesh
    locations = mesh.local_device_locations()
    if len(components) != len(locations):
        return  # pack itself reports the count
    used = set(layout.partial)
    for spec in layout.sharding_specs:
        used.update(name for name in mesh.dim_names if name in spec.split("+"))
    dims = [name for name in mesh.dim_names if name in used]
    first: dict = {}
    for i, location in enumerate(locations):
        key = tuple(location[d] for d in dims)
        if key not in first:
            first[key] = i
            continue
        j = first[key]
        a, b = components[j].numpy(), components[i].numpy()
        same = a.shape == b.shape and (
            np.array_equal(a, b, equal_nan=True) if a.dtype.kind in "fc" else np.array_equal(a, b))
        if not same:
            devices = mesh.local_devices()
            replicated = [d for d in mesh.dim_names if d not in used]
            raise PackError(
                f"pack(run_check=True): components {j} ({devices[j]}) and {i} ({devices[i]}) "
                f"differ, but layout {layout.short()} makes them replicas (they agree on "
                f"{', '.join(dims) or 'every sharded dimension'}; replicated over "
                f"{', '.join(replicated)}). Give replicas equal values, or shard the axis "
                f"they differ along over {' or '.join(replicated)} (or mark it partial).")


def unpack(tensor: Any) -> Sequence[Any]:
    """The components of a DTensor, one per local device in mesh order (first dim outermost).

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=(4,))
      >>> [c.shape for c in unpack(t)]
      [TensorShape([2]), TensorShape([2])]

    Raises:
      TypeError: `tensor` is not a tensor, or is a variable (as in TensorFlow's DTensor:
        unpack its `read_value()`).
      LayoutError: `tensor` is a regular tensor.
      RuntimeError: called while tracing a `tf.function`.
    """
    _tensors.refuse_while_tracing("unpack")
    if isinstance(tensor, resource_variable_ops.BaseResourceVariable):
        raise TypeError(f"unpack takes a DTensor, not a variable (Expecting a Tensor); got a "
                        f"`{type(tensor).__name__}`. Unpack its value: "
                        f"`unpack(variable.read_value())`.")
    if not tf.is_tensor(tensor):
        raise TypeError(f"unpack expects a DTensor (Expecting a Tensor); got a "
                        f"`{type(tensor).__name__}`.")
    if context.executing_eagerly() and not _tensors.is_dtensor_value(tensor):
        raise LayoutError(f"unpack expects a DTensor (DTensorUnpack expects a tensor placed on "
                          f"the DTensor device); got a regular tensor on `{tensor.device}`. "
                          f"Make one with `pack`, `copy_to_mesh` or `call_with_layout`.")
    sparse = _SPARSE_COMPONENTS.get(id(tensor)) if _SPARSE_COMPONENTS else None
    if sparse is not None and sparse[0]() is tensor:
        return list(sparse[1])
    global _unpack_capacity
    dtype = tensor.dtype.as_datatype_enum
    if _tensors.is_dtensor_value(tensor):
        # Room for as many components as any DTensor had so far: the device returns the
        # ones there are, so most calls skip reading the layout (half of unpack's time).
        try:
            return _device.run(_core.UNPACK_OP, [tensor], ("T", dtype, "N", _unpack_capacity),
                               _unpack_capacity)
        except tf.errors.InvalidArgumentError:
            pass  # more components than that: the layout says how many
    layout = _tensors.fetch_layout(tensor)
    # A single-device mesh reports no local devices, but its tensor has one component.
    n = 1 if layout.mesh.is_single_device() else layout.mesh.num_local_devices()
    _unpack_capacity = max(_unpack_capacity, n)
    return _device.run(_core.UNPACK_OP, [tensor], ("T", dtype, "N", n), n)


# How many components unpack makes room for before reading a DTensor's layout.
_unpack_capacity = 8
