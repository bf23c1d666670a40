"""Spatial sharding of convolutions and pooling (cc/rules/conv_rules.cc, cc/spmd/halo.cc).

A sharded height or width stays sharded: each device receives a halo of its neighbours'
rows and runs the op with VALID padding on its extended block.

    conv [*,x,*,*] SAME k=3          -> halo 1 row each side          -> [*,x,*,*]
    conv [*,x,*,*] SAME k=3 stride 2 -> output blocks line up          -> [*,x,*,*]
    conv [*,x,*,*] VALID k=3         -> output blocks do not line up   -> h gathered
    max_pool [x,y,*,*] SAME          -> -inf at the global edges       -> [x,y,*,*]

Every case is checked against one device (values, dtype, global shape, the layout
`debug.explain` predicts), in strict mode, eagerly, in tf.function and through gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, assert_values_equal, check_op, layout_of,
                             random_array, reassemble, run_without_fallback, to_dtensor)
from tf_dtensor import config, dtensor
from tf_dtensor.dtensor import Layout


def _pad_attr(padding):
    if isinstance(padding, str):
        return {"padding": padding}
    return {"padding": "EXPLICIT", "explicit_paddings": [p for pair in padding for p in pair]}


def _conv_attrs(padding, stride, dilation):
    return dict(_pad_attr(padding), strides=[1, stride, stride, 1],
                dilations=[1, dilation, dilation, 1])


def _conv(padding, stride, dilation):
    def fn(x, w):
        return tf.nn.conv2d(x, w, strides=stride, padding=padding, dilations=dilation)
    return fn


def _sharded_axes(layout):
    return [i for i, s in enumerate(layout.sharding_specs) if s != dtensor.UNSHARDED]


EXPLICIT_1_1 = [[0, 0], [1, 1], [1, 1], [0, 0]]
EXPLICIT_2_0 = [[0, 0], [2, 0], [0, 1], [0, 0]]

# (mesh, x spec, x shape, kernel, stride, dilation, padding, spatial axes kept sharded)
CONV_CASES = [
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 1, 1, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 2, 1, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 1, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 5, 1, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 2, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 2, 2, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 5, 2, 1, "SAME", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 1, 2, "SAME", [1]),
    (MESH_1D, "[*,*,x,*]", (2, 6, 8, 3), 3, 1, 2, "SAME", [2]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 1, 1, EXPLICIT_1_1, [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 2, 1, EXPLICIT_1_1, [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 1, 1, EXPLICIT_2_0, [1]),  # 2 rows before
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 2, 1, 1, EXPLICIT_1_1, []),   # 9 rows out
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 2, 2, 1, "VALID", [1]),       # no halo at all
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 1, 1, 1, "VALID", [1]),
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 1, 2, 1, "VALID", [1]),       # rows dropped
    (MESH_1D, "[*,x,*,*]", (2, 8, 6, 3), 3, 1, 1, "VALID", []),        # 6 rows out
    (MESH_1D, "[*,x,*,*]", (2, 7, 6, 3), 3, 1, 1, "SAME", [1]),        # uneven 4 + 3
    (MESH_1D, "[*,x,*,*]", (2, 5, 6, 3), 5, 1, 1, "SAME", [1]),        # halo = block
    (MESH_1D, "[*,x,*,*]", (2, 7, 6, 3), 3, 2, 1, "SAME", []),         # uneven, stride 2
    (MESH_2X2, "[x,y,*,*]", (4, 8, 6, 3), 3, 1, 1, "SAME", [1]),       # batch x height
    (MESH_2X2, "[x,y,*,*]", (4, 8, 6, 3), 3, 2, 2, "SAME", [1]),
    (MESH_2X2, "[*,x,y,*]", (2, 8, 8, 3), 3, 1, 1, "SAME", [1, 2]),    # corners
    (MESH_2X2, "[*,x,y,*]", (2, 8, 6, 3), 3, 2, 1, EXPLICIT_1_1, [1]),  # w: 3 rows out
    (MESH_2X2, "[*,y,*,x]", (2, 8, 6, 4), 3, 1, 1, "SAME", [1]),       # + in-channels
]


def _case_id(case):
    mesh, spec, shape, k, s, d, padding, _ = case
    pad = padding if isinstance(padding, str) else "EXPLICIT" + str(padding[1] + padding[2])
    return f"{spec}-{'x'.join(map(str, shape))}-k{k}-s{s}-d{d}-{pad}-{len(mesh.dim_names)}d"


@pytest.mark.parametrize("case", CONV_CASES, ids=[_case_id(c) for c in CONV_CASES])
def test_conv2d_spatial(case):
    mesh, spec, shape, k, stride, dilation, padding, kept = case
    w_shape = (k, k, shape[-1], 4)
    w_spec = "[*,*,x,*]" if spec.endswith("x]") else "[*,*,*,*]"
    actual = check_op(_conv(padding, stride, dilation), "Conv2D",
                      [random_array(shape), random_array(w_shape, seed=1)],
                      [layout_of(spec, mesh), layout_of(w_spec, mesh)],
                      attrs=_conv_attrs(padding, stride, dilation))
    layout = dtensor.fetch_layout(actual)
    assert [a for a in _sharded_axes(layout) if a in (1, 2)] == kept


@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[-1]][::3],
                         ids=[_case_id(c) for c in CONV_CASES if c[-1]][::3])
def test_conv2d_spatial_in_function(case):
    mesh, spec, shape, k, stride, dilation, padding, kept = case
    x, w = random_array(shape), random_array((k, k, shape[-1], 4), seed=1)
    fn = _conv(padding, stride, dilation)
    expected = fn(tf.constant(x), tf.constant(w)).numpy()
    w_spec = "[*,*,x,*]" if spec.endswith("x]") else "[*,*,*,*]"
    actual = run_without_fallback(tf.function(fn), to_dtensor(x, layout_of(spec, mesh)),
                                  to_dtensor(w, layout_of(w_spec, mesh)))
    assert tuple(actual.shape) == expected.shape
    assert_values_equal(expected, reassemble(actual))
    assert [a for a in _sharded_axes(dtensor.fetch_layout(actual)) if a in (1, 2)] == kept


def test_explain_names_the_halo_and_the_fallback(mesh_1d):
    x = layout_of("[*,x,*,*]", mesh_1d)
    w = Layout.replicated(mesh_1d, 4)
    plan = tf_dtensor.debug.explain("Conv2D", [x, w], [[2, 8, 6, 3], [3, 3, 3, 4]],
                                    attrs=_conv_attrs("SAME", 1, 1))
    assert plan["outputs"] == [layout_of("[*,x,*,*]", mesh_1d)]
    assert plan["collectives"] == ["halo exchange of input 0 axis 1 over x: 1 rows before, "
                                   "1 after"]
    plan = tf_dtensor.debug.explain("Conv2D", [x, w], [[2, 8, 6, 3], [3, 3, 3, 4]],
                                    attrs=_conv_attrs("VALID", 1, 1))
    assert plan["outputs"] == [Layout.replicated(mesh_1d, 4)]
    assert plan["collectives"][0] == "input 0: all-gather axis 1 [*,x,*,*] -> [*,*,*,*]"
    assert plan["collectives"][1].startswith("spatial axis 1 of input 0 gathered over x: "
                                             "output block 1 starts at row 3")


def test_conv2d_spatial_with_collective_ops(mesh_2x2):
    config.set_collective_lowering("ops")
    try:
        test_conv2d_spatial(CONV_CASES[22])
        test_pool_spatial(POOL_CASES[0])
    finally:
        config.set_collective_lowering("")


# ---------------------------------------------------------------------------------------
# Depthwise and 3-D convolutions
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["[*,x,*,*]", "[x,*,y,*]", "[*,x,*,y]"])
@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (2, "SAME"), (1, "EXPLICIT")])
def test_depthwise_spatial(spec, stride, padding, mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D
    pad = EXPLICIT_1_1 if padding == "EXPLICIT" else padding

    def fn(x, w):
        return tf.raw_ops.DepthwiseConv2dNative(
            input=x, filter=w, strides=[1, stride, stride, 1], padding=padding,
            explicit_paddings=_pad_attr(pad).get("explicit_paddings", []))

    actual = check_op(fn, "DepthwiseConv2dNative",
                      [random_array((2, 8, 8, 4)), random_array((3, 3, 4, 2), seed=1)],
                      [layout_of(spec, mesh), Layout.replicated(mesh, 4)],
                      attrs=dict(_pad_attr(pad), strides=[1, stride, stride, 1]))
    assert set(_sharded_axes(dtensor.fetch_layout(actual))) & {1, 2}


@pytest.mark.parametrize("spec", ["[*,x,*,*,*]", "[x,*,*,y,*]", "[*,*,x,y,*]"])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv3d_spatial(spec, stride, mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D

    def fn(x, w):
        return tf.nn.conv3d(x, w, strides=[1, stride, stride, stride, 1], padding="SAME")

    actual = check_op(fn, "Conv3D", [random_array((2, 4, 4, 4, 2)),
                                     random_array((3, 3, 3, 2, 3), seed=1)],
                      [layout_of(spec, mesh), Layout.replicated(mesh, 5)],
                      attrs={"padding": "SAME", "strides": [1, stride, stride, stride, 1]})
    assert set(_sharded_axes(dtensor.fetch_layout(actual))) & {1, 2, 3}


# ---------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------

# (op, x spec, x shape, window, stride, padding, kept)
POOL_CASES = [
    ("MaxPool", "[*,x,y,*]", (2, 8, 8, 3), 3, 1, "SAME", [1, 2]),
    ("MaxPool", "[*,x,*,*]", (2, 8, 6, 3), 2, 2, "VALID", [1]),
    ("MaxPool", "[*,x,*,*]", (2, 8, 6, 3), 3, 2, "SAME", [1]),
    ("MaxPool", "[*,x,*,*]", (2, 7, 6, 3), 3, 1, "SAME", [1]),
    ("MaxPool", "[x,y,*,*]", (4, 8, 6, 3), 5, 1, "SAME", [1]),
    ("MaxPool", "[*,x,*,*]", (2, 8, 6, 3), 3, 1, "VALID", []),
    ("AvgPool", "[*,x,y,*]", (2, 8, 8, 3), 3, 1, "SAME", [1, 2]),
    ("AvgPool", "[*,x,*,*]", (2, 8, 6, 3), 3, 2, "SAME", [1]),
    ("AvgPool", "[x,y,*,*]", (4, 8, 6, 3), 2, 2, "VALID", [1]),
    ("AvgPool", "[*,*,x,*]", (2, 6, 7, 3), 5, 1, "SAME", [2]),
]


def _pool(op, k, s, padding):
    if op == "MaxPool":
        return lambda x: tf.nn.max_pool2d(x, k, s, padding)
    return lambda x: tf.nn.avg_pool2d(x, k, s, padding)


@pytest.mark.parametrize("case", POOL_CASES,
                         ids=[f"{c[0]}-{c[1]}-{'x'.join(map(str, c[2]))}-k{c[3]}-s{c[4]}-{c[5]}"
                              for c in POOL_CASES])
def test_pool_spatial(case):
    op, spec, shape, k, s, padding, kept = case
    mesh = MESH_2X2 if "y" in spec else MESH_1D
    actual = check_op(_pool(op, k, s, padding), op, [random_array(shape)],
                      [layout_of(spec, mesh)],
                      attrs={"padding": padding, "ksize": [1, k, k, 1], "strides": [1, s, s, 1]})
    assert [a for a in _sharded_axes(dtensor.fetch_layout(actual)) if a in (1, 2)] == kept


def test_max_pool_of_negative_values_ignores_the_padding(mesh_1d):
    # -inf, not zeros, at the global edges: every value is negative.
    x = random_array((1, 8, 4, 2), low=-3.0, high=-1.0)
    check_op(_pool("MaxPool", 3, 1, "SAME"), "MaxPool", [x], [layout_of("[*,x,*,*]", mesh_1d)],
             attrs={"padding": "SAME", "ksize": [1, 3, 3, 1], "strides": [1, 1, 1, 1]})


def test_pool3d_spatial(mesh_2x2):
    attrs = {"padding": "SAME", "ksize": [1, 3, 3, 3, 1], "strides": [1, 1, 1, 1, 1]}
    for op, fn in [("MaxPool3D", lambda x: tf.nn.max_pool3d(x, 3, 1, "SAME")),
                   ("AvgPool3D", lambda x: tf.nn.avg_pool3d(x, 3, 1, "SAME"))]:
        actual = check_op(fn, op, [random_array((2, 4, 4, 4, 2))],
                          [layout_of("[*,x,*,y,*]", mesh_2x2)], attrs=attrs)
        assert _sharded_axes(dtensor.fetch_layout(actual)) == [1, 3]


# ---------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------

def _tape(loss, *args):
    with tf.GradientTape() as tape:
        tape.watch(list(args))
        value = loss(*args)
    return [value] + tape.gradient(value, list(args))


def _cnn(padding, stride, dilation):
    def loss(x, w):
        h = tf.nn.conv2d(x, w, strides=stride, padding=padding, dilations=dilation)
        h = tf.nn.max_pool2d(tf.nn.relu(h), 3, 1, "SAME")
        return tf.reduce_sum(tf.nn.avg_pool2d(h, 3, 1, "SAME") * h)
    return loss


GRAD_CASES = [
    pytest.param(MESH_1D, "[*,x,*,*]", "SAME", 1, 1, id="h_x-SAME"),
    pytest.param(MESH_1D, "[*,x,*,*]", "SAME", 2, 1, id="h_x-SAME-stride2"),
    pytest.param(MESH_1D, "[*,x,*,*]", EXPLICIT_2_0, 1, 1, id="h_x-EXPLICIT"),
    pytest.param(MESH_1D, "[*,*,x,*]", "VALID", 2, 1, id="w_x-VALID-stride2"),
    pytest.param(MESH_2X2, "[x,y,*,*]", "SAME", 1, 1, id="batch_x-h_y"),
    pytest.param(MESH_2X2, "[*,x,y,*]", "SAME", 1, 1, id="h_x-w_y"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,spec,padding,stride,dilation", GRAD_CASES)
def test_gradients_match_one_device(mesh, spec, padding, stride, dilation, in_function):
    x = random_array((2, 8, 8, 3))
    w = random_array((3, 3, 3, 4), low=-0.5, high=0.5, seed=1)
    loss = _cnn(padding, stride, dilation)
    expected = [v.numpy() for v in _tape(loss, tf.constant(x), tf.constant(w))]
    fn = tf.function(lambda a, b: _tape(loss, a, b)) if in_function else (
        lambda a, b: _tape(loss, a, b))
    actual = run_without_fallback(fn, to_dtensor(x, layout_of(spec, mesh)),
                                  to_dtensor(w, Layout.replicated(mesh, 4)))
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == want.shape
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padding,stride,k", [("SAME", 1, 3), ("SAME", 2, 3), ("SAME", 1, 5),
                                              (EXPLICIT_1_1, 1, 3), ("VALID", 2, 2),
                                              ("VALID", 2, 1)])
@pytest.mark.parametrize("spec", ["[*,x,*,*]", "[x,y,*,*]", "[*,x,y,*]"])
def test_backprop_ops_keep_height_sharded(spec, padding, stride, k, mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D
    x_shape, w_shape = (2, 8, 8, 3), (k, k, 3, 4)
    x, w = random_array(x_shape), random_array(w_shape, seed=1)
    attrs = _conv_attrs(padding, stride, 1)
    attrs.pop("dilations")
    raw = dict(strides=attrs["strides"], padding=attrs["padding"],
               explicit_paddings=attrs.get("explicit_paddings", []))
    dy_shape = tf.nn.conv2d(x, w, strides=stride, padding=padding).shape
    dy = random_array(dy_shape, seed=2)
    dx_want = tf.raw_ops.Conv2DBackpropInput(input_sizes=list(x_shape), filter=w,
                                             out_backprop=dy, **raw).numpy()
    dw_want = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=list(w_shape),
                                              out_backprop=dy, **raw).numpy()
    lx = layout_of(spec, mesh)
    ddy = to_dtensor(dy, lx)
    for in_function in (False, True):
        def run_dx():
            return tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.constant(list(x_shape)), filter=to_dtensor(w, Layout.replicated(
                    mesh, 4)), out_backprop=ddy, **raw)

        def run_dw():
            return tf.raw_ops.Conv2DBackpropFilter(
                input=to_dtensor(x, lx), filter_sizes=tf.constant(list(w_shape)),
                out_backprop=ddy, **raw)

        wrap = tf.function if in_function else (lambda f: f)
        dx = run_without_fallback(wrap(run_dx))
        dw = run_without_fallback(wrap(run_dw))
        np.testing.assert_allclose(reassemble(dx), dx_want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(reassemble(dw), dw_want, rtol=1e-4, atol=1e-4)
        assert tuple(dx.shape) == x_shape and tuple(dw.shape) == w_shape
        assert dtensor.fetch_layout(dw) == Layout.replicated(mesh, 4)
        assert _sharded_axes(dtensor.fetch_layout(dx)) == _sharded_axes(lx)


def test_filter_gradient_is_partial_over_the_height_mesh_dim(mesh_1d):
    plan = tf_dtensor.debug.explain(
        "Conv2DBackpropFilter", [layout_of("[*,x,*,*]", mesh_1d), None,
                                 layout_of("[*,x,*,*]", mesh_1d)],
        [[2, 8, 8, 3], [4], [2, 8, 8, 4]], int_values={1: [3, 3, 3, 4]},
        attrs=_conv_attrs("SAME", 1, 1))
    assert plan["outputs"] == [Layout.replicated(mesh_1d, 4)]
    assert plan["collectives"] == [
        "all-reduce(sum) of output 0 over x",
        "halo exchange of input 0 axis 1 over x: 1 rows before, 1 after"]


def test_requested_spatial_output_asks_for_spatial_input(mesh_1d):
    want = layout_of("[*,x,*,*]", mesh_1d)
    plan = tf_dtensor.debug.explain("Conv2D", [None, None], [[2, 8, 6, 3], [3, 3, 3, 4]],
                                    attrs=_conv_attrs("SAME", 1, 1), output_layouts=[want])
    assert plan["backward"][0] == want


def _depthwise_loss(x, w):
    h = tf.nn.depthwise_conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")
    return tf.reduce_sum(tf.nn.relu(h) * h)


def _conv3d_loss(x, w):
    h = tf.nn.conv3d(x, w, strides=[1, 1, 1, 1, 1], padding="SAME")
    return tf.reduce_sum(tf.nn.max_pool3d(h, 3, 1, "SAME") * h)


@pytest.mark.parametrize("loss,x_shape,w_shape,spec", [
    pytest.param(_depthwise_loss, (2, 8, 8, 4), (3, 3, 4, 1), "[*,x,y,*]",
                 id="depthwise-h_x-w_y"),
    pytest.param(_depthwise_loss, (2, 7, 8, 4), (3, 3, 4, 2), "[*,x,*,*]", id="depthwise-uneven"),
    pytest.param(_conv3d_loss, (2, 4, 4, 4, 2), (3, 3, 3, 2, 3), "[*,x,*,y,*]",
                 id="conv3d-d_x-w_y"),
    pytest.param(_cnn("SAME", 1, 1), (2, 7, 8, 3), (3, 3, 3, 4), "[*,x,*,*]", id="conv2d-uneven"),
])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_more_spatial_gradients(loss, x_shape, w_shape, spec, in_function, mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D
    x, w = random_array(x_shape), random_array(w_shape, low=-0.5, high=0.5, seed=1)
    expected = [v.numpy() for v in _tape(loss, tf.constant(x), tf.constant(w))]
    fn = tf.function(lambda a, b: _tape(loss, a, b)) if in_function else (
        lambda a, b: _tape(loss, a, b))
    actual = run_without_fallback(fn, to_dtensor(x, layout_of(spec, mesh)),
                                  to_dtensor(w, Layout.replicated(mesh, len(w_shape))))
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == want.shape
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-4)


def test_nchw_height_stays_sharded_in_the_plan(mesh_2x2):
    # NCHW: h is axis 2 (the CPU kernels have no NCHW Conv2D, so the planner alone).
    plan = tf_dtensor.debug.explain(
        "Conv2D", [layout_of("[x,*,y,*]", mesh_2x2), Layout.replicated(mesh_2x2, 4)],
        [[4, 3, 8, 6], [3, 3, 3, 4]],
        attrs={"data_format": "NCHW", "padding": "SAME", "strides": [1, 1, 1, 1]})
    assert plan["outputs"] == [layout_of("[x,*,y,*]", mesh_2x2)]
    assert plan["collectives"] == ["halo exchange of input 0 axis 2 over y: 1 rows before, "
                                   "1 after"]


def test_integer_max_pool_gathers(mesh_1d):
    # -inf padding needs a floating type: an int32 max pool gathers h instead.
    x = random_array((1, 8, 4, 2), dtype=np.int32, low=-5, high=5)
    actual = run_without_fallback(lambda v: tf.nn.max_pool2d(v, 3, 1, "SAME"),
                                  to_dtensor(x, layout_of("[*,x,*,*]", mesh_1d)))
    assert_values_equal(tf.nn.max_pool2d(tf.constant(x), 3, 1, "SAME").numpy(),
                        reassemble(actual))
    assert dtensor.fetch_layout(actual) == Layout.replicated(mesh_1d, 4)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_conv_gradients_keep_height_sharded(in_function, mesh_1d):
    def loss(x, w):
        h = tf.nn.conv2d(x, w, strides=1, padding="SAME")
        return tf.reduce_sum(tf.nn.relu(h) * h)

    x = random_array((2, 8, 6, 3))
    w = random_array((3, 3, 3, 4), low=-0.5, high=0.5, seed=1)
    expected = [v.numpy() for v in _tape(loss, tf.constant(x), tf.constant(w))]
    fn = tf.function(lambda a, b: _tape(loss, a, b)) if in_function else (
        lambda a, b: _tape(loss, a, b))
    actual = run_without_fallback(fn, to_dtensor(x, layout_of("[*,x,*,*]", mesh_1d)),
                                  to_dtensor(w, Layout.replicated(mesh_1d, 4)))
    for want, got in zip(expected, actual):
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-4)
    assert dtensor.fetch_layout(actual[1]) == layout_of("[*,x,*,*]", mesh_1d)
    assert dtensor.fetch_layout(actual[2]) == Layout.replicated(mesh_1d, 4)


@pytest.mark.parametrize("spec,shape,k,s,padding", [
    ("[*,x,*,*]", (2, 8, 6, 3), 3, 1, "SAME"),
    ("[*,x,*,*]", (2, 7, 6, 3), 3, 1, "SAME"),
    ("[x,y,*,*]", (4, 8, 6, 3), 3, 2, "SAME"),
    ("[*,x,y,*]", (2, 8, 8, 3), 2, 2, "VALID"),
    ("[*,x,*,*]", (2, 8, 6, 3), 3, 1, "VALID"),   # gathered
])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_max_pool_gradient_keeps_spatial_sharding(spec, shape, k, s, padding, in_function,
                                                  mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.max_pool2d(x, k, s, padding)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, x)

    x = random_array(shape, low=-3.0, high=-1.0)   # all negative: -inf padding matters
    want = grad(tf.constant(x)).numpy()
    fn = tf.function(grad) if in_function else grad
    got = run_without_fallback(fn, to_dtensor(x, layout_of(spec, mesh)))
    np.testing.assert_allclose(reassemble(got), want, rtol=1e-5, atol=1e-5)
    kept = padding == "SAME" or k == s
    # Whether the rule keeps the sharding shows inside tf.function; an eager tape gives a
    # replicated gradient its source's layout (tf_dtensor/_tape.py).
    assert (dtensor.fetch_layout(got) == layout_of(spec, mesh)) == (kept or not in_function)


def test_max_pool3d_gradient(mesh_2x2):
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.max_pool3d(x, 3, 1, "SAME") ** 2)
        return tape.gradient(loss, x)

    x = random_array((2, 4, 4, 4, 2))
    got = run_without_fallback(grad, to_dtensor(x, layout_of("[*,x,*,y,*]", mesh_2x2)))
    np.testing.assert_allclose(reassemble(got), grad(tf.constant(x)).numpy(), rtol=1e-5,
                               atol=1e-5)
    assert dtensor.fetch_layout(got) == layout_of("[*,x,*,y,*]", mesh_2x2)


@pytest.mark.parametrize("spec,k,s,padding,kept", [
    ("[*,x,*,*]", 2, 2, "VALID", True),
    ("[x,y,*,*]", 2, 2, "SAME", True),      # SAME whose windows fit: no padding
    ("[*,x,y,*]", 1, 2, "VALID", True),     # rows skipped by the stride
    ("[*,x,*,*]", 3, 1, "SAME", False),     # padded windows: gathered
])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_avg_pool_gradient(spec, k, s, padding, kept, in_function, mesh_2x2):
    mesh = mesh_2x2 if "y" in spec else MESH_1D

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.avg_pool2d(x, k, s, padding) ** 2)
        return tape.gradient(loss, x)

    x = random_array((4, 8, 8, 3))
    fn = tf.function(grad) if in_function else grad
    got = run_without_fallback(fn, to_dtensor(x, layout_of(spec, mesh)))
    np.testing.assert_allclose(reassemble(got), grad(tf.constant(x)).numpy(), rtol=1e-5,
                               atol=1e-5)
    # Whether the rule keeps the sharding shows inside tf.function; an eager tape gives a
    # replicated gradient its source's layout (tf_dtensor/_tape.py).
    assert (dtensor.fetch_layout(got) == layout_of(spec, mesh)) == (kept or not in_function)


def test_partial_input_keeps_its_sum_through_the_halo(mesh_2x2):
    # Inside tf.function the einsum leaves x partial over y; the conv is linear in x, so
    # the halo exchange runs on the partial terms and the sum is taken once at the end.
    def fn(a, b, w):
        x = tf.einsum("nhwk,kc->nhwc", a, b)
        return tf.nn.avg_pool2d(tf.nn.conv2d(x, w, strides=1, padding="SAME"), 3, 1, "SAME")

    a, b = random_array((2, 8, 6, 4)), random_array((4, 3), seed=1)
    w = random_array((3, 3, 3, 4), seed=2)
    expected = fn(tf.constant(a), tf.constant(b), tf.constant(w)).numpy()
    actual = run_without_fallback(tf.function(fn),
                                  to_dtensor(a, layout_of("[*,x,*,y]", mesh_2x2)),
                                  to_dtensor(b, layout_of("[y,*]", mesh_2x2)),
                                  to_dtensor(w, Layout.replicated(mesh_2x2, 4)))
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-4, atol=1e-4)
