"""tf.function control flow over DTensors (cc/graph/control_flow.cc): nested function calls
(expanded with their arguments' layouts, and cached), If and While.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, cpus,
                             assert_values_equal, collective_lowering, layout_of, random_array,
                             reassemble, run_without_fallback, spec_params, to_dtensor)
from function_testing import check_function, no_relayout, num_expanded
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

# Shared by the sections below.
_A = random_array((8, 8), seed=1)
_B = random_array((8, 4), seed=2)


# ---------------------------------------------------------------------------------------
# Nested functions and control flow
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]", "[*,*]"),
                                                ("[*,x]", "[x,*]"))
                         + spec_params(MESH_2X2, ("[x,y]", "[y,*]"))
                         + spec_params(MESH_8, ("[x,*]", "[*,*]")))
def test_nested_functions(layouts):
    @tf.function
    def dense(a, w):
        return tf.nn.relu(tf.matmul(a, w))

    @tf.function
    def scale(a):
        return a * 0.5 + tf.reduce_mean(a)

    def outer(a, w):
        h = dense(a, w)
        return scale(h), dense(a * 2.0, w), tf.reduce_sum(scale(a), axis=0)

    check_function(outer, [_A, _B], layouts)


def test_nested_function_called_with_two_layouts(mesh_2x2):
    @tf.function
    def inner(a):
        return tf.reduce_sum(a * a, axis=1)

    def outer(a, relayout=dtensor.relayout):
        return inner(a), inner(relayout(a, layout_of("[*,y]", mesh_2x2)))

    check_function(outer, [_A], [layout_of("[x,y]", mesh_2x2)],
                   reference=lambda a: outer(a, relayout=no_relayout))


def test_three_levels_of_nesting_with_gradient(mesh_1d):
    @tf.function
    def level3(a, w):
        return tf.matmul(a, w)

    @tf.function
    def level2(a, w):
        return tf.tanh(level3(a, w))

    def level1(a, w):
        with tf.GradientTape() as tape:
            tape.watch(w)
            loss = tf.reduce_sum(level2(a, w))
        return loss, tape.gradient(loss, w)

    check_function(level1, [_A, _B], [layout_of("[x,*]", mesh_1d), layout_of("[*,*]", mesh_1d)])


def test_nested_expansion_is_cached(mesh_1d):
    inner = tf.function(lambda a: a + 1.0)
    outer = tf.function(lambda a: inner(a) * 2.0)
    x = to_dtensor(_A, layout_of("[x,*]", mesh_1d))
    before = num_expanded()
    assert_dtensor_equal((_A + 1) * 2, layout_of("[x,*]", mesh_1d), outer(x))
    after_first = num_expanded()
    assert after_first > before
    outer(x)
    assert num_expanded() == after_first


_PRED_CASES = [pytest.param(1.0, id="true"), pytest.param(-1.0, id="false")]


def _cond_program(a, p):
    return tf.cond(p > 0, lambda: tf.matmul(a, a) * 2.0, lambda: a - 1.0)


def _while_program(a):
    i = tf.constant(0)
    _, result = tf.while_loop(lambda i, r: i < 3, lambda i, r: (i + 1, r * 0.5 + a), (i, a))
    return result


@pytest.mark.parametrize("pred", _PRED_CASES)
def test_cond_values(pred, mesh_1d, lenient_mode):
    layout = layout_of("[x,*]", mesh_1d)
    expected = tf.function(_cond_program)(tf.constant(_A), tf.constant(pred))
    for p in (tf.constant(pred), to_dtensor(np.float32(pred), Layout.replicated(mesh_1d, 0))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tf_dtensor.UnsupportedOpWarning)
            got = tf.function(_cond_program)(to_dtensor(_A, layout), p)
        assert dtensor.is_dtensor(got)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert_values_equal(expected.numpy(), reassemble(got))


@pytest.mark.parametrize("pred", _PRED_CASES)
def test_cond_keeps_the_branch_layout(pred, mesh_1d, lenient_mode):
    layout = layout_of("[x,*]", mesh_1d)
    x = to_dtensor(_A, layout)
    branch = tf.matmul(x, x) * 2.0 if pred > 0 else x - 1.0
    got = run_without_fallback(tf.function(_cond_program), x,
                               to_dtensor(np.float32(pred), Layout.replicated(mesh_1d, 0)))
    assert dtensor.fetch_layout(got) == dtensor.fetch_layout(branch)


def test_while_loop_values(mesh_2x2, lenient_mode):
    layout = layout_of("[x,y]", mesh_2x2)
    expected = tf.function(_while_program)(tf.constant(_A))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_dtensor.UnsupportedOpWarning)
        got = tf.function(_while_program)(to_dtensor(_A, layout))
    assert dtensor.is_dtensor(got)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert_values_equal(expected.numpy(), reassemble(got))


def test_while_loop_keeps_the_layout(mesh_2x2, lenient_mode):
    layout = layout_of("[x,y]", mesh_2x2)
    got = run_without_fallback(tf.function(_while_program), to_dtensor(_A, layout))
    assert dtensor.fetch_layout(got) == layout  # r * 0.5 + a keeps a's layout eagerly


def _cond_of_two_shapes(a, flag):
    # The then branch gives 8 rows, the else branch 4.
    return tf.cond(flag, lambda: a * 2.0, lambda: a[:4])


def _switch_case_of_two_shapes(a, flag):
    # Branch 0 gives 3 rows, branch 1 16.
    return tf.switch_case(tf.cast(flag, tf.int32), [lambda: a[:3], lambda: tf.concat([a, a], 0)])


def _then_reduced_and_differentiated(program, gradient):
    def run(a, flag):
        with tf.GradientTape() as tape:
            tape.watch(a)
            out = program(a, flag)
            loss = tf.reduce_sum(out * out)
        return (out, tf.reduce_sum(out, axis=0)) + ((tape.gradient(loss, a),) if gradient else ())

    return run


@pytest.mark.parametrize("program", [_cond_of_two_shapes, _switch_case_of_two_shapes])
@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("spec", ["[*,*]", "[x,*]", "[*,x]"])
def test_branches_giving_different_shapes(program, flag, spec):
    # The result's rows are unknown until a branch runs. It used to take the first
    # branch's shape over the shards of the branch that ran ([8, 6] over components of 4
    # rows, devices with no row at all); now its size there is unknown, unsharded along it.
    # The gradient of out * out over a result of unknown rows with sharded columns needs a
    # reduction over axes known only when it runs (BroadcastGradientArgs): refused, typed.
    run = _then_reduced_and_differentiated(program, gradient=spec != "[*,x]")
    a = random_array((8, 6), seed=6)
    expected = tf.function(run)(tf.constant(a), tf.constant(flag))
    got = tf.function(run)(to_dtensor(a, layout_of(spec, MESH_8)), tf.constant(flag))
    for want, value in zip(expected, got):
        assert value.shape == want.shape and value.dtype == want.dtype
        assert_values_equal(want.numpy(), reassemble(value))
    # Unsharded along the rows whose number varies; the columns keep their sharding.
    assert dtensor.fetch_layout(got[0]) == layout_of("[*,x]" if spec == "[*,x]" else "[*,*]",
                                                     MESH_8)


def _growing_loop(a):
    # The loop variable gains i rows per iteration (shape_invariants [None, 6]).
    def body(i, x):
        return i + 1, tf.concat([x, x[:i]], axis=0)

    return tf.while_loop(lambda i, x: i < 3, body, [1, a],
                         shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, 6])])[1]


def _growing_loop_by_a_fixed_step(a):
    def body(i, x):
        return i + 1, tf.concat([x, x[:1] * 2.0], axis=0)

    return tf.while_loop(lambda i, x: i < 3, body, [0, a],
                         shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, 6])])[1]


def _shrinking_columns_loop(a):
    def body(i, x):
        return i + 1, x[:, 1:] * 2.0

    return tf.while_loop(lambda i, x: i < 3, body, [0, a],
                         shape_invariants=[tf.TensorShape([]), tf.TensorShape([8, None])])[1]


@pytest.mark.parametrize("program,unknown_axis", [(_growing_loop, 0),
                                                  (_growing_loop_by_a_fixed_step, 0),
                                                  (_shrinking_columns_loop, 1)])
@pytest.mark.parametrize("spec", ["[*,*]", "[x,*]", "[*,x]"])
def test_while_loop_variable_whose_shape_varies(program, unknown_axis, spec):
    # Used to come out claiming the entry shape [8, 6] over shards of 11 (or 2) rows, or
    # fail setting the shape of the While's results. The loop variable now enters with an
    # unknown size along the axis that changes, unsharded along it.
    def run(a):
        out = program(a)
        return out, tf.reduce_sum(out, axis=0), tf.reduce_sum(out, axis=1)

    a = random_array((8, 6), seed=5)
    expected = tf.function(run)(tf.constant(a))
    got = tf.function(run)(to_dtensor(a, layout_of(spec, MESH_8)))
    for want, value in zip(expected, got):
        assert value.shape == want.shape and value.dtype == want.dtype
        assert_values_equal(want.numpy(), reassemble(value))
    specs = list(layout_of(spec, MESH_8).sharding_specs)
    specs[unknown_axis] = "*"
    assert dtensor.fetch_layout(got[0]) == layout_of("[" + ",".join(specs) + "]", MESH_8)


def test_while_loop_variable_with_none_invariant_but_fixed_shape(mesh_2x2):
    # shape_invariants with None, but the body keeps the shape: runs, equal to one device.
    def program(a):
        def body(i, x):
            return i + 1, x * 0.5 + tf.reduce_sum(x)

        return tf.while_loop(lambda i, x: i < 3, body, [0, a],
                             shape_invariants=[tf.TensorShape([]),
                                               tf.TensorShape([None, None])])[1]

    check_function(program, [_A], [layout_of("[x,y]", mesh_2x2)])


def test_while_loop_collecting_pieces_of_varying_size_in_a_tensor_array(mesh_8):
    # The way out the error above names: a TensorArray of pieces of varying size.
    def program(a):
        ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True, infer_shape=False)

        def body(i, ta):
            return i + 1, ta.write(i, a[: i + 1] * 2.0)

        _, ta = tf.while_loop(lambda i, ta: i < 4, body, [0, ta])
        return ta.concat()

    for spec in ("[x,*]", "[*,x]"):
        check_function(program, [_A], [layout_of(spec, mesh_8)])


def test_training_loop_over_tf_range_updates_sharded_dvariable(mesh_1d):
    layout = layout_of("[x,*]", mesh_1d)
    v = dtensor.DVariable(to_dtensor(_A, layout))

    @tf.function
    def loop(n):
        for i in tf.range(n):
            v.assign_add(tf.ones_like(v) * tf.cast(i, tf.float32))
        return v.read_value()

    assert_dtensor_equal(_A + 3.0, layout, loop(tf.constant(3)))


def test_cond_updating_sharded_dvariable(mesh_1d):
    layout = layout_of("[x,*]", mesh_1d)
    v = dtensor.DVariable(to_dtensor(_A, layout))

    @tf.function
    def maybe_double(p):
        if p > 0:
            v.assign(v * 2.0)
        return v.read_value()

    assert_dtensor_equal(_A * 2, layout, maybe_double(tf.constant(1.0)))
    assert_dtensor_equal(_A * 2, layout, maybe_double(tf.constant(-1.0)))


@pytest.mark.parametrize("start", ["zeros_like", "replicated_zeros"])
def test_loop_accumulator_takes_the_sharding_of_what_it_accumulates(mesh_2x2, start):
    # Microbatching: an accumulator started from zeros (a host value in the function, or a
    # replicated one) that each step adds a sharded term to stays sharded, as in
    # TensorFlow's DTensor, instead of being gathered at the end of every iteration.
    layout = dtensor.Layout(["x", "y"], mesh_2x2)
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = dtensor.copy_to_mesh(tf.constant(value), layout)
    replicated = dtensor.Layout.replicated(mesh_2x2, 2)

    @tf.function
    def accumulate(a):
        acc = (tf.zeros_like(a) if start == "zeros_like"
               else dtensor.relayout(tf.zeros([4, 4]), replicated))
        for i in tf.range(3):
            acc += a * tf.cast(i, tf.float32)
        return acc

    out = accumulate(t)
    assert dtensor.fetch_layout(out) == layout
    np.testing.assert_allclose(reassemble(out), value * 3.0)


def test_cond_result_merges_the_branches_shardings(mesh_2x2):
    # One branch gives [x,*], the other [*,y]: the result is [x,y] (as TensorFlow's DTensor
    # gives it), each branch slicing what it left unsharded.
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(mesh_2x2, 2))

    @tf.function
    def pick(a, p):
        return tf.cond(p, lambda: dtensor.relayout(a * 2.0, layout_of("[x,*]", mesh_2x2)),
                       lambda: dtensor.relayout(a * 3.0, layout_of("[*,y]", mesh_2x2)))

    for flag, factor in ((True, 2.0), (False, 3.0)):
        out = pick(t, tf.constant(flag))
        assert dtensor.fetch_layout(out) == layout_of("[x,y]", mesh_2x2)
        np.testing.assert_allclose(reassemble(out), value * factor)


def _switch_program(index, a, b):
    # Three branches: elementwise (keeps [x,y]), a contraction over the sharded axis, and a
    # reduction whose result is replicated; index 7 is out of range and runs the last.
    return tf.switch_case(index, [lambda: a * 2.0 + b,
                                  lambda: tf.matmul(a, b, transpose_b=True),
                                  lambda: a - tf.reduce_mean(b, axis=0)])


@pytest.mark.parametrize("index", [0, 1, 2, 7])
def test_switch_case_runs_the_chosen_branch_without_gathering(index, mesh_2x2):
    """tf.switch_case (a Case op) expands every branch for its inputs' layouts, as If does;
    it had no rule and gathered its inputs with a warning. The result is [x,y] whichever
    branch runs: the branches' [x,y], [x,*] and [x,y] merged."""
    a, b = random_array((4, 4), seed=5), random_array((4, 4), seed=6)
    layout = layout_of("[x,y]", mesh_2x2)
    want = tf.function(_switch_program)(tf.constant(index), tf.constant(a), tf.constant(b))
    for i in (tf.constant(index), to_dtensor(np.int32(index), Layout.replicated(mesh_2x2, 0))):
        got = run_without_fallback(tf.function(_switch_program), i, to_dtensor(a, layout),
                                   to_dtensor(b, layout))
        assert_dtensor_equal(want.numpy(), layout, got)


