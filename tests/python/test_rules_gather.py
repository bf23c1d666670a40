"""Numerical checks of cc/rules/gather_rules.cc: GatherV2, Gather, OneHot, the unsorted,
sorted and sparse segment reductions.

    gather(params [V,D] [*,y], indices [B] [x]) -> [x,y]
    gather(params [x,*], ...) -> gather axis 0 of params first
    one_hot(indices [x], depth) -> [x,*]
    unsorted_segment_sum(data [x,y], ids [x], n) -> partial(x) -> all-reduce -> [*,y]
    segment_sum(data [x,y], ids) -> [*,y]      sparse.segment_mean(data [x,y], ...) -> [*,y]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, check_op, layout_of,
                             layout_params, random_array, reassemble, run_without_fallback,
                             spec_params, to_dtensor)

PARAMS = (6, 4)
INDICES = np.array([[5, 0, 2, 2], [1, 4, 3, 0]], np.int32)  # [2, 4]


@pytest.mark.parametrize("layouts", layout_params(PARAMS, INDICES.shape))
def test_gather_axis0(layouts):
    check_op(lambda p, i: tf.gather(p, i), "GatherV2", [random_array(PARAMS), INDICES], layouts,
             host_inputs=[([], [0])])


@pytest.mark.parametrize("layouts", layout_params((4, 6), INDICES.shape, meshes=[MESH_2X2]))
def test_gather_axis1(layouts):
    check_op(lambda p, i: tf.gather(p, i, axis=1), "GatherV2", [random_array((4, 6)), INDICES],
             layouts, host_inputs=[([], [1])])


@pytest.mark.parametrize("layouts", layout_params((4, 6, 2), (4, 3), meshes=[MESH_2X2]))
def test_gather_with_batch_dims(layouts):
    indices = np.array([[0, 5, 1], [2, 2, 3], [4, 0, 1], [5, 5, 5]], np.int32)
    check_op(lambda p, i: tf.gather(p, i, axis=1, batch_dims=1), "GatherV2",
             [random_array((4, 6, 2)), indices], layouts, host_inputs=[([], [1])],
             attrs={"batch_dims": 1})


@pytest.mark.parametrize("layouts", layout_params(PARAMS, (4,), meshes=[MESH_2X2]))
def test_gather_v1(layouts):
    indices = np.array([5, 0, 2, 2], np.int32)
    check_op(lambda p, i: tf.raw_ops.Gather(params=p, indices=i), "Gather",
             [random_array(PARAMS), indices], layouts)


def test_embedding_lookup_gradient_sums_over_the_batch(mesh_2x2):
    """tf.gather's gradient on sharded ids: a segment sum, all-reduced to replicated rows."""
    table = random_array(PARAMS)
    ids = np.array([5, 0, 2, 2, 1, 4, 3, 0], np.int32)

    def gradient(t, i):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = tf.reduce_sum(tf.square(tf.gather(t, i)))
        return tf.convert_to_tensor(tape.gradient(loss, t))

    expected = gradient(tf.constant(table), tf.constant(ids))
    actual = run_without_fallback(gradient, to_dtensor(table, layout_of("[*,*]", mesh_2x2)),
                                  to_dtensor(ids, layout_of("[x]", mesh_2x2)))
    assert_dtensor_equal(expected, layout_of("[*,*]", mesh_2x2), actual)


# OneHot's host inputs after the indices: depth (6, which the plan reads), on_value and
# off_value (scalars whose values it does not).
ONE_HOT_HOST_INPUTS = [([], [6]), ([], None), ([], None)]


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("layouts", layout_params(INDICES.shape))
def test_one_hot(layouts, axis):
    check_op(lambda i: tf.one_hot(i, 6, axis=axis), "OneHot", [INDICES], layouts,
             host_inputs=ONE_HOT_HOST_INPUTS, attrs={"axis": axis})


def test_one_hot_with_int64_labels_and_values(mesh_2x2):
    labels = INDICES.astype(np.int64)
    check_op(lambda i: tf.one_hot(i, 6, on_value=3, off_value=-1, dtype=tf.int32), "OneHot",
             [labels], [layout_of("[x,y]", mesh_2x2)], host_inputs=ONE_HOT_HOST_INPUTS)


SEGMENT_OPS = {
    "UnsortedSegmentSum": tf.math.unsorted_segment_sum,
    "UnsortedSegmentMax": tf.math.unsorted_segment_max,
    "UnsortedSegmentMin": tf.math.unsorted_segment_min,
    "UnsortedSegmentProd": tf.math.unsorted_segment_prod,
}


def _check_segment_op(op_name, layouts):
    ids = np.array([3, 0, 2, 2, 1, 0, 3, 0], np.int32)
    data = random_array((8, 4), low=0.5, high=1.5)
    # Segment 4 is empty: every op fills it with its identity.
    check_op(lambda d, i: SEGMENT_OPS[op_name](d, i, num_segments=5), op_name, [data, ids],
             layouts, host_inputs=[([], [5])])


@pytest.mark.parametrize("layouts", layout_params((8, 4), (8,)))
def test_unsorted_segment_sum(layouts):
    _check_segment_op("UnsortedSegmentSum", layouts)


