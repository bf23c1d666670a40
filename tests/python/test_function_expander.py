"""tf.function over DTensors: one SPMD multi-device function per call
(cc/graph/function_expansion.cc, graph_builder.cc): forward programs, the expansion cache,
gradients and the errors raised while tracing or expanding.

Every sharded result is compared with the same tf.function run on plain tensors on one
device (value, dtype, global shape), and its layout with what the same ops give when run
eagerly on the same DTensors: the eager path is the layout reference (check_function).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, layout_of, random_array, reassemble,
                             run_without_fallback, spec_params, to_dtensor)
from function_testing import MLP_PARAMS, MLP_X, MLP_Y, check_function, mlp_loss, num_expanded
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

# Shared by the sections below.
_A = random_array((8, 8), seed=1)
_B = random_array((8, 4), seed=2)


# ---------------------------------------------------------------------------------------
# Forward programs
# ---------------------------------------------------------------------------------------

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


def test_the_calls_run_options_reach_the_spmd_function():
    """TF gives every tf.function call its run options (`config_proto`, with soft placement,
    and `executor_type`); the SPMD function runs with the executor type, and on meshes of
    accelerators with soft placement. Without it, an op with no kernel for the mesh's
    devices (CholeskyGrad, ResizeBicubic on GPUs) failed to place inside a function where
    one device runs it on the host. Soft placement cannot be seen on CPUs, so this checks
    the executor type, which travels the same way: an unknown one fails as it does on
    plain tensors."""
    from tensorflow.python.eager import context
    fn = lambda t: t * 3   # noqa: E731
    sharded = to_dtensor(_A, layout_of("[x,*]", MESH_1D))
    expected = tf.function(fn)(tf.constant(_A))
    assert_values_equal(expected.numpy(), reassemble(tf.function(fn)(sharded)))
    with context.function_executor_type("NO_SUCH_EXECUTOR"):
        with pytest.raises(tf.errors.NotFoundError, match="NO_SUCH_EXECUTOR"):
            tf.function(fn)(tf.constant(_A))
        with pytest.raises(tf.errors.NotFoundError, match="NO_SUCH_EXECUTOR"):
            tf.function(fn)(sharded)


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

def _loss_and_grads(x, y, *params):
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = mlp_loss(x, y, *params)
    return loss, tape.gradient(loss, list(params))


# Batch-sharded data, replicated weights: data parallelism.
_DATA_PARALLEL = [
    pytest.param(mesh, id=mesh.short()) for mesh in (MESH_1D, MESH_2X2, MESH_8)]


def _data_parallel_inputs(mesh):
    batch = layout_of("[x,*]", mesh)
    params = [to_dtensor(p, Layout.replicated(mesh, p.ndim)) for p in MLP_PARAMS]
    return [to_dtensor(MLP_X, batch), to_dtensor(MLP_Y, batch)] + params


@pytest.mark.parametrize("mesh", _DATA_PARALLEL)
def test_gradient_tape_inside_the_function(mesh):
    f = tf.function(_loss_and_grads)
    expected_loss, expected_grads = f(tf.constant(MLP_X), tf.constant(MLP_Y),
                                      *[tf.constant(p) for p in MLP_PARAMS])
    inputs = _data_parallel_inputs(mesh)
    eager_loss, eager_grads = _loss_and_grads(*inputs)
    loss, grads = run_without_fallback(f, *inputs)
    assert_dtensor_equal(expected_loss, Layout.replicated(mesh, 0), loss)
    assert dtensor.fetch_layout(eager_loss) == Layout.replicated(mesh, 0)
    for want, eager, got, param in zip(expected_grads, eager_grads, grads, MLP_PARAMS):
        # Weight gradients are all-reduced over the batch: replicated.
        assert dtensor.fetch_layout(eager) == Layout.replicated(mesh, param.ndim)
        assert_dtensor_equal(want, Layout.replicated(mesh, param.ndim), got)


@pytest.mark.parametrize("mesh", _DATA_PARALLEL)
def test_eager_tape_over_a_function_call(mesh):
    loss_fn = tf.function(mlp_loss)
    _, expected_grads = _loss_and_grads(tf.constant(MLP_X), tf.constant(MLP_Y),
                                        *[tf.constant(p) for p in MLP_PARAMS])
    inputs = _data_parallel_inputs(mesh)
    params = inputs[2:]
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = loss_fn(*inputs)
    grads = tape.gradient(loss, params)
    _, eager_grads = _loss_and_grads(*inputs)
    assert_dtensor_equal(mlp_loss(tf.constant(MLP_X), tf.constant(MLP_Y),
                                   *[tf.constant(p) for p in MLP_PARAMS]),
                         Layout.replicated(mesh, 0), loss)
    for want, eager, got, param in zip(expected_grads, eager_grads, grads, MLP_PARAMS):
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
