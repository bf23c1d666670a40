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


# Local-only runs (PlanCache::SetLocalOnly): on virtual CPUs many ops expand to the op
# itself on each device's own components, devices holding the same shard sharing one
# result. Once an expansion did exactly that, a repeat runs those ops directly. Each test
# checks what the expansion gives: values, dtype, global shape, layout, every component.

REPLICATED_2D = Layout.replicated(MESH_2X2, 2)


@pytest.mark.parametrize("spec", ["[*,*]", "[x,*]", "[x,y]", "[*,y]"])
def test_repeated_op_runs_its_local_ops(spec):
    device = _device.get()
    layout = layout_of(spec, MESH_2X2)
    a, b = random_array((4, 6), seed=4), random_array((4, 6), seed=5)
    da, db = to_dtensor(a, layout), to_dtensor(b, layout)
    assert_dtensor_equal(a * b, layout, da * db)  # expanded; records the run
    before = device.num_local_only_runs
    y = da * db
    for _ in range(3):
        y = y * db
    assert device.num_local_only_runs == before + 4
    assert_dtensor_equal(a * b ** 4, layout, y)


def test_local_only_run_with_uneven_shards():
    # [x,*] over 2 devices of 5 rows: blocks of 3 and 2; the global shape sums them.
    device = _device.get()
    layout = layout_of("[x,*]", MESH_2X2)
    a = random_array((5, 3), seed=9)
    da = to_dtensor(a, layout)
    tf.nn.relu(da)
    before = device.num_local_only_runs
    assert_dtensor_equal(np.maximum(a, 0), layout, tf.nn.relu(da))
    assert device.num_local_only_runs == before + 1


def test_local_only_runs_with_host_arguments_are_keyed_by_their_values():
    # An axis or a permutation is part of the plan: each value has its own run, and a
    # value whose expansion needs a collective (the sum over the sharded axis) has none.
    device = _device.get()
    a = random_array((4, 6), seed=10)
    rows = to_dtensor(a, layout_of("[x,*]", MESH_2X2))
    for axis in (1, 0, 1, 0, 1):
        kept = layout_of("[x]" if axis == 1 else "[*]", MESH_2X2)
        assert_dtensor_equal(a.sum(axis=axis), kept, tf.reduce_sum(rows, axis=axis))
    before = device.num_local_only_runs
    tf.reduce_sum(rows, axis=1)
    assert device.num_local_only_runs == before + 1
    tf.reduce_sum(rows, axis=0)  # all-reduces over x: never recorded
    assert device.num_local_only_runs == before + 1
    blocks = to_dtensor(a, layout_of("[x,y]", MESH_2X2))
    for perm in ([1, 0], [0, 1], [1, 0], [0, 1]):
        expected = layout_of("[y,x]" if perm == [1, 0] else "[x,y]", MESH_2X2)
        assert_dtensor_equal(a.transpose(perm), expected, tf.transpose(blocks, perm))
    before = device.num_local_only_runs
    tf.transpose(blocks, [1, 0])
    assert device.num_local_only_runs == before + 1


def test_local_only_runs_take_each_ops_own_attributes():
    # Cast's plan does not read DstT, so casts to different types share it; the local op
    # must still take each call's attributes. MatMul's plan reads transpose_a: keyed by it.
    device = _device.get()
    value = np.array([[4.5, -6.0], [8.25, 9.0]], np.float32)
    dx = to_dtensor(value, REPLICATED_2D)
    before = device.num_local_only_runs
    for dtype in (tf.float64, tf.int32, tf.float64, tf.int64, tf.int32):
        assert_dtensor_equal(value.astype(dtype.as_numpy_dtype), REPLICATED_2D,
                             tf.cast(dx, dtype))
    assert device.num_local_only_runs == before + 4
    for transpose_a in (False, True, False, True):
        assert_dtensor_equal(value.T @ value if transpose_a else value @ value, REPLICATED_2D,
                             tf.matmul(dx, dx, transpose_a=transpose_a))


