"""The DTensor API of `tf.experimental.dtensor`, backed by tf_dtensor's C++ device.

Python only normalises arguments and forwards them: every check is made in C++.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context
from tensorflow.python.eager import execute
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import ops

from tf_dtensor import _core
from tf_dtensor import _device
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError, RelayoutError
from tf_dtensor._packing import pack, unpack  # noqa: F401 (the API)
from tf_dtensor._tensors import check_layout, fetch_layout, is_dtensor  # noqa: F401 (the API)
from tf_dtensor.layout import Layout, LayoutType
from tf_dtensor.mesh import Mesh


def device_name() -> str:
    """The name of the DTensor device (`with tf.device(device_name()):` places ops on it)."""
    _device.get()
    return _device.DEVICE_NAME


def set_strict_mode(strict: bool) -> None:
    """Whether an op with no sharding rule raises `UnsupportedOpError`.

    Off by default: such an op has its sharded inputs gathered to replicated, runs on every
    device and warns once per op name (`UnsupportedOpWarning`). The environment variable
    `TF_DTENSOR_STRICT=1` turns strict mode on at start-up.
    """
    _device.get().strict = bool(strict)


def _matched(tensor, layout: Layout) -> Layout:
    """`layout` with each MATCH axis given `tensor`'s sharding of it (eagerly)."""
    current = fetch_layout(tensor)
    if current.rank != layout.rank:
        # Checked here, before MATCH is filled in: the message showed a target no one wrote
        # ([x,*,y] for [match,match,y]).
        raise RelayoutError(f"relayout to {layout.short()}: the layout has rank {layout.rank} "
                            f"but the input ({current.short()}) has rank {current.rank}. Give "
                            f"one sharding spec (or MATCH) per tensor axis.")
    if current.mesh != layout.mesh:
        raise LayoutError(f"relayout to {layout.short()}: MATCH keeps an axis's sharding on "
                          f"the same mesh, but the input is on {current.mesh.short()}.")
    specs = layout.sharding_specs
    for i in layout._match:  # pylint: disable=protected-access
        specs[i] = current.sharding_specs[i]
    return Layout(specs, layout.mesh)


def _refuse_uneven_across_clients(op: str, shape, layout: Layout) -> None:
    """Uneven blocks on a mesh spanning clients are refused: a client sees only its own
    blocks, so the sizes of the others' (and the global shape of what ops make from them)
    would be guesses."""
    if not _tensors.spans_clients(layout.mesh):  # the common case, checked first: no shape built
        return
    shape = tf.TensorShape(shape)
    dims = shape.as_list() if shape.rank is not None else None
    if dims is None or None in dims or layout.rank != len(dims) or layout.is_even(dims):
        return
    uneven = [axis for axis in range(len(dims))
              if dims[axis] % layout.num_shards(axis) != 0]
    axis = uneven[0]
    raise LayoutError(
        f"{op}: shape {dims} does not divide evenly into {layout.short()} (axis {axis}: "
        f"{dims[axis]} over {layout.num_shards(axis)} shards), and the mesh spans several "
        f"clients. Uneven blocks work on meshes within one client only: a client holds only "
        f"its own blocks, so it cannot know the sizes of the others'. Pad axis {axis} to a "
        f"multiple of {layout.num_shards(axis)}, or leave it unsharded.")


def _relayout(tensor, layout: Layout, function: str = "relayout"):
    _tensors.layout_arg(layout, function, allow_match=True)
    if isinstance(layout, Layout) and not layout.has_match:
        _refuse_uneven_across_clients("relayout", tensor.shape, layout)
    if layout.has_match and context.executing_eagerly():
        if not _tensors.is_dtensor_value(tensor):
            raise LayoutError(f"{function} to {layout.short()}: MATCH keeps the input's "
                              f"sharding of an axis, and a regular tensor has none; name the "
                              f"axis's mesh dimension or UNSHARDED.")
        layout = _matched(tensor, layout)
    attrs = ("T", tensor.dtype.as_datatype_enum, "layout", layout.to_string())
    if not context.executing_eagerly():
        # Inside tf.function: a node of the traced graph; expansion honours it (and asks
        # the op that produced `tensor` for this layout). The device registers the op.
        _device.get()
        _, _, op, outputs = op_def_library._apply_op_helper(  # pylint: disable=protected-access
            _core.RELAYOUT_OP, input=tensor, layout=layout.to_string())
        if execute.must_record_gradient():
            execute.record_gradient(_core.RELAYOUT_OP, op.inputs,
                                    ("T", op._get_attr_type("T"),  # pylint: disable=protected-access
                                     "layout", op.get_attr("layout")), outputs)
        return outputs[0]
    try:
        (out,) = _device.run(_core.RELAYOUT_OP, [tensor], attrs)
    except tf.errors.InvalidArgumentError as error:
        raise RelayoutError(error.message) from error
    execute.record_gradient(_core.RELAYOUT_OP, [tensor], attrs, [out])
    return out


