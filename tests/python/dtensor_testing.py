"""Test helpers: standard meshes, layout enumeration, `assert_dtensor_equal` and the
generic numerical validator for op rules (`check_op`).

The meshes are plain values and need no runtime, so they can be built at collection time
for parameter ids; `conftest.py` splits the host CPU into 8 virtual CPUs before any of
them is used.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import warnings
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from tf_dtensor import _device as dtensor_device
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout, Mesh


# The devices the shared meshes (and the fuzzer's) are built on: the 8 virtual CPUs, or
# with TF_DTENSOR_TEST_DEVICE=GPU the 8 logical GPUs conftest.py splits a GPU into (the
# `gpu` tests run the numerical checks and the fuzzer so, tests/python/test_gpu.py).
TEST_DEVICE = os.environ.get("TF_DTENSOR_TEST_DEVICE", "CPU").upper()


def cpus(n: int) -> List[str]:
    """The first n test devices (virtual CPUs unless TF_DTENSOR_TEST_DEVICE says GPU)."""
    return [f"{TEST_DEVICE}:{i}" for i in range(n)]


MESH_1D = dtensor.create_mesh([("x", 2)], devices=cpus(2))
MESH_2X2 = dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4))
MESH_8 = dtensor.create_mesh([("x", 8)], devices=cpus(8))


# ---------------------------------------------------------------------------------------
# Layouts and parameter ids
# ---------------------------------------------------------------------------------------

def spec_id(layout: Layout) -> str:
    """`[x,*]` for `[x,*] @ mesh(x=2)`: the short form without the mesh."""
    return layout.short().split(" @ ")[0]


def case_id(layouts: Sequence[Layout]) -> str:
    """`[x,*]-[*,y]`; cases on a mesh other than the 2x2 one end in `@mesh(x=2)`."""
    ident = "-".join(spec_id(l) for l in layouts)
    mesh = layouts[0].mesh
    return ident if mesh == MESH_2X2 else f"{ident}@{mesh.short()}"


def layout_of(spec: str, mesh: Mesh) -> Layout:
    """`layout_of("[x,*]", mesh)`: a layout from its short form (`*` is unsharded)."""
    body = spec.strip().lstrip("[").rstrip("]")
    specs = [s.strip() for s in body.split(",")] if body else []
    return Layout([UNSHARDED if s == "*" else s for s in specs], mesh)


def layouts_for(mesh: Mesh, shape: Sequence[int], uneven: bool = False) -> List[Layout]:
    """Every layout of `shape` on `mesh` that shards each axis by at most one mesh dim, uses
    each mesh dim at most once, and divides evenly (with `uneven`, also those that don't)."""
    options = [UNSHARDED] + mesh.dim_names
    out = []
    for specs in itertools.product(options, repeat=len(shape)):
        sharded = [s for s in specs if s != UNSHARDED]
        if len(set(sharded)) != len(sharded):
            continue
        if not uneven and any(s != UNSHARDED and shape[i] % mesh.dim_size(s)
                              for i, s in enumerate(specs)):
            continue
        out.append(Layout(list(specs), mesh))
    return out


def layout_params(*shapes: Sequence[int], meshes: Iterable[Mesh] = (MESH_1D, MESH_2X2),
                  select: Optional[Callable[[Tuple[Layout, ...]], bool]] = None) -> list:
    """pytest params: every combination of `layouts_for` each shape, on each mesh."""
    params = []
    for mesh in meshes:
        for combo in itertools.product(*(layouts_for(mesh, s) for s in shapes)):
            if select is None or select(combo):
                params.append(pytest.param(combo, id=case_id(combo)))
    return params


def spec_params(mesh: Mesh, *cases: Sequence[str]) -> list:
    """pytest params from short specs: `spec_params(MESH_2X2, ("[x,*]", "[*,y]"), ...)`."""
    params = []
    for case in cases:
        combo = tuple(layout_of(s, mesh) for s in case)
        params.append(pytest.param(combo, id=case_id(combo)))
    return params


def is_replicated(layout: Layout) -> bool:
    return all(s == UNSHARDED for s in layout.sharding_specs)


# ---------------------------------------------------------------------------------------
# Making and reading DTensors
# ---------------------------------------------------------------------------------------

def to_dtensor(value, layout: Layout):
    """A DTensor holding `value` with `layout`: replicated copy, then relayout."""
    tensor = tf.convert_to_tensor(value)
    replicated = dtensor.copy_to_mesh(tensor, Layout.replicated(layout.mesh, layout.rank))
    return dtensor.relayout(replicated, layout)


def _same_device(a: str, b: str) -> bool:
    spec_a, spec_b = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    return (spec_a.device_type, spec_a.device_index) == (spec_b.device_type, spec_b.device_index)


_COMBINE = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
            "prod": np.multiply}


