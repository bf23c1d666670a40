"""Helpers of the tf.function tests (test_function_*.py, test_control_flow.py)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dtensor_testing import (assert_dtensor_equal, assert_values_equal, random_array,
                             reassemble, run_without_fallback, to_dtensor)
from tf_dtensor import _device
from tf_dtensor import dtensor


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


def no_relayout(tensor, layout):
    """Stands in for `dtensor.relayout` in the plain-device reference run."""
    del layout
    return tensor


# A small MLP and its data, for the gradient and training-step tests.
MLP_X = random_array((8, 4), seed=10)
MLP_Y = random_array((8, 3), seed=11)
_W1 = random_array((4, 6), low=-1, high=1, seed=12)
_B1 = random_array((6,), low=-0.1, high=0.1, seed=13)
_W2 = random_array((6, 3), low=-1, high=1, seed=14)
_B2 = random_array((3,), low=-0.1, high=0.1, seed=15)
MLP_PARAMS = [_W1, _B1, _W2, _B2]


def mlp_loss(x, y, w1, b1, w2, b2):
    h = tf.nn.relu(tf.matmul(x, w1) + b1)
    out = tf.matmul(h, w2) + b2
    return tf.reduce_mean(tf.square(out - y))