@ops.RegisterGradient(_core.RELAYOUT_OP)
def _relayout_grad(op, grad):
    """The gradient returns to the layout (and mesh) of the relayout's input, as in TF."""
    source = op.inputs[0]
    if context.executing_eagerly():
        if not _tensors.is_dtensor_value(source) or not _tensors.is_dtensor_value(grad):
            return grad
        return relayout(grad, fetch_layout(source))
    return _relayout_like_op(grad, source)


@ops.RegisterGradient(_core.RELAYOUT_LIKE_OP)
def _relayout_like_grad(op, grad):
    return _relayout_grad(op, grad), None


def _relayout_like_op(tensor, layout_tensor):
    """Inside tf.function: a node the expansion turns into a relayout to the layout (and
    mesh) `layout_tensor` has there."""
    _device.get()
    _, _, op, outputs = op_def_library._apply_op_helper(  # pylint: disable=protected-access
        _core.RELAYOUT_LIKE_OP, input=tensor, layout_input=layout_tensor)
    if execute.must_record_gradient():
        execute.record_gradient(_core.RELAYOUT_LIKE_OP, op.inputs,
                                ("T", op._get_attr_type("T"),  # pylint: disable=protected-access
                                 "U", op._get_attr_type("U")), outputs)  # pylint: disable=protected-access
    return outputs[0]


def copy_to_mesh(tensor: Any, layout: Layout, source_layout: Optional[Layout] = None) -> tf.Tensor:
    """Copies a regular tensor onto `layout.mesh`, laid out as `layout` (sliced locally).

    Each device keeps its block of the value; a DTensor is relaid out (`relayout`). A fully
    replicated `layout` of another rank is taken at the tensor's rank, as in TensorFlow's
    DTensor. Works inside `tf.function` under `run_on(mesh)`.

    Args:
      tensor: a tensor, or a NumPy or Python value (made on the host first).
      layout: the layout of the result.
      source_layout: ignored (TensorFlow's signature): a regular tensor's source is its
        own device.

    Returns:
      A DTensor with `layout`.

    Raises:
      TypeError: `layout` is not a `Layout`.
      RelayoutError: `layout` has another rank than `tensor`.
      LayoutError: `layout` has MATCH axes and `tensor` is a regular tensor.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = copy_to_mesh([[1, 2], [3, 4]], Layout(["x", dtensor.UNSHARDED], mesh))
      >>> [c.numpy().tolist() for c in unpack(t)]
      [[[1, 2]], [[3, 4]]]
    """
    del source_layout  # The source of a regular tensor is its own device.
    # Checked here, so that a wrong argument names copy_to_mesh, not relayout.
    _tensors.layout_arg(layout, "copy_to_mesh", allow_match=True)
    if _tensors.is_dtensor_value(tensor):
        return relayout(tensor, layout)
    tensor = _host_tensor(tensor)
    rank = tensor.shape.rank
    if (isinstance(layout, Layout) and not layout.has_match and rank is not None and
            layout.rank != rank and
            layout.is_fully_replicated() and not layout.partial and
            layout.type == LayoutType.STATIC):
        # A replicated layout means "whole on every device" at any rank; TensorFlow's
        # DTensor takes one of another rank here (a scalar layout for a matrix), so do we.
        layout = Layout.replicated(layout.mesh, rank)
    return _relayout(tensor, layout, "copy_to_mesh")


def _host_tensor(value) -> tf.Tensor:
    """`value` as a tensor; a Python or NumPy value is made on the host, also under a device
    scope that would place its constant on the DTensor device (as TensorFlow's relayout
    and copy_to_mesh take them there, mesh or no mesh)."""
    if tf.is_tensor(value) or not context.executing_eagerly():
        return tf.convert_to_tensor(value)
    with ops.device("/device:CPU:0"):
        return tf.convert_to_tensor(value)