def reassemble(actual, replicas_close: bool = False) -> np.ndarray:
    """The global value of a DTensor, built from `unpack` and its layout.

    Device i of the mesh holds the block whose index along each tensor axis is the
    device's mesh coordinate along the mesh dim sharding that axis (0 if unsharded); the
    block's shape and offset come from `Layout.shard_geometry` (uneven blocks included).
    A partial layout's terms are combined along each partial mesh dim with its reduction.
    Fails if a component is on the wrong device or has the wrong shape, if two replicas
    of one block differ, or if a block is missing. With `replicas_close`, float replicas
    may differ in the last bits (each device's part compiled by XLA on its own, as GPU
    kernels may round differently on different GPUs).
    """
    layout = dtensor.fetch_layout(actual)
    mesh = layout.mesh
    shape = tuple(int(d) for d in actual.shape)
    specs = layout.sharding_specs
    partial = layout.partial
    assert len(specs) == len(shape), (
        f"layout {layout.short()} has rank {len(specs)} but the tensor has shape {shape}")
    # An axis over several mesh dims ("x+y") has one piece per coordinate pair, numbered
    # major first (PyTorch's [Shard(0), Shard(0)]).
    pieces = [int(np.prod([mesh.dim_size(d) for d in s.split("+")])) if s != UNSHARDED else 1
              for s in specs]

    def piece_index(spec: str, coords) -> int:
        index = 0
        for d in ([] if spec == UNSHARDED else spec.split("+")):
            index = index * mesh.dim_size(d) + int(coords[mesh.dim_names.index(d)])
        return index

    components = dtensor.unpack(actual)
    assert len(components) == mesh.num_local_devices(), (
        f"unpack returned {len(components)} components for {mesh.num_local_devices()} devices")
    partial_dims = list(partial)
    # (block index, coordinates along the partial dims) -> the term that device holds.
    terms: Dict[tuple, np.ndarray] = {}
    for device, device_id, component in zip(mesh.local_devices(), mesh.local_device_ids(),
                                            components):
        assert _same_device(component.device, device), (
            f"component for {device} lives on {component.device}")
        coords = mesh._mesh.coords(device_id)
        index = tuple(piece_index(s, coords) for s in specs)
        block_shape, _ = layout.shard_geometry(shape, index)
        value = component.numpy()
        if component.dtype == tf.string:
            value = np.asarray(value, dtype=object)   # a scalar string's numpy() is bytes
        assert value.shape == tuple(block_shape), (
            f"component on {device} has shape {value.shape}; {layout.short()} of {list(shape)} "
            f"needs {list(block_shape)} for block {index}")
        key = (index, tuple(int(coords[mesh.dim_names.index(d)]) for d in partial_dims))
        if key in terms:
            message = f"replicas of block {key} differ ({device}, layout {layout.short()})"
            if (TEST_DEVICE == "GPU" or replicas_close) and value.dtype.kind in "fc":
                # GPU reductions (BiasAddGrad, Sum) add in an order that varies from run to
                # run: replicas computed on different GPUs may differ in the last bit.
                np.testing.assert_allclose(value, terms[key], rtol=1e-6, atol=1e-6,
                                           err_msg=message)
            else:
                np.testing.assert_array_equal(_comparable(value), _comparable(terms[key]),
                                              err_msg=message)
            continue
        terms[key] = value
    # Combine the terms one partial dim at a time.
    for position, dim in enumerate(partial_dims):
        combined: Dict[tuple, np.ndarray] = {}
        for (index, pcoords), value in sorted(terms.items(), key=lambda kv: kv[0]):
            rest = pcoords[:position] + (None,) + pcoords[position + 1:]
            key = (index, rest)
            combined[key] = value if key not in combined else _COMBINE[partial[dim]](
                combined[key], value)
        if partial[dim] == "mean":
            combined = {k: v / mesh.dim_size(dim) for k, v in combined.items()}
        terms = combined
    out = np.zeros(shape, dtype=actual.dtype.as_numpy_dtype)
    blocks = {index for index, _ in terms}
    for (index, _), value in terms.items():
        block_shape, offset = layout.shard_geometry(shape, index)
        region = tuple(slice(o, o + b) for o, b in zip(offset, block_shape))
        out[region] = value
    assert len(blocks) == int(np.prod(pieces)), (
        f"only blocks {sorted(blocks)} of {pieces} are held by some device")
    return out


