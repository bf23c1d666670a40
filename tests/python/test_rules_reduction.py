"""Numerical checks of cc/rules/reduction_rules.cc: Sum/Mean/Max/Min/Prod, ArgMax,
Softmax and LogSoftmax, the softmax cross entropies, BiasAddGrad, L2Loss, Cumsum,
Cumprod and CumulativeLogsumexp.

    sum([x,*], axis=1) -> [x]                       (local)
    sum([x,*], axis=0) -> partial(x) -> all-reduce -> [*]
    mean([x,*], axis=0) -> local sum, all-reduce(sum), divide by the global count
    argmax([x,*], axis=0) -> the input is first gathered along axis 0 -> [*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, check_op, is_replicated,
                             layout_of, layout_params, random_array, reassemble,
                             run_without_fallback, spec_params, to_dtensor)

SHAPE = (4, 8)

REDUCTIONS = {
    "Sum": tf.reduce_sum,
    "Mean": tf.reduce_mean,
    "Max": tf.reduce_max,
    "Min": tf.reduce_min,
    "Prod": tf.reduce_prod,
}
AXES = {"axis0": [0], "axis1": [1], "both": [0, 1]}


def _data(name: str, dtype) -> np.ndarray:
    if dtype == np.int32:
        # Negative values make the integer Mean's truncation visible; Prod stays small.
        low, high = (-1, 2) if name == "Prod" else (-9, 7)
        return random_array(SHAPE, np.int32, low, high, seed=7)
    # Positive values: no cancellation in sums, and a well-conditioned product.
    return random_array(SHAPE, np.float32, 0.5, 1.5, seed=7)


def _check_reduction(name, dtype, axes, keepdims, layouts):
    reduce = REDUCTIONS[name]
    axis = AXES[axes]

    def fn(x):
        return reduce(x, axis=axis, keepdims=keepdims)

    check_op(fn, name, [_data(name, dtype)], layouts, host_inputs=[([len(axis)], axis)],
             attrs={"keep_dims": keepdims})


@pytest.mark.parametrize("keepdims", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("axes", sorted(AXES))
@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["f32", "i32"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",)))
def test_reduce(layouts, name, dtype, axes, keepdims):
    _check_reduction(name, dtype, axes, keepdims, layouts)


@pytest.mark.parametrize("axes", sorted(AXES))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("layouts", spec_params(MESH_1D, ("[*,x]",)))
def test_reduce_1d(layouts, name, axes):
    _check_reduction(name, np.float32, axes, False, layouts)


@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_reduce_sum_every_layout(layouts):
    _check_reduction("Sum", np.float32, "axis0", False, layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,y]",)))
def test_reduce_negative_axis(layouts):
    check_op(lambda x: tf.reduce_sum(x, axis=-1), "Sum", [_data("Sum", np.float32)], layouts,
             host_inputs=[([1], [-1])])


def test_integer_mean_truncates_like_tensorflow(mesh_2x2):
    # Column sums -3 and 5 over 4 rows: TF's integer Mean gives trunc(-0.75)=0, trunc(1.25)=1.
    x = np.array([[-3, 5], [0, 0], [0, 0], [0, 0]], dtype=np.int32)
    layout = layout_of("[x,*]", mesh_2x2)
    out = tf.reduce_mean(to_dtensor(x, layout), axis=0)
    assert_dtensor_equal(np.array([0, 1], np.int32), layout_of("[*]", mesh_2x2), out)
    assert tf.reduce_mean(tf.constant(x), axis=0).numpy().tolist() == [0, 1]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.float32],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_mean_of_no_elements_over_sharded_axes_is_one_devices(mesh_2x2, dtype, traced):
    # One device's complex Mean of nothing is 0 (a float one NaN); sum / count over the
    # sharded axes gave NaN for complex numbers too.
    x = np.zeros((0, 4), dtype)
    mean = tf.function(tf.reduce_mean) if traced else tf.reduce_mean
    for axis, spec in [(0, "[y]"), (None, "[]")]:
        out = mean(to_dtensor(x, layout_of("[x,y]", mesh_2x2)), axis=axis)
        assert_dtensor_equal(tf.reduce_mean(x, axis=axis), layout_of(spec, mesh_2x2), out)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_argmax(layouts, axis):
    # Distinct values: no ties, so the index is unambiguous.
    x = np.random.default_rng(9).permutation(32).reshape(SHAPE).astype(np.float32)
    check_op(lambda t: tf.argmax(t, axis=axis), "ArgMax", [x], layouts,
             host_inputs=[([], [axis])])


@pytest.mark.parametrize("fn,op_name", [(tf.nn.softmax, "Softmax"),
                                        (tf.nn.log_softmax, "LogSoftmax")],
                         ids=["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_softmax(layouts, fn, op_name):
    check_op(fn, op_name, [random_array(SHAPE)], layouts)


# Golden plans from the header of reduction_rules.cc.
@pytest.mark.parametrize("op_name,spec,axes,keep_dims,expected,all_reduce", [
    pytest.param("Sum", "[x,*]", [1], False, "[x]", None, id="Sum-[x,*]-axis1"),
    pytest.param("Sum", "[x,*]", [0], False, "[*]", "all-reduce(sum)", id="Sum-[x,*]-axis0"),
    pytest.param("Sum", "[x,y]", [0], True, "[*,y]", "all-reduce(sum)", id="Sum-[x,y]-axis0-keep"),
    pytest.param("Mean", "[x,*]", [0], False, "[*]", "all-reduce(sum)", id="Mean-[x,*]-axis0"),
    pytest.param("Max", "[x,y]", [0, 1], False, "[]", "all-reduce(max)", id="Max-[x,y]-both"),
    pytest.param("Min", "[*,y]", [1], False, "[*]", "all-reduce(min)", id="Min-[*,y]-axis1"),
    pytest.param("ArgMax", "[x,*]", [0], False, "[*]", None, id="ArgMax-[x,*]-axis0"),
])
def test_reduction_plan(op_name, spec, axes, keep_dims, expected, all_reduce, mesh_2x2):
    plan = tf_dtensor.debug.explain(op_name, [layout_of(spec, mesh_2x2), None],
                                    [list(SHAPE), [len(axes)]], int_values={1: axes},
                                    attrs={"keep_dims": keep_dims})
    assert plan["outputs"] == [layout_of(expected, mesh_2x2)]
    reduces = [c for c in plan["collectives"] if "all-reduce" in c]
    if all_reduce is None:
        assert reduces == []
    else:
        assert len(reduces) == 1 and all_reduce in reduces[0], plan["collectives"]


def test_reduction_axis_out_of_range_names_the_op(mesh_2x2):
    with pytest.raises(ValueError, match=r"(?s)out of range.*'Sum'"):
        tf_dtensor.debug.explain("Sum", [layout_of("[x,*]", mesh_2x2), None], [[4, 8], [1]],
                                 int_values={1: [2]})


# Cross entropies: the class axis is gathered, the batch axis keeps either input's sharding.
LOGITS = (8, 4)


def _labels(seed=3):
    return random_array((LOGITS[0],), np.int32, 0, LOGITS[1] - 1, seed=seed)


@pytest.mark.parametrize("output", [0, 1], ids=["loss", "backprop"])
@pytest.mark.parametrize("layouts", layout_params(LOGITS, (LOGITS[0],)))
def test_sparse_softmax_cross_entropy(layouts, output):
    def fn(logits, labels):
        return tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits,
                                                              labels=labels)[output]

    check_op(fn, "SparseSoftmaxCrossEntropyWithLogits", [random_array(LOGITS), _labels()],
             layouts, output=output)


@pytest.mark.parametrize("output", [0, 1], ids=["loss", "backprop"])
@pytest.mark.parametrize("layouts", layout_params(
    LOGITS, LOGITS, meshes=[MESH_2X2],
    select=lambda c: c[0] == c[1] or is_replicated(c[0]) or is_replicated(c[1])))
def test_softmax_cross_entropy(layouts, output):
    labels = tf.nn.softmax(random_array(LOGITS, seed=4)).numpy()

    def fn(logits, labels_):
        return tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=logits, labels=labels_)[output]

    check_op(fn, "SoftmaxCrossEntropyWithLogits", [random_array(LOGITS), labels], layouts,
             output=output)


@pytest.mark.parametrize("layouts", layout_params(LOGITS, (1, LOGITS[1]), meshes=[MESH_2X2]))
def test_softmax_cross_entropy_broadcasts_labels(layouts):
    labels = tf.nn.softmax(random_array((1, LOGITS[1]), seed=4)).numpy()
    check_op(lambda l, t: tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=l, labels=t)[0],
             "SoftmaxCrossEntropyWithLogits", [random_array(LOGITS), labels], layouts)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("layouts", layout_params((4, 8, 2)))
def test_bias_add_grad(layouts, data_format):
    check_op(lambda g: tf.raw_ops.BiasAddGrad(out_backprop=g, data_format=data_format),
             "BiasAddGrad", [random_array((4, 8, 2))], layouts, attrs={"data_format": data_format})


@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_l2_loss(layouts):
    check_op(tf.nn.l2_loss, "L2Loss", [random_array(SHAPE)], layouts)


SCANS = {"Cumsum": tf.math.cumsum, "Cumprod": tf.math.cumprod,
         "CumulativeLogsumexp": tf.math.cumulative_logsumexp}


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op_name", sorted(SCANS))
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_scan(layouts, op_name, axis):
    check_op(lambda x: SCANS[op_name](x, axis=axis), op_name,
             [random_array(SHAPE, low=0.5, high=1.5)], layouts, host_inputs=[([], [axis])])


@pytest.mark.parametrize("options", [{"exclusive": True}, {"reverse": True},
                                     {"exclusive": True, "reverse": True}],
                         ids=["exclusive", "reverse", "both"])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,x]",)))
def test_scan_options(layouts, axis, options):
    check_op(lambda x: tf.math.cumsum(x, axis=axis, **options), "Cumsum",
             [random_array(SHAPE)], layouts, host_inputs=[([], [axis])])


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,y]",)))
def test_sum_keep_dims_as_in_gradients(layouts):
    # softmax's gradient: sum(grad * softmax, -1, keepdims=True), then broadcast back.
    x = random_array(SHAPE)
    check_op(lambda t: tf.reduce_sum(t, axis=-1, keepdims=True), "Sum", [x], layouts,
             host_inputs=[([1], [-1])], attrs={"keep_dims": True})
    out = run_without_fallback(lambda t: t - tf.reduce_sum(t, axis=-1, keepdims=True),
                               to_dtensor(x, layouts[0]))
    assert_dtensor_equal(x - x.sum(axis=-1, keepdims=True), layouts[0], out)


# reduce_logsumexp is composed (Max, StopGradient, Sub, Exp, Sum, Log, Add, IsFinite,
# SelectV2): over a sharded axis every piece has a rule, so it runs in strict mode and
# matches one device, eagerly, in tf.function and through its gradient; large values
# check that the max is taken over the whole axis (exp would overflow otherwise).
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("axis", [0, 1, None], ids=["axis0", "axis1", "all"])
@pytest.mark.parametrize("layouts", layout_params((4, 6)))
def test_reduce_logsumexp(layouts, axis, in_function):
    x = random_array((4, 6), low=-50.0, high=100.0, seed=9)

    def value_and_grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.math.reduce_logsumexp(t, axis=axis)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, t)

    expected = [v.numpy() for v in value_and_grad(tf.constant(x))]
    run = tf.function(value_and_grad) if in_function else value_and_grad
    actual = run_without_fallback(run, to_dtensor(x, layouts[0]))
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == e.shape
        np.testing.assert_allclose(reassemble(a), e, rtol=1e-5, atol=1e-4)


def test_reduce_logsumexp_uneven_rows(mesh_2x2):
    x = random_array((5, 6), low=-5.0, high=5.0, seed=10)
    out = run_without_fallback(lambda t: tf.math.reduce_logsumexp(t, axis=0),
                               to_dtensor(x, layout_of("[x,y]", mesh_2x2)))
    np.testing.assert_allclose(reassemble(out), tf.math.reduce_logsumexp(x, axis=0).numpy(),
                               rtol=1e-5)


@pytest.mark.parametrize("partial", [{"x": "sum"}, {"x": "min"}], ids=["sum", "min"])
def test_mean_of_a_partial_input_keeps_the_planned_pending_sum(partial):
    # Found by the fuzzer: explain said Mean over a sharded axis of a partial input stays
    # partial (an eager op whose input is partial keeps pending reductions), but the run
    # all-reduced; now each device divides its own term and the sum stays pending.
    from tf_dtensor.dtensor import Layout
    array = random_array((6,), seed=3)
    layout = Layout(["y"], MESH_2X2, partial=partial)
    plan = tf_dtensor.debug.explain("Mean", [layout, None], [[6], []], int_values={1: [0]})
    value = to_dtensor(array, layout)
    for run in (lambda v: tf.reduce_mean(v, axis=0),
                tf.function(lambda v: tf.reduce_mean(v, axis=0))):
        result = run(value)
        assert tf_dtensor.dtensor.fetch_layout(result) == plan["outputs"][0]
        np.testing.assert_allclose(reassemble(result), array.mean(axis=0), rtol=1e-5)


@pytest.mark.parametrize("spec", ["[x,*]", "[x,y]", "[*,y]"])
@pytest.mark.parametrize("axis", [None, 0, 1], ids=["both", "axis0", "axis1"])
def test_mean_over_an_axis_of_unknown_size_inside_a_loop(spec, axis):
    # Batches of a tf.data iterator in a loop have no static size (the last one is
    # partial); the mean divided the sum by the product of the static sizes, -1: -23.65
    # where one device gives 6.85, silently.
    values = np.arange(44, dtype=np.float32).reshape(11, 4) / 10
    data = tf.data.Dataset.from_tensor_slices(values).batch(4)
    layout = layout_of(spec, MESH_2X2)

    @tf.function
    def total(dataset):
        result = tf.zeros([] if axis is None else [4 if axis == 0 else 1])
        for batch in iter(dataset):
            mean = tf.reduce_mean(tf_dtensor.relayout(batch, layout), axis=axis)
            result += mean if axis != 1 else tf.reduce_sum(mean, keepdims=True)
        return result

    with tf_dtensor.run_on(MESH_2X2):
        got = reassemble(total(data))
    batches = [values[i:i + 4] for i in range(0, 11, 4)]
    want = (sum(np.mean(b, axis=axis) for b in batches) if axis != 1 else
            np.array([sum(np.mean(b, axis=1).sum() for b in batches)]))
    np.testing.assert_allclose(got, want, rtol=1e-5)