def relayout(tensor: tf.Tensor, layout: Layout, name: Optional[str] = None) -> tf.Tensor:
    """Changes a DTensor's layout, inserting the needed all-gathers, slices or all-to-alls.

    Works eagerly and inside `tf.function`; the gradient returns to the input's layout.

    Args:
      tensor: a DTensor, or a DVariable (its value is read); a regular tensor is laid out
        as by `copy_to_mesh`.
      layout: the target layout, possibly on another mesh (the value moves there); a
        `MATCH` axis keeps the input's sharding of that axis.
      name: ignored (TensorFlow's signature).

    Returns:
      The DTensor with `layout`.

    Raises:
      TypeError: `layout` is not a `Layout`.
      RelayoutError: `layout` has another rank than `tensor`, or the relayout cannot be
        made.
      LayoutError: `MATCH` axes for a regular tensor or a target on another mesh.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = copy_to_mesh(tf.reshape(tf.range(4), [2, 2]), Layout(["x", dtensor.UNSHARDED], mesh))
      >>> fetch_layout(relayout(t, Layout([dtensor.UNSHARDED, "x"], mesh))).short()
      '[*,x] @ mesh(x=2)'
    """
    del name
    if isinstance(tensor, tf.Variable):
        tensor = tensor.read_value()  # TensorFlow's relayout reads a variable, too
    elif not _tensors.is_dtensor_value(tensor):
        tensor = _host_tensor(tensor)
    return _relayout(tensor, layout)


def relayout_like(tensor: tf.Tensor, layout_tensor: tf.Tensor,
                  name: Optional[str] = None) -> tf.Tensor:
    """Relayouts `tensor` to the layout of `layout_tensor`, also inside a `tf.function`.

    `layout_tensor` may live on another mesh: the value moves there.

    Args:
      tensor: a DTensor or a regular tensor (see `relayout`).
      layout_tensor: the DTensor whose layout `tensor` takes.
      name: ignored (TensorFlow's signature).

    Returns:
      `tensor` in the layout of `layout_tensor`.

    Raises:
      LayoutError: eagerly, `layout_tensor` is a regular tensor.
      TypeError: eagerly, `layout_tensor` is a tensor of a `tf.function` being traced.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> layout = Layout(["x", dtensor.UNSHARDED], mesh)
      >>> b = relayout_like(tf.ones((4, 2)), call_with_layout(tf.zeros, layout, [4, 2]))
      >>> fetch_layout(b) == layout
      True
    """
    if not context.executing_eagerly():
        return _relayout_like_op(tensor, layout_tensor)
    if tf.is_tensor(layout_tensor) and not isinstance(layout_tensor, ops.EagerTensor):
        # Eager code (an init_scope inside a tf.function) reaching for a traced tensor.
        raise TypeError(f"relayout_like: `layout_tensor` {layout_tensor!r} is a tensor of the "
                        f"tf.function being traced, and it is out of scope and cannot be used "
                        f"here (eagerly, e.g. under `init_scope`). Pass a DTensor made eagerly, "
                        f"or call relayout_like in the function's body.")
    if not _tensors.is_dtensor_value(layout_tensor):
        raise LayoutError(f"relayout_like: `layout_tensor` must be a DTensor, whose layout "
                          f"`tensor` takes; got a regular {type(layout_tensor).__name__} "
                          f"(FetchLayout expects a tensor placed on the layout device.), which "
                          f"has none. Pass a DTensor, or call `relayout(tensor, layout)`.")
    return relayout(tensor, fetch_layout(layout_tensor), name)