def _comparable(value: np.ndarray) -> np.ndarray:
    """`value`, with bfloat16 as float32: numpy's comparisons tell NaN from NaN only for
    its own float kinds, and bfloat16 (ml_dtypes) is not one."""
    return value.astype(np.float32) if value.dtype == tf.bfloat16.as_numpy_dtype else value


def assert_values_equal(expected: np.ndarray, actual: np.ndarray, msg: str = "") -> None:
    expected, actual = _comparable(np.asarray(expected)), _comparable(np.asarray(actual))
    if np.issubdtype(expected.dtype, np.floating) or np.issubdtype(expected.dtype,
                                                                    np.complexfloating):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=msg)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=msg)


def assert_dtensor_equal(expected, expected_layout: Layout, actual) -> None:
    """Checks a DTensor's layout, global shape, dtype and global value.

    Args:
      expected: the global value; a np.ndarray (or tf.Tensor), which also gives the dtype.
      expected_layout: the layout `actual` must have.
      actual: the DTensor.
    """
    if isinstance(expected, tf.Tensor):
        expected = expected.numpy()
    expected = np.asarray(expected)
    assert dtensor.is_dtensor(actual), f"expected a DTensor, got a tensor on {actual.device}"
    layout = dtensor.fetch_layout(actual)
    assert layout == expected_layout, (
        f"layout is {layout.short()}, expected {expected_layout.short()}")
    assert tuple(actual.shape) == expected.shape, (
        f"global shape is {tuple(actual.shape)}, expected {expected.shape}")
    assert actual.dtype == tf.as_dtype(expected.dtype), (
        f"dtype is {actual.dtype.name}, expected {tf.as_dtype(expected.dtype).name}")
    assert_values_equal(expected, reassemble(actual), f"layout {layout.short()}")


# ---------------------------------------------------------------------------------------
# The generic numerical validator
# ---------------------------------------------------------------------------------------

def explain_plan(op_name: str, layouts: Sequence[Layout], shapes: Sequence[Sequence[int]],
                 host_inputs: Sequence[Tuple[Sequence[int], Sequence[int]]] = (),
                 attrs: Optional[dict] = None, host_first: bool = False) -> dict:
    """`debug.explain`'s plan for the op; host inputs follow the tensor inputs as
    `(shape, int_values)` pairs (int_values None: a host tensor whose value the plan does
    not read, PadV2's constant), or precede them with `host_first` (Split's axis,
    StridedSliceGrad's shape and slice spec)."""
    tensors = [(l, list(s), None) for l, s in zip(layouts, shapes)]
    hosts = [(None, list(s), None if v is None else list(v)) for s, v in host_inputs]
    inputs = hosts + tensors if host_first else tensors + hosts
    return tf_dtensor.debug.explain(
        op_name, [l for l, _, _ in inputs], [s for _, s, _ in inputs],
        int_values={i: v for i, (_, _, v) in enumerate(inputs) if v is not None},
        attrs=attrs or {})


def _output_of(plan: dict, mesh: Mesh, rank: Optional[int], output: int) -> Layout:
    if plan["outputs"]:
        return plan["outputs"][min(output, len(plan["outputs"]) - 1)]
    # An empty plan means "replicated, whatever the rank".
    return Layout.replicated(mesh, rank)


def planned_output(op_name: str, layouts: Sequence[Layout], shapes: Sequence[Sequence[int]],
                   host_inputs: Sequence[Tuple[Sequence[int], Sequence[int]]] = (),
                   attrs: Optional[dict] = None, rank: Optional[int] = None,
                   host_first: bool = False, output: int = 0) -> Layout:
    """The layout of output `output` that `debug.explain` predicts (see `explain_plan`)."""
    plan = explain_plan(op_name, layouts, shapes, host_inputs, attrs, host_first)
    return _output_of(plan, layouts[0].mesh, rank, output)


