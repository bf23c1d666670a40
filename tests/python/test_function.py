"""Tests of tf.function over DTensors: one SPMD multi-device function per call
(cc/graph/function_expansion.cc).

Every sharded result is compared with the same tf.function run on plain tensors on one
device (value, dtype, global shape), and its layout with what the same ops give when run
eagerly on the same DTensors: the eager path is the layout reference.
"""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, layout_of, random_array, reassemble,
                             run_python, run_without_fallback, spec_params, to_dtensor)
from tf_dtensor import _device
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout


def num_expanded() -> int:
    return _device.get().num_expanded_functions


def _numpy(tensor) -> np.ndarray:
    return tensor.numpy()


def check_function(fn, arrays, layouts, *, reference=None, allow_fallback: bool = False):
    """Runs `tf.function(fn)` on plain tensors and on DTensors laid out as `layouts` (None: a
    plain tensor argument), and `fn` eagerly on the same DTensors.

    Each result must equal the plain one (value, dtype, global shape) and have the layout
    the eager run gives. `reference`, if given, is the program run on plain tensors instead
    of `fn` (for programs that use `dtensor.relayout`). Returns the DTensor results (a
    structure like fn's).
    """
    function = tf.function(fn)
    plain = tf.function(reference or fn)
    expected = tf.nest.map_structure(_numpy, plain(*[tf.constant(a) for a in arrays]))
    inputs = [tf.constant(a) if l is None else to_dtensor(a, l) for a, l in zip(arrays, layouts)]
    eager = fn(*inputs)
    if allow_fallback:
        actual = function(*inputs)
    else:
        actual = run_without_fallback(function, *inputs)
    tf.nest.assert_same_structure(expected, actual)
    for want, eager_result, got in zip(tf.nest.flatten(expected), tf.nest.flatten(eager),
                                       tf.nest.flatten(actual)):
        assert_dtensor_equal(want, dtensor.fetch_layout(eager_result), got)
        # The eager result must be right too, or the layout comparison means little.
        assert_values_equal(want, reassemble(eager_result), "eager reference")
    return actual


@pytest.fixture
def lenient_mode():
    """Strict mode off for one test (ops without rule run replicated), whatever
    TF_DTENSOR_STRICT says; the previous mode is restored."""
    previous = _device.get().strict
    dtensor.set_strict_mode(False)
    try:
        yield
    finally:
        dtensor.set_strict_mode(previous)


def _no_relayout(tensor, layout):
    """Stands in for `dtensor.relayout` in the plain-device reference run."""
    del layout
    return tensor


# ---------------------------------------------------------------------------------------
# Forward programs
# ---------------------------------------------------------------------------------------

_A = random_array((8, 8), seed=1)
_B = random_array((8, 4), seed=2)
_BIAS = random_array((4,), seed=3)


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]", "[*,*]"), ("[*,x]", "[x,*]"),
                                                ("[*,*]", "[*,x]"), ("[x,*]", "[x,*]"))
                         + spec_params(MESH_2X2, ("[x,*]", "[*,y]"), ("[x,y]", "[y,*]"),
                                       ("[*,y]", "[y,*]"), ("[y,x]", "[x,*]"), ("[x,y]", "[*,*]"))
                         + spec_params(MESH_8, ("[x,*]", "[*,*]"), ("[*,x]", "[x,*]")))
def test_matmul(layouts):
    check_function(lambda a, b: tf.matmul(a, b), [_A, _B], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[*,x]", "[x,*]"))
                         + spec_params(MESH_2X2, ("[*,y]", "[y,*]"), ("[x,y]", "[y,*]"))
                         + spec_params(MESH_8, ("[*,x]", "[x,*]")))
def test_matmul_contracting_a_sharded_axis_all_reduces_to_replicated(layouts):
    (result,) = check_function(lambda a, b: (tf.matmul(a, b),), [_A, _B], layouts)
    layout = dtensor.fetch_layout(result)
    contracted = layouts[0].sharding_specs[1]
    assert contracted not in layout.sharding_specs, layout.short()


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]", "[*,*]", "[*]"),
                                                ("[*,*]", "[*,x]", "[x]"))
                         + spec_params(MESH_2X2, ("[x,*]", "[*,y]", "[y]"),
                                       ("[x,y]", "[y,*]", "[*]"))
                         + spec_params(MESH_8, ("[x,*]", "[*,*]", "[*]")))