def test_switch_case_result_merges_the_branches_shardings(mesh_2x2):
    # Branches giving [x,*], [*,y] and [*,*]: the result is [x,y] (If's merge, over every
    # branch), and each branch slices what it left unsharded.
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(mesh_2x2, 2))

    @tf.function
    def pick(a, i):
        return tf.switch_case(i, [lambda: dtensor.relayout(a * 2.0, layout_of("[x,*]", mesh_2x2)),
                                  lambda: dtensor.relayout(a * 3.0, layout_of("[*,y]", mesh_2x2)),
                                  lambda: a * 4.0])

    for index, factor in ((0, 2.0), (1, 3.0), (2, 4.0)):
        out = run_without_fallback(pick, t, tf.constant(index))
        assert dtensor.fetch_layout(out) == layout_of("[x,y]", mesh_2x2)
        np.testing.assert_allclose(reassemble(out), value * factor)


def test_switch_case_gradient_equals_one_device(mesh_2x2):
    a = random_array((4, 4), seed=7)
    layout = layout_of("[x,y]", mesh_2x2)

    def loss_and_grad(x, index):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.switch_case(index, [lambda: tf.sin(x), lambda: x * x]) ** 2)
        return loss, tape.gradient(loss, x)

    for index in (0, 1):
        want_loss, want_grad = tf.function(loss_and_grad)(tf.constant(a), tf.constant(index))
        loss, grad = run_without_fallback(tf.function(loss_and_grad), to_dtensor(a, layout),
                                          tf.constant(index))
        assert_values_equal(want_loss.numpy(), reassemble(loss))
        assert_dtensor_equal(want_grad.numpy(), layout, grad)


