"""DVariables inside tf.function (cc/graph/function_expander.cc): reads, assignments in
program order, updates that keep the variable's layout, and training steps that match one
device.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, layout_of,
                             random_array, reassemble, run_without_fallback, spec_params,
                             to_dtensor)
from function_testing import MLP_PARAMS, MLP_X, MLP_Y, mlp_loss, num_expanded
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

_A = random_array((8, 8), seed=1)
_B = random_array((8, 4), seed=2)


# ---------------------------------------------------------------------------------------
# DVariables inside tf.function
# ---------------------------------------------------------------------------------------

_VAR_LAYOUTS = (spec_params(MESH_1D, ("[*,*]",), ("[x,*]",))
                + spec_params(MESH_2X2, ("[x,y]",), ("[*,y]",))
                + spec_params(MESH_8, ("[x,*]",)))


@pytest.mark.parametrize("layouts", _VAR_LAYOUTS)
def test_read_dvariable_in_function(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_A, layout))
    f = tf.function(lambda: v.read_value() * 2.0 + tf.reduce_sum(v))
    eager = v.read_value() * 2.0 + tf.reduce_sum(v)
    expected = _A * 2 + _A.sum()
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager), run_without_fallback(f))


@pytest.mark.parametrize("layouts", _VAR_LAYOUTS)
def test_assign_add_sub_then_read_in_one_function(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(np.zeros_like(_A), layout))
    c = random_array((8, 8), seed=20)

    @tf.function
    def update(a, b, c):
        v.assign(a)
        after_assign = v.read_value()
        v.assign_add(b)
        after_add = tf.identity(v)
        v.assign_sub(c)
        return after_assign, after_add, v.read_value()

    first, second, third = run_without_fallback(
        update, to_dtensor(_A, layout), to_dtensor(_B.repeat(2, axis=1), layout),
        to_dtensor(c, layout))
    b = _B.repeat(2, axis=1)
    assert_dtensor_equal(_A, layout, first)
    assert_dtensor_equal(_A + b, layout, second)
    assert_dtensor_equal(_A + b - c, layout, third)
    assert_dtensor_equal(_A + b - c, layout, v.read_value())
    # Again, from the new state: the function reads the variable, not a stale copy.
    update(to_dtensor(_A, layout), to_dtensor(_A, layout), to_dtensor(_A, layout))
    assert_dtensor_equal(_A, layout, v.read_value())


@pytest.mark.parametrize("layouts", _VAR_LAYOUTS)
def test_assign_then_read_of_the_same_variable_reads_the_new_value(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_A, layout))

    @tf.function
    def step():
        v.assign(v * 3.0)
        return v.read_value() + 1.0  # must see the assignment

    before = num_expanded()
    assert_dtensor_equal(_A * 3 + 1, layout, step())
    assert_dtensor_equal(_A * 9 + 1, layout, step())
    assert num_expanded() == before + 1
    assert_dtensor_equal(_A * 9, layout, v.read_value())


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]",))
                         + spec_params(MESH_2X2, ("[x,*]",), ("[x,y]",))
                         + spec_params(MESH_8, ("[x,*]",)))
def test_sharded_dvariable_sgd_update(layouts):
    (layout,) = layouts
    w = dtensor.DVariable(to_dtensor(_B, layout))
    x = random_array((4, 8), seed=21)
    plain = tf.Variable(_B)

    def make_step(var):
        @tf.function
        def step(inp):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.tanh(tf.matmul(inp, var)))
            grad = tape.gradient(loss, var)
            if isinstance(var, dtensor.DVariable):
                # The gradient of a sharded weight used with replicated data comes back
                # replicated (as eagerly); the variable keeps its layout.
                grad = dtensor.relayout(grad, var.layout)
            var.assign_sub(0.1 * grad)
            return loss
        return step

    dstep, pstep = make_step(w), make_step(plain)
    xd = to_dtensor(x, Layout.replicated(layout.mesh, 2))
    for _ in range(2):
        want = pstep(tf.constant(x))
        got = dstep(xd)
        assert_dtensor_equal(want, Layout.replicated(layout.mesh, 0), got)
        assert_dtensor_equal(plain.numpy(), layout, w.read_value())


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]",))
                         + spec_params(MESH_2X2, ("[x,y]",))
                         + spec_params(MESH_8, ("[x,*]",)))
def test_sharded_dvariable_elementwise_update_stays_sharded(layouts):
    # Data laid out as the variable: the gradient comes out in the variable's layout.
    (layout,) = layouts
    w = dtensor.DVariable(to_dtensor(_A, layout))
    plain = tf.Variable(_A)
    x = random_array((8, 8), seed=22)

    def make_step(var):
        @tf.function
        def step(inp):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(var * inp - 1.0))
            var.assign_sub(0.5 * tape.gradient(loss, var))
            return loss
        return step

    dstep, pstep = make_step(w), make_step(plain)
    for _ in range(3):
        want = pstep(tf.constant(x))
        got = run_without_fallback(dstep, to_dtensor(x, layout))
        assert_dtensor_equal(want, Layout.replicated(layout.mesh, 0), got)
        assert_dtensor_equal(plain.numpy(), layout, w.read_value())


def test_dvariable_created_by_a_callable_in_a_function(mesh_1d):
    layout = layout_of("[x,*]", mesh_1d)
    holder = {}

    @tf.function
    def accumulate(a):
        if "v" not in holder:
            holder["v"] = dtensor.DVariable(lambda: tf.ones([8, 8]), layout=layout)
        holder["v"].assign_add(a)
        return holder["v"].read_value()

    assert_dtensor_equal(_A + 1, layout, accumulate(to_dtensor(_A, layout)))
    assert_dtensor_equal(2 * _A + 1, layout, accumulate(to_dtensor(_A, layout)))
    assert holder["v"].layout == layout


@pytest.mark.parametrize("with_layout_argument", [False, True], ids=["dtensor", "layout="])
@pytest.mark.parametrize("layouts", _VAR_LAYOUTS)
def test_dvariable_created_in_a_function_from_a_value_made_outside(layouts,
                                                                   with_layout_argument):
    # The documented alternative to a callable: an initial value made outside the function
    # (an eager DTensor, or a regular tensor with `layout=`). Reading `.graph` of that eager
    # tensor raised AttributeError ("Tensor.graph is undefined when eager execution is
    # enabled") while tracing. The result must match a tf.Variable made so on one device.
    (layout,) = layouts
    initial = tf.constant(_B * 3.0) if with_layout_argument else to_dtensor(_B * 3.0, layout)
    holders = {"plain": [], "dtensor": []}

    def make(key, value, **kwargs):
        @tf.function
        def accumulate(a):
            if not holders[key]:
                holders[key].append(dtensor.DVariable(value, **kwargs) if key == "dtensor"
                                    else tf.Variable(value))
            holders[key][0].assign_add(a)
            return holders[key][0].read_value() * 2.0
        return accumulate

    plain = make("plain", tf.constant(_B * 3.0))
    sharded = make("dtensor", initial, **({"layout": layout} if with_layout_argument else {}))
    for step in range(2):
        want = plain(tf.constant(_B + step))
        got = run_without_fallback(sharded, to_dtensor(_B + step, layout))
        assert_dtensor_equal(want.numpy(), layout, got)
    assert holders["dtensor"][0].layout == layout
    assert_dtensor_equal(holders["plain"][0].numpy(), layout,
                         holders["dtensor"][0].read_value())


def test_dvariable_from_a_traced_tensor_in_a_function_is_refused_clearly(mesh_1d):
    # A DVariable made while tracing is created eagerly, once; a value computed inside the
    # function does not exist then. A callable initial value works (tested above).
    layout = layout_of("[x,*]", mesh_1d)
    holder = {}

    @tf.function(autograph=False)
    def accumulate(a):
        if "v" not in holder:
            holder["v"] = dtensor.DVariable(tf.zeros([8, 8]), layout=layout)
        holder["v"].assign_add(a)
        return holder["v"].read_value()

    with pytest.raises(RuntimeError, match="callable"):
        accumulate(to_dtensor(_A, layout))


@pytest.mark.parametrize("layouts", _VAR_LAYOUTS)
def test_read_before_assign_sees_the_old_value(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_A, layout))

    @tf.function
    def swap(a):
        old = v.read_value()
        v.assign(a)
        return old, v.read_value()

    old, new = swap(to_dtensor(_B.repeat(2, axis=1), layout))
    assert_dtensor_equal(_A, layout, old)
    assert_dtensor_equal(_B.repeat(2, axis=1), layout, new)


def test_dvariable_as_function_argument(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    v = dtensor.DVariable(to_dtensor(_A, layout))
    w = dtensor.DVariable(to_dtensor(-_A, layout))

    @tf.function
    def decay(var, a):
        var.assign_sub(a * 0.5)
        return var.read_value() * 2.0

    x = to_dtensor(_A, layout)
    assert_dtensor_equal(_A, layout, decay(v, x))
    assert_dtensor_equal(-3 * _A, layout, decay(w, x))
    assert_dtensor_equal(_A * 0.5, layout, v.read_value())
    assert_dtensor_equal(-1.5 * _A, layout, w.read_value())


def test_nested_functions_update_variables_in_order(mesh_1d):
    layout = layout_of("[x,*]", mesh_1d)
    v = dtensor.DVariable(to_dtensor(np.zeros_like(_A), layout))

    @tf.function
    def accumulate(a):
        v.assign_add(a)  # no results: only control outputs order it

    @tf.function
    def overwrite(var, a):
        var.assign(a * 5.0)
        return var.read_value()

    @tf.function
    def outer(a):
        accumulate(a)
        accumulate(a)
        after_two = v.read_value()
        written = overwrite(v, a)
        return after_two, written + v.read_value()

    after_two, doubled = outer(to_dtensor(_A, layout))
    assert_dtensor_equal(2 * _A, layout, after_two)
    assert_dtensor_equal(10 * _A, layout, doubled)
    assert_dtensor_equal(5 * _A, layout, v.read_value())


# A hand-written Adam step; the same code runs on plain tf.Variables and on DVariables.
_LR, _BETA1, _BETA2, _EPS = 0.05, 0.9, 0.999, 1e-7


def _make_adam_step(params, ms, vs, t):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = mlp_loss(x, y, *params)
        grads = tape.gradient(loss, params)
        t.assign_add(1.0)
        correction1 = 1.0 - tf.pow(_BETA1, t)
        correction2 = 1.0 - tf.pow(_BETA2, t)
        for p, m, v, g in zip(params, ms, vs, grads):
            m.assign(_BETA1 * m + (1.0 - _BETA1) * g)
            v.assign(_BETA2 * v + (1.0 - _BETA2) * tf.square(g))
            p.assign_sub(_LR * (m / correction1) / (tf.sqrt(v / correction2) + _EPS))
        return loss
    return step


_ADAM_CASES = [
    # (data layout, parameter layouts W1, b1, W2, b2)
    pytest.param(MESH_1D, "[x,*]", ("[*,*]", "[*]", "[*,*]", "[*]"), id="dp@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,*]", ("[*,*]", "[*]", "[*,*]", "[*]"), id="dp@mesh(x=2,y=2)"),
    # Data parallel over x, model parallel over y (column- then row-sharded weights).
    pytest.param(MESH_2X2, "[x,*]", ("[*,y]", "[y]", "[y,*]", "[*]"), id="dp-mp@mesh(x=2,y=2)"),
    pytest.param(MESH_8, "[x,*]", ("[*,*]", "[*]", "[*,*]", "[*]"), id="dp@mesh(x=8)"),
]


@pytest.mark.parametrize("mesh,data_spec,param_specs", _ADAM_CASES)
def test_adam_training_steps_match_one_device(mesh, data_spec, param_specs):
    param_layouts = [layout_of(s, mesh) for s in param_specs]
    plain_params = [tf.Variable(p) for p in MLP_PARAMS]
    plain_ms = [tf.Variable(np.zeros_like(p)) for p in MLP_PARAMS]
    plain_vs = [tf.Variable(np.zeros_like(p)) for p in MLP_PARAMS]
    plain_t = tf.Variable(0.0)
    d_params = [dtensor.DVariable(to_dtensor(p, l)) for p, l in zip(MLP_PARAMS, param_layouts)]
    d_ms = [dtensor.DVariable(to_dtensor(np.zeros_like(p), l))
            for p, l in zip(MLP_PARAMS, param_layouts)]
    d_vs = [dtensor.DVariable(to_dtensor(np.zeros_like(p), l))
            for p, l in zip(MLP_PARAMS, param_layouts)]
    d_t = dtensor.DVariable(to_dtensor(np.float32(0.0), Layout.replicated(mesh, 0)))
    plain_step = _make_adam_step(plain_params, plain_ms, plain_vs, plain_t)
    d_step = _make_adam_step(d_params, d_ms, d_vs, d_t)

    data = layout_of(data_spec, mesh)
    x, y = to_dtensor(MLP_X, data), to_dtensor(MLP_Y, data)
    before = num_expanded()
    for i in range(3):
        want = plain_step(tf.constant(MLP_X), tf.constant(MLP_Y))
        got = run_without_fallback(d_step, x, y)
        if i == 0:
            after_first = num_expanded()
            assert after_first > before
        else:  # later steps reuse the first expansion
            assert num_expanded() == after_first, f"step {i} expanded again"
        assert_dtensor_equal(want, Layout.replicated(mesh, 0), got)
        for name, p, dp, layout in zip(["w1", "b1", "w2", "b2"], plain_params, d_params,
                                       param_layouts):
            value = dp.read_value()
            assert dtensor.fetch_layout(value) == layout, f"step {i}, {name}"
            np.testing.assert_allclose(reassemble(value), p.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {i}, {name}")
        assert_dtensor_equal(plain_t.numpy(), Layout.replicated(mesh, 0), d_t.read_value())
