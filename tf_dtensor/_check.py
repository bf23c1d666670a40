"""`debug.check(fn, *args)`: the first op whose sharded result differs from one device.

`fn` (a `tf.function`, or a Python function, traced into one) is traced for `args`; then
its graph is run op by op twice: each op eagerly on the DTensor device with the sharded
values (its rule plans and expands it, as any eager op), and on the host CPU with the
plain global values. After each op, every output's global value (a DTensor's relaid out
to replicated, pending reductions done) is compared with the plain one: shape, dtype and
values within `rtol`/`atol`; then each device's block of it, so replicas that disagree are
found at the op that made them (a partial value's summands are not compared); and every
variable the op took (what an assign or an optimizer's apply op wrote into it). The first
op that differs is reported with its input and output layouts and the collectives its
sharded run issued.

Variables the function reads or writes are copied first on both sides (a DVariable into
a DVariable of its layout, and into a plain variable), so checking changes no state.
Ops that call other functions are not entered: a nested `tf.function` is called whole
(the device expands it, as from Python) and compared like any op; control flow (`If`,
`While`, `Case`) runs eagerly on the DTensor device, which takes it replicated, so it
is compared whole, not as its expanded sharded form.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.eager import execute
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_shape
from tensorflow.python.framework import tensor_util
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import _core, _ledger
from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor import checkpoint
from tf_dtensor._device import UnsupportedOpWarning
from tf_dtensor._estimate import Spec
from tf_dtensor.layout import LayoutType
from tf_dtensor.variable import DVariable

_SKIPPED_TYPES = frozenset(["Placeholder", "NoOp"])
_CALLS = frozenset(["PartitionedCall", "StatefulPartitionedCall"])
# Run eagerly on the DTensor device, these take the fallback (replicated inputs, the
# op on every device): compared whole, not sharded as inside an expanded function.
_CONTROL_FLOW = frozenset(["If", "StatelessIf", "While", "StatelessWhile", "Case",
                           "StatelessCase"])
# tf_dtensor's own ops move a value between layouts: on one device they pass it on (a
# regular device has no kernel for them).
_LAYOUT_ONLY = frozenset([_core.RELAYOUT_OP, _core.RELAYOUT_LIKE_OP])
_ASSIGNS = frozenset(["AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"])


@dataclasses.dataclass
class CheckedOp:
    """One op of the checked function as both runs saw it."""
    name: str
    type: str
    input_layouts: List[Optional[str]]   # None: a plain (host) input
    output_layouts: List[Optional[str]]
    collectives: List[_ledger.Collective]
    max_error: float = 0.0               # the largest |sharded - plain| over its outputs
    problem: str = ""                    # why it differs ("" when it agrees)


@dataclasses.dataclass
class CheckReport:
    """What `debug.check` found: `ok`, the ops it compared in order, and `first_mismatch`
    (None when every op agreed)."""
    function: str
    ops: List[CheckedOp]
    first_mismatch: Optional[CheckedOp]

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def __str__(self) -> str:
        if self.ok:
            return (f"check {self.function}: all {len(self.ops)} ops agree with one device")
        bad = self.first_mismatch
        lines = [f"check {self.function}: op {len(self.ops)} of the graph, '{bad.name}' "
                 f"({bad.type}), differs from one device: {bad.problem}",
                 f"  inputs:  {', '.join(l or 'host' for l in bad.input_layouts)}",
                 f"  outputs: {', '.join(l or 'host' for l in bad.output_layouts)}"]
        if bad.collectives:
            lines.append("  collectives: " + "; ".join(c.label for c in bad.collectives))
        else:
            lines.append("  collectives: none")
        return "\n".join(lines)


def _attrs(op) -> tuple:
    """The op's attributes as `execute.execute` takes them (name, value, ...)."""
    out = []
    for name in op.node_def.attr:
        if name.startswith("_"):
            continue
        value = op.get_attr(name)
        if isinstance(value, dtypes.DType):
            value = value.as_datatype_enum
        elif isinstance(value, list) and value and isinstance(value[0], dtypes.DType):
            value = [v.as_datatype_enum for v in value]
        elif isinstance(value, tensor_shape.TensorShape):
            value = value.as_list() if value.rank is not None else None
        elif isinstance(value, list) and value and isinstance(value[0], tensor_shape.TensorShape):
            value = [v.as_list() if v.rank is not None else None for v in value]
        elif isinstance(value, list) and value and hasattr(value[0], "unknown_rank"):
            value = [None if v.unknown_rank else [d.size for d in v.dim] for v in value]
        elif hasattr(value, "unknown_rank") and hasattr(value, "dim"):
            value = None if value.unknown_rank else [d.size for d in value.dim]
        elif hasattr(value, "name") and hasattr(value, "attr") and not isinstance(value, str):
            value = value.name  # a function: by name (registered with the context)
        out.extend([name, value])
    return tuple(out)


def _global(value) -> Optional[np.ndarray]:
    """A DTensor's (or plain tensor's) global value as numpy; None for resources and
    variants, which are not compared."""
    if not isinstance(value, tf.Tensor) or value.dtype in (tf.resource, tf.variant):
        return None
    if _tensors.is_dtensor_value(value):
        value = checkpoint.global_value(value)
    return value.numpy()