def test_switch_case_index_read_from_sharded_data(mesh_1d):
    # Every device must pick the same branch: the index is gathered to a replicated scalar
    # first, not taken from each device's block.
    a = to_dtensor(random_array((4, 4), seed=8), layout_of("[x,*]", mesh_1d))
    @tf.function
    def pick(a, i):
        return tf.switch_case(i[0], [lambda: a * 2.0, lambda: a * 3.0])

    index = to_dtensor(np.array([1, 0, 0, 0], dtype=np.int32), layout_of("[x]", mesh_1d))
    assert_dtensor_equal(reassemble(a) * 3.0, layout_of("[x,*]", mesh_1d), pick(a, index))


def _loss_and_grads_around_a_loop(branching):
    """A tf.function of (w, xs, chooser): the loss of `branching(chooser, loop, xs)`, one of
    whose branches runs a tanh recurrence over xs's rows with w, and its gradients with
    respect to w and xs."""

    @tf.function
    def loss_and_grads(w, xs, chooser):
        with tf.GradientTape() as tape:
            tape.watch([w, xs])

            def loop():
                _, h = tf.while_loop(
                    lambda i, h: i < 3,
                    lambda i, h: (i + 1, tf.tanh(tf.linalg.matvec(w, h) + xs[i])), (0, xs[0]))
                return h

            loss = tf.reduce_sum(branching(chooser, loop, xs) ** 2)
        return (loss, *tape.gradient(loss, [w, xs]))

    return loss_and_grads


