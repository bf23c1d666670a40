"""Numerical checks of cc/rules/conv_rules.cc: convolutions and pooling, batch- and
channel-sharded; sharded spatial axes get a halo exchange (test_rules_conv_spatial.py),
so the planner is given the op's attributes to predict the output layout.

    x [x,*,*,*] conv w [*,*,*,*] -> [x,*,*,*]                    (batch)
    x [*,*,*,*] conv w [*,*,*,y] -> [*,*,*,y]                    (output channels)
    x [*,*,*,x] conv w [*,*,x,*] -> partial(x) -> all-reduce      (input channels)
    max_pool [x,*,*,y] -> [x,*,*,y]

TF's CPU kernels run Conv2D and the pools only in NHWC, so NCHW is checked with the
planner alone (debug.explain).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, collective_lowering,
                             assert_values_equal, check_op, is_replicated, layout_of, layout_params, random_array,
                             reassemble, run_without_fallback, spec_params, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

X_SHAPE, W_SHAPE = (4, 6, 6, 4), (3, 3, 4, 4)


def _attrs(padding, stride, dilation=1, rank=4):
    inner = [1] + [stride] * (rank - 2) + [1]
    attrs = {"padding": padding, "strides": inner,
             "dilations": [1] + [dilation] * (rank - 2) + [1]}
    return attrs


def _pool_attrs(padding, k, stride, rank=4):
    return {"padding": padding, "ksize": [1] + [k] * (rank - 2) + [1],
            "strides": [1] + [stride] * (rank - 2) + [1]}


def _conv(padding, stride, dilation=1):
    def fn(x, w):
        return tf.nn.conv2d(x, w, strides=stride, padding=padding, dilations=dilation)
    return fn


# Every layout pair on both meshes at SAME / stride 1; the other padding and stride modes on
# the 1-D mesh in full and on the 2x2 mesh with a replicated filter or a replicated input.
@pytest.mark.parametrize("layouts", layout_params(X_SHAPE, W_SHAPE))
def test_conv2d_every_layout(layouts):
    check_op(_conv("SAME", 1), "Conv2D", [random_array(X_SHAPE), random_array(W_SHAPE, seed=1)],
             layouts, attrs=_attrs("SAME", 1))


@pytest.mark.parametrize("padding,stride", [("VALID", 1), ("SAME", 2), ("VALID", 2)])
@pytest.mark.parametrize("layouts", layout_params(X_SHAPE, W_SHAPE, meshes=[MESH_1D]) +
                         layout_params(X_SHAPE, W_SHAPE, meshes=[MESH_2X2],
                                       select=lambda c: is_replicated(c[0]) or is_replicated(c[1])))
def test_conv2d_padding_and_stride(layouts, padding, stride):
    check_op(_conv(padding, stride), "Conv2D",
             [random_array(X_SHAPE), random_array(W_SHAPE, seed=1)], layouts,
             attrs=_attrs(padding, stride))


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,*,*,y]", "[*,*,y,*]"), ("[x,*,*,*]", "[*,*,*,y]"), ("[*,x,y,*]", "[*,*,*,*]")))
def test_conv2d_explicit_padding_and_dilation(layouts):
    def fn(x, w):
        return tf.nn.conv2d(x, w, strides=1, padding=[[0, 0], [1, 2], [2, 0], [0, 0]],
                            dilations=2)

    check_op(fn, "Conv2D", [random_array(X_SHAPE), random_array(W_SHAPE, seed=1)], layouts,
             attrs=dict(_attrs("EXPLICIT", 1, 2), explicit_paddings=[0, 0, 1, 2, 2, 0, 0, 0]))


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,*,*,*]", "[*,*,*,*]"), ("[x,*,*,y]", "[*,*,y,*]"), ("[*,*,*,*]", "[*,*,*,x]"),
    ("[y,*,*,*]", "[*,*,*,x]")))
def test_conv2d_in_function(layouts):
    x, w = random_array(X_SHAPE), random_array(W_SHAPE, seed=1)
    fn = _conv("SAME", 1)
    expected = fn(tf.constant(x), tf.constant(w)).numpy()
    actual = run_without_fallback(tf.function(fn), to_dtensor(x, layouts[0]),
                                  to_dtensor(w, layouts[1]))
    assert tuple(actual.shape) == expected.shape
    assert_values_equal(expected, reassemble(actual))


def test_conv2d_uneven_batch(mesh_1d):
    x, w = random_array((3, 6, 6, 4)), random_array(W_SHAPE, seed=1)
    layouts = [layout_of("[x,*,*,*]", mesh_1d), layout_of("[*,*,*,*]", mesh_1d)]
    check_op(_conv("SAME", 1), "Conv2D", [x, w], layouts)


def test_conv2d_nchw_plan(mesh_2x2):
    # NCHW: channels at axis 1; the CPU kernel has no NCHW Conv2D, so the planner alone.
    plan = tf_dtensor.debug.explain(
        "Conv2D", [layout_of("[x,y,*,*]", mesh_2x2), layout_of("[*,*,y,*]", mesh_2x2)],
        [[4, 4, 6, 6], [3, 3, 4, 4]], attrs={"data_format": "NCHW"})
    assert plan["outputs"] == [layout_of("[x,*,*,*]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 0 over y"]


def test_grouped_conv_keeps_channels_whole(mesh_1d):
    # Filter in-channels 2 against data channels 4: two groups; channels run replicated.
    x, w = random_array((4, 6, 6, 4)), random_array((3, 3, 2, 4), seed=1)
    layouts = [layout_of("[x,*,*,*]", mesh_1d), layout_of("[*,*,*,x]", mesh_1d)]
    plan = tf_dtensor.debug.explain("Conv2D", list(layouts), [list(x.shape), list(w.shape)])
    assert plan["inputs"][1] == layout_of("[*,*,*,*]", mesh_1d)
    check_op(_conv("SAME", 1), "Conv2D", [x, w], layouts)


def test_conv1d_through_conv2d(mesh_2x2):
    def fn(x, w):
        return tf.nn.conv1d(x, w, stride=1, padding="SAME")

    x, w = random_array((4, 8, 4)), random_array((3, 4, 6), seed=1)
    for specs in [("[x,*,*]", "[*,*,*]"), ("[x,*,y]", "[*,y,*]"), ("[*,*,*]", "[*,*,y]")]:
        layouts = [layout_of(s, mesh_2x2) for s in specs]
        expected = fn(tf.constant(x), tf.constant(w)).numpy()
        actual = run_without_fallback(fn, to_dtensor(x, layouts[0]), to_dtensor(w, layouts[1]))
        assert_values_equal(expected, reassemble(actual))


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,*,*,*,*]", "[*,*,*,*,*]"), ("[x,*,*,*,y]", "[*,*,*,y,*]"),
    ("[*,*,*,*,*]", "[*,*,*,*,x]")))
def test_conv3d(layouts):
    def fn(x, w):
        return tf.nn.conv3d(x, w, strides=[1, 1, 1, 1, 1], padding="SAME")

    check_op(fn, "Conv3D", [random_array((4, 4, 4, 4, 4)), random_array((2, 2, 2, 4, 4), seed=1)],
             layouts, attrs=_attrs("SAME", 1, rank=5))


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,*,*,*]", "[*,*,*,*]"), ("[x,*,*,y]", "[*,*,*,*]"), ("[*,*,*,y]", "[*,*,y,*]"),
    ("[*,*,*,*]", "[*,*,*,x]")))
@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_conv2d(layouts, multiplier):
    def fn(x, w):
        return tf.nn.depthwise_conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")

    check_op(fn, "DepthwiseConv2dNative",
             [random_array(X_SHAPE), random_array((3, 3, 4, multiplier), seed=1)], layouts,
             attrs=_attrs("SAME", 1))


@pytest.mark.parametrize("multiplier", [1, 4])
def test_depthwise_conv2d_uneven_channels(multiplier, mesh_2x2):
    # Found by the fuzzer: with m > 1, 3 channels over y made (c block) * m output
    # channels per device (8 on CPU:0), not the blocks of 12 (6); they are gathered.
    def fn(x, w):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 2, 2, 1],
                                                padding="VALID")

    layouts = [layout_of("[*,y,x,*]", mesh_2x2), layout_of("[x,*,y,*]", mesh_2x2)]
    arrays = [random_array((1, 5, 4, 3)), random_array((2, 2, 3, multiplier), seed=1)]
    for run in (fn, tf.function(fn)):
        check_op(run, "DepthwiseConv2dNative", arrays, layouts,
                 attrs={"strides": [1, 2, 2, 1], "padding": "VALID"})


# ---------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------

POOLS = {
    "MaxPool": (lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID"), _pool_attrs("VALID", 2, 2)),
    "AvgPool": (lambda x: tf.nn.avg_pool2d(x, 3, 1, "SAME"), _pool_attrs("SAME", 3, 1)),
}


@pytest.mark.parametrize("op", sorted(POOLS))
@pytest.mark.parametrize("layouts", layout_params(X_SHAPE))
def test_pool2d(op, layouts):
    fn, attrs = POOLS[op]
    check_op(fn, op, [random_array(X_SHAPE)], layouts, attrs=attrs)


@pytest.mark.parametrize("op,fn,attrs", [
    ("MaxPool3D", lambda x: tf.nn.max_pool3d(x, 2, 2, "VALID"), _pool_attrs("VALID", 2, 2, 5)),
    ("AvgPool3D", lambda x: tf.nn.avg_pool3d(x, 2, 1, "SAME"), _pool_attrs("SAME", 2, 1, 5)),
])
@pytest.mark.parametrize("spec", ["[x,*,*,*,y]", "[y,*,*,*,*]", "[*,x,*,*,*]"])
def test_pool3d(op, fn, attrs, spec, mesh_2x2):
    check_op(fn, op, [random_array((4, 4, 4, 4, 4))], [layout_of(spec, mesh_2x2)], attrs=attrs)


def test_pool_nchw_plan(mesh_2x2):
    plan = tf_dtensor.debug.explain("MaxPool", [layout_of("[x,y,*,*]", mesh_2x2)],
                                    [[4, 4, 6, 6]], attrs={"data_format": "NCHW"})
    assert plan["outputs"] == [layout_of("[x,y,*,*]", mesh_2x2)]


# ---------------------------------------------------------------------------------------
# Gradients: a small CNN step, batch- and channel-sharded, against one device
# ---------------------------------------------------------------------------------------

def _cnn_loss(x, w1, w2):
    h = tf.nn.relu(tf.nn.conv2d(x, w1, strides=1, padding="SAME"))
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.nn.conv2d(h, w2, strides=2, padding="VALID")
    h = tf.nn.avg_pool2d(tf.nn.relu(h), 1, 1, "VALID")
    return tf.reduce_mean(h)


def _cnn_grads(x, w1, w2):
    with tf.GradientTape() as tape:
        tape.watch([x, w1, w2])
        loss = _cnn_loss(x, w1, w2)
    return [loss] + tape.gradient(loss, [x, w1, w2])


CNN_CASES = [
    pytest.param(MESH_1D, "[x,*,*,*]", "[*,*,*,*]", id="batch_x@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,*,*,*]", "[*,*,*,*]", id="batch_x"),
    pytest.param(MESH_2X2, "[y,*,*,*]", "[*,*,*,*]", id="batch_y"),
    pytest.param(MESH_2X2, "[x,*,*,*]", "[*,*,*,y]", id="batch_x-out_channels_y"),
    pytest.param(MESH_2X2, "[x,*,*,y]", "[*,*,y,*]", id="batch_x-in_channels_y"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,x_spec,w_spec", CNN_CASES)
def test_cnn_gradients_match_one_device(mesh, x_spec, w_spec, in_function):
    x = random_array((4, 8, 8, 4))
    w1 = random_array((3, 3, 4, 4), low=-0.5, high=0.5, seed=1)
    w2 = random_array((2, 2, 4, 4), low=-0.5, high=0.5, seed=2)
    expected = [v.numpy() for v in _cnn_grads(*[tf.constant(a) for a in (x, w1, w2)])]
    fn = tf.function(_cnn_grads) if in_function else _cnn_grads
    inputs = [to_dtensor(x, layout_of(x_spec, mesh)), to_dtensor(w1, layout_of(w_spec, mesh)),
              to_dtensor(w2, Layout.replicated(mesh, 4))]
    actual = run_without_fallback(fn, *inputs)
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == want.shape
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-5)


def test_batch_sharded_weight_gradient_is_replicated(mesh_2x2):
    # dw = Conv2DBackpropFilter over a sharded batch: partial over x, all-reduced eagerly.
    x = random_array((4, 8, 8, 4))
    w1 = random_array((3, 3, 4, 4), seed=1)
    w2 = random_array((2, 2, 4, 4), seed=2)
    expected = _cnn_grads(*[tf.constant(a) for a in (x, w1, w2)])
    actual = run_without_fallback(_cnn_grads, to_dtensor(x, layout_of("[x,*,*,*]", mesh_2x2)),
                                  to_dtensor(w1, Layout.replicated(mesh_2x2, 4)),
                                  to_dtensor(w2, Layout.replicated(mesh_2x2, 4)))
    assert dtensor.fetch_layout(actual[1]).sharding_specs[0] == "x"
    for want, got in zip(expected[2:], actual[2:]):
        assert_dtensor_equal(want, Layout.replicated(mesh_2x2, 4), got)


@pytest.mark.parametrize("specs", [("[x,*,*,*]", "[*,*,*,*]"), ("[x,*,*,y]", "[*,*,*,*]"),
                                   ("[*,*,*,*]", "[*,*,*,y]")])
def test_backprop_ops_directly(specs, mesh_2x2):
    # Conv2DBackpropInput / Conv2DBackpropFilter with global shape arguments.
    x = random_array(X_SHAPE)
    w = random_array(W_SHAPE, seed=1)
    dy = random_array(X_SHAPE, seed=2)
    dx_want = tf.raw_ops.Conv2DBackpropInput(
        input_sizes=list(X_SHAPE), filter=w, out_backprop=dy, strides=[1, 1, 1, 1],
        padding="SAME").numpy()
    dw_want = tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=list(W_SHAPE), out_backprop=dy, strides=[1, 1, 1, 1],
        padding="SAME").numpy()
    lx, lw = (layout_of(s, mesh_2x2) for s in specs)
    ddy = to_dtensor(dy, lx)
    dx = run_without_fallback(lambda: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=tf.constant(list(X_SHAPE)), filter=to_dtensor(w, lw), out_backprop=ddy,
        strides=[1, 1, 1, 1], padding="SAME"))
    dw = run_without_fallback(lambda: tf.raw_ops.Conv2DBackpropFilter(
        input=to_dtensor(x, lx), filter_sizes=tf.constant(list(W_SHAPE)), out_backprop=ddy,
        strides=[1, 1, 1, 1], padding="SAME"))
    np.testing.assert_allclose(reassemble(dx), dx_want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(reassemble(dw), dw_want, rtol=1e-4, atol=1e-4)
    assert tuple(dx.shape) == X_SHAPE and tuple(dw.shape) == W_SHAPE


def test_pool_gradients(mesh_2x2):
    def loss(x):
        return tf.reduce_sum(tf.nn.max_pool2d(x, 2, 2, "VALID") *
                             tf.nn.avg_pool2d(x, 3, 1, "SAME")[:, ::2, ::2, :])

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = loss(x)
        return tape.gradient(y, x)

    x = random_array(X_SHAPE)
    want = grads(tf.constant(x)).numpy()
    for spec in ["[x,*,*,y]", "[y,*,*,*]"]:
        got = run_without_fallback(grads, to_dtensor(x, layout_of(spec, mesh_2x2)))
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-5)


def _tape(loss, *args):
    with tf.GradientTape() as tape:
        tape.watch(list(args))
        value = loss(*args)
    return [value] + tape.gradient(value, list(args))


def _conv3d_loss(x, w):
    h = tf.nn.conv3d(x, w, strides=[1, 1, 1, 1, 1], padding="SAME")
    return tf.reduce_mean(tf.nn.max_pool3d(h, 2, 2, "VALID") +
                          tf.nn.avg_pool3d(h, 2, 2, "VALID"))


def _depthwise_loss(x, w):
    h = tf.nn.depthwise_conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
    return tf.reduce_mean(tf.nn.relu(h))


@pytest.mark.parametrize("loss,x_shape,w_shape,x_spec,w_spec", [
    pytest.param(_conv3d_loss, (4, 4, 4, 4, 4), (2, 2, 2, 4, 4), "[x,*,*,*,*]", "[*,*,*,*,*]",
                 id="conv3d-batch"),
    pytest.param(_conv3d_loss, (4, 4, 4, 4, 4), (2, 2, 2, 4, 4), "[x,*,*,*,y]", "[*,*,*,y,*]",
                 id="conv3d-batch-in_channels"),
    pytest.param(_depthwise_loss, X_SHAPE, (3, 3, 4, 1), "[x,*,*,y]", "[*,*,y,*]",
                 id="depthwise-m1"),
    pytest.param(_depthwise_loss, X_SHAPE, (3, 3, 4, 2), "[x,*,*,y]", "[*,*,y,*]",
                 id="depthwise-m2"),
])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_more_gradients_match_one_device(loss, x_shape, w_shape, x_spec, w_spec, in_function,
                                         mesh_2x2):
    x, w = random_array(x_shape), random_array(w_shape, low=-0.5, high=0.5, seed=1)
    expected = [v.numpy() for v in _tape(loss, tf.constant(x), tf.constant(w))]
    fn = tf.function(lambda a, b: _tape(loss, a, b)) if in_function else (
        lambda a, b: _tape(loss, a, b))
    actual = run_without_fallback(fn, to_dtensor(x, layout_of(x_spec, mesh_2x2)),
                                  to_dtensor(w, layout_of(w_spec, mesh_2x2)))
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == want.shape
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-5)


# Uneven shards are valid layouts: 3 channels or a batch of 3 over x=2.
@pytest.mark.parametrize("x_shape,w_shape,specs", [
    ((3, 6, 6, 4), W_SHAPE, ("[x,*,*,*]", "[*,*,*,*]")),
    ((4, 6, 6, 3), (3, 3, 3, 4), ("[*,*,*,x]", "[*,*,*,*]")),
    ((4, 6, 6, 4), (3, 3, 4, 3), ("[*,*,*,*]", "[*,*,*,x]")),
    ((3, 6, 6, 3), (3, 3, 3, 3), ("[x,*,*,y]", "[*,*,y,*]")),
], ids=["batch", "in_channels", "out_channels", "batch-in_channels"])
def test_conv2d_uneven(x_shape, w_shape, specs, mesh_2x2):
    layouts = [layout_of(s, mesh_2x2) for s in specs]
    check_op(_conv("SAME", 1), "Conv2D", [random_array(x_shape), random_array(w_shape, seed=1)],
             layouts)


def test_cnn_gradients_uneven_batch(mesh_1d):
    x = random_array((3, 8, 8, 4))
    w1 = random_array((3, 3, 4, 4), low=-0.5, high=0.5, seed=1)
    w2 = random_array((2, 2, 4, 4), low=-0.5, high=0.5, seed=2)
    expected = [v.numpy() for v in _cnn_grads(*[tf.constant(a) for a in (x, w1, w2)])]
    for fn in (_cnn_grads, tf.function(_cnn_grads)):
        actual = run_without_fallback(fn, to_dtensor(x, layout_of("[x,*,*,*]", mesh_1d)),
                                      to_dtensor(w1, Layout.replicated(mesh_1d, 4)),
                                      to_dtensor(w2, Layout.replicated(mesh_1d, 4)))
        for want, got in zip(expected, actual):
            assert tuple(got.shape) == want.shape
            np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", ["[x,*,*,*]", "[x,*,*,y]"])
def test_conv2d_transpose_takes_a_global_output_shape(spec, mesh_2x2):
    # conv2d_transpose is Conv2DBackpropInput with output_shape as input_sizes.
    def fn(y, w):
        return tf.nn.conv2d_transpose(y, w, output_shape=[4, 12, 12, 4], strides=2,
                                      padding="SAME")

    y, w = random_array((4, 6, 6, 4)), random_array(W_SHAPE, seed=1)
    expected = fn(tf.constant(y), tf.constant(w)).numpy()
    actual = run_without_fallback(fn, to_dtensor(y, layout_of(spec, mesh_2x2)),
                                  to_dtensor(w, Layout.replicated(mesh_2x2, 4)))
    assert tuple(actual.shape) == expected.shape
    assert dtensor.fetch_layout(actual).sharding_specs[0] == "x"
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-4, atol=1e-4)


# Uneven shards leave some devices empty blocks (a batch of 2, or 3 channels, over x=8);
# TF's CPU kernels mishandle those (Conv2D returns its input, an empty filter is refused,
# DepthwiseConv2dNativeBackpropFilter returned uninitialised memory that the all-reduce
# added in, MaxPool3DGradGrad refuses, the oneDNN MaxPoolGrad aborts in a tf.function),
# so those devices make zeros of their output block instead of running the kernel.
_S = [1, 1, 1, 1]
_EMPTY_BLOCK_CASES = {
    "conv2d_batch": (lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, strides=_S,
                                                    padding="SAME"),
                     [(2, 5, 4, 3), (2, 2, 3, 4)], ["[x,*,*,*]", "[*,*,*,*]"]),
    "conv2d_in_channels": (lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, strides=_S,
                                                          padding="VALID"),
                           [(2, 5, 4, 3), (2, 2, 3, 4)], ["[*,*,*,x]", "[*,*,x,*]"]),
    "conv2d_out_channels": (lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, strides=_S,
                                                           padding="SAME"),
                            [(2, 5, 4, 3), (2, 2, 3, 3)], ["[*,*,*,*]", "[*,*,*,x]"]),
    "depthwise_filter_grad": (
        lambda x, dy: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=[2, 2, 3, 1], out_backprop=dy, strides=_S, padding="VALID"),
        [(2, 5, 4, 3), (2, 4, 3, 3)], ["[x,*,*,*]", "[x,*,*,*]"]),
    "depthwise_batch": (lambda x, w: tf.raw_ops.DepthwiseConv2dNative(
        input=x, filter=w, strides=_S, padding="SAME"),
        [(2, 5, 4, 3), (2, 2, 3, 1)], ["[x,*,*,*]", "[*,*,*,*]"]),
    "max_pool_batch": (lambda x: tf.nn.max_pool2d(x, 2, 1, "SAME"), [(2, 5, 4, 3)],
                       ["[x,*,*,*]"]),
    "max_pool3d_grad_grad": (
        lambda x, g: tf.raw_ops.MaxPool3DGradGrad(
            orig_input=x, orig_output=tf.raw_ops.MaxPool3D(
                input=x, ksize=[1, 2, 2, 2, 1], strides=[1, 1, 1, 1, 1], padding="VALID"),
            grad=g, ksize=[1, 2, 2, 2, 1], strides=[1, 1, 1, 1, 1], padding="VALID"),
        [(2, 3, 3, 3, 2), (2, 3, 3, 3, 2)], ["[x,*,*,*,*]", "[x,*,*,*,*]"]),
}


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("case", sorted(_EMPTY_BLOCK_CASES))
def test_empty_blocks_of_uneven_shards(case, in_function):
    fn, shapes, specs = _EMPTY_BLOCK_CASES[case]
    arrays = [random_array(s, seed=i) for i, s in enumerate(shapes)]
    expected = fn(*[tf.constant(a) for a in arrays]).numpy()
    run = tf.function(fn) if in_function else fn
    actual = run_without_fallback(run, *[to_dtensor(a, layout_of(s, MESH_8))
                                         for a, s in zip(arrays, specs)])
    assert tuple(actual.shape) == expected.shape
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_max_pool_gradient_of_empty_blocks(in_function):
    # The gradient runs MaxPoolGrad, whose oneDNN kernel aborts on an empty block.
    x = random_array((2, 6, 6, 3))

    def grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(tf.nn.max_pool2d(v, 2, 2, "VALID") ** 2)
        return tape.gradient(loss, v)

    expected = grad(tf.constant(x)).numpy()
    run = tf.function(grad) if in_function else grad
    actual = run_without_fallback(run, to_dtensor(x, layout_of("[x,*,*,*]", MESH_8)))
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["mean", "max", "sum"])
def test_empty_blocks_of_a_partial_input(op):
    # Found by the fuzzer: a batch of 1 over y=4 with a pending mean over x; the devices
    # with empty blocks make zeros too (the conv of an empty block is empty or zero
    # whatever pending reductions its term joins).
    mesh = dtensor.create_mesh([("x", 2), ("y", 4)], devices=[f"CPU:{i}" for i in range(8)])
    x, w = random_array((1, 5, 6, 2)), random_array((3, 1, 2, 2), seed=1)

    def fn(a, b):
        return tf.raw_ops.Conv2D(input=a, filter=b, strides=[1, 2, 1, 1], padding="VALID")

    expected = fn(tf.constant(x), tf.constant(w)).numpy()
    u = dtensor.UNSHARDED
    xs = to_dtensor(x, Layout(["y", u, u, u], mesh,
                              partial={"x": op}))
    ws = to_dtensor(w, Layout.replicated(mesh, 4))
    for run in (fn, tf.function(fn)):
        np.testing.assert_allclose(reassemble(run_without_fallback(run, xs, ws)), expected,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lowering", ["", "ops"])
@pytest.mark.parametrize("spatial", [2, 3])
def test_max_pool_grad_grad_of_a_gradient_gathered_inside_a_function(spatial, lowering):
    """TensorFlow's MaxPoolGradGrad and MaxPool3DGradGrad kernels write their output into
    `grad`'s buffer where nothing else holds it, and read `grad` as they write: inside a
    tf.function, where `grad` was gathered just before, the result was wrong (on one
    device too, for `grad * 2.0`). The expanded function now holds `grad` until the op is
    done (found by the op fuzzer)."""
    rng = np.random.RandomState(5)
    shape = [4, 2, 6, 3] if spatial == 2 else [4, 2, 1, 6, 3]
    ksize = [1, 2, 2, 1] if spatial == 2 else [1, 2, 1, 2, 1]
    pool = tf.raw_ops.MaxPool if spatial == 2 else tf.raw_ops.MaxPool3D
    grad_grad = tf.raw_ops.MaxPoolGradGrad if spatial == 2 else tf.raw_ops.MaxPool3DGradGrad
    attrs = dict(ksize=ksize, strides=[1] * (spatial + 2), padding="SAME")
    x, g = rng.randn(*shape).astype(np.float32), rng.randn(*shape).astype(np.float32)
    y = pool(input=x, **attrs).numpy()
    want = grad_grad(orig_input=x, orig_output=y, grad=g, **attrs).numpy()
    over_rows = Layout([dtensor.UNSHARDED, "x"] + [dtensor.UNSHARDED] * spatial, MESH_1D)
    whole = Layout.replicated(MESH_1D, spatial + 2)

    @tf.function
    def run(x, y, g):
        return grad_grad(orig_input=x, orig_output=y, grad=g, **attrs)

    with collective_lowering(lowering):
        got = run(to_dtensor(x, over_rows), to_dtensor(y, whole), to_dtensor(g, over_rows))
    np.testing.assert_allclose(reassemble(got), want, rtol=1e-6)