def call_with_layout(fn: Callable[..., Any], layout: Optional[Layout], *args, **kwargs) -> Any:
    """Calls `fn` so that its result (the first of several from a tf.function) is a DTensor
    with `layout`.

    Ops inside run on the DTensor device with `layout.mesh` as default mesh; creation ops
    produce their blocks directly in `layout`.

    Args:
      fn: the function to call.
      layout: the layout of the result; None calls `fn` as it is.
      *args, **kwargs: `fn`'s arguments.

    Returns:
      `fn`'s result as a DTensor with `layout`.

    Raises:
      TypeError: `layout` is neither a `Layout` nor None.
      LayoutError: `layout` has `MATCH` axes.
      RelayoutError: `layout` has another rank than the result.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> ones = call_with_layout(tf.ones, Layout(["x", dtensor.UNSHARDED], mesh), shape=(4, 2))
      >>> fetch_layout(ones).short()
      '[x,*] @ mesh(x=2)'
    """
    if layout is None:
        return fn(*args, **kwargs)
    _tensors.layout_arg(layout, "call_with_layout")
    with _device.mesh_scope(layout.mesh), _device.layout_scope(layout):
        result = fn(*args, **kwargs)
        if not context.executing_eagerly():
            # While tracing, ops are graph nodes that the default layout does not reach: the
            # relayout node asks the op that made the result for `layout` instead.
            return relayout(result, layout) if tf.is_tensor(result) else result
    if isinstance(result, (ops.EagerTensor,)) and (not _tensors.is_dtensor_value(result) or
                                                   fetch_layout(result) != layout):
        result = relayout(result, layout)
    return result


@contextlib.contextmanager
def default_mesh(mesh: Mesh):
    """Runs ops inside on the DTensor device with `mesh` as the default mesh.

    Scopes nest; leaving one (also by an exception) restores the enclosing mesh.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> with default_mesh(mesh):
      ...     fetch_layout(tf.ones([2])) == Layout.replicated(mesh, 1)
      True

    Raises:
      ValueError: `mesh` is not a `Mesh`.
    """
    if not isinstance(mesh, Mesh):
        raise ValueError(f"default_mesh expects a `Mesh` (Expect `mesh` to be `Mesh`); got a "
                         f"`{type(mesh).__name__}`. "
                         f"Create one with `create_mesh`.")
    with _device.mesh_scope(mesh):
        yield


run_on = default_mesh


def get_default_mesh() -> Optional[Mesh]:
    """The innermost mesh set by `default_mesh`/`run_on`, or None."""
    return _device.default_mesh()