def _check_gradients_around_a_loop(branching, chooser, w_spec, seed, lowering=""):
    xs = random_array((5, 8), seed=seed)
    loss_and_grads = _loss_and_grads_around_a_loop(branching)
    expected = loss_and_grads(tf.constant(_A / 8), tf.constant(xs), tf.constant(chooser))
    with collective_lowering(lowering):
        actual = run_without_fallback(tf.function(loss_and_grads.python_function),
                                      to_dtensor(_A / 8, layout_of(w_spec, MESH_8)),
                                      to_dtensor(xs, layout_of("[*,x]", MESH_8)),
                                      to_dtensor(np.array(chooser), layout_of("[]", MESH_8)))
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == tuple(e.shape)
        assert_values_equal(e.numpy(), reassemble(a))


@pytest.mark.parametrize("lowering", ["", "ops"], ids=["auto", "ops"])
@pytest.mark.parametrize("pred", [True, False])
@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]"])
def test_gradient_of_a_cond_around_a_while_loop_with_a_sharded_input(spec, pred, lowering):
    # cond_v2's gradient wraps the branch's intermediates in optionals (OptionalFromValue,
    # OptionalNone in the other branch, OptionalGetValue in the gradient branch), the
    # loop's accumulator lists of sharded elements among them.
    _check_gradients_around_a_loop(
        lambda pred, loop, xs: tf.cond(pred, loop, lambda: xs[1] * 2.0), pred, spec, seed=3,
        lowering=lowering)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_gradient_of_a_switch_case_around_a_while_loop_with_a_sharded_input(index):
    # As tf.cond's: Case's gradient wraps each branch's intermediates in optionals, the
    # branches that do not run giving OptionalNone, over three branches here.
    _check_gradients_around_a_loop(
        lambda index, loop, xs: tf.switch_case(
            index, [lambda: xs[1] * 2.0, loop, lambda: tf.sin(xs[2])]),
        np.int32(index), "[x,*]", seed=4)