def test_dense_layer_bias_add_relu_softmax(layouts):
    def dense(a, w, b):
        h = tf.nn.bias_add(tf.matmul(a, w), b)
        return tf.nn.relu(h), tf.nn.softmax(h, axis=-1)

    check_function(dense, [_A, _B, _BIAS], layouts)


_REDUCTION_LAYOUTS = (spec_params(MESH_1D, ("[x,*]",), ("[*,x]",), ("[*,*]",))
                      + spec_params(MESH_2X2, ("[x,y]",), ("[y,x]",), ("[*,y]",))
                      + spec_params(MESH_8, ("[x,*]",), ("[*,x]",)))


@pytest.mark.parametrize("axis", [0, 1, None], ids=["axis0", "axis1", "all"])
@pytest.mark.parametrize("layouts", _REDUCTION_LAYOUTS)
def test_reductions(layouts, axis):
    def reduce(a):
        return (tf.reduce_sum(a, axis=axis), tf.reduce_mean(a, axis=axis),
                tf.reduce_max(a, axis=axis), tf.reduce_sum(a, axis=axis, keepdims=True))

    check_function(reduce, [_A], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]",), ("[*,x]",))
                         + spec_params(MESH_2X2, ("[x,y]",)))
def test_integer_reduction_keeps_the_dtype(layouts):
    ints = random_array((8, 8), dtype=np.int32, low=-50, high=50, seed=4)
    check_function(lambda a: (tf.reduce_sum(a, 0), tf.reduce_max(a)), [ints], layouts)


_SHAPE_FNS = {
    "reshape_flat": lambda a: tf.reshape(a, [-1]),
    "reshape_split": lambda a: tf.reshape(a, [8, 2, 4]),
    "reshape_merge_rows": lambda a: tf.reshape(a, [4, 16]),
    "transpose": lambda a: tf.transpose(a),
    "expand_dims": lambda a: (tf.expand_dims(a, 0), tf.expand_dims(a, -1)),
    "expand_squeeze": lambda a: tf.squeeze(tf.expand_dims(a, 1), axis=1),
    "shape_reshape": lambda a: tf.reshape(tf.reshape(a, [8, 4, 2]), [tf.shape(a)[0], -1]),
    "shape_arith": lambda a: a * tf.cast(tf.shape(a)[0], a.dtype) + tf.cast(tf.size(a), a.dtype),
}


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]",), ("[*,x]",))
                         + spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",))
                         + spec_params(MESH_8, ("[x,*]",)))
@pytest.mark.parametrize("name", sorted(_SHAPE_FNS))
def test_shape_ops(name, layouts):
    check_function(_SHAPE_FNS[name], [_A], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]",), ("[*,x]",))
                         + spec_params(MESH_2X2, ("[x,y]",))
                         + spec_params(MESH_8, ("[x,*]",)))
def test_python_scalars_and_captured_constants_broadcast(layouts):
    row = tf.constant(np.linspace(-1, 1, 8, dtype=np.float32))  # captured, plain, shape [8]
    col = tf.constant(np.arange(8, dtype=np.float32).reshape(8, 1))  # captured, plain, [8,1]

    def program(a):
        return 2.0 * a + 1, (a - 0.5) * row, a / (col + 1.0), tf.maximum(a, 0.25)

    check_function(program, [_A], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]", "[*,*]", "[*]"),
                                                ("[*,*]", "[*,x]", "[x]"))
                         + spec_params(MESH_2X2, ("[x,*]", "[*,*]", "[y]"),
                                       ("[*,*]", "[x,y]", "[*]"))
                         + spec_params(MESH_8, ("[x,*]", "[*,*]", "[*]")))
def test_mixed_replicated_and_sharded_inputs(layouts):
    c = random_array((8, 8), seed=5)
    v = random_array((8,), seed=6)
    check_function(lambda a, b, r: (a + b * r, tf.matmul(a, b) - r), [_A, c, v], layouts)


_WITH_PLAIN = [
    pytest.param((layout_of("[x,*]", MESH_1D), None), id="[x,*]-plain@mesh(x=2)"),
    pytest.param((None, layout_of("[*,x]", MESH_1D)), id="plain-[*,x]@mesh(x=2)"),
    pytest.param((layout_of("[x,y]", MESH_2X2), None), id="[x,y]-plain"),
]


@pytest.mark.parametrize("layouts", _WITH_PLAIN)
def test_plain_tensor_argument_joins_replicated(layouts):
    c = random_array((8, 8), seed=7)
    check_function(lambda a, b: (a * b, tf.matmul(a, b)), [_A, c], layouts)