def _layout_text(value) -> Optional[str]:
    if isinstance(value, tf.Tensor) and _tensors.is_dtensor_value(value):
        return api.fetch_layout(value).short()
    return None


def _difference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple:
    """(max error, problem or "") between two numpy values of the same role."""
    if a.shape != b.shape:
        return float("inf"), f"shape {list(a.shape)} against {list(b.shape)} on one device"
    if a.dtype != b.dtype:
        return float("inf"), f"dtype {a.dtype} against {b.dtype} on one device"
    if a.dtype.kind in "biu?" or a.dtype.kind in "SOU":
        same = np.array_equal(a, b)
        return (0.0 if same else float("inf")), ("" if same else "values differ")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    error = float(np.nanmax(diff)) if diff.size else 0.0
    if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
        return error, (f"values differ by up to {error:.3g} (rtol={rtol}, atol={atol})")
    return error, ""


def _device_blocks_difference(sharded, whole: np.ndarray, rtol: float, atol: float) -> tuple:
    """(max error, problem or "") between each device's component of `sharded` and the
    block of the one-device value `whole` its layout gives that device.

    The global value reads one replica of each block, so replicas that disagree (a
    dropped reduction that left the right value on the first device only) show here, at
    the op that made them. Partial values are skipped: their devices hold summands.
    """
    layout = api.fetch_layout(sharded)
    if layout.type != LayoutType.STATIC or layout.is_partial:
        return 0.0, ""
    mesh = layout.mesh
    offsets = {int(i): n for n, i in enumerate(np.ravel(mesh.global_device_ids()))}
    shards = layout.offset_to_shard()
    worst = 0.0
    for device_id, device, component in zip(mesh.local_device_ids(), mesh.local_devices(),
                                            api.unpack(sharded)):
        size, start = layout.shard_geometry(whole.shape, shards[offsets[int(device_id)]])
        region = tuple(slice(o, o + n) for o, n in zip(start, size))
        error, problem = _difference(component.numpy(), whole[region], rtol, atol)
        worst = max(worst, error)
        if problem:
            where = ", ".join(f"{o}:{o + n}" for o, n in zip(start, size)) or "scalar"
            return error, (f"the block [{where}] on {device.rsplit('device:', 1)[-1]} "
                           f"differs from one device ({problem}), while the global value "
                           f"(read from one replica of each block) agrees")
    return worst, ""


def _compare(sharded, plain, rtol: float, atol: float) -> tuple:
    """(max error, problem or "") between one output's two runs: the global values, then
    every device's block."""
    a, b = _global(sharded), _global(plain)
    if a is None or b is None:
        return 0.0, ""
    error, problem = _difference(a, b, rtol, atol)
    if problem or not _tensors.is_dtensor_value(sharded):
        return error, problem
    block_error, problem = _device_blocks_difference(sharded, b, rtol, atol)
    return max(error, block_error), problem


