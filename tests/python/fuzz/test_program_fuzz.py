"""Programs of many ops against one plain device (program_fuzz.py draws and runs them).

Default run (part of `pytest`): the programs of seeds 0..TF_DTENSOR_PROGRAMS-1 (default 40),
and REGRESSION_SEEDS.
Long run, a fresh range of seeds each time unless TF_DTENSOR_PROGRAM_SEED is set:

    TF_DTENSOR_PROGRAMS=2000 pytest -q -s -p no:cacheprovider tests/python/fuzz/test_program_fuzz.py

Each program runs eagerly and inside `tf.function` (every other seed traced with the first
axis of its tensor inputs unknown, as for a dataset's batches, where one device can trace
it so), both with the gradient of a loss of
its outputs with respect to every input (some inputs are variables, updated with their
gradients after, and read back; every fourth seed compiled with XLA, by `jit_compile` or
`set_jit`), in strict mode (an op that falls back fails),
under the collective lowering the seed picks; a failure prints the program.
"""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import pytest
import tensorflow as tf

import program_fuzz
from dtensor_testing import LOWERINGS, collective_lowering, reassemble, run_python, to_dtensor
from fuzz_engine import assert_close, run_strict
from tf_dtensor import dtensor

PROGRAMS = int(os.environ.get("TF_DTENSOR_PROGRAMS", "40"))
_LONG = "TF_DTENSOR_PROGRAMS" in os.environ
FIRST = int(os.environ.get("TF_DTENSOR_PROGRAM_SEED",
                           random.randrange(1, 10**6) * 10**4 if _LONG else 0))
# Seeds of long runs that once failed for the harness's sake, run by default too: 90380's
# gradient of a batch norm's offset under a normalize cancels to 2.6e-5 from terms of
# order 1, which a tolerance scaled by that gradient alone refused.
REGRESSION_SEEDS = () if _LONG else (90380,)


def _run(program, inputs, on_mesh):
    """Outputs, then the gradients (one per input) and the updated variables' values."""
    with tf.GradientTape() as tape:
        tape.watch([x for x in inputs if not isinstance(x, tf.Variable)])
        outputs = program_fuzz.run(program, inputs, on_mesh=on_mesh)
        loss = program_fuzz.loss_of(outputs)
    gradients = tape.gradient(loss, inputs, unconnected_gradients="zero")
    gradients = [tf.convert_to_tensor(g) for g in gradients]   # gathers give IndexedSlices
    return outputs, gradients + program_fuzz.update_variables(inputs, gradients)


@contextlib.contextmanager
def _auto_clustering():
    before = tf.config.optimizer.get_jit()
    tf.config.optimizer.set_jit("autoclustering")
    try:
        yield
    finally:
        tf.config.optimizer.set_jit(before or False)


def _function(program, inputs, on_mesh, run_time_sizes, jit=True):
    """`_run` as a tf.function. With `run_time_sizes` it is traced with the first axis of
    every tensor input unknown (as for the batches of a dataset, the last one smaller), a
    quarter of the other axes too, and the variables captured."""
    if not run_time_sizes:
        # Every fourth seed compiles with XLA (each device's part, as on GPUs; Keras' default).
        jit = program_fuzz.compiled(program.seed) and jit
        if jit and program_fuzz.auto_clustered(program.seed):
            with _auto_clustering():
                return tf.function(lambda *xs: _run(program, list(xs), on_mesh))(*inputs)
        return tf.function(lambda *xs: _run(program, list(xs), on_mesh),
                           jit_compile=jit)(*inputs)
    positions = [i for i, x in enumerate(inputs) if not isinstance(x, tf.Variable)]
    rng = np.random.RandomState(program.seed + 2)
    specs = []
    for i in positions:   # the first axis unknown, now and then others too
        shape = [None if a == 0 or rng.rand() < 0.25 else size
                 for a, size in enumerate(inputs[i].shape.as_list())]
        specs.append(tf.TensorSpec(shape, inputs[i].dtype))

    def body(*tensors):
        xs = list(inputs)
        for i, t in zip(positions, tensors):
            xs[i] = t
        return _run(program, xs, on_mesh)
    return tf.function(body, input_signature=specs)(*[inputs[i] for i in positions])


def _one_device_runs(program, values, run_time_sizes: bool, expected=None) -> bool:
    """Whether one plain device runs the program's function traced with run-time sizes
    (ops such as `tf.unstack` or `tf.one_hot` of a dimension need that dimension's size),
    or else compiled with XLA where the seed asks for it, with `expected`'s shapes and
    values (XLA refuses some programs: a TensorList of no fixed size, a Pad gradient of an
    empty tensor; and gets some wrong: the gradient of an empty strided slice of a [1, 3]
    value has shape [1, 4])."""
    try:
        with tf.device("CPU:0"):
            outputs, gradients = _function(program, _plain_inputs(program, values), False,
                                           run_time_sizes)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError):
        return False
    for want, got in zip(expected or (), list(outputs) + list(gradients)):
        if want.shape != tuple(got.shape) or not np.allclose(
                got.numpy(), want, rtol=1e-4, atol=1e-4, equal_nan=True):
            return False
    return True


def _plain_inputs(program, values):
    return [tf.Variable(v) if variable else tf.constant(v)
            for v, variable in zip(values, program.variables)]


def _plain(program, values):
    with tf.device("CPU:0"):
        outputs, gradients = _run(program, _plain_inputs(program, values), on_mesh=False)
    return [o.numpy() for o in outputs], [g.numpy() for g in gradients]