def test_results_of_several_dtypes_and_the_input_itself(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)

    def program(a):
        return a, tf.cast(a > 0, tf.int32), tf.cast(a, tf.float64) * 2, tf.shape(a)

    check_function(program, [_A], [layout])


def test_nested_structure_and_host_results(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)

    @tf.function
    def program(a):
        return {"double": a * 2.0, "more": [tf.reduce_sum(a, axis=0), tf.constant(5)],
                "rows": tf.shape(a)[0]}

    x = to_dtensor(_A, layout)
    result = program(x)
    assert_dtensor_equal(_A * 2, dtensor.fetch_layout(x * 2.0), result["double"])
    assert_dtensor_equal(_A.sum(axis=0), dtensor.fetch_layout(tf.reduce_sum(x, axis=0)),
                         result["more"][0])
    # Values computed on the host join the mesh replicated.
    assert_dtensor_equal(np.int32(5), Layout.replicated(mesh_2x2, 0), result["more"][1])
    assert_dtensor_equal(np.int32(8), Layout.replicated(mesh_2x2, 0), result["rows"])


@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[x,*]", "[*,*]"),
                                                ("[x,*]", "[x,*]"))
                         + spec_params(MESH_2X2, ("[x,y]", "[y,*]"))
                         + spec_params(MESH_8, ("[x,*]", "[*,*]")))
def test_captured_dtensors(layouts):
    data_layout, weight_layout = layouts
    weight = to_dtensor(_A, weight_layout)  # captured by the closure, not an argument
    x = to_dtensor(_A * 0.5, data_layout)
    eager = (tf.matmul(x, weight), x + weight, weight * 2.0)
    function = tf.function(lambda a: (tf.matmul(a, weight), a + weight))
    only_captures = tf.function(lambda: weight * 2.0)
    got = run_without_fallback(function, x) + (run_without_fallback(only_captures),)
    expected = (np.matmul(_A * 0.5, _A), _A * 1.5, _A * 2)
    for want, reference, actual in zip(expected, eager, got):
        assert_dtensor_equal(want.astype(np.float32), dtensor.fetch_layout(reference), actual)


def test_input_signature_and_concrete_function(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    x = to_dtensor(_A, layout)
    with_signature = tf.function(lambda a: tf.nn.relu(a) * 3.0,
                                 input_signature=[tf.TensorSpec([8, 8], tf.float32)])
    concrete = tf.function(lambda a: tf.reduce_sum(a, axis=1)).get_concrete_function(
        tf.TensorSpec([8, 8], tf.float32))
    assert_dtensor_equal(np.maximum(_A, 0) * 3, dtensor.fetch_layout(tf.nn.relu(x) * 3.0),
                         with_signature(x))
    assert_dtensor_equal(_A.sum(axis=1), dtensor.fetch_layout(tf.reduce_sum(x, axis=1)),
                         concrete(x))


def test_plain_inputs_under_run_on_give_replicated_dtensors(mesh_2x2):
    f = tf.function(lambda a, b: tf.matmul(a, b) + 1.0)
    with dtensor.run_on(mesh_2x2):
        eager = tf.matmul(tf.constant(_A), tf.constant(_B)) + 1.0
        got = f(tf.constant(_A), tf.constant(_B))
    expected = np.matmul(_A, _B) + 1
    assert_dtensor_equal(expected, Layout.replicated(mesh_2x2, 2), eager)
    assert_dtensor_equal(expected, Layout.replicated(mesh_2x2, 2), got)


# ---------------------------------------------------------------------------------------
# The expansion cache
# ---------------------------------------------------------------------------------------

def test_second_call_with_the_same_layouts_reuses_the_expansion(mesh_2x2):
    f = tf.function(lambda a, b: tf.nn.relu(tf.matmul(a, b)))
    la, lb = layout_of("[x,*]", mesh_2x2), layout_of("[*,y]", mesh_2x2)
    before = num_expanded()
    first = f(to_dtensor(_A, la), to_dtensor(_B, lb))
    assert num_expanded() == before + 1
    # Same layouts and shapes, other values: cached.
    second = f(to_dtensor(-_A, la), to_dtensor(_B, lb))
    assert num_expanded() == before + 1
    expected = tf.nn.relu(tf.matmul(_A, _B)).numpy()
    expected_neg = tf.nn.relu(tf.matmul(-_A, _B)).numpy()
    layout = dtensor.fetch_layout(tf.nn.relu(tf.matmul(to_dtensor(_A, la), to_dtensor(_B, lb))))
    assert_dtensor_equal(expected, layout, first)
    assert_dtensor_equal(expected_neg, layout, second)


def test_a_different_layout_expands_again(mesh_2x2, mesh_1d):
    f = tf.function(lambda a: tf.reduce_sum(a * 2.0, axis=0))
    before = num_expanded()
    specs = [("[x,*]", mesh_2x2), ("[*,y]", mesh_2x2), ("[x,*]", mesh_1d)]
    for count, (spec, mesh) in enumerate(specs, start=1):
        x = to_dtensor(_A, layout_of(spec, mesh))
        result = f(x)
        assert num_expanded() == before + count, f"after {spec} on {mesh.short()}"
        eager_layout = dtensor.fetch_layout(tf.reduce_sum(x * 2.0, axis=0))
        assert_dtensor_equal(_A.sum(axis=0) * 2, eager_layout, result)
    # Back to the first: all three are cached.
    f(to_dtensor(_A, layout_of("[x,*]", mesh_2x2)))
    f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)))
    assert num_expanded() == before + len(specs)