def check(fn, *args, rtol: float = 1e-5, atol: float = 1e-6, **kwargs) -> CheckReport:
    """Runs `fn(*args, **kwargs)` op by op sharded and on one device; reports the first op
    whose sharded result differs. See the module docstring.

    Args:
      fn: a `tf.function` or a Python function (traced into one).
      *args, **kwargs: its arguments: DTensors, regular tensors or Python values.
      rtol, atol: the tolerance of the value comparison (floating-point outputs).

    Returns:
      A `CheckReport`: `ok`, `ops` (each `CheckedOp` with layouts and collectives) and
      `first_mismatch`; `str(report)` says which op differs and how.
    """
    for given in tf.nest.flatten((args, kwargs)):
        if isinstance(given, Spec):
            raise TypeError(f"debug.check runs the function, so it needs values: got "
                            f"{given!r}. Pass a DTensor (`copy_to_mesh`, `pack`); "
                            f"`debug.estimate` is the one that takes `debug.spec`.")
    function = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
    concrete = function.get_concrete_function(*args, **kwargs)
    concrete.add_to_graph()  # the functions its ops call (branches, bodies), by name
    graph = concrete.graph
    name = concrete.name.decode() if isinstance(concrete.name, bytes) else str(concrete.name)
    flat_args = [a for a in tf.nest.flatten((args, kwargs), expand_composites=True)
                 if isinstance(a, (tf.Tensor, tf.Variable, np.ndarray))]
    captured = list(concrete.captured_inputs)
    externals = flat_args + captured
    inputs = list(graph.inputs)
    if len(inputs) != len(externals):
        raise ValueError(f"debug.check could not match the {len(inputs)} inputs of "
                         f"'{name}' with its {len(externals)} arguments and "
                         f"captures; pass tensors (not nested Python structures).")
    variables = {id(v.handle): v for v in concrete.variables}
    sharded: Dict[Any, Any] = {}   # graph tensor -> its sharded value
    pairs: Dict[Any, tuple] = {}   # graph resource tensor -> (sharded copy, plain copy)
    host = "/job:localhost/replica:0/task:0/device:CPU:0"
    for placeholder, value in zip(inputs, externals):
        if isinstance(value, tf.Variable):
            value = value.handle
        variable = variables.get(id(value))
        if variable is not None:
            whole = _global(variable.read_value())
            with ops.device(host):
                plain_copy = tf.Variable(whole)
            if isinstance(variable, DVariable):
                sharded_copy = DVariable(api.copy_to_mesh(tf.constant(whole), variable.layout))
            else:
                with ops.device(variable.device):
                    sharded_copy = tf.Variable(whole)
            pairs[placeholder.ref()] = (sharded_copy, plain_copy)
            sharded[placeholder.ref()] = sharded_copy.handle
            continue
        sharded[placeholder.ref()] = value if isinstance(value, tf.Tensor) else \
            tf.convert_to_tensor(value)

    plain_values = {}  # tensor ref -> its global value on the host, made once per tensor

    def plain_input(t):
        # Each op gets on one device exactly what its sharded run got (the global values),
        # so a difference is that op's alone and errors do not pile up along the graph.
        if t.ref() in pairs:
            return pairs[t.ref()][1].handle
        if t.ref() not in plain_values:
            whole = _global(sharded[t.ref()])
            if whole is None:
                plain_values[t.ref()] = sharded[t.ref()]
            else:
                with ops.device(host):
                    plain_values[t.ref()] = tf.constant(whole)
        return plain_values[t.ref()]

    checked: List[CheckedOp] = []
    ctx = context.context()
    for op in graph.get_operations():
        if op.type in _SKIPPED_TYPES:
            continue
        if op.type == "Const":  # the same host constant on both sides
            with ops.device(host):
                sharded[op.outputs[0].ref()] = tf.constant(
                    tensor_util.MakeNdarray(op.get_attr("value")), dtype=op.outputs[0].dtype)
            continue
        op_type, attrs = op.type, _attrs(op)
        if op.type in _CALLS:
            # A nested tf.function: called by name, as a call from Python is, so that the
            # device expands it (a PartitionedCall op would run replicated).
            op_type, attrs = op.get_attr("f").name, ()
        sharded_in = [sharded[t.ref()] for t in op.inputs]
        plain_in = [plain_input(t) for t in op.inputs]
        with _ledger.collectives() as ledger, warnings.catch_warnings():
            if op.type in _CONTROL_FLOW:
                warnings.simplefilter("ignore", UnsupportedOpWarning)
            if op.type in _ASSIGNS and op.inputs[0].ref() in pairs:
                # Inside the function the value is brought to the variable's layout (a
                # gradient's reduce-scatter into a sharded weight); an eager assign refuses
                # another sharding, so that relayout is made here, as part of the op (a
                # pending reduction the op makes itself).
                target = pairs[op.inputs[0].ref()][0]
                value = sharded_in[1]
                if isinstance(target, DVariable) and _tensors.is_dtensor_value(value) and \
                        api.fetch_layout(value).without_partial() != target.layout:
                    sharded_in[1] = api.relayout(value, target.layout)
            sharded_out = execute.execute(op_type, len(op.outputs), sharded_in, attrs, ctx)
        with ops.device(host):
            if op.type in _LAYOUT_ONLY:
                plain_out = [tf.identity(plain_in[0])]
            else:
                plain_out = execute.execute(op_type, len(op.outputs), plain_in, attrs, ctx)
        record = CheckedOp(op.name, op.type, [_layout_text(v) for v in sharded_in],
                           [_layout_text(v) for v in sharded_out], ledger.records)
        checked.append(record)
        for i, (a, b) in enumerate(zip(sharded_out, plain_out)):
            error, problem = _compare(a, b, rtol, atol)
            record.max_error = max(record.max_error, error)
            if problem:
                record.problem = f"output {i}: {problem}"
                return CheckReport(name, checked, record)
        for t, a in zip(op.outputs, sharded_out):
            sharded[t.ref()] = a
        # A variable the op may have written (an assign, an optimizer's apply op) is
        # compared after it on both sides: the op returns nothing of it, and its next
        # reader would see the same value on both sides. Then its plain copy takes the
        # sharded value, so that a difference is never carried to a later op. A resource
        # passed on (Identity of a handle) keeps its pair.
        for i, t in enumerate(op.inputs):
            if t.ref() in pairs and op.type not in ("ReadVariableOp",):
                sharded_copy, plain_copy = pairs[t.ref()]
                sharded_value = sharded_copy.read_value()
                error, problem = _compare(sharded_value, plain_copy.read_value(), rtol, atol)
                record.max_error = max(record.max_error, error)
                if problem:
                    record.problem = f"the variable of input {i} after the op: {problem}"
                    return CheckReport(name, checked, record)
                whole = _global(sharded_value)
                with ops.device(host):
                    plain_copy.assign(whole)
        for t in op.outputs:
            if t.dtype == tf.resource and op.inputs and op.inputs[0].ref() in pairs:
                pairs[t.ref()] = pairs[op.inputs[0].ref()]
    return CheckReport(name, checked, None)
