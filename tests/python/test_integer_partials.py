"""Integer means and quotients of sharded or pending sums give one device's answer.

Integer division truncates, so it does not distribute over a sum: a mean over a sharded
axis gathers the axis first (a sum of int8 terms could also wrap before the division), a
quotient of a pending sum is reduced first, and a `Partial("mean")` of integers adds in
int64 and truncates as TF's Mean of integers does. Checked under every collective lowering,
eagerly and inside tf.function, against one plain device.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import LOWERINGS, MESH_8, collective_lowering, layout_of, reassemble, to_dtensor
import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.placements import Partial, from_local, full_tensor, init_device_mesh

CASES = [
    (np.int32, [1, 2, 2, 2, 2, 2, 2, 2]),   # mean 1 (15 // 8); per-device means sum to 0
    (np.int8, [100] * 8),                   # the sum, 800, wraps in int8
    (np.uint8, [200] * 4 + [10] * 4),       # 105; the sum wraps in uint8
    (np.int64, [-7, 3, 0, 1, 2, 2, 5, -1]),  # mean 5 // 8 = 0, truncated toward zero
]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("dtype,values", CASES, ids=[c[0].__name__ for c in CASES])
def test_integer_mean_over_a_sharded_axis(lowering, traced, dtype, values):
    values = np.array(values, dtype)
    want = tf.reduce_mean(tf.constant(values)).numpy()
    with collective_lowering(lowering):
        x = to_dtensor(values, layout_of("[x]", MESH_8))
        fn = tf.function(tf.reduce_mean) if traced else tf.reduce_mean
        got = fn(x)
        assert got.dtype == tf.as_dtype(dtype)
        assert reassemble(got) == want


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_integer_division_of_a_pending_sum_is_reduced_first(traced):
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    terms = [tf.constant([1, 3, 5], tf.int32)] * 4  # the value is [4, 12, 20]
    p = from_local(terms, mesh, [Partial("sum")])
    divide = lambda p: tf.raw_ops.Div(x=p, y=tf.constant(3, tf.int32))
    got = (tf.function(divide) if traced else divide)(p)
    np.testing.assert_array_equal(full_tensor(got).numpy(), [1, 4, 6])  # not 4 * [0, 1, 1]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64])
def test_a_partial_mean_of_integers_is_their_truncated_mean(lowering, dtype):
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    rows = [[1, 2, 100], [3, 2, 100], [5, 2, 100], [7, 3, 100]]  # means 4, 2.25, 100
    with collective_lowering(lowering):
        p = from_local([tf.constant(r, dtype) for r in rows], mesh, [Partial("mean")])
        got = full_tensor(p)
    assert got.dtype == tf.as_dtype(dtype)
    np.testing.assert_array_equal(got.numpy(), [4, 2, 100])


@pytest.mark.parametrize("op", ["reduce_sum", "matmul", "add"])
def test_an_integer_partial_mean_is_made_before_linear_ops(op):
    # Terms 0,1,0,1,... : the mean is 0 (truncated). Passed through the op pending, the
    # per-device results' mean was 1 for a sum, a matmul and t + t.
    mesh = MESH_8
    t = dtensor.pack([tf.constant([i % 2, i % 2], tf.int32) for i in range(8)],
                     dtensor.Layout([dtensor.UNSHARDED], mesh, partial={"x": "mean"}))
    fns = {"reduce_sum": tf.reduce_sum,
           "matmul": lambda t: tf.matmul(tf.reshape(t, [1, 2]), tf.ones([2, 1], tf.int32)),
           "add": lambda t: t + t}
    got = fns[op](t)
    want = fns[op](tf.constant([0, 0], tf.int32)).numpy()
    np.testing.assert_array_equal(full_tensor(got).numpy() if dtensor.fetch_layout(got).partial
                                  else reassemble(got), want)


@pytest.mark.parametrize("dtype,reduction", [
    (tf.string, "sum"), (tf.string, "max"), (tf.complex64, "max"), (tf.complex128, "min"),
    (tf.bool, "mean")])
def test_a_partial_layout_no_kernel_can_reduce_is_refused_where_it_is_made(dtype, reduction):
    # It was accepted, and the first reduction failed with a raw kernel error.
    mesh = MESH_8
    layout = dtensor.Layout([dtensor.UNSHARDED], mesh, partial={"x": reduction})
    value = tf.constant(["a", "b"]) if dtype == tf.string else tf.cast([1, 0], dtype)
    with pytest.raises(tf_dtensor.PackError, match=f"pending {reduction}.*{dtype.name}"):
        dtensor.pack([value] * 8, layout)
    replicated = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh, 1))
    with pytest.raises(Exception, match=f"pending {reduction}.*{dtype.name}"):
        dtensor.relayout(replicated, layout)


def test_partial_layouts_kernels_can_reduce_still_pack():
    mesh = MESH_8
    for dtype, reduction in [(tf.complex64, "sum"), (tf.complex64, "prod"), (tf.bool, "sum"),
                             (tf.bool, "max"), (tf.int8, "mean")]:
        layout = dtensor.Layout([dtensor.UNSHARDED], mesh, partial={"x": reduction})
        t = dtensor.pack([tf.cast([1, 0], dtype)] * 8, layout)
        assert dtensor.fetch_layout(t).partial
