"""The differential fuzzer's engine: draws a case for one op and checks it.

A case is an op from the table (`fuzz_ops.OPS`), a mesh, the op's arguments (drawn by the
table entry: shapes, dtypes, host arguments, attributes) and a layout per tensor argument
(sharded, replicated, uneven, partial). The op runs on one plain device for reference, then
on DTensors eagerly, inside `tf.function` and through `tf.GradientTape`; each output must
match the reference in value (dtype-appropriate tolerance), dtype and global shape, and
have the layout the op's rule claims (`debug.explain` on the same layouts, shapes, host
values and attributes). A resource op's variable (`V`) is a tf.Variable for reference and
a DVariable in the drawn layout; its value after the op is compared too (`_check_variable`).
Everything runs in strict mode: an op that falls back is a mismatch too.

The engine records what it ran and every mismatch in `LOG`, so a long run reports all of
them instead of stopping at the first.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import os
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import tf_dtensor
from dtensor_testing import (LOWERINGS, collective_lowering, cpus, reassemble,
                             run_without_fallback, to_dtensor)
from fuzz_known import KnownMismatch
from tf_dtensor import _core
from tf_dtensor import _device as dtensor_device
from tf_dtensor import debug, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESHES = [
    dtensor.create_mesh([("x", 2)], devices=cpus(2)),
    dtensor.create_mesh([("x", 4)], devices=cpus(4)),
    dtensor.create_mesh([("x", 8)], devices=cpus(8)),
    dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4)),
    dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8)),
    # Dimensions of size 1 (TensorFlow's tests use meshes like b=1, x=1, y=2), a 3-D mesh,
    # and devices not in the order 0..n-1.
    dtensor.create_mesh([("x", 1), ("y", 4)], devices=cpus(4)),
    dtensor.create_mesh([("x", 2), ("y", 1), ("z", 2)], devices=cpus(4)),
    dtensor.create_mesh([("x", 2), ("y", 2), ("z", 2)], devices=cpus(8)),
    dtensor.create_mesh([("x", 4)], devices=[cpus(4)[i] for i in (2, 0, 3, 1)]),
]

VERBOSE = bool(os.environ.get("TF_DTENSOR_FUZZ_VERBOSE"))
REDUCTIONS = ("sum", "sum", "mean", "max", "min")
FLOATS = (tf.float32, tf.float64)


# ---------------------------------------------------------------------------------------
# What a table entry draws
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class T:
    """A tensor argument: the fuzzer lays it out on the mesh (sharded, uneven, partial)."""
    value: np.ndarray
    partial: bool = True     # may it be given a partial layout
    sharded: bool = True     # may it be sharded at all
    nonempty: bool = False   # only layouts whose every block holds elements


@dataclasses.dataclass
class V(T):
    """A variable argument (a resource op's `resource` or `ref`): the case makes a
    tf.Variable of `value` for reference and a DVariable in a drawn layout (sharded,
    uneven, replicated; never partial), passes their handles, and compares the variable's
    value (and layout) after the op as well as the op's outputs."""
    partial: bool = False


@dataclasses.dataclass
class H:
    """A host argument (shape, axis, multiples, ...) or small data passed as a plain tensor:
    a Python value or array, converted with `dtype` (default: TensorFlow's choice)."""
    value: Any
    dtype: Optional[tf.DType] = None

    def tensor(self) -> tf.Tensor:
        return tf.constant(self.value, dtype=tf.as_dtype(self.dtype) if self.dtype else None)


@dataclasses.dataclass
class Call:
    """One call of an op: `args` by op-definition input name, or in op-definition order (a
    `T`, an `H` or, for list inputs, a list of `T`), the attributes, and whether the
    gradient is checked."""
    args: Any
    attrs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    grad: bool = True
    tol: Optional[float] = None   # relative/absolute tolerance for floats, else by dtype
    # The outputs whose values, dtype, shape and layout are compared (all when None); the
    # others are implementation-defined (FusedBatchNorm's reserve spaces).
    compare: Optional[Sequence[int]] = None
    # Several ops run as one, for ops whose own outputs cannot be compared (TensorList
    # variants): `composite(*args, **attrs)` gets `args` (a list: `T`s as tensors, `H`s as
    # plain tensors) and returns the outputs to compare, which have no layout claim.
    composite: Optional[Callable[..., Sequence[tf.Tensor]]] = None


@dataclasses.dataclass
class OpSpec:
    """A table entry: `draw(d)` returns a `Call`; `grad` False for ops without a gradient
    (or whose gradient is not interesting); `creation` for ops without tensor arguments,
    whose output layout is requested (`dtensor.call_with_layout`)."""
    name: str
    draw: Callable[["Drawer"], Call]
    grad: bool = True
    creation: bool = False
    # Inside tf.function the op reads its inputs whole and its outputs are replicated (an
    # output counted from data, whose consumers' gradients only a replicated value can
    # plan: ReadWhole in cc/rules/gather_rules.cc); debug.explain gives the eager plan.
    function_reads_whole: bool = False


class Drawer:
    """The drawing helpers a table entry uses; every choice goes through hypothesis."""

    SIZES = (1, 2, 3, 4, 5, 6, 7, 8)

    def __init__(self, data, seed: Optional[int] = None):
        self._data = data
        self._rng = np.random.default_rng(self.int(0, 2**31 - 1) if seed is None else seed)
        self.mesh = None   # the case's mesh, once drawn

    def draw(self, strategy):
        return self._data.draw(strategy)

    def int(self, low: int, high: int) -> int:
        from hypothesis import strategies as st
        assert self._data is not None, "a Drawer without hypothesis data draws arrays only"
        return self._data.draw(st.integers(low, high))

    def bool(self) -> bool:
        return self.int(0, 1) == 1

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.int(0, len(options) - 1)]

    def size(self, low: int = 1, high: int = 8) -> int:
        return self.int(low, high)

    def shape(self, min_rank: int = 0, max_rank: int = 4, low: int = 1,
              high: int = 8) -> Tuple[int, ...]:
        rank = self.int(min_rank, max_rank)
        return tuple(self.size(low, high) for _ in range(rank))

    def broadcastable(self, shape: Sequence[int]) -> Tuple[int, ...]:
        """A shape that broadcasts with `shape`: a suffix, with some dims set to 1."""
        rank = self.int(0, len(shape))
        suffix = list(shape[len(shape) - rank:])
        return tuple(1 if self.int(0, 3) == 0 else s for s in suffix)

    def dtype(self, options: Sequence[tf.DType] = FLOATS) -> tf.DType:
        return self.choice(list(options))

    def array(self, shape: Sequence[int], dtype: tf.DType = tf.float32, low: float = -2.0,
              high: float = 2.0) -> np.ndarray:
        """Random values in [low, high]; integers in [low, high] too; booleans fair coins."""
        dtype = tf.as_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        if dtype == tf.bool:
            return self._rng.random(shape) < 0.5
        if dtype.is_integer:
            return self._rng.integers(int(low), int(high) + 1, size=shape).astype(
                dtype.as_numpy_dtype)
        if dtype.is_complex:
            return (self._rng.uniform(low, high, size=shape) +
                    1j * self._rng.uniform(low, high, size=shape)).astype(dtype.as_numpy_dtype)
        return self._rng.uniform(low, high, size=shape).astype(dtype.as_numpy_dtype)

    def axis(self, rank: int, negative: bool = True) -> int:
        axis = self.int(0, rank - 1)
        return axis - rank if negative and self.bool() else axis

    def permutation(self, n: int) -> List[int]:
        return list(self._rng.permutation(n))