@pytest.mark.parametrize("lowering", ["ops", "copies"])
def test_a_loop_that_updates_a_dvariable_waits_for_every_devices_read_before_it(lowering):
    # Where devices share no buffers each op waits only for its own device's part of its
    # control inputs; the While (placed on the host, CPU:0, also the mesh's first device)
    # then waited only for CPU:0's read, and the loop's assigns on the other devices could
    # run before their reads: `before` sometimes held the values after the loop.
    mesh = dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
    start = random_array((6, 4), seed=3)
    with collective_lowering(lowering):
        v = dtensor.DVariable(to_dtensor(start, layout_of("[x,y]", mesh)))

        @tf.function
        def step(p):
            if p > 0:
                v.assign(v * 0.5)
            before = v.read_value() + 1.0

            def body(i, total):
                v.assign_add(tf.fill(v.shape, tf.cast(i, tf.float32)))
                return i + 1, total + tf.reduce_sum(v)

            _, total = tf.while_loop(lambda i, total: i < 4, body, [0, 0.0])
            return before, total

        want = start
        for _ in range(30):
            before, total = step(tf.constant(1.0))
            want = want * 0.5
            want_total = sum((want + sum(range(k + 1))).sum() for k in range(4))
            assert_dtensor_equal(want + 1.0, layout_of("[x,y]", mesh), before)
            np.testing.assert_allclose(reassemble(total), want_total, rtol=1e-5)
            want = want + 6.0
        assert_values_equal(want, reassemble(v.read_value()))