def _on_mesh(program, values):
    return [dtensor.DVariable(to_dtensor(v, layout)) if variable else to_dtensor(v, layout)
            for v, layout, variable in zip(values, program.layouts, program.variables)]


def _magnitude(values) -> float:
    return max((float(np.max(np.abs(v), initial=0.0)) for v in values), default=0.0)


def _tolerance(program, scale: float) -> float:
    # Sums in another order (partial sums, all-reduces) round differently, by a few ulps
    # of the terms summed.
    base = 1e-9 if program.dtype == tf.float64 else 2e-5
    return base * max(1.0, scale)


def _compare(program, how, expected_outputs, expected_gradients, outputs, gradients):
    # An output's rounding scales with its own values. A gradient is a sum over the backward
    # pass, whose terms can cancel to almost nothing (the gradient of a batch norm's offset
    # under a normalize, seed 90380: 2.6e-5 from terms of order 1): its rounding scales with
    # the backward pass's values, which the largest of the gradients and updated variables
    # stands for.
    gradient_scale = _magnitude(expected_gradients)
    for kind, expected, actual in (("output", expected_outputs, outputs),
                                   ("gradient/updated variable", expected_gradients, gradients)):
        for i, (e, a) in enumerate(zip(expected, actual)):
            scale = _magnitude([e]) if kind == "output" else gradient_scale
            what = f"{how}: {kind} {i}"
            assert a is not None, f"{what}: no gradient"
            assert dtensor.is_dtensor(a), f"{what}: not a DTensor (on {a.device})"
            layout = dtensor.fetch_layout(a)
            assert layout.mesh == program.mesh, f"{what}: on {layout.mesh}"
            assert a.dtype == program.dtype, f"{what}: dtype {a.dtype.name}"
            assert tuple(a.shape) == e.shape, f"{what}: shape {tuple(a.shape)}, expected {e.shape}"
            compiled = " with jit_compile" in how or "set_jit" in how
            assert_close(e, reassemble(a, replicas_close=compiled),
                         _tolerance(program, scale), f"{what} ({layout.short()})")


@pytest.mark.parametrize("seed", [*range(FIRST, FIRST + PROGRAMS), *REGRESSION_SEEDS])
def test_program_matches_one_device(seed):
    program = program_fuzz.draw(seed)
    values = program_fuzz.input_values(program)
    expected_outputs, expected_gradients = _plain(program, values)
    lowering = LOWERINGS[seed % len(LOWERINGS)]
    if program_fuzz.compiled(seed):   # the lowerings of meshes apart from the host (GPUs)
        lowering = ("ops", "copies")[seed // 4 % 2]
    text = program_fuzz.describe(program) + f"\n  lowering {lowering or 'default'}"
    try:
        with collective_lowering(lowering):
            outputs, gradients = run_strict(_run, program, _on_mesh(program, values), True)
            _compare(program, "eager", expected_outputs, expected_gradients, outputs, gradients)
            how = "tf.function"
            run_time_sizes = seed % 2 == 1 and _one_device_runs(program, values, True)
            if run_time_sizes:
                how += " traced with run-time sizes"
            jit = program_fuzz.compiled(seed) and _one_device_runs(
                program, values, False, expected_outputs + expected_gradients)
            if jit:
                how += (' under set_jit("autoclustering")' if program_fuzz.auto_clustered(seed)
                        else " with jit_compile=True")
            outputs, gradients = run_strict(_function, program, _on_mesh(program, values), True,
                                            run_time_sizes, jit)
            _compare(program, how, expected_outputs, expected_gradients, outputs, gradients)
    except Exception as error:   # the program is the reproducer
        raise AssertionError(f"{type(error).__name__}: {error}\n\nprogram:\n{text}") from error



_JIT_OFF = """
import sys
sys.path[:0] = [FUZZ, FUZZ + "/.."]
import conftest   # the suite's 8 virtual CPUs
import tensorflow as tf
import program_fuzz
import test_program_fuzz as t
from dtensor_testing import collective_lowering
tf.config.optimizer.set_jit(False)
program = program_fuzz.draw(70397)
assert "normalize(v2, axis=0)" in program_fuzz.describe(program), "the draw changed"
values = program_fuzz.input_values(program)
with collective_lowering("copies"):
    got = t.run_strict(t._function, program, t._on_mesh(program, values), True, True, False)
# Compared after: which of Grappler's rewrites happen depends on what ran before.
t._compare(program, "tf.function, XLA off", *t._plain(program, values), *got)
print("equal")
"""


def test_set_jit_off_leaves_the_replicas_of_a_replicated_result_equal():
    # `set_jit(False)` asks for XLA's OFF level, which is what the default is. Carried to
    # the SPMD function, its config_proto gave the function Grappler, whose constant
    # folding rewrote one device's x / 5 (a mean's gradient) into x * 0.2 and left the
    # other's alone: the replicas of a replicated gradient differed in the last bit (seed
    # 70397, after programs under set_jit). OFF is no longer carried. In a process of its
    # own, as Grappler's rewrites depend on what ran before.
    fuzz = os.path.dirname(os.path.abspath(__file__))
    result = run_python(f"FUZZ = {fuzz!r}\n" + _JIT_OFF, env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                        timeout=180)
    assert result.returncode == 0 and "equal" in result.stdout, result.stderr[-5000:]