# ---------------------------------------------------------------------------------------
# The record of a run
# ---------------------------------------------------------------------------------------

class Log:
    """Cases per op, cases the reference refused, and mismatches with their descriptions."""

    def __init__(self):
        self.cases: Dict[str, int] = collections.Counter()
        self.invalid: Dict[str, int] = collections.Counter()
        self.mismatches: Dict[str, List[str]] = collections.defaultdict(list)
        self.known: Dict[str, List[str]] = collections.defaultdict(list)   # KNOWN_MISMATCHES
        self.lowerings: Dict[str, int] = collections.Counter()   # cases per collective lowering
        self.seconds = 0.0

    def summary(self) -> str:
        ops = sorted(set(self.cases) | set(self.mismatches))
        total = sum(self.cases.values())
        bad = sum(len(v) for v in self.mismatches.values())
        rate = total / self.seconds if self.seconds else 0.0
        lowerings = ", ".join(f"{n} {k}" for k, n in sorted(self.lowerings.items()))
        lines = [f"tf_dtensor fuzz: {total} cases over {len(ops)} ops ({lowerings} lowering), "
                 f"{bad} mismatches, {self.seconds:.0f} s ({rate:.1f} cases/s)"]
        for op in ops:
            extra = f", {len(self.mismatches[op])} MISMATCHES" if self.mismatches[op] else ""
            if self.known[op]:
                extra += f", {len(self.known[op])} known mismatches"
            invalid = f", {self.invalid[op]} refused by TF" if self.invalid[op] else ""
            lines.append(f"  {op:40s} {self.cases[op]:6d}{invalid}{extra}")
        for op in ops:
            for text in self.mismatches[op][:3]:
                lines.append(f"--- {op}\n{text}")
        return "\n".join(lines)