# Every collective lowering the numerical checks run under. "" is the default ("auto": the
# shared buffers on this process's virtual CPUs, device-to-device copies on GPUs); "ops"
# forces TensorFlow's collective ops (CollectiveReduceV2, ...), the lowering of several
# clients; "copies" the device-to-device copies GPUs of one process use.
LOWERINGS = ("", "ops", "copies") if TEST_DEVICE == "CPU" else ("", "ops")


@contextlib.contextmanager
def collective_lowering(policy: str):
    """Collectives lowered as `policy` (`config.set_collective_lowering`) inside the block."""
    tf_dtensor.config.set_collective_lowering(policy)
    try:
        yield
    finally:
        tf_dtensor.config.set_collective_lowering("")


def traced_again(fn: Callable) -> Callable:
    """`fn`, or a tf.function of the same Python function traced anew: the device keeps the
    expansion of a traced function per function and input layouts, not per lowering, so a
    second run of the same tf.function under another lowering would reuse the first's."""
    python_function = getattr(fn, "python_function", None)
    return tf.function(python_function) if python_function is not None else fn


def run_without_fallback(fn: Callable, *args, fail: Callable[[str], None] = pytest.fail):
    """Runs `fn(*args)` and fails if an op in it has no rule.

    Runs in strict mode, so an op without a rule is caught even when its inputs are
    replicated (no gather, no warning) or its one-time warning was already given.
    `fail(message)` reports a fallback (pytest.fail; the fuzzer raises an AssertionError
    it records as a mismatch).
    """
    device = dtensor_device.get()
    strict = device.strict
    device.strict = True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(*args)
    except tf.errors.UnimplementedError as error:
        if "has no tf_dtensor rule" in str(error):
            fail(f"ran without a rule: {error}")
        raise
    finally:
        device.strict = strict
    fallbacks = [str(w.message) for w in caught
                 if issubclass(w.category, tf_dtensor.UnsupportedOpWarning)]
    if fallbacks:
        fail(f"ran without a rule: {fallbacks}")
    return result


def check_op(fn: Callable, op_name: str, arrays: Sequence[np.ndarray], layouts: Sequence[Layout],
             host_inputs: Sequence[Tuple[Sequence[int], Sequence[int]]] = (),
             attrs: Optional[dict] = None, host_first: bool = False, output: int = 0):
    """Runs `fn` on plain tensors and on DTensors laid out as `layouts`; checks that values,
    dtype and global shape agree and that the output layout is the one the planner
    (`debug.explain(op_name, ...)`) predicts for output `output` of the op (`fn` returns
    that output). Returns the DTensor result.

    Runs under each of `LOWERINGS` when the plan has a collective (a relayout of an input or
    a reduction of an output); a plan without one runs the same local ops under every
    lowering, so the default lowering alone covers it (a case that fails under one
    lowering only is marked on its parameter: a strict xfail naming the lowering).
    """
    expected = fn(*[tf.constant(a) for a in arrays]).numpy()
    inputs = [to_dtensor(a, l) for a, l in zip(arrays, layouts)]
    plan = explain_plan(op_name, layouts, [a.shape for a in arrays], host_inputs, attrs,
                        host_first)
    expected_layout = _output_of(plan, layouts[0].mesh, expected.ndim, output)
    actual = run_without_fallback(fn, *inputs)
    assert_dtensor_equal(expected, expected_layout, actual)
    if plan["collectives"]:
        for lowering in LOWERINGS[1:]:
            try:
                with collective_lowering(lowering):
                    again = run_without_fallback(traced_again(fn), *inputs)
                    assert_dtensor_equal(expected, expected_layout, again)
            except (AssertionError, tf.errors.OpError) as error:
                raise AssertionError(f"{op_name} {case_id(layouts)} under the "
                                     f"'{lowering}' collective lowering: {error}") from error
    return actual


def random_array(shape: Sequence[int], dtype=np.float32, low: float = -2.0, high: float = 2.0,
                 seed: int = 0) -> np.ndarray:
    """Deterministic test data; integers are drawn from [low, high]."""
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(low, high, size=shape).astype(dtype)


def run_python(source: str, env: Optional[Dict[str, str]] = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `source` with `python -c` in a fresh process that imports the same tf_dtensor
    build as this one (installed, or the source tree with its built module), with
    `env` added to this process's environment. `-c` puts the working directory first on
    sys.path, so it runs from the package's parent directory: a source checkout there
    (as in CI, which installs the package) has no built module."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tf_dtensor.__file__)))
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [package_root, full_env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=package_root)