def test_a_different_shape_expands_again(mesh_1d):
    f = tf.function(lambda a: a + 1.0)
    layout = layout_of("[x,*]", mesh_1d)
    before = num_expanded()
    f(to_dtensor(_A, layout))
    f(to_dtensor(_A, layout))
    assert num_expanded() == before + 1
    result = f(to_dtensor(_B, layout))
    assert num_expanded() == before + 2
    assert_dtensor_equal(_B + 1, layout, result)


def test_call_with_layout_request_is_part_of_the_cache_key(mesh_2x2):
    f = tf.function(lambda: tf.ones([8, 4]) * 2.0 + 1.0)
    before = num_expanded()
    for count, spec in enumerate(["[x,y]", "[y,*]"], start=1):
        layout = layout_of(spec, mesh_2x2)
        assert_dtensor_equal(np.full((8, 4), 3.0, np.float32), layout,
                             dtensor.call_with_layout(f, layout))
        assert num_expanded() == before + count
    dtensor.call_with_layout(f, layout_of("[x,y]", mesh_2x2))
    assert num_expanded() == before + 2


# ---------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------

_X = random_array((8, 4), seed=10)
_Y = random_array((8, 3), seed=11)
_W1 = random_array((4, 6), low=-1, high=1, seed=12)
_B1 = random_array((6,), low=-0.1, high=0.1, seed=13)
_W2 = random_array((6, 3), low=-1, high=1, seed=14)
_B2 = random_array((3,), low=-0.1, high=0.1, seed=15)
_PARAMS = [_W1, _B1, _W2, _B2]


def _mlp_loss(x, y, w1, b1, w2, b2):
    h = tf.nn.relu(tf.matmul(x, w1) + b1)
    out = tf.matmul(h, w2) + b2
    return tf.reduce_mean(tf.square(out - y))


def _loss_and_grads(x, y, *params):
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = _mlp_loss(x, y, *params)
    return loss, tape.gradient(loss, list(params))


# Batch-sharded data, replicated weights: data parallelism.
_DATA_PARALLEL = [
    pytest.param(mesh, id=mesh.short()) for mesh in (MESH_1D, MESH_2X2, MESH_8)]


def _data_parallel_inputs(mesh):
    batch = layout_of("[x,*]", mesh)
    params = [to_dtensor(p, Layout.replicated(mesh, p.ndim)) for p in _PARAMS]
    return [to_dtensor(_X, batch), to_dtensor(_Y, batch)] + params


@pytest.mark.parametrize("mesh", _DATA_PARALLEL)
def test_gradient_tape_inside_the_function(mesh):
    f = tf.function(_loss_and_grads)
    expected_loss, expected_grads = f(tf.constant(_X), tf.constant(_Y),
                                      *[tf.constant(p) for p in _PARAMS])
    inputs = _data_parallel_inputs(mesh)
    eager_loss, eager_grads = _loss_and_grads(*inputs)
    loss, grads = run_without_fallback(f, *inputs)
    assert_dtensor_equal(expected_loss, Layout.replicated(mesh, 0), loss)
    assert dtensor.fetch_layout(eager_loss) == Layout.replicated(mesh, 0)
    for want, eager, got, param in zip(expected_grads, eager_grads, grads, _PARAMS):
        # Weight gradients are all-reduced over the batch: replicated.
        assert dtensor.fetch_layout(eager) == Layout.replicated(mesh, param.ndim)
        assert_dtensor_equal(want, Layout.replicated(mesh, param.ndim), got)