LOG = Log()


# ---------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------

def _blocks_nonempty(size: int, pieces: int) -> bool:
    # Blocks are ceil(size / pieces) long, the last ones short or empty (torch.chunk).
    return (pieces - 1) * -(-size // pieces) < size


def draw_layout(d: Drawer, mesh, value: np.ndarray, partial_ok: bool = True,
                sharded_ok: bool = True, nonempty: bool = False, even: bool = False) -> Layout:
    """Each axis unsharded or sharded by an unused mesh dim (even or not); sometimes a
    pending reduction over unused mesh dims (floats and integers only)."""
    free = list(mesh.dim_names)
    specs = []
    for size in value.shape:
        options = [dim for dim in free
                   if (not nonempty or _blocks_nonempty(size, mesh.dim_size(dim))) and
                   (not even or size % mesh.dim_size(dim) == 0)]
        spec = d.choice([UNSHARDED] + options) if sharded_ok and options else UNSHARDED
        if spec != UNSHARDED:
            free.remove(spec)
        specs.append(spec)
    partial = {}
    numeric = value.dtype != np.bool_
    if partial_ok and numeric and free and d.int(0, 3) == 0:
        for dim in free:
            if d.bool():
                reduction = d.choice(REDUCTIONS)
                if reduction == "mean" and not np.issubdtype(value.dtype, np.inexact):
                    reduction = "sum"
                if reduction in ("max", "min") and np.issubdtype(value.dtype, np.complexfloating):
                    reduction = "sum"   # complex numbers have no order
                partial[dim] = reduction
    return Layout(specs, mesh, partial=partial) if partial else Layout(specs, mesh)


# ---------------------------------------------------------------------------------------
# Calling an op
# ---------------------------------------------------------------------------------------

_EXPLAIN_ATTR_TYPES = {"int", "bool", "string", "list(int)"}


def _op_def(name: str):
    op_def = op_def_registry.get(name)
    assert op_def is not None, f"TensorFlow has no op `{name}`"
    return op_def


def explain_attrs(name: str, call: Call) -> Dict[str, Any]:
    """The attributes a rule sees: the call's, the op definition's defaults, list sizes (N)
    and the input types (T), limited to what `debug.explain` can carry."""
    attrs = {}
    op_def = _op_def(name)
    for attr in op_def.attr:
        if attr.type in _EXPLAIN_ATTR_TYPES and attr.HasField("default_value"):
            value = attr.default_value
            kind = value.WhichOneof("value")
            if kind == "i":
                attrs[attr.name] = value.i
            elif kind == "b":
                attrs[attr.name] = value.b
            elif kind == "s":
                attrs[attr.name] = value.s.decode()
            elif kind == "list":
                attrs[attr.name] = list(value.list.i)
    for arg in op_def.input_arg:
        value = call.args.get(arg.name)
        if arg.number_attr and isinstance(value, list):
            attrs[arg.number_attr] = len(value)
        if arg.type_attr and isinstance(value, T):   # a type the op infers (Bitcast's T)
            attrs[arg.type_attr] = tf.as_dtype(value.value.dtype)
    renamed = _attr_names(name)
    for key, value in call.attrs.items():
        key = renamed.get(key, key)
        if isinstance(value, (bool, int, str, tf.DType)) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)):
            attrs[key] = list(value) if isinstance(value, tuple) else value
    return attrs