@pytest.mark.parametrize("op_name", sorted(SEGMENT_OPS))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]", "[x]"), ("[*,y]", "[x]"),
                                                ("[y,*]", "[*]"), ("[x,*]", "[y]")))
def test_unsorted_segment(layouts, op_name):
    _check_segment_op(op_name, layouts)


@pytest.mark.parametrize("layouts", layout_params((4, 2, 3), (4, 2), meshes=[MESH_1D]))
def test_unsorted_segment_sum_with_2d_ids(layouts):
    ids = np.array([[0, 1], [1, 2], [2, 0], [0, 0]], np.int32)
    check_op(lambda d, i: tf.math.unsorted_segment_sum(d, i, num_segments=3),
             "UnsortedSegmentSum", [random_array((4, 2, 3)), ids], layouts,
             host_inputs=[([], [3])])


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_ids_sharded_like_the_table_rows_keep_their_sharding(in_function):
    """gather(table [x,*], ids [x,*]) -> [x,*,*]: each device looks up the rows it holds for
    all the ids, and the partial results are reduce-scattered back to the ids' sharding
    (TensorFlow's DTensor keeps the ids' sharding too), not all-reduced to replicated."""
    table = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    ids = np.array([[1, 63, 5], [40, 2, 33], [7, 7, 0], [62, 31, 32]], np.int32)
    fn = tf.function(tf.gather) if in_function else tf.gather
    got = fn(to_dtensor(table, layout_of("[x,*]", MESH_1D)),
             to_dtensor(ids, layout_of("[x,*]", MESH_1D)))
    assert_dtensor_equal(table[ids], layout_of("[x,*,*]", MESH_1D), got)


SORTED_IDS = np.array([0, 0, 1, 3, 3, 3, 4, 4], np.int32)
SEGMENTS = {"SegmentSum": tf.math.segment_sum, "SegmentMean": tf.math.segment_mean,
            "SegmentMax": tf.math.segment_max, "SegmentMin": tf.math.segment_min,
            "SegmentProd": tf.math.segment_prod}


@pytest.mark.parametrize("op_name", sorted(SEGMENTS))
@pytest.mark.parametrize("layouts", layout_params((8, 6), SORTED_IDS.shape, meshes=[MESH_2X2]))
def test_sorted_segment(layouts, op_name):
    """The segment axis is read whole (the ids too); data's other axes keep their sharding."""
    check_op(SEGMENTS[op_name], op_name, [random_array((8, 6), low=0.5, high=1.5), SORTED_IDS],
             layouts)


PICKS = np.array([7, 0, 2, 2, 5], np.int32)
PICK_IDS = np.array([0, 0, 1, 2, 2], np.int32)
SPARSE_SEGMENTS = {"SparseSegmentSum": tf.sparse.segment_sum,
                   "SparseSegmentMean": tf.sparse.segment_mean,
                   "SparseSegmentSqrtN": tf.sparse.segment_sqrt_n}


@pytest.mark.parametrize("with_num_segments", [False, True], ids=["", "num_segments"])
@pytest.mark.parametrize("op_name", sorted(SPARSE_SEGMENTS))
@pytest.mark.parametrize("layouts", layout_params((8, 6), meshes=[MESH_1D, MESH_2X2]))
def test_sparse_segment(layouts, op_name, with_num_segments):
    fn = SPARSE_SEGMENTS[op_name]
    name = op_name + ("WithNumSegments" if with_num_segments else "")
    num = {"num_segments": 4} if with_num_segments else {}
    hosts = [([5], None), ([5], None)] + (
        [([], [4])] if with_num_segments else [])
    check_op(lambda d: fn(d, PICKS, PICK_IDS, **num), name, [random_array((8, 6))], layouts,
             host_inputs=hosts)


def _segment_model(x):
    # An embedding bag (tf.nn.embedding_lookup_sparse's combiner) and a graph pooling.
    bags = tf.sparse.segment_mean(x, PICKS, PICK_IDS, num_segments=4)
    pooled = tf.math.segment_sum(x, SORTED_IDS)
    return tf.reduce_sum(bags * bags) + tf.reduce_sum(pooled * pooled)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("spec", ["[x,y]", "[*,x]", "[x,*]"])
def test_segment_gradients_match_one_device(spec, in_function, mesh_2x2):
    x = random_array((8, 6))

    def run(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = _segment_model(t)
        return [loss, tape.gradient(loss, t)]

    expected = [v.numpy() for v in run(tf.constant(x))]
    actual = run_without_fallback(tf.function(run) if in_function else run,
                                  to_dtensor(x, layout_of(spec, mesh_2x2)))
    np.testing.assert_allclose(reassemble(actual[0]), expected[0], rtol=1e-5)
    np.testing.assert_allclose(reassemble(tf.convert_to_tensor(actual[1])), expected[1],
                               rtol=1e-5, atol=1e-6)


def test_segment_sum_keeps_the_feature_sharding(mesh_2x2):
    x = random_array((8, 6))
    out = run_without_fallback(lambda t: tf.math.segment_sum(t, SORTED_IDS),
                               to_dtensor(x, layout_of("[x,y]", mesh_2x2)))
    assert_dtensor_equal(tf.math.segment_sum(x, SORTED_IDS), layout_of("[*,y]", mesh_2x2), out)