@pytest.mark.parametrize("mesh", _DATA_PARALLEL)
def test_eager_tape_over_a_function_call(mesh):
    loss_fn = tf.function(_mlp_loss)
    _, expected_grads = _loss_and_grads(tf.constant(_X), tf.constant(_Y),
                                        *[tf.constant(p) for p in _PARAMS])
    inputs = _data_parallel_inputs(mesh)
    params = inputs[2:]
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = loss_fn(*inputs)
    grads = tape.gradient(loss, params)
    _, eager_grads = _loss_and_grads(*inputs)
    assert_dtensor_equal(_mlp_loss(tf.constant(_X), tf.constant(_Y),
                                   *[tf.constant(p) for p in _PARAMS]),
                         Layout.replicated(mesh, 0), loss)
    for want, eager, got, param in zip(expected_grads, eager_grads, grads, _PARAMS):
        assert dtensor.fetch_layout(eager) == Layout.replicated(mesh, param.ndim)
        assert_dtensor_equal(want, Layout.replicated(mesh, param.ndim), got)


def test_gradient_with_respect_to_a_sharded_input(mesh_2x2):
    def grad_of_input(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)) ** 2)
        return tape.gradient(loss, x)

    check_function(grad_of_input, [_A, _B],
                   [layout_of("[x,y]", mesh_2x2), layout_of("[y,*]", mesh_2x2)])


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
            loss = _mlp_loss(x, y, *params)
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
    plain_params = [tf.Variable(p) for p in _PARAMS]
    plain_ms = [tf.Variable(np.zeros_like(p)) for p in _PARAMS]
    plain_vs = [tf.Variable(np.zeros_like(p)) for p in _PARAMS]
    plain_t = tf.Variable(0.0)
    d_params = [dtensor.DVariable(to_dtensor(p, l)) for p, l in zip(_PARAMS, param_layouts)]
    d_ms = [dtensor.DVariable(to_dtensor(np.zeros_like(p), l))
            for p, l in zip(_PARAMS, param_layouts)]
    d_vs = [dtensor.DVariable(to_dtensor(np.zeros_like(p), l))
            for p, l in zip(_PARAMS, param_layouts)]
    d_t = dtensor.DVariable(to_dtensor(np.float32(0.0), Layout.replicated(mesh, 0)))
    plain_step = _make_adam_step(plain_params, plain_ms, plain_vs, plain_t)
    d_step = _make_adam_step(d_params, d_ms, d_vs, d_t)

    data = layout_of(data_spec, mesh)
    x, y = to_dtensor(_X, data), to_dtensor(_Y, data)
    before = num_expanded()
    for i in range(3):
        want = plain_step(tf.constant(_X), tf.constant(_Y))
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


# ---------------------------------------------------------------------------------------
# call_with_layout(tf.function(...))
# ---------------------------------------------------------------------------------------

_CREATION_LAYOUTS = (spec_params(MESH_1D, ("[x,*]",), ("[*,x]",), ("[*,*]",))
                     + spec_params(MESH_2X2, ("[x,y]",), ("[y,x]",), ("[*,y]",), ("[x,*]",))
                     + spec_params(MESH_8, ("[x,*]",), ("[*,x]",)))


@tf.function
def _ones_times_two_plus_one():
    return tf.ones([16, 8]) * 2.0 + 1.0


@tf.function
def _xavier_uniform(shape, seed, dtype=tf.float32):
    # As the DTensor training guide initialises its dense layers.
    fan_in, fan_out = shape
    limit = tf.math.sqrt(6.0 / (fan_in + fan_out))
    return tf.random.stateless_uniform(shape, seed=seed, minval=-limit, maxval=limit,
                                       dtype=dtype)


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_ones_arithmetic(layouts):
    (layout,) = layouts
    result = dtensor.call_with_layout(_ones_times_two_plus_one, layout)
    assert_dtensor_equal(np.full((16, 8), 3.0, np.float32), layout, result)


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_xavier_uniform_matches_one_device(layouts):
    (layout,) = layouts
    expected = _xavier_uniform(shape=(16, 8), seed=(3, 4))
    result = dtensor.call_with_layout(_xavier_uniform, layout, shape=(16, 8), seed=(3, 4))
    assert_dtensor_equal(expected, layout, result)
    limit = np.sqrt(6.0 / 24)
    values = reassemble(result)
    assert np.all(np.abs(values) <= limit) and values.std() > limit / 4


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_stateless_normal_with_tensor_seed(layouts):
    (layout,) = layouts
    normal = tf.function(tf.random.stateless_normal)
    seed = tf.constant([7, 8])
    expected = normal(shape=[16, 8], seed=seed)
    result = dtensor.call_with_layout(normal, layout, shape=[16, 8], seed=seed)
    assert_dtensor_equal(expected, layout, result)