def _arg_names(name: str, call: Call) -> List[str]:
    """The keys of `call.args` in order: the op definition's inputs, or a composite's."""
    if call.composite is not None:
        return list(call.args)
    return [arg.name for arg in _op_def(name).input_arg]


def flat_inputs(name: str, call: Call) -> List[Any]:
    """The call's arguments in op-definition order, list inputs expanded."""
    out = []
    for arg_name in _arg_names(name, call):
        value = call.args[arg_name]
        out.extend(value if isinstance(value, list) else [value])
    return out


@functools.lru_cache(maxsize=None)
def _attr_names(name: str) -> Dict[str, str]:
    """The raw op's keyword for each attribute the caller sets -> its op-definition name
    (Python renames a few: Squeeze's `squeeze_dims` is `axis`)."""
    op_def = _op_def(name)
    inferred = set()
    for arg in op_def.input_arg:
        inferred.update(a for a in (arg.type_attr, arg.number_attr, arg.type_list_attr) if a)
    # Python lists the attributes without a default first, each group in definition order.
    settable = [a for a in op_def.attr if a.name not in inferred]
    settable = ([a.name for a in settable if not a.HasField("default_value")] +
                [a.name for a in settable if a.HasField("default_value")])
    parameters = list(inspect.signature(getattr(tf.raw_ops, name)).parameters)
    keywords = [p for p in parameters[len(op_def.input_arg):] if p != "name"]
    return {k: a for k, a in zip(keywords, settable) if k != a and k not in settable}


@functools.lru_cache(maxsize=None)
def _python_names(name: str) -> Tuple[str, ...]:
    """The raw op's keyword for each op-definition input (Python renames a few, e.g. Sum's
    `reduction_indices` is `axis`); inputs come first, in order."""
    parameters = list(inspect.signature(getattr(tf.raw_ops, name)).parameters)
    return tuple(parameters[:len(_op_def(name).input_arg)])


