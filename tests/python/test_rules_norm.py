"""Numerical checks of normalisation over sharded axes:

- cc/rules/norm_rules.cc, synchronised batch norm (FusedBatchNorm V1/V2/V3 and gradients):
      x [x,*,*,y] (training) -> sums over n/h/w all-reduced over x -> mean, variance [y]
      x [*,*,*,y] or inference -> local, no communication
- cc/rules/reduction_rules.cc, vocab-parallel softmax: a sharded class axis stays sharded
      softmax([x,y]) -> all-reduce(max), all-reduce(sum) over y -> [x,y]
      sparse_softmax_cross_entropy([x,y], labels [x]) -> loss [x], backprop [x,y]
- layer normalisation built from tf.nn.moments over a sharded feature axis stays sharded.

Every result is compared with one plain device (values, dtype, global shape, layout),
eagerly, inside tf.function and through tf.GradientTape, in strict mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, TEST_DEVICE, assert_dtensor_equal, check_op,
                             layout_of, layout_params, layouts_for, random_array, reassemble,
                             run_without_fallback, spec_params, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

_EMPTY = np.zeros((0,), np.float32)
_BN_OPS = {1: tf.raw_ops.FusedBatchNorm, 2: tf.raw_ops.FusedBatchNormV2,
           3: tf.raw_ops.FusedBatchNormV3}


def _close(want, got, what=""):
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(reassemble(got), np.asarray(want), rtol=1e-4, atol=2e-5,
                               err_msg=what)


def _channel(fmt: str, rank: int) -> int:
    return 1 if fmt in ("NCHW", "NCDHW") else rank - 1


def _vector_layout(x_layout: Layout, channel: int) -> Layout:
    return Layout([x_layout.sharding_specs[channel]], x_layout.mesh)


def _bn_case(shape, fmt="NHWC", training=True, avg=1.0, version=3, seed=0):
    channels = shape[_channel(fmt, len(shape))]
    return dict(
        x=random_array(shape, seed=seed), scale=random_array((channels,), seed=seed + 1),
        offset=random_array((channels,), seed=seed + 2),
        mean=random_array((channels,), seed=seed + 3),
        variance=random_array((channels,), low=0.5, high=2.0, seed=seed + 4),
        fmt=fmt, training=training, avg=avg, version=version)


def _bn_fn(case, with_grads):
    op = _BN_OPS[case["version"]]
    attrs = dict(is_training=case["training"], epsilon=0.001, data_format=case["fmt"])
    if case["version"] > 1:
        attrs["exponential_avg_factor"] = case["avg"]
    running = not case["training"] or case["avg"] != 1.0

    def forward(x, scale, offset, mean, variance):
        if not running:
            mean = variance = tf.constant(_EMPTY)
        return op(x=x, scale=scale, offset=offset, mean=mean, variance=variance, **attrs)[:5]

    def fn(x, scale, offset, mean, variance):
        if not with_grads:
            return list(forward(x, scale, offset, mean, variance))
        with tf.GradientTape() as tape:
            tape.watch([x, scale, offset])
            outputs = forward(x, scale, offset, mean, variance)
            loss = tf.reduce_sum(outputs[0] * outputs[0] * 0.5 + outputs[0])
        return list(outputs) + tape.gradient(loss, [x, scale, offset])

    return fn


def _check_bn(case, x_layout, with_grads=False, in_function=False):
    """Runs the case on one device and on DTensors (scale, offset and the statistics laid out
    like x's channel axis); every output keeps x's layout or its channel sharding."""
    fn = _bn_fn(case, with_grads)
    names = ["x", "scale", "offset", "mean", "variance"]
    expected = fn(*[tf.constant(case[n]) for n in names])
    channel = _channel(case["fmt"], case["x"].ndim)
    vector = _vector_layout(x_layout, channel)
    inputs = [to_dtensor(case["x"], x_layout)] + [to_dtensor(case[n], vector) for n in names[1:]]
    actual = run_without_fallback(tf.function(fn) if in_function else fn, *inputs)
    layouts = [x_layout] + [vector] * 4 + ([x_layout, vector, vector] if with_grads else [])
    for i, (want, got, layout) in enumerate(zip(expected, actual, layouts)):
        assert dtensor.fetch_layout(got) == layout, (
            f"output {i}: {dtensor.fetch_layout(got).short()}, expected {layout.short()}")
        if 1 <= i <= 4 and not case["training"] and TEST_DEVICE == "GPU":
            # TF's GPU kernel leaves the statistics and reserve spaces unwritten in inference
            # (on an H200 they held the previous op's values): nothing to compare with.
            # tf_dtensor passes the population statistics through, as the CPU kernel does.
            continue
        _close(want.numpy(), got, f"output {i} with x {x_layout.short()}")


# ---------------------------------------------------------------------------------------
# Batch norm: every layout of x, training and inference, eagerly
# ---------------------------------------------------------------------------------------

BN_SHAPE = (4, 2, 2, 4)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("layouts", layout_params(BN_SHAPE))
def test_batch_norm_every_layout(layouts, training):
    _check_bn(_bn_case(BN_SHAPE, training=training), layouts[0])


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,*,*,*]",), ("[x,*,*,y]",), ("[*,x,y,*]",), ("[*,*,*,y]",), ("[y,x,*,*]",),
    ("[*,*,*,*]",)) + spec_params(MESH_1D, ("[x,*,*,*]",), ("[*,*,*,x]",)))
def test_batch_norm_gradients(layouts, training, in_function):
    _check_bn(_bn_case(BN_SHAPE, training=training), layouts[0], with_grads=True,
              in_function=in_function)


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("spec", ["[x,*,*,y]", "[*,*,*,y]", "[y,x,*,*]"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_batch_norm_versions(version, spec, training, mesh_2x2):
    for in_function in (False, True):
        _check_bn(_bn_case(BN_SHAPE, training=training, version=version),
                  layout_of(spec, mesh_2x2), with_grads=True, in_function=in_function)


@pytest.mark.parametrize("spec", ["[x,y,*,*]", "[y,*,x,*]", "[*,x,*,*]", "[*,*,*,*]"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_batch_norm_nchw(spec, training, mesh_2x2):
    case = _bn_case((4, 4, 2, 2), fmt="NCHW", training=training)
    for in_function in (False, True):
        _check_bn(case, layout_of(spec, mesh_2x2), with_grads=True, in_function=in_function)


@pytest.mark.parametrize("spec", ["[x,*,y,*,*]", "[y,*,*,*,x]", "[x,*,*,y,*]"])
def test_batch_norm_5d(spec, mesh_2x2):
    case = _bn_case((4, 2, 2, 2, 4), fmt="NDHWC")
    for in_function in (False, True):
        _check_bn(case, layout_of(spec, mesh_2x2), with_grads=True, in_function=in_function)


@pytest.mark.parametrize("spec", ["[x,*,*,y]", "[*,x,y,*]", "[*,*,*,x]"])
def test_batch_norm_running_average(spec, mesh_2x2):
    # exponential_avg_factor != 1 blends the global batch statistics into the running ones.
    case = _bn_case(BN_SHAPE, avg=0.3)
    for in_function in (False, True):
        _check_bn(case, layout_of(spec, mesh_2x2), with_grads=True, in_function=in_function)


# Uneven shards: 3 examples, 3 rows or 3 channels over 2 devices; the statistics use the
# global counts.
@pytest.mark.parametrize("shape,spec", [
    ((3, 2, 2, 4), "[x,*,*,y]"), ((4, 3, 2, 3), "[*,x,*,y]"), ((3, 3, 2, 3), "[y,x,*,*]"),
    ((5, 2, 2, 4), "[x,*,*,*]"),
], ids=["batch", "rows-channels", "batch-rows", "batch5"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_batch_norm_uneven(shape, spec, training, mesh_2x2):
    case = _bn_case(shape, training=training)
    mesh = mesh_2x2 if "y" in spec else MESH_1D
    for in_function in (False, True):
        _check_bn(case, layout_of(spec, mesh), with_grads=True, in_function=in_function)


# Found by the fuzzer: V1/V2 in inference ran TF's kernel on each block, which writes NaN
# batch_mean/batch_variance for an empty block of x (3 examples over 8 devices) instead of
# passing the population statistics through.
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_batch_norm_inference_with_empty_blocks(version, fmt):
    shape = (3, 2, 2, 4) if fmt == "NHWC" else (3, 4, 2, 1)
    case = _bn_case(shape, fmt=fmt, training=False, version=version)
    for in_function in (False, True):
        _check_bn(case, layout_of("[x,*,*,*]", MESH_8), with_grads=True, in_function=in_function)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_batch_norm_half_precision_input(dtype, mesh_2x2):
    # T = half/bfloat16 with float32 scale and statistics: the arithmetic runs in float32.
    x = tf.cast(random_array(BN_SHAPE), dtype)
    scale, offset = random_array((4,), seed=1), random_array((4,), seed=2)

    def fn(x, scale, offset):
        with tf.GradientTape() as tape:
            tape.watch([x, scale, offset])
            out = tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset,
                                              mean=tf.constant(_EMPTY),
                                              variance=tf.constant(_EMPTY), is_training=True)
            loss = tf.reduce_sum(tf.cast(out[0], tf.float32) ** 2)
        return list(out[:3]) + tape.gradient(loss, [x, scale, offset])

    expected = fn(x, tf.constant(scale), tf.constant(offset))
    channels = layout_of("[y]", mesh_2x2)
    for run in (fn, tf.function(fn)):
        actual = run_without_fallback(run, to_dtensor(x, layout_of("[x,*,*,y]", mesh_2x2)),
                                      to_dtensor(scale, channels), to_dtensor(offset, channels))
        for want, got in zip(expected, actual):
            assert got.dtype == want.dtype
            np.testing.assert_allclose(reassemble(got).astype(np.float32),
                                       want.numpy().astype(np.float32), rtol=1e-2, atol=1e-2)


def test_batch_norm_plans(mesh_2x2):
    x, c = [4, 2, 2, 4], [4]
    # Inference gradient: scale/offset gradients are partial sums over the sharded batch.
    plan = tf_dtensor.debug.explain(
        "FusedBatchNormGradV3",
        [layout_of("[x,*,*,y]", mesh_2x2), layout_of("[x,*,*,y]", mesh_2x2)] +
        [layout_of("[y]", mesh_2x2)] * 4, [x, x, c, c, c, [0]], attrs={"is_training": False})
    assert plan["outputs"][:3] == [layout_of("[x,*,*,y]", mesh_2x2),
                                   layout_of("[y]", mesh_2x2), layout_of("[y]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 1 over x",
                                   "all-reduce(sum) of output 2 over x"]
    # Channels sharded, batch whole: no communication.
    plan = tf_dtensor.debug.explain(
        "FusedBatchNormV3", [layout_of("[*,*,*,y]", mesh_2x2)] + [layout_of("[y]", mesh_2x2)] * 4,
        [x, c, c, c, c])
    assert plan["collectives"] == []
    assert plan["outputs"][0] == layout_of("[*,*,*,y]", mesh_2x2)
    # Training with the batch sharded: the statistics are all-reduced.
    plan = tf_dtensor.debug.explain(
        "FusedBatchNormV3", [layout_of("[x,*,*,y]", mesh_2x2)] + [layout_of("[y]", mesh_2x2)] * 4,
        [x, c, c, c, c])
    assert plan["collectives"] == ["all-reduce(sum) of the batch mean over x",
                                   "all-reduce(sum) of the batch variance over x"]


def test_batch_norm_statistics_are_global(mesh_1d):
    # Each device holds one half of the batch; the two halves have different means, and
    # both shards are normalised with the statistics of the whole batch.
    x = np.concatenate([np.full((2, 1, 1, 2), -1.0, np.float32),
                        np.full((2, 1, 1, 2), 3.0, np.float32)])
    ones, zeros = np.ones((2,), np.float32), np.zeros((2,), np.float32)
    y, mean, variance = tf.raw_ops.FusedBatchNormV3(
        x=to_dtensor(x, layout_of("[x,*,*,*]", mesh_1d)), scale=to_dtensor(ones, Layout(
            [UNSHARDED], mesh_1d)), offset=to_dtensor(zeros, Layout([UNSHARDED], mesh_1d)),
        mean=tf.constant(_EMPTY), variance=tf.constant(_EMPTY), epsilon=0.0)[:3]
    np.testing.assert_allclose(reassemble(mean), [1.0, 1.0])
    np.testing.assert_allclose(reassemble(variance), [16.0 / 3.0] * 2, rtol=1e-6)  # Bessel
    np.testing.assert_allclose(reassemble(y)[:, 0, 0, 0], [-1, -1, 1, 1], rtol=1e-6)


# ---------------------------------------------------------------------------------------
# A CNN with fused batch norm trains like one device
# ---------------------------------------------------------------------------------------

def _cnn_step(x, w, scale, offset):
    with tf.GradientTape() as tape:
        tape.watch([w, scale, offset])
        h = tf.nn.conv2d(x, w, strides=1, padding="SAME")
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(h, scale, offset, epsilon=0.001,
                                                   is_training=True)
        loss = tf.reduce_mean(tf.nn.relu(h) * tf.range(4, dtype=tf.float32))
    dw, ds, do = tape.gradient(loss, [w, scale, offset])
    return loss, w - 0.5 * dw, scale - 0.5 * ds, offset - 0.5 * do


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,x_spec,c_spec", [
    pytest.param(MESH_1D, "[x,*,*,*]", "[*]", id="batch@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,y,*,*]", "[*]", id="batch-rows"),
    pytest.param(MESH_2X2, "[x,*,*,*]", "[y]", id="batch-channels"),
])
def test_cnn_with_fused_batch_norm_matches_one_device(mesh, x_spec, c_spec, in_function):
    x = random_array((4, 4, 4, 3))
    params = [random_array((3, 3, 3, 4), low=-0.5, high=0.5, seed=1),
              random_array((4,), low=0.5, high=1.5, seed=2), random_array((4,), seed=3)]
    step = tf.function(_cnn_step) if in_function else _cnn_step
    plain = [tf.constant(p) for p in params]
    w_layout = Layout([UNSHARDED] * 3 + [c_spec.strip("[]").replace("*", UNSHARDED)], mesh)
    sharded = [to_dtensor(params[0], w_layout), to_dtensor(params[1], layout_of(c_spec, mesh)),
               to_dtensor(params[2], layout_of(c_spec, mesh))]
    dx = to_dtensor(x, layout_of(x_spec, mesh))
    for _ in range(3):
        want_loss, *plain = _cnn_step(tf.constant(x), *plain)
        loss, *sharded = run_without_fallback(step, dx, *sharded)
        np.testing.assert_allclose(reassemble(loss), want_loss.numpy(), rtol=1e-4, atol=1e-6)
    for want, got in zip(plain, sharded):
        _close(want.numpy(), got)


# ---------------------------------------------------------------------------------------
# Softmax family over a sharded class axis
# ---------------------------------------------------------------------------------------

LOGITS = random_array((4, 6), seed=5)
LABELS = np.array([0, 5, 2, 3], np.int32)
SOFT_LABELS = tf.nn.softmax(random_array((4, 6), seed=6)).numpy()


@pytest.mark.parametrize("op,fn", [("Softmax", tf.nn.softmax), ("LogSoftmax", tf.nn.log_softmax)])
@pytest.mark.parametrize("layouts", layout_params((4, 6)))
def test_softmax_every_layout(op, fn, layouts):
    actual = check_op(fn, op, [LOGITS], layouts)
    # The class axis keeps its sharding.
    assert dtensor.fetch_layout(actual) == layouts[0]


@pytest.mark.parametrize("output", [0, 1], ids=["loss", "backprop"])
@pytest.mark.parametrize("layouts", layout_params((4, 6), (4,)))
def test_sparse_cross_entropy_every_layout(layouts, output):
    def fn(logits, labels):
        return tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits,
                                                              labels=labels)[output]

    check_op(fn, "SparseSoftmaxCrossEntropyWithLogits", [LOGITS, LABELS], layouts, output=output)


@pytest.mark.parametrize("output", [0, 1], ids=["loss", "backprop"])
@pytest.mark.parametrize("layouts", layout_params((4, 6), (4, 6)))
def test_dense_cross_entropy_every_layout(layouts, output):
    def fn(logits, labels):
        return tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=logits, labels=labels)[output]

    check_op(fn, "SoftmaxCrossEntropyWithLogits", [LOGITS, SOFT_LABELS], layouts, output=output)


def _softmax_losses():
    return {
        "softmax": lambda x: tf.nn.softmax(x),
        "log_softmax": lambda x: tf.nn.log_softmax(x),
        "sparse": lambda x: tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.constant(LABELS[:x.shape[0]] % x.shape[1]), logits=x),
        "dense": lambda x: tf.nn.softmax_cross_entropy_with_logits(
            labels=tf.constant(SOFT_LABELS[:x.shape[0], :x.shape[1]]), logits=x),
    }


def _value_and_grad(fn):
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = tf.reduce_sum(y * y + y)
        return [y, tape.gradient(loss, x)]
    return run


@pytest.mark.parametrize("name", sorted(_softmax_losses()))
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("shape,spec,mesh", [
    ((4, 6), "[x,y]", MESH_2X2), ((4, 6), "[*,y]", MESH_2X2), ((4, 6), "[y,*]", MESH_2X2),
    ((4, 6), "[*,x]", MESH_1D), ((4, 5), "[x,y]", MESH_2X2), ((3, 5), "[*,x]", MESH_1D),
], ids=["x,y", "*,y", "y,*", "*,x@1d", "uneven-classes", "uneven-both@1d"])
def test_softmax_gradients_keep_classes_sharded(name, in_function, shape, spec, mesh):
    fn = _value_and_grad(_softmax_losses()[name])
    x = random_array(shape, seed=7)
    expected = fn(tf.constant(x))
    layout = layout_of(spec, mesh)
    actual = run_without_fallback(tf.function(fn) if in_function else fn, to_dtensor(x, layout))
    for want, got in zip(expected, actual):
        _close(want.numpy(), got, name)
    # The gradient keeps the class axis sharded (no gather on the way back). Uneven classes
    # are checked by value only: tf.nn's cross entropies reshape the logits, and Reshape
    # gathers an uneven axis.
    if shape == (4, 6):
        assert dtensor.fetch_layout(actual[1]) == layout


def test_cross_entropy_plan_keeps_classes_sharded(mesh_2x2):
    plan = tf_dtensor.debug.explain(
        "SparseSoftmaxCrossEntropyWithLogits",
        [layout_of("[x,y]", mesh_2x2), layout_of("[x]", mesh_2x2)], [[4, 6], [4]])
    assert plan["inputs"][0] == layout_of("[x,y]", mesh_2x2)
    assert plan["outputs"] == [layout_of("[x]", mesh_2x2), layout_of("[x,y]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 0 over y",
                                   "all-reduce(max) of the row max over y",
                                   "all-reduce(sum) of the row sum over y"]


def test_cross_entropy_loss_stays_partial_in_function(mesh_2x2):
    # Inside tf.function the loss's sum over the classes is left pending until needed.
    @tf.function
    def fn(logits):
        loss, backprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=logits, labels=tf.constant(LABELS))
        return tf.reduce_mean(loss), backprop

    want = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=LOGITS, labels=LABELS)
    mean, backprop = run_without_fallback(fn, to_dtensor(LOGITS, layout_of("[x,y]", mesh_2x2)))
    _close(tf.reduce_mean(want[0]).numpy(), mean)
    assert_dtensor_equal(want[1], layout_of("[x,y]", mesh_2x2), backprop)


# ---------------------------------------------------------------------------------------
# Layer normalisation over a sharded feature axis
# ---------------------------------------------------------------------------------------

def _layer_norm(x, gamma, beta):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-5)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("shape,spec,mesh", [
    ((2, 4, 6), "[*,*,x]", MESH_2X2), ((2, 4, 6), "[x,*,y]", MESH_2X2),
    ((2, 4, 6), "[*,y,x]", MESH_2X2), ((2, 4, 6), "[*,*,x]", MESH_1D),
    ((2, 4, 5), "[x,*,y]", MESH_2X2),
], ids=["*,*,x", "x,*,y", "*,y,x", "*,*,x@1d", "uneven-features"])
def test_layer_norm_keeps_features_sharded(shape, spec, mesh, in_function):
    x = random_array(shape)
    gamma = random_array(shape[-1:], seed=1)
    beta = random_array(shape[-1:], seed=2)

    def step(x, gamma, beta):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            y = _layer_norm(x, gamma, beta)
            loss = tf.reduce_sum(y * y + y)
        return [y] + tape.gradient(loss, [x, gamma, beta])

    expected = step(*[tf.constant(a) for a in (x, gamma, beta)])
    layout = layout_of(spec, mesh)
    feature = Layout([layout.sharding_specs[-1]], mesh)
    actual = run_without_fallback(tf.function(step) if in_function else step,
                                  to_dtensor(x, layout), to_dtensor(gamma, feature),
                                  to_dtensor(beta, feature))
    # gamma/beta's gradients of uneven features pass a Reshape (tf's broadcast gradient),
    # which gathers an uneven axis: checked by value only.
    even = shape[-1] % 2 == 0
    for i, (want, got) in enumerate(zip(expected, actual)):
        _close(want.numpy(), got)
        if i < 2 or even:
            assert dtensor.fetch_layout(got) == (layout if i < 2 else feature)


def test_keras_normalization_layers_stay_sharded(mesh_2x2):
    # Keras 3 decomposes both layers into moments; eagerly, with host weights.
    keras = pytest.importorskip("keras")
    for layer, shape, spec in [(keras.layers.LayerNormalization(), (2, 4, 6), "[x,*,y]"),
                               (keras.layers.BatchNormalization(), (4, 2, 2, 6), "[x,y,*,*]")]:
        layer.build(shape)
        x = random_array(shape)

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(y * y + y)
            return [y, tape.gradient(loss, x)]

        expected = step(tf.constant(x))
        actual = run_without_fallback(step, to_dtensor(x, layout_of(spec, mesh_2x2)))
        for want, got in zip(expected, actual):
            _close(want.numpy(), got, type(layer).__name__)
        assert dtensor.fetch_layout(actual[0]) == layout_of(spec, mesh_2x2)


@pytest.mark.parametrize("mesh,x_spec", [
    pytest.param(MESH_1D, "[x,*,*,*]", id="batch@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,y,*,*]", id="batch-rows"),
])
def test_keras_cnn_with_batch_normalization_trains_like_one_device(mesh, x_spec):
    # Conv2D -> BatchNormalization -> ReLU -> pool -> Dense, three SGD steps eagerly with
    # Keras's own (host) variables: losses, weights and moving statistics match one device.
    keras = pytest.importorskip("keras")

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([
            keras.Input((4, 4, 3)), keras.layers.Conv2D(4, 3, padding="same"),
            keras.layers.BatchNormalization(), keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])

    def train(net, x, labels):
        optimizer = keras.optimizers.SGD(0.1)
        losses = []
        for _ in range(3):
            with tf.GradientTape() as tape:
                logits = net(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=labels, logits=logits))
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))
            losses.append(reassemble(loss) if dtensor.is_dtensor(loss) else loss.numpy())
        return losses, [v.numpy() for v in net.variables]

    x = random_array((4, 4, 4, 3))
    labels = np.array([0, 1, 1, 0], np.int32)
    want_losses, want_weights = train(model(), tf.constant(x), tf.constant(labels))
    losses, weights = run_without_fallback(
        train, model(), to_dtensor(x, layout_of(x_spec, mesh)),
        to_dtensor(labels, Layout([x_spec[1]], mesh)))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for want, got in zip(want_weights, weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec", ["[x,*,*,*]", "[x,*,*,y]", "[x,y,*,*]"])
def test_batch_norm_over_batches_of_unknown_size_inside_a_loop(spec):
    # A loop over a tf.data iterator's batches (no static size, the last one partial):
    # the count was the product of the static sizes, -1, and the statistics were
    # silently wrong (a batch mean of 966 where one device gives 4.35, NaN outputs).
    values = (np.arange(11 * 2 * 2 * 4, dtype=np.float32).reshape(11, 2, 2, 4) % 7) / 3
    data = tf.data.Dataset.from_tensor_slices(values).batch(4)

    def run(layout):
        scale = tf.constant([1.0, 2.0, 0.5, 1.5])
        offset = tf.constant([0.0, 0.1, -0.2, 0.3])

        @tf.function
        def loop(dataset):
            statistics, outputs = tf.zeros([4]), tf.constant(0.0)
            gradients = tf.zeros([4])
            for batch in iter(dataset):
                x = tf_dtensor.relayout(batch, layout) if layout else batch
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                        x, scale, offset, is_training=True)[:3]
                    loss = tf.reduce_sum(tf.sin(y) + tf.square(y))
                statistics += mean + variance
                outputs += loss
                gradients += tf.reduce_sum(tape.gradient(loss, x), axis=[0, 1, 2])
            return statistics, outputs, gradients
        return loop(data)

    want = [t.numpy() for t in run(None)]
    with tf_dtensor.run_on(MESH_2X2):
        got = [reassemble(t) for t in run(layout_of(spec, MESH_2X2))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