_BROADCAST_CREATIONS = {
    "rank1_fill": lambda: tf.ones([8, 4]) + tf.fill([4], 2.0),
    "row_broadcast": lambda: tf.ones([1, 4]) * 3.0 + tf.zeros([8, 4]),
    "column_broadcast": lambda: tf.zeros([8, 4]) + tf.ones([8, 1]) * 2.0,
    "range": lambda: tf.ones([8, 4]) * tf.range(4.0),
    "random_product": lambda: (tf.random.stateless_uniform([8, 4], seed=[1, 2])
                               * tf.random.stateless_normal([4], seed=[3, 4])),
    "transpose_of_range": lambda: tf.transpose(tf.reshape(tf.range(32.0), [4, 8])),
}


@pytest.mark.parametrize("name", sorted(_BROADCAST_CREATIONS))
def test_call_with_layout_request_reaches_smaller_operands(name, mesh_2x2):
    # The request passes back through pointwise ops to operands of other shapes (a row,
    # a column, a rank-1 value), which cannot take it whole.
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(_BROADCAST_CREATIONS[name])
    assert_dtensor_equal(f(), layout, dtensor.call_with_layout(f, layout))


def _new_spmd_functions(before):
    """FunctionDefs of the SPMD functions expanded since `before` (a set of names)."""
    from tensorflow.python.eager import context
    names = [n for n in context.context().list_function_names()
             if "_tfd_spmd_" in n and n not in before]
    return [context.context().get_function_def(n) for n in names]


def _spmd_function_names():
    from tensorflow.python.eager import context
    return set(context.context().list_function_names())


@tf.function
def _ones_through_matmul_transpose_sum(a):
    w = tf.ones([64, 64])  # 1000 elements or more: a Fill op, not a constant
    return tf.reduce_sum(tf.matmul(a, tf.transpose(w)), axis=0, keepdims=True)


@pytest.mark.parametrize("mesh,spec,local_dims", [
    (MESH_1D, "[*,x]", [32, 64]),
    (MESH_2X2, "[*,y]", [32, 64]),
], ids=["[*,x]", "[*,y]"])
def test_call_with_layout_request_passes_back_through_matmul_transpose_and_sum(
        mesh, spec, local_dims):
    # MatMul, Transpose and Sum were not among the ops a request passed through before the
    # solver (cc/propagation/propagate.h): now their rules' Backward send the request
    # [*,x] on the result to the product ([*,x]), to transpose(w) ([*,x]) and to w
    # ([x,*]), so the ones are created sharded and the result needs no relayout.
    array = random_array((4, 64), seed=21)
    a = to_dtensor(array, layout_of("[*,*]", mesh))
    layout = layout_of(spec, mesh)
    before = _spmd_function_names()
    result = dtensor.call_with_layout(_ones_through_matmul_transpose_sum, layout, a)
    assert_dtensor_equal(_ones_through_matmul_transpose_sum(tf.constant(array)), layout, result)
    (expanded,) = _new_spmd_functions(before)
    nodes = {node.name: node for node in expanded.node_def}
    fills = [node for node in expanded.node_def if node.op == "Fill"]
    assert fills
    for fill in fills:
        dims = nodes[fill.input[0].split(":")[0]]
        assert list(tf.make_ndarray(dims.attr["value"].tensor)) == local_dims
    relayouts = [node.op for node in expanded.node_def
                 if node.op in ("Split", "SplitV", "Slice", "StridedSlice")]
    assert not relayouts


