"""Numerical checks of cc/rules/count_rules.cc: HistogramFixedWidth and DenseBincount
(`tf.histogram_fixed_width`, `tf.math.bincount`). Each device counts its own block into
every bin and the blocks' counts add; with `binary_output` they combine with max:

    histogram_fixed_width(values [x,y]) -> partial(x,y) -> all-reduce -> [*]
    dense_bincount(input [x] of [N]) -> partial(x) [*]
    dense_bincount(input [x,y] of [B, N]) -> partial(y) [x,*]   (the batch stays)

The expected layouts are derived here, independently of the C++ rule: the bins are
replicated, a 2-D input's batch spec reaches the output's axis 0. Inside `tf.function` the
counts stay pending (a Partial of int32 or of the weights' dtype) until something reads them.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (LOWERINGS, MESH_1D, MESH_2X2, assert_dtensor_equal, check_op,
                             collective_lowering, layout_of, layouts_for, run_without_fallback,
                             spec_id, to_dtensor)
from function_testing import check_function
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=[f"CPU:{i}" for i in range(8)])
MESHES = (MESH_1D, MESH_2X2, MESH_2X4)

_RNG = np.random.default_rng(7)
VALUES = _RNG.uniform(-1.0, 11.0, size=(6, 5)).astype(np.float32)   # 5 columns: uneven
RANGE = np.array([0.0, 10.0], np.float32)
IDS_1D = _RNG.integers(0, 7, size=(11,)).astype(np.int32)          # 11: uneven everywhere
IDS_2D = _RNG.integers(0, 7, size=(4, 9)).astype(np.int32)
SIZE = 6  # ids of 6 are dropped, as on one device


def _params(shape, meshes=MESHES):
    return [pytest.param(layout, id=f"{spec_id(layout)}@{layout.mesh.dim_names}")
            for mesh in meshes for layout in layouts_for(mesh, shape, uneven=True)]


def _replicated(mesh, rank):
    return Layout.replicated(mesh, rank)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("layout", _params(VALUES.shape))
def test_histogram_fixed_width(layout, dtype):
    expected = tf.histogram_fixed_width(VALUES, RANGE, nbins=4, dtype=dtype).numpy()
    values = to_dtensor(VALUES, layout)
    got = run_without_fallback(
        lambda: tf.histogram_fixed_width(values, RANGE, nbins=4, dtype=dtype))
    assert_dtensor_equal(expected, _replicated(layout.mesh, 1), got)


@pytest.mark.parametrize("layout", [layout_of("[x,y]", MESH_2X4), layout_of("[*,x]", MESH_1D),
                                    layout_of("[y,*]", MESH_2X2)], ids=spec_id)
def test_histogram_fixed_width_in_function(layout):
    check_function(lambda v: tf.histogram_fixed_width(v, RANGE, nbins=5), [VALUES], [layout])


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_pending_int32_counts_sum_right(lowering, traced):
    # Inside tf.function the counts stay a Partial(sum) of int32 through an addition and
    # are summed once when read; every lowering adds int32 exactly.
    layout = layout_of("[x,y]", MESH_2X2)

    def twice(v):
        counts = tf.histogram_fixed_width(v, RANGE, nbins=3)
        return counts + counts

    expected = twice(tf.constant(VALUES)).numpy()
    fn = tf.function(twice) if traced else twice
    with collective_lowering(lowering):
        got = run_without_fallback(fn, to_dtensor(VALUES, layout))
    assert_dtensor_equal(expected, _replicated(MESH_2X2, 1), got)


def _bincount_layout(layout):
    """The output's layout: bins replicated; a 2-D input's batch spec on axis 0."""
    if layout.rank == 1:
        return _replicated(layout.mesh, 1)
    return Layout([layout.sharding_specs[0], UNSHARDED], layout.mesh)


@pytest.mark.parametrize("binary", [False, True], ids=["counts", "binary"])
@pytest.mark.parametrize("weighted", [False, True], ids=["ones", "weights"])
@pytest.mark.parametrize("layout", _params(IDS_1D.shape) + _params(IDS_2D.shape),)
def test_dense_bincount(layout, weighted, binary):
    ids = IDS_1D if layout.rank == 1 else IDS_2D
    weights = (_RNG.uniform(0.5, 2.0, size=ids.shape).astype(np.float32) if weighted
               else np.zeros([0], np.float32))

    def bincount(i, w):
        return tf.raw_ops.DenseBincount(input=i, size=SIZE, weights=w, binary_output=binary)

    expected = bincount(tf.constant(ids), tf.constant(weights)).numpy()
    w = to_dtensor(weights, layout if weighted else _replicated(layout.mesh, 1))
    got = run_without_fallback(bincount, to_dtensor(ids, layout), w)
    assert_dtensor_equal(expected, _bincount_layout(layout), got)
    # Inside tf.function (the count stays pending until the function returns).
    again = run_without_fallback(tf.function(bincount), to_dtensor(ids, layout), w)
    assert_dtensor_equal(expected, _bincount_layout(layout), again)


@pytest.mark.parametrize("layout", [layout_of("[x]", MESH_2X2), layout_of("[y]", MESH_2X4),
                                    layout_of("[*]", MESH_1D)], ids=spec_id)
def test_math_bincount_computes_its_size_from_data(layout):
    # tf.math.bincount's size is max(ids) + 1, a replicated value computed from the data
    # (known only when a tf.function runs): the rule never needs it.
    ids = to_dtensor(IDS_1D, layout)
    expected = tf.math.bincount(IDS_1D).numpy()
    assert_dtensor_equal(expected, _replicated(layout.mesh, 1),
                         run_without_fallback(tf.math.bincount, ids))
    check_function(lambda i: tf.math.bincount(i, minlength=9), [IDS_1D], [layout])


def test_bincount_weights_of_another_shape_are_refused(mesh_1d):
    ids = to_dtensor(IDS_1D, layout_of("[x]", mesh_1d))
    weights = to_dtensor(np.ones([4], np.float32), layout_of("[*]", mesh_1d))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"'DenseBincount' needs weights of its input's shape"):
        tf.raw_ops.DenseBincount(input=ids, size=SIZE, weights=weights, binary_output=False)


@pytest.mark.parametrize("layout", [layout_of("[x,y]", MESH_2X2), layout_of("[*,y]", MESH_2X4)],
                         ids=spec_id)
def test_explain_agrees_with_execution(layout):
    # debug.explain's plan (output layout, all-reduces) is the one that runs.
    plan = tf_dtensor.debug.explain(
        "HistogramFixedWidth", [layout, layout_of("[*]", layout.mesh), None],
        [list(VALUES.shape), [2], []], int_values={2: [4]})
    over = ",".join(s for s in layout.sharding_specs if s != UNSHARDED)
    assert plan["collectives"] == [f"all-reduce(sum) of output 0 over {over}"]
    check_op(lambda v, r: tf.histogram_fixed_width(v, r, nbins=4), "HistogramFixedWidth",
             [VALUES, RANGE], [layout, layout_of("[*]", layout.mesh)], host_inputs=[([], [4])])
    # DenseBincount's size sits between its tensors: the plan and the run side by side.
    plan = tf_dtensor.debug.explain(
        "DenseBincount", [layout, None, layout], [list(IDS_2D.shape), [], list(IDS_2D.shape)],
        int_values={1: [SIZE]}, attrs={"binary_output": True})
    weights = np.ones(IDS_2D.shape, np.float32)
    got = run_without_fallback(lambda: tf.raw_ops.DenseBincount(
        input=to_dtensor(IDS_2D, layout), size=SIZE, weights=to_dtensor(weights, layout),
        binary_output=True))
    assert plan["outputs"] == [_bincount_layout(layout)]
    assert_dtensor_equal(tf.raw_ops.DenseBincount(input=IDS_2D, size=SIZE, weights=weights,
                                                  binary_output=True),
                         plan["outputs"][0], got)