def barrier(mesh: Mesh, barrier_name: Optional[str] = None,
            timeout_in_ms: Optional[int] = None) -> None:
    """Waits until every device of `mesh` has finished the work queued before it.

    Sums one value per device with an all-reduce over the whole mesh and reads the result.
    In a multi-client run every client then waits at the coordination service's barrier
    `barrier_name` (default `"(barrier)"`) for up to `timeout_in_ms` (default: one day).

    Args:
      mesh: the mesh whose devices take part.
      barrier_name: the coordination service's barrier (multi-client runs).
      timeout_in_ms: how long a client waits for the others (multi-client runs).

    Raises:
      TypeError: `mesh` is not a `Mesh`.
      tf.errors.DeadlineExceededError: a client did not arrive in time.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> barrier(mesh)
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"barrier takes a `Mesh` as `mesh`; got {mesh!r} "
                        f"({type(mesh).__name__}). Build one with `create_mesh`.")
    # One element per device: [n] sharded over every mesh dimension, via a [d0, d1, ...]
    # tensor sharded axis by axis.
    ones = call_with_layout(tf.ones, Layout(mesh.dim_names, mesh), shape=mesh.shape())
    total = tf.reduce_sum(ones)
    if int(total.numpy()) != mesh.size:
        raise RuntimeError(f"barrier on {mesh.short()} counted {int(total.numpy())} devices, "
                           f"expected {mesh.size}.")
    from tf_dtensor import _cluster  # pylint: disable=import-outside-toplevel
    if _cluster.started():
        _cluster.barrier(barrier_name or "(barrier)",
                         24 * 3600 * 1000 if timeout_in_ms is None else int(timeout_in_ms))


# --- TensorFlow's `api._dtensor_device()` ---------------------------------------------------

class _DeviceView:
    """What TensorFlow's `tensorflow.dtensor.python.api._dtensor_device()` returns, for code
    that reaches for it (TensorFlow's `numpy_util`, `d_random` and tests do): the same
    methods, on tf_dtensor's device.

    - `pack`, `unpack`, `copy_to_mesh`, `fetch_layout`, `is_dtensor`: as the module
      functions.
    - `_default_layout(layout)`: a scope in which ops run on the DTensor device and their
      outputs (creation ops, variables) get `layout`; while tracing a `tf.function`, the
      ops traced in it give their (first) output that layout, as in TensorFlow.
    - `_experimental_default_mesh(mesh)`: the mesh of ops placed on the DTensor device that
      have no DTensor input (`with tf.device(device_name())` inside).
    - `_get_stats()`: cache counters under TensorFlow's names (see the method).
    """

    @property
    def name(self) -> str:
        return _device.DEVICE_NAME

    @property
    def is_async(self) -> bool:
        return _IS_ASYNC["value"]

    pack = staticmethod(pack)
    unpack = staticmethod(unpack)
    copy_to_mesh = staticmethod(copy_to_mesh)
    fetch_layout = staticmethod(fetch_layout)
    is_dtensor = staticmethod(is_dtensor)

    @contextlib.contextmanager
    def _default_layout(self, layout: Layout):
        _tensors.layout_arg(layout, "_default_layout")
        if not context.executing_eagerly():
            # While tracing, as TensorFlow's: the ops traced in the scope carry the layout
            # in their `_layout` attribute, and the expansion gives their first output
            # that layout (where the ranks agree).
            value = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                s=[layout.to_string().encode()]))
            with ops.get_default_graph()._attr_scope({"_layout": value}):  # pylint: disable=protected-access
                yield
            return
        with _device.mesh_scope(layout.mesh), _device.layout_scope(layout):
            yield

    @contextlib.contextmanager
    def _experimental_default_mesh(self, mesh: Mesh):
        # As TensorFlow's: the mesh for ops that run on the DTensor device with no DTensor
        # input; ops outside the device (no `tf.device(device_name())`) stay where they are.
        if not isinstance(mesh, Mesh):
            raise ValueError(f"_experimental_default_mesh expects a `Mesh`; got a "
                             f"`{type(mesh).__name__}`.")
        with _device.mesh_scope(mesh, place_ops=False):
            yield

    def _get_stats(self) -> dict:
        """TensorFlow's counters by TensorFlow's names: `function_manager.hit`, `.miss` and
        `.size` count tf.function expansions (TensorFlow's DTensor also counts each eager
        op's compiled function there; tf_dtensor runs eager ops without one), and
        `kernel_cache.size` the eager plans kept."""
        device = _device.get()
        stats = device.function_cache_stats()
        # The baseline counts only for the device it was read from (a context reset brings
        # a fresh device, whose counters start at zero).
        base = _STATS_BASE if _STATS_BASE["device"] is device else {"hit": 0, "miss": 0}
        return {"function_manager.hit": stats["hit"] - base["hit"],
                "function_manager.miss": stats["miss"] - base["miss"],
                "function_manager.size": stats["size"],
                "kernel_cache.size": device.num_cached_plans}


_VIEW = _DeviceView()
_IS_ASYNC = {"value": True}
# The device's counters at the last reset_dtensor_device, and that device.
_STATS_BASE: dict = {"device": None, "hit": 0, "miss": 0}


def _dtensor_device() -> _DeviceView:
    """The device, as TensorFlow's `api._dtensor_device()` shows it (see `_DeviceView`)."""
    return _VIEW


def reset_dtensor_device(is_async: bool) -> None:
    """TensorFlow's `api.reset_dtensor_device`: `_get_stats()` counts hits and misses from
    here, and `_dtensor_device().is_async` is `is_async`.

    tf_dtensor keeps one device per eager context (a context reset brings a fresh one), and
    its ops follow TensorFlow's own executor: `tf.config.experimental.set_synchronous_execution`
    chooses synchronous or asynchronous execution for both.
    """
    if not isinstance(is_async, bool):
        raise TypeError(f"reset_dtensor_device takes `is_async` as a bool; got {is_async!r}.")
    _IS_ASYNC["value"] = is_async
    device = _device.live()
    stats = device.function_cache_stats() if device is not None else {"hit": 0, "miss": 0}
    _STATS_BASE.update(device=device, hit=stats["hit"], miss=stats["miss"])


def _reset() -> None:
    """TensorFlow's `api._reset()`, which its tests call between cases: forget the default
    stats baseline (`_get_stats` counts from here) and the `is_async` choice. The device itself
    belongs to the eager context, so a context reset (not this call) brings a fresh one."""
    reset_dtensor_device(is_async=True)