def test_call_with_layout_creation_into_dvariable(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    v = dtensor.DVariable(dtensor.call_with_layout(_xavier_uniform, layout, shape=(8, 4),
                                                   seed=(1, 2)))
    assert v.layout == layout
    assert_dtensor_equal(_xavier_uniform((8, 4), (1, 2)), layout, v.read_value())


# ---------------------------------------------------------------------------------------
# relayout inside tf.function
# ---------------------------------------------------------------------------------------

_RELAYOUT_CASES = (spec_params(MESH_1D, ("[x,*]", "[*,*]"), ("[*,*]", "[*,x]"),
                               ("[x,*]", "[*,x]"))
                   + spec_params(MESH_2X2, ("[x,y]", "[*,*]"), ("[*,*]", "[y,x]"),
                                 ("[x,*]", "[*,x]"), ("[x,y]", "[y,x]"))
                   + spec_params(MESH_8, ("[x,*]", "[*,x]")))


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_relayout_inside_function_is_honoured(layouts):
    source, target = layouts

    def program(a, relayout=dtensor.relayout):
        moved = relayout(a * 2.0, target)
        return moved, moved + 1.0

    moved, plus_one = check_function(program, [_A], [source],
                                     reference=lambda a: program(a, relayout=_no_relayout))
    assert dtensor.fetch_layout(moved) == target
    assert dtensor.fetch_layout(plus_one) == target


def _relayout_loss(a, w, target):
    return tf.reduce_sum(tf.sin(dtensor.relayout(a, target)) * w)


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_gradient_flows_through_relayout_in_function_eager_tape(layouts):
    source, target = layouts
    w = random_array((8, 8), seed=30)
    loss_fn = tf.function(_relayout_loss)
    x, wd = to_dtensor(_A, source), to_dtensor(w, target)

    def grad(loss):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(x, wd, target)
        return value, tape.gradient(value, x)

    eager_loss, eager_grad = grad(_relayout_loss)
    loss, got = grad(loss_fn)
    expected = np.cos(_A) * w
    assert_values_equal(expected, reassemble(eager_grad))
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager_grad), got)
    assert_dtensor_equal(np.sum(np.sin(_A) * w, dtype=np.float32),
                         dtensor.fetch_layout(eager_loss), loss)


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_gradient_flows_through_relayout_in_function_tape_inside(layouts):
    source, target = layouts
    w = random_array((8, 8), seed=30)

    def grads(a, w):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = _relayout_loss(a, w, target)
        return tape.gradient(loss, a)

    expected = np.cos(_A) * w
    eager = grads(to_dtensor(_A, source), to_dtensor(w, target))
    assert_values_equal(expected, reassemble(eager))
    got = tf.function(grads)(to_dtensor(_A, source), to_dtensor(w, target))
    assert got is not None, "tape.gradient through dtensor.relayout in tf.function is None"
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager), got)


def test_relayout_of_created_values_under_run_on(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(lambda: dtensor.relayout(tf.ones([8, 4]) * 3.0, layout))
    with dtensor.run_on(mesh_2x2):
        result = f()
    assert_dtensor_equal(np.full((8, 4), 3.0, np.float32), layout, result)


_TRACE_FIRST = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tf_dtensor import dtensor
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    f = tf.function(lambda a: dtensor.relayout(a * 2.0, layout))
    # Traced before any DTensor exists (as a training step traced ahead of time).
    f.get_concrete_function(tf.TensorSpec([4, 2], tf.float32))
    x = dtensor.copy_to_mesh(tf.ones([4, 2]), dtensor.Layout.replicated(mesh, 2))
    y = f(x)
    assert dtensor.fetch_layout(y) == layout, dtensor.fetch_layout(y)
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in dtensor.unpack(y)]),
                                  np.full([4, 2], 2.0, np.float32))
    print("ok")
