"""The one dispatch path and the eager plan cache (cc/rules/dispatch.h, plan_cache.h)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import MESH_2X2, assert_dtensor_equal, layout_of, random_array, to_dtensor
from tf_dtensor import _device
from tf_dtensor.dtensor import Layout


def test_repeated_op_reuses_its_plan():
    device = _device.get()
    x = to_dtensor(random_array((4, 6)), layout_of("[x,y]", MESH_2X2))
    y = x + x  # plans AddV2 on [x,y] once
    before = device.num_cached_plans
    for _ in range(5):
        y = y + x
    assert device.num_cached_plans == before
    assert_dtensor_equal(random_array((4, 6)) * 7, layout_of("[x,y]", MESH_2X2), y)


@pytest.mark.parametrize("transpose_a", [False, True, False])
def test_plans_that_read_attributes_are_keyed_by_them(transpose_a):
    # Same op, layouts and shapes; only transpose_a differs. A plan made for one must
    # never serve the other (the row-sharded axis moves to the contraction).
    a = random_array((4, 4), seed=1)
    b = random_array((4, 4), seed=2)
    da = to_dtensor(a, layout_of("[x,*]", MESH_2X2))
    db = to_dtensor(b, Layout.replicated(MESH_2X2, 2))
    got = tf.matmul(da, db, transpose_a=transpose_a)
    expected = (a.T if transpose_a else a) @ b
    assert_dtensor_equal(expected, layout_of("[*,*]" if transpose_a else "[x,*]", MESH_2X2), got)


def test_host_argument_values_are_part_of_the_key():
    x = random_array((4, 6), seed=3)
    dx = to_dtensor(x, layout_of("[x,y]", MESH_2X2))
    for axis in (0, 1, 0):
        kept = Layout(["y"] if axis == 0 else ["x"], MESH_2X2)
        assert_dtensor_equal(x.sum(axis=axis), kept, tf.reduce_sum(dx, axis=axis))


def test_same_error_for_eager_and_function_names_the_node():
    # Both paths report through Dispatch: the op, its inputs, and in a function the node.
    x = to_dtensor(np.ones((4, 4), np.float32), layout_of("[x,y]", MESH_2X2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"DTensor op 'Transpose'") as eager:
        tf.transpose(x, [1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"DTensor op 'Transpose'.*node '.*' of tf.function") as traced:
        tf.function(lambda t: tf.transpose(t, [1, 1]))(x)
    assert "names axis 1 twice" in str(eager.value) and "names axis 1 twice" in str(traced.value)
