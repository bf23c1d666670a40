"""Numerical checks of cc/rules/creation_rules.cc through `call_with_layout`.

    range(0, 10) with requested [x] @ mesh(x=4) -> each device runs Range over its block

    fill(dims=[8,4], 1.0) with requested [x,*] -> each device fills its [8/|x|,4] block
    stateless_random_normal(shape, seed) with requested [x,y] -> the global value is drawn
      once and sliced, so values equal the single-device result for every layout
    empty(shape=[8,4], init=true) with requested [x,y] -> each device makes its own block
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, layout_of,
                             layout_params, reassemble, run_without_fallback, spec_params,
                             to_dtensor)
from tf_dtensor import dtensor

SHAPE = (8, 4)
# tf.ones/zeros/fill of 1000 elements or more run a Fill op; smaller ones are constants.
BIG_SHAPE = (64, 32)

# Random values must equal the single-device draw for every layout; the deterministic
# creators run on a subset.
RANDOM = {
    "stateless_normal": (tf.random.stateless_normal, {"shape": SHAPE, "seed": (1, 2)}),
    "stateless_uniform": (tf.random.stateless_uniform, {"shape": SHAPE, "seed": (3, 4)}),
    "stateless_uniform_int": (tf.random.stateless_uniform,
                              {"shape": SHAPE, "seed": (5, 6), "minval": 0, "maxval": 100,
                               "dtype": tf.int32}),
}
CONSTANT = {
    "ones": (tf.ones, {"shape": SHAPE}),
    "zeros": (tf.zeros, {"shape": SHAPE}),
    "fill": (tf.fill, {"dims": SHAPE, "value": 3.5}),
    "ones_big": (tf.ones, {"shape": BIG_SHAPE}),
    "fill_big_int": (tf.fill, {"dims": BIG_SHAPE, "value": 7}),
}


def _check_creation(fn, kwargs, layout):
    expected = fn(**kwargs).numpy()
    actual = run_without_fallback(lambda: dtensor.call_with_layout(fn, layout, **kwargs))
    assert_dtensor_equal(expected, layout, actual)


@pytest.mark.parametrize("name", sorted(RANDOM))
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_random_equals_single_device_value(layouts, name):
    fn, kwargs = RANDOM[name]
    _check_creation(fn, kwargs, layouts[0])


@pytest.mark.parametrize("name", sorted(CONSTANT))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",), ("[*,*]",)) +
                         spec_params(MESH_1D, ("[*,x]",)))
def test_constant_creation(layouts, name):
    fn, kwargs = CONSTANT[name]
    _check_creation(fn, kwargs, layouts[0])


@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_stateless_normal_in_tf_function(layouts):
    (layout,) = layouts
    fn = tf.function(tf.random.stateless_normal)
    expected = tf.random.stateless_normal(shape=SHAPE, seed=(1, 1)).numpy()
    actual = dtensor.call_with_layout(fn, layout, shape=SHAPE, seed=(1, 1))
    assert_dtensor_equal(expected, layout, actual)


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,x]",)))
def test_ones_in_tf_function(layouts):
    (layout,) = layouts
    actual = dtensor.call_with_layout(tf.function(tf.ones), layout, shape=SHAPE)
    assert_dtensor_equal(np.ones(SHAPE, np.float32), layout, actual)


def test_random_values_differ_across_blocks(mesh_2x2):
    # A rule that drew each block with the same seed would repeat one block everywhere.
    layout = layout_of("[x,y]", mesh_2x2)
    actual = dtensor.call_with_layout(tf.random.stateless_normal, layout, shape=SHAPE,
                                      seed=(1, 2))
    blocks = [c.numpy() for c in dtensor.unpack(actual)]
    assert not np.allclose(blocks[0], blocks[3])


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",)))
def test_fill_plan_gives_the_requested_layout(layouts):
    (layout,) = layouts
    plan = tf_dtensor.debug.explain("Fill", [None, None], [[2], []], int_values={0: list(SHAPE)},
                                    requested=layout)
    assert plan["outputs"] == [layout]
    assert plan["collectives"] == []


@pytest.mark.parametrize("fn,kwargs", [
    pytest.param(tf.ones, {"shape": (6, 4)}, id="ones"),
    pytest.param(tf.ones, {"shape": (12, 100)}, id="ones_big"),
    pytest.param(tf.random.stateless_normal, {"shape": (12, 4), "seed": (1, 2)},
                 id="stateless_normal"),
])
def test_uneven_shape_in_requested_layout(fn, kwargs, mesh_8):
    # An uneven request: blocks of 2, 2, 2, 2, 2, 2, 0, 0 rows; values as on one device.
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_8)
    got = dtensor.call_with_layout(fn, layout, **kwargs)
    assert_dtensor_equal(fn(**kwargs).numpy(), layout, got)


# Creation ops asked for an uneven layout make their value in it, as debug.explain says:
# Fill and Empty each device its own block, random ops and LinSpace drawn whole and
# sliced. They used to come out replicated (explain: replicated for Fill, nothing for
# the others), left for call_with_layout's final relayout to cut.
UNEVEN_CREATIONS = {
    "Fill": (lambda shape: tf.raw_ops.Fill(dims=shape, value=2.5), {}),
    "Empty": (lambda shape: tf.raw_ops.Empty(shape=shape, dtype=tf.int32, init=True),
              {"dtype": tf.int32, "init": True}),
    "StatelessRandomNormal": (
        lambda shape: tf.raw_ops.StatelessRandomNormal(shape=shape, seed=[1, 2]), {}),
    "StatelessRandomUniformIntV2": (
        lambda shape: tf.raw_ops.StatelessRandomUniformIntV2(
            shape=shape, key=np.array([7], np.uint64), counter=np.array([3, 0], np.uint64),
            alg=1, minval=0, maxval=100), {}),
    "StatelessTruncatedNormalV2": (
        lambda shape: tf.raw_ops.StatelessTruncatedNormalV2(
            shape=shape, key=np.array([5], np.uint64), counter=np.array([9, 0], np.uint64),
            alg=1), {}),
}
# The global shapes of each op's inputs, its shape first.
_SHAPES_OF = {"Fill": [[2], []], "Empty": [[2]], "StatelessRandomNormal": [[2], [2]],
              "StatelessRandomUniformIntV2": [[2], [1], [2], [], [], []],
              "StatelessTruncatedNormalV2": [[2], [1], [2], []]}
UNEVEN_LAYOUTS = (spec_params(MESH_2X2, ("[x,y]",), ("[*,y]",)) +
                  spec_params(MESH_8, ("[x,*]",), ("[*,x]",)))


@pytest.mark.parametrize("how", ["default_layout", "call_with_layout", "function"])
@pytest.mark.parametrize("op_name", sorted(UNEVEN_CREATIONS))
@pytest.mark.parametrize("layouts", UNEVEN_LAYOUTS)
def test_uneven_request_is_made_in_that_layout(layouts, op_name, how):
    (layout,) = layouts
    shape = [5, 3]   # over 2: 3 and 2 rows, 2 and 1 columns; over 8: 1,1,1,1,1,0,0,0 rows
    make, attrs = UNEVEN_CREATIONS[op_name]
    expected = make(shape).numpy()
    if how == "default_layout":   # TensorFlow's device scope: the op's own output
        from tf_dtensor import api
        with api._dtensor_device()._default_layout(layout):
            actual = run_without_fallback(lambda: make(shape))
    elif how == "call_with_layout":
        actual = run_without_fallback(lambda: dtensor.call_with_layout(make, layout, shape))
    else:
        actual = run_without_fallback(
            lambda: dtensor.call_with_layout(tf.function(make), layout, shape))
    assert_dtensor_equal(expected, layout, actual)
    assert actual.dtype == tf.as_dtype(expected.dtype)
    shapes = _SHAPES_OF[op_name]
    plan = tf_dtensor.debug.explain(op_name, [None] * len(shapes), shapes,
                                    int_values={0: shape}, attrs=attrs, requested=layout)
    assert plan["outputs"] == [layout]
    assert plan["collectives"] == []


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("layouts", spec_params(MESH_8, ("[x]",)) + spec_params(MESH_2X2, ("[y]",)))
def test_linspace_in_an_uneven_requested_layout(layouts, in_function):
    (layout,) = layouts
    make = lambda: tf.raw_ops.LinSpace(start=-1.0, stop=2.0, num=7)  # noqa: E731
    fn = tf.function(make) if in_function else make
    expected = make().numpy()
    actual = run_without_fallback(lambda: dtensor.call_with_layout(fn, layout))
    assert_dtensor_equal(expected, layout, actual)
    from tf_dtensor import api
    with api._dtensor_device()._default_layout(layout):
        actual = run_without_fallback(fn)
    assert_dtensor_equal(expected, layout, actual)
    plan = tf_dtensor.debug.explain("LinSpace", [None, None, None], [[], [], []],
                                    int_values={2: [7]}, requested=layout)
    assert plan["outputs"] == [layout]


def test_fill_keeps_replicated_when_the_requested_layout_cannot_divide_it(mesh_2x2):
    # call_with_layout asks every creation op for its layout; a [1,4] operand that
    # broadcasts later is not split over x (an axis of size 1 over several devices), so
    # it is made replicated, as debug.explain says, and only the final result takes the
    # layout.
    layout = dtensor.Layout(["x", "y"], mesh_2x2)
    got = dtensor.call_with_layout(lambda: tf.ones([1, 4]) * 3.0 + tf.zeros([8, 4]), layout)
    assert dtensor.fetch_layout(got) == layout
    np.testing.assert_array_equal(np.concatenate(
        [np.concatenate([c.numpy() for c in dtensor.unpack(got)[r * 2:r * 2 + 2]], axis=1)
         for r in range(2)]), np.full((8, 4), 3.0, np.float32))
    plan = tf_dtensor.debug.explain("Fill", [None, None], [[2], []], int_values={0: [1, 4]},
                                    requested=layout)
    assert plan["outputs"] == [dtensor.Layout.replicated(mesh_2x2, 2)]
    from tf_dtensor import api
    with api._dtensor_device()._default_layout(layout):
        ones = tf.raw_ops.Fill(dims=[1, 4], value=1.0)
    assert dtensor.fetch_layout(ones) == dtensor.Layout.replicated(mesh_2x2, 2)


# Range in a requested layout: each device runs Range over its own block (uneven blocks
# included); a float range is made replicated and sliced.
RANGES = [(0, 10, 1), (3, 20, 3), (10, 0, -3), (0, 3, 1), (5, 5, 1)]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("bounds", RANGES, ids=lambda b: "range" + "_".join(map(str, b)))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x]",), ("[y]",), ("[*]",)) +
                         spec_params(MESH_1D, ("[x]",)) +
                         spec_params(MESH_8, ("[x]",)))
def test_range_in_requested_layout(layouts, bounds, in_function):
    (layout,) = layouts
    fn = tf.function(lambda: tf.range(*bounds)) if in_function else (lambda: tf.range(*bounds))
    actual = run_without_fallback(lambda: dtensor.call_with_layout(fn, layout))
    assert_dtensor_equal(np.arange(*bounds, dtype=np.int32), layout, actual)


def test_range_blocks_are_made_on_each_device(mesh_2x2):
    plan = tf_dtensor.debug.explain("Range", [None, None, None], [[], [], []],
                                    int_values={0: [0], 1: [10], 2: [1]},
                                    requested=layout_of("[y]", mesh_2x2))
    assert plan["outputs"] == [layout_of("[y]", mesh_2x2)]
    assert plan["collectives"] == []


def test_float_range_is_made_replicated_then_sliced(mesh_2x2):
    layout = layout_of("[x]", mesh_2x2)
    actual = run_without_fallback(lambda: dtensor.call_with_layout(tf.range, layout, 0.0, 5.0,
                                                                   0.5))
    assert_dtensor_equal(np.arange(0, 5, 0.5, dtype=np.float32), layout, actual)


def test_range_feeding_a_sharded_sum_in_function_stays_sharded(mesh_2x2):
    x = np.arange(10, dtype=np.float32) * 0.5
    fn = tf.function(lambda t: t * tf.cast(tf.range(10), tf.float32))
    actual = run_without_fallback(fn, to_dtensor(x, layout_of("[x]", mesh_2x2)))
    assert_dtensor_equal(x * np.arange(10, dtype=np.float32), layout_of("[x]", mesh_2x2), actual)


# Empty (tf.nn.ctc_loss's buffers) makes its blocks in the requested layout, as Fill does:
# zeros with init, values left unset without (only shape, dtype and layout are compared).
EMPTY_LAYOUTS = (spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",), ("[*,x]",), ("[*,*]",)) +
                 spec_params(MESH_1D, ("[x,*]",)) + spec_params(MESH_8, ("[x,*]",)))


def _empty(dtype, init):
    def make():
        return tf.raw_ops.Empty(shape=SHAPE, dtype=dtype, init=init)
    return make


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.int32, tf.bool], ids=lambda t: t.name)
@pytest.mark.parametrize("layouts", EMPTY_LAYOUTS)
def test_empty_in_requested_layout(layouts, dtype, in_function):
    (layout,) = layouts
    make = _empty(dtype, init=True)
    fn = tf.function(make) if in_function else make
    expected = make().numpy()
    actual = run_without_fallback(lambda: dtensor.call_with_layout(fn, layout))
    assert_dtensor_equal(expected, layout, actual)
    if not in_function:  # no collective: each device made its own block
        plan = tf_dtensor.debug.explain("Empty", [None], [[2]], int_values={0: list(SHAPE)},
                                        attrs={"dtype": dtype, "init": True}, requested=layout)
        assert plan["outputs"] == [layout]
        assert plan["collectives"] == []


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,y]",)))
def test_empty_without_init_has_the_shape_dtype_and_layout(layouts):
    (layout,) = layouts
    actual = run_without_fallback(
        lambda: dtensor.call_with_layout(_empty(tf.float32, init=False), layout))
    assert dtensor.fetch_layout(actual) == layout
    assert tuple(actual.shape) == SHAPE and actual.dtype == tf.float32
    assert [tuple(c.shape) for c in dtensor.unpack(actual)][0] == (
        SHAPE[0] // (2 if layout.sharding_specs[0] != "unsharded" else 1),
        SHAPE[1] // (2 if layout.sharding_specs[1] != "unsharded" else 1))


def test_empty_with_an_uneven_request(mesh_8):
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_8)
    make = lambda: tf.raw_ops.Empty(shape=(6, 4), dtype=tf.float32, init=True)  # noqa: E731
    assert_dtensor_equal(np.zeros((6, 4), np.float32), layout,
                         dtensor.call_with_layout(make, layout))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_ctc_loss_and_its_gradient_keep_the_batch_sharded(traced, mesh_2x2):
    # tf.nn.ctc_loss's gradient makes its buffers with Empty inside tf.function: with a
    # rule, nothing falls back (strict mode) and the batch stays sharded.
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4, 5)).astype(np.float32)  # [time, batch, classes]
    labels = np.array([[1, 2, 0], [3, 3, 1], [2, 0, 0], [4, 1, 2]], np.int32)
    label_length = np.array([2, 3, 1, 3], np.int32)
    logit_length = np.array([6, 5, 3, 6], np.int32)

    def loss_and_grad(labels, logits, label_length, logit_length):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = tf.nn.ctc_loss(labels, logits, label_length, logit_length,
                                  logits_time_major=True, blank_index=0)
            total = tf.reduce_sum(loss)
        return loss, tape.gradient(total, logits)

    fn = tf.function(loss_and_grad) if traced else loss_and_grad
    expected = loss_and_grad(labels, tf.constant(logits), label_length, logit_length)
    batch = layout_of("[x]", mesh_2x2)
    loss, grad = run_without_fallback(
        fn, to_dtensor(labels, layout_of("[x,*]", mesh_2x2)),
        to_dtensor(logits, layout_of("[*,x,*]", mesh_2x2)), to_dtensor(label_length, batch),
        to_dtensor(logit_length, batch))
    assert dtensor.fetch_layout(loss) == batch
    assert dtensor.fetch_layout(grad) == layout_of("[*,x,*]", mesh_2x2)
    np.testing.assert_allclose(reassemble(loss), expected[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reassemble(grad), expected[1].numpy(), rtol=1e-5, atol=1e-5)