""")


def test_relayout_traced_before_the_device_is_first_used():
    # A fresh process: in this one the device is registered already.
    result = run_python(_TRACE_FIRST, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_relayout_of_plain_tensor_in_function_without_mesh_scope(mesh_2x2):
    # With no DTensor input and no mesh in scope the call never reaches tf_dtensor; the
    # relayout then fails with a message saying how to run it, and works under run_on.
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(lambda: dtensor.relayout(tf.ones([8, 4]) * 3.0, layout))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"run_on\(mesh\)"):
        f()
    with dtensor.run_on(mesh_2x2):
        got = f()
    assert_dtensor_equal(np.full((8, 4), 3.0, np.float32), layout, got)


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
                   reference=lambda a: outer(a, relayout=_no_relayout))


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


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------

_TRACING = r"(?s)tf\.function|tracing"


def test_pack_while_tracing_raises_a_clear_error(mesh_1d):
    f = tf.function(lambda a: dtensor.pack([a, a], Layout.replicated(mesh_1d, 2)))
    with pytest.raises(RuntimeError, match=_TRACING):
        f(tf.constant(_A))


def test_unpack_while_tracing_raises_a_clear_error(mesh_1d):
    f = tf.function(lambda a: dtensor.unpack(a), autograph=False)
    with pytest.raises(RuntimeError, match=_TRACING):
        f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)))


def test_fetch_layout_while_tracing_raises_a_clear_error(mesh_1d):
    f = tf.function(lambda a: tf.constant(dtensor.fetch_layout(a).to_string()), autograph=False)
    with pytest.raises(RuntimeError, match=_TRACING):
        f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)))


def test_strict_mode_names_the_op_without_rule(strict_mode, mesh_1d):
    # tensor_diag_part runs DiagPart, which has no rule.
    f = tf.function(lambda a: tf.linalg.tensor_diag_part(a * 2.0))
    with pytest.raises(tf.errors.UnimplementedError, match=r"(?s)'DiagPart' has no tf_dtensor rule"):
        f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)))


def test_without_strict_mode_op_without_rule_runs_replicated(mesh_1d, lenient_mode):
    f = tf.function(lambda a: tf.math.cumprod(a, axis=0))
    x = to_dtensor(_A[:, :4] * 0.5, layout_of("[x,*]", mesh_1d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_dtensor.UnsupportedOpWarning)
        eager = tf.math.cumprod(x, axis=0)
        got = f(x)
    expected = np.cumprod(_A[:, :4] * 0.5, axis=0)
    assert_values_equal(expected, reassemble(eager))
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager), got)


def test_strict_mode_applies_to_an_already_expanded_function(mesh_1d, lenient_mode):
    f = tf.function(lambda a: tf.linalg.tensor_diag_part(a))
    x = to_dtensor(_A, layout_of("[*,x]", mesh_1d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_dtensor.UnsupportedOpWarning)
        f(x)
    dtensor.set_strict_mode(True)
    try:
        with pytest.raises(tf.errors.UnimplementedError, match="'DiagPart'"):
            f(x)
    finally:
        dtensor.set_strict_mode(False)


def test_uneven_relayout_in_function(mesh_8):
    six = np.arange(12, dtype=np.float32).reshape(6, 2)
    f = tf.function(lambda a: dtensor.relayout(a + 1.0, layout_of("[x,*]", mesh_8)))
    assert_dtensor_equal(six + 1.0, layout_of("[x,*]", mesh_8),
                         f(to_dtensor(six, Layout.replicated(mesh_8, 2))))


def test_uneven_call_with_layout_of_function(mesh_8):
    f = tf.function(lambda: tf.ones([6, 2]) * 2.0)
    assert_dtensor_equal(np.full((6, 2), 2.0, np.float32), layout_of("[x,*]", mesh_8),
                         dtensor.call_with_layout(f, layout_of("[x,*]", mesh_8)))


def test_inputs_sharded_on_two_meshes_raise(mesh_1d, mesh_2x2):
    f = tf.function(lambda a, b: a + b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="two meshes"):
        f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)), to_dtensor(_A, layout_of("[x,y]", mesh_2x2)))


def test_dvariable_on_another_mesh_raises(mesh_1d, mesh_2x2):
    v = dtensor.DVariable(to_dtensor(_A, Layout.replicated(mesh_2x2, 2)))
    f = tf.function(lambda a: v.read_value() + a)
    with pytest.raises(tf.errors.InvalidArgumentError, match="two meshes"):
        f(to_dtensor(_A, layout_of("[x,*]", mesh_1d)))


@pytest.mark.parametrize("how", ["argument", "capture"])
@pytest.mark.parametrize("other", [MESH_2X2, MESH_8], ids=lambda m: m.short())
def test_replicated_input_on_another_mesh_raises(other, how, mesh_1d):
    a = to_dtensor(_A, layout_of("[x,*]", mesh_1d))
    b = to_dtensor(_A * 100, Layout.replicated(other, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="different meshes"):
        a + b  # the eager reference
    if how == "argument":
        f = tf.function(lambda x, y: x + y)
        args = (a, b)
    else:
        f = tf.function(lambda x: x + b)
        args = (a,)
    with pytest.raises(tf.errors.InvalidArgumentError, match="two meshes"):
        f(*args)
