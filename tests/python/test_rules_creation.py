"""Numerical checks of cc/rules/creation_rules.cc through `call_with_layout`.

    fill(dims=[8,4], 1.0) with requested [x,*] -> each device fills its [8/|x|,4] block
    stateless_random_normal(shape, seed) with requested [x,y] -> the global value is drawn
      once and sliced, so values equal the single-device result for every layout
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_2X2, assert_dtensor_equal, layout_of, layout_params,
                             run_without_fallback, spec_params)
from tf_dtensor import dtensor

SHAPE = (8, 4)
# tf.ones/zeros/fill of 1000 elements or more run a Fill op; smaller ones are constants.
BIG_SHAPE = (64, 32)

CREATORS = {
    "ones": (tf.ones, {"shape": SHAPE}),
    "zeros": (tf.zeros, {"shape": SHAPE}),
    "fill": (tf.fill, {"dims": SHAPE, "value": 3.5}),
    "stateless_normal": (tf.random.stateless_normal, {"shape": SHAPE, "seed": (1, 2)}),
    "stateless_uniform": (tf.random.stateless_uniform, {"shape": SHAPE, "seed": (3, 4)}),
    "stateless_uniform_int": (tf.random.stateless_uniform,
                              {"shape": SHAPE, "seed": (5, 6), "minval": 0, "maxval": 100,
                               "dtype": tf.int32}),
    "ones_big": (tf.ones, {"shape": BIG_SHAPE}),
    "fill_big_int": (tf.fill, {"dims": BIG_SHAPE, "value": 7}),
}


@pytest.mark.parametrize("name", sorted(CREATORS))
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_call_with_layout_creates_the_single_device_value(layouts, name):
    fn, kwargs = CREATORS[name]
    (layout,) = layouts
    expected = fn(**kwargs).numpy()
    actual = run_without_fallback(lambda: dtensor.call_with_layout(fn, layout, **kwargs))
    assert_dtensor_equal(expected, layout, actual)


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