def invoke(name: str, call: Call, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Runs raw op `name` with `tensors` for the call's `T` arguments (in order) and the
    host arguments as plain tensors; returns the outputs as a flat list."""
    feed = iter(tensors)
    if call.composite is not None:
        values = [next(feed) if isinstance(x, T) else x.tensor() for x in call.args.values()]
        return list(call.composite(*values, **call.attrs))
    kwargs = {}
    for arg, keyword in zip(_op_def(name).input_arg, _python_names(name)):
        value = call.args[arg.name]
        if isinstance(value, list):
            kwargs[keyword] = [next(feed) for _ in value]
        elif isinstance(value, T):
            kwargs[keyword] = next(feed)
        else:
            kwargs[keyword] = value.tensor()
    result = getattr(tf.raw_ops, name)(**kwargs, **call.attrs)
    if isinstance(result, (list, tuple)):
        flat = []
        for r in result:
            flat.extend(r if isinstance(r, (list, tuple)) else [r])
        return flat
    # An op without outputs gives None eagerly, its Operation while tracing.
    return [result] if result is not None and not isinstance(result, tf.Operation) else []


def _raise_assertion(message: str) -> None:
    raise AssertionError(message)


def run_strict(fn: Callable, *args):
    """Runs `fn` in strict mode; an op without a rule is an AssertionError (a mismatch)."""
    return run_without_fallback(fn, *args, fail=_raise_assertion)


# ---------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------

def tolerance(dtype: np.dtype, tol: Optional[float]) -> float:
    if tol is not None:
        return tol
    if dtype == tf.bfloat16.as_numpy_dtype:  # 8 bits of mantissa: sums in another order
        return 3e-2
    if dtype == np.float16:
        return 3e-3
    return 1e-9 if dtype in (np.float64, np.complex128) else 2e-5


def assert_close(expected: np.ndarray, actual: np.ndarray, tol: float, what: str) -> None:
    if expected.dtype == tf.bfloat16.as_numpy_dtype:  # not a NumPy float: compare as float32
        expected = expected.astype(np.float32)
        actual = np.asarray(actual).astype(np.float32)
    if np.issubdtype(expected.dtype, np.inexact):   # floats and complex numbers
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def assert_output(expected: np.ndarray, claim: Optional[Layout], actual, tol: float,
                  what: str) -> None:
    assert dtensor.is_dtensor(actual), f"{what}: not a DTensor (on {actual.device})"
    layout = dtensor.fetch_layout(actual)
    if claim is not None:
        assert layout == claim, f"{what}: layout {layout.short()}, the rule claims {claim.short()}"
    assert actual.dtype == tf.as_dtype(expected.dtype), (
        f"{what}: dtype {actual.dtype.name}, expected {tf.as_dtype(expected.dtype).name}")
    assert tuple(actual.shape) == expected.shape, (
        f"{what}: global shape {tuple(actual.shape)}, expected {expected.shape}")
    assert_close(expected, reassemble(actual), tol, f"{what} ({layout.short()})")


# ---------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------

_FUNCTIONS: "collections.OrderedDict[tuple, Callable]" = collections.OrderedDict()
_MAX_FUNCTIONS = 256


def _freeze(value) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, H):
        return ("H", _freeze(np.asarray(value.value)), str(value.dtype))
    if isinstance(value, T):
        return ("T", value.value.dtype.str)
    return value


def _differentiable(dtype) -> bool:
    return tf.as_dtype(dtype) in FLOATS


def outputs_and_gradients(name: str, call: Call, grad: bool, tensors: Sequence[tf.Tensor],
                          upstream: Sequence[tf.Tensor] = ()):
    """The op's outputs and, with `grad`, the gradients of sum(output_i * upstream_i) over
    the float outputs with respect to the float tensor arguments."""
    if not grad:
        return invoke(name, call, tensors), []
    watched = [t for t in tensors if _differentiable(t.dtype)]
    with tf.GradientTape() as tape:
        tape.watch(watched)
        outputs = invoke(name, call, tensors)
    targets = [o for o in outputs if _differentiable(o.dtype)]
    gradients = tape.gradient(targets, watched, output_gradients=list(upstream),
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # Gathers give IndexedSlices: compare their dense value (UnsortedSegmentSum).
    return outputs, [tf.convert_to_tensor(g) for g in gradients]


def _function_for(name: str, call: Call, grad: bool, num_tensors: int,
                  lowering: str) -> Callable:
    """One tf.function per op call (attributes and host arguments) and collective lowering
    (the device keeps a function's expansion per function and layouts, not per lowering);
    TensorFlow caches its traces per input shapes and dtypes."""
    key = (name, _freeze(call.args), _freeze(call.attrs), grad, call.composite, lowering)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = tf.function(lambda *t: outputs_and_gradients(name, call, grad, t[:num_tensors],
                                                          t[num_tensors:]))
        _FUNCTIONS[key] = fn
        if len(_FUNCTIONS) > _MAX_FUNCTIONS:
            _FUNCTIONS.popitem(last=False)
    else:
        _FUNCTIONS.move_to_end(key)
    return fn


def describe(name: str, call: Call, layouts: Sequence[Layout]) -> str:
    parts = []
    feed = iter(layouts)
    for arg_name in _arg_names(name, call):
        value = call.args[arg_name]
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, T):
                parts.append(f"{arg_name}: {item.value.dtype.name}{list(item.value.shape)} "
                             f"{next(feed).short()}")
            else:
                parts.append(f"{arg_name}: host {np.asarray(item.value).tolist()!r}")
    attrs = f"\n  attrs: {call.attrs}" if call.attrs else ""
    if call.composite is not None:
        attrs += f"\n  composite: {call.composite.__name__}"
    return "  " + "\n  ".join(parts) + attrs


def case_lowering(name: str) -> str:
    """The collective lowering case number n of `name` runs under: the default and the ops
    lowering in turn (deterministic: cases are counted per op)."""
    return LOWERINGS[LOG.cases[name] % len(LOWERINGS)]


class _Invalid(Exception):
    """TensorFlow refuses the drawn case on one plain device: not a case to compare."""


def check_case(spec: OpSpec, call: Call, layouts: Sequence[Layout], d: Drawer,
               lowering: str) -> None:
    """Runs one case against one plain device under collective lowering `lowering`; raises
    on a mismatch and `_Invalid` when TensorFlow refuses the case. `d` draws the upstream
    gradients (and a creation op's requested layout)."""
    name = spec.name
    inputs = flat_inputs(name, call)
    if any(isinstance(x, V) for x in inputs):
        _check_variable(spec, call, inputs, layouts, lowering)
        return
    arrays = [x.value for x in inputs if isinstance(x, T)]
    grad = spec.grad and call.grad and any(_differentiable(a.dtype) for a in arrays)
    plain = [tf.constant(a) for a in arrays]
    try:
        # A scalar string's numpy() is bytes, not an array: keep arrays throughout.
        expected_outputs = [np.asarray(o.numpy(), dtype=object) if o.dtype == tf.string
                            else o.numpy() for o in invoke(name, call, plain)]
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            tf.errors.NotFoundError, ValueError, TypeError) as error:
        raise _Invalid() from error   # the table drew something TensorFlow refuses
    # The reference gradient: a failure here is the table's mistake, not a mismatch.
    upstream = [d.array(o.shape, o.dtype) for o in expected_outputs
                if _differentiable(o.dtype)] if grad else []
    try:
        _, expected_grads = outputs_and_gradients(name, call, grad, plain,
                                                  [tf.constant(u) for u in upstream])
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        raise _Invalid() from error   # TensorFlow has no gradient kernel for this case
    expected_grads = [g.numpy() for g in expected_grads]
    with collective_lowering(lowering):
        if spec.creation:
            _check_creation(d, spec, call, d.mesh, expected_outputs)
        else:
            _check(spec, call, inputs, arrays, layouts, upstream, expected_outputs,
                   expected_grads, lowering)


def run_case(spec: OpSpec, data, known: Sequence[KnownMismatch] = ()) -> None:
    """Draws and checks one case of `spec`; records the outcome in `LOG`. A case in `known`
    that mismatches is recorded as known; a strict one that passes, as a mismatch."""
    d = Drawer(data)
    mesh = d.mesh = d.choice(MESHES)
    call = spec.draw(d)
    name = spec.name
    if call.composite is not None:
        call.args = {f"arg{i}": x for i, x in enumerate(call.args)}
    elif not isinstance(call.args, dict):
        call.args = dict(zip((a.name for a in _op_def(name).input_arg), call.args))
    tensor_args = [x for x in flat_inputs(name, call) if isinstance(x, T)]
    arrays = [x.value for x in tensor_args]
    layouts = [draw_layout(d, mesh, x.value, x.partial, x.sharded, x.nonempty)
               for x in tensor_args]
    lowering = case_lowering(name)
    case = describe(name, call, layouts)
    if VERBOSE:   # a case that crashes the process is the last one printed
        print(f"case {name} on {mesh.short()}, lowering {lowering or 'default'}\n{case}",
              flush=True)
    entry = next((k for k in known if k.matches(name, mesh, case, lowering)), None)
    start = time.perf_counter()
    LOG.cases[name] += 1
    LOG.lowerings[lowering or "default"] += 1
    text = f"mesh {mesh.short()}, {lowering or 'default'} lowering\n{case}"
    try:
        check_case(spec, call, layouts, d, lowering)
        if entry is not None and entry.strict:
            LOG.mismatches[name].append(f"{text}\npasses, but KNOWN_MISMATCHES expects it to "
                                        f"fail ({entry.reason}); remove the entry.")
    except _Invalid:
        LOG.invalid[name] += 1
    except Exception as error:  # noqa: BLE001 - every failure is a mismatch to report
        text += f"\n{type(error).__name__}: {str(error)[:1500]}"
        if not isinstance(error, AssertionError):
            text += "\n" + "".join(traceback.format_tb(error.__traceback__)[-3:])
        (LOG.known if entry is not None else LOG.mismatches)[name].append(text)
    finally:
        LOG.seconds += time.perf_counter() - start


def host_array(x: H) -> np.ndarray:
    return np.asarray(x.value, dtype=tf.as_dtype(x.dtype).as_numpy_dtype if x.dtype else None)


def _claims(name: str, call: Call, inputs, layouts) -> List[Layout]:
    feed = iter(layouts)
    explain_layouts, shapes, int_values = [], [], {}
    # Values go to explain for the inputs the op's traits read as host arguments; other
    # host inputs (PadV2's constant_values) are data that joins the mesh replicated.
    host_arguments = set(_core.host_inputs(name, len(inputs)))
    for i, x in enumerate(inputs):
        if isinstance(x, T):
            explain_layouts.append(next(feed))
            shapes.append(list(x.value.shape))
        else:
            value = host_array(x)
            explain_layouts.append(None)
            shapes.append(list(value.shape))
            if i in host_arguments and np.issubdtype(value.dtype, np.integer):
                int_values[i] = [int(v) for v in value.reshape(-1)]
    plan = debug.explain(name, explain_layouts, shapes, int_values=int_values,
                         attrs=explain_attrs(name, call))
    return plan["outputs"]


def _check(spec, call, inputs, arrays, layouts, upstream, expected_outputs, expected_grads,
           lowering):
    name = spec.name
    grad = bool(expected_grads)
    claims = _claims(name, call, inputs, layouts) if call.composite is None else None
    tols = [tolerance(o.dtype, call.tol) for o in expected_outputs]
    grad_tol = call.tol or 1e-4

    def check(outputs, gradients, where, settle):
        assert len(outputs) == len(expected_outputs), (
            f"{where}: {len(outputs)} outputs, expected {len(expected_outputs)}")
        for i, (e, a) in enumerate(zip(expected_outputs, outputs)):
            if call.compare is not None and i not in call.compare:
                continue
            if call.composite is not None:
                claim = None   # several ops: no one rule claims the result's layout
            else:
                claim = claims[min(i, len(claims) - 1)] if claims else Layout.replicated(
                    layouts[0].mesh if layouts else None, e.ndim)
            if settle and claim is not None and claim.is_partial:
                claim = None   # a function's partial result is settled when returned
            if settle and spec.function_reads_whole:
                claim = Layout.replicated(layouts[0].mesh, e.ndim)
            assert_output(e, claim, a, tols[i], f"{where} output {i}")
        for i, (e, a) in enumerate(zip(expected_grads, gradients)):
            assert_close(e, reassemble(a), grad_tol, f"{where} gradient of input {i}")

    dtensors = [to_dtensor(a, l) for a, l in zip(arrays, layouts)]
    mesh = layouts[0].mesh
    weights = [to_dtensor(u, Layout.replicated(mesh, u.ndim)) for u in upstream]
    outputs, gradients = run_strict(outputs_and_gradients, name, call, grad, dtensors, weights)
    check(outputs, gradients, "eager", settle=False)
    fn = _function_for(name, call, grad, len(dtensors), lowering)
    outputs, gradients = run_strict(fn, *dtensors, *weights)
    check(outputs, gradients, "tf.function", settle=True)


def _check_creation(d: Drawer, spec: OpSpec, call: Call, mesh, expected_outputs) -> None:
    """Creation ops: the output layout is requested; the rule must produce it."""
    expected = expected_outputs[0]
    # Uneven requests too: the op makes its value in the requested layout, or, where a
    # size-1 axis would be split over several devices, replicated; explain says which.
    layout = draw_layout(d, mesh, expected, partial_ok=False)
    inputs = flat_inputs(spec.name, call)
    shapes = [list(host_array(x).shape) for x in inputs]
    int_values = {i: [int(v) for v in host_array(x).reshape(-1)]
                  for i, x in enumerate(inputs) if np.issubdtype(host_array(x).dtype, np.integer)}
    plan = debug.explain(spec.name, [None] * len(inputs), shapes, int_values=int_values,
                         attrs=explain_attrs(spec.name, call), requested=layout)
    claim = plan["outputs"][0] if plan["outputs"] else layout

    def create():
        with dtensor_device.mesh_scope(mesh), dtensor_device.layout_scope(layout):
            return invoke(spec.name, call, [])[0]

    actual = run_strict(create)
    assert_output(expected, claim, actual, tolerance(expected.dtype, call.tol), "eager output 0")
    def create_with_layout():
        return dtensor.call_with_layout(lambda: invoke(spec.name, call, [])[0], layout)

    with dtensor.run_on(mesh):
        in_function = run_strict(tf.function(create_with_layout))
    assert_output(expected, layout, in_function, tolerance(expected.dtype, call.tol),
                  "tf.function output 0")


def _check_variable(spec: OpSpec, call: Call, inputs, layouts: Sequence[Layout],
                    lowering: str) -> None:
    """Resource ops: the op runs on a tf.Variable's handle for reference, then on a
    DVariable's (in the drawn layout) eagerly and, on a fresh DVariable, inside
    tf.function. Outputs must match in value, dtype and global shape; the variable must
    hold the reference's value afterwards, in the layout it was made with. Runs under
    the case's collective lowering, which the DVariables are made under too."""
    name = spec.name
    tensor_args = [x for x in inputs if isinstance(x, T)]
    variables = [tf.Variable(x.value) if isinstance(x, V) else None for x in tensor_args]
    feed = [v.handle if v is not None else tf.constant(x.value)
            for v, x in zip(variables, tensor_args)]
    try:
        expected_outputs = [o.numpy() for o in invoke(name, call, feed)]
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            tf.errors.NotFoundError, ValueError, TypeError) as error:
        raise _Invalid() from error   # the table drew something TensorFlow refuses
    expected_values = [v.numpy() for v in variables if v is not None]
    tols = [tolerance(o.dtype, call.tol) for o in expected_outputs]

    def made():
        """Fresh DVariables (None for data arguments) and the op's tensor arguments."""
        dvariables = [dtensor.DVariable(to_dtensor(x.value, layout)) if isinstance(x, V)
                      else None for x, layout in zip(tensor_args, layouts)]
        data = [to_dtensor(x.value, layout) if dv is None else None
                for x, layout, dv in zip(tensor_args, layouts, dvariables)]
        return dvariables, data

    def check(outputs, dvariables, where):
        assert len(outputs) == len(expected_outputs), (
            f"{where}: {len(outputs)} outputs, expected {len(expected_outputs)}")
        for i, (e, a) in enumerate(zip(expected_outputs, outputs)):
            assert_output(e, None, a, tols[i], f"{where} output {i}")
        made_as = [l for l, dv in zip(layouts, dvariables) if dv is not None]
        for e, dv, layout in zip(expected_values, [v for v in dvariables if v is not None],
                                 made_as):
            assert dv.layout == layout, (
                f"{where}: the variable's layout is {dv.layout.short()}, made {layout.short()}")
            assert_output(e, layout, dv.read_value(), tolerance(e.dtype, call.tol),
                          f"{where} variable after the op")

    def handles(dvariables, data):
        return [dv.handle if dv is not None else t for dv, t in zip(dvariables, data)]

    dvariables, data = run_strict(made)
    outputs = run_strict(lambda: invoke(name, call, handles(dvariables, data)))
    check(outputs, dvariables, "eager")

    dvariables, data = run_strict(made)
    positions = [i for i, t in enumerate(data) if t is not None]

    @tf.function
    def in_function(*given):
        feed = handles(dvariables, data)
        for i, t in zip(positions, given):
            feed[i] = t
        return invoke(name, call, feed)

    outputs = run_strict(in_function, *[data[i] for i in positions])
    check(outputs, dvariables, "tf.function")


def examples_per_op(num_ops: int) -> int:
    """TF_DTENSOR_FUZZ_EXAMPLES is the total for a run (spread over the ops); the default
    short run draws a few cases per op."""
    total = int(os.environ.get("TF_DTENSOR_FUZZ_EXAMPLES", "0"))
    return max(1, -(-total // num_ops)) if total else 3