@pytest.mark.parametrize("spec, row_layout", [("[*,*]", "[*]"), ("[*,y]", "[y]")])
def test_local_only_run_with_several_outputs(spec, row_layout):
    device = _device.get()
    value = random_array((3, 4), seed=6)
    dx = to_dtensor(value, layout_of(spec, MESH_2X2))
    tf.unstack(dx)
    before = device.num_local_only_runs
    rows = tf.unstack(dx)
    assert device.num_local_only_runs == before + 1
    assert len(rows) == 3
    for i, row in enumerate(rows):
        assert_dtensor_equal(value[i], layout_of(row_layout, MESH_2X2), row)


def test_local_only_failure_reports_as_the_expansion_does():
    # Integer division by zero fails only for some values: the recorded run fails, and
    # the op is expanded again to report it with the op and its layouts.
    layout = layout_of("[x,*]", MESH_2X2)
    x = to_dtensor(np.array([[4, 6], [8, 9]], np.int32), layout)
    y = to_dtensor(np.array([[2, 3], [1, 2]], np.int32), layout)
    zero = to_dtensor(np.array([[2, 3], [1, 0]], np.int32), layout)
    for _ in range(2):
        assert_dtensor_equal(np.array([[2, 2], [8, 4]], np.int32), layout,
                             tf.math.floordiv(x, y))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"DTensor op 'FloorDiv' with inputs \(\[x,\*\].*division by zero"):
        tf.math.floordiv(x, zero)


def test_no_local_only_run_for_collectives_or_requested_layouts():
    device = _device.get()
    a = random_array((4, 6), seed=7)
    b = random_array((6, 3), seed=8)
    da = to_dtensor(a, layout_of("[*,y]", MESH_2X2))
    db = to_dtensor(b, layout_of("[y,*]", MESH_2X2))
    before = device.num_local_only_runs
    for _ in range(3):  # contracting the sharded axis all-reduces the partial products
        assert_dtensor_equal(a @ b, REPLICATED_2D, tf.matmul(da, db))
    assert device.num_local_only_runs == before
    # A requested layout (call_with_layout's scope) is honoured by the op itself: its
    # output comes in that layout even though these inputs' run is recorded.
    replicated = to_dtensor(a, REPLICATED_2D)
    replicated + replicated
    replicated + replicated
    requested = layout_of("[*,y]", MESH_2X2)
    before = device.num_local_only_runs
    with _device.layout_scope(requested):
        got = tf.add(replicated, replicated)
    assert device.num_local_only_runs == before
    assert_dtensor_equal(a + a, requested, got)


@pytest.mark.parametrize("op", [
    lambda t: tf.matmul(t, t, transpose_b=True),   # reads transpose_a and transpose_b
    lambda t: tf.unstack(t, axis=1),               # reads num and axis
    lambda t: tf.nn.softmax(t),
])
def test_plans_that_read_attributes_are_found_again(op):
    # TF serializes an op's attributes in no fixed order; the key must not depend on it.
    device = _device.get()
    x = to_dtensor(random_array((4, 4), seed=8), layout_of("[x,*]", MESH_2X2))
    op(x)
    before = device.num_cached_plans
    for _ in range(6):
        op(x)
    assert device.num_cached_plans == before


def test_a_layout_scope_in_another_thread_leaves_this_threads_local_only_runs():
    # An open layout scope (call_with_layout) turns the fast path off in its own thread,
    # where the scope may lay out what an op makes; another thread's scope must not.
    import threading

    from tf_dtensor import dtensor

    device = _device.get()
    layout = layout_of("[x,y]", MESH_2X2)
    a = random_array((4, 6), seed=11)
    da = to_dtensor(a, layout)
    tf.nn.relu(da)  # expanded; records the run
    opened, release = threading.Event(), threading.Event()

    def hold_a_scope():
        def body():
            opened.set()
            release.wait(30)
            return tf.zeros([4, 6])
        dtensor.call_with_layout(body, layout)

    holder = threading.Thread(target=hold_a_scope)
    holder.start()
    try:
        assert opened.wait(30)
        before = device.num_local_only_runs
        assert_dtensor_equal(np.maximum(a, 0), layout, tf.nn.relu(da))
        assert device.num_local_only_runs == before + 1
    finally:
        release.set()
        holder.join()

    def in_own_scope():
        before = device.num_local_only_runs
        got = tf.nn.relu(da)
        assert device.num_local_only_runs == before
        return got

    assert_dtensor_equal(np.maximum(a, 0), layout, dtensor.call_with_layout(in_own_scope, layout))
