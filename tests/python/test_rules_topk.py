"""TopKV2 and InTopKV2: batch-parallel over the leading axes, the ranked axis gathered."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_2X2, assert_dtensor_equal, check_op, layout_of, layout_params,
                             random_array, to_dtensor)

_X = random_array((4, 6), seed=11)


@pytest.mark.parametrize("output", [0, 1], ids=["values", "indices"])
@pytest.mark.parametrize("layouts", layout_params((4, 6)))
def test_top_k_every_layout(layouts, output):
    check_op(lambda x: tf.math.top_k(x, k=3)[output], "TopKV2", [_X], layouts,
             host_inputs=[((), [3])], output=output)


@pytest.mark.parametrize("layouts", layout_params((2, 4, 6), meshes=[MESH_2X2]))
def test_top_k_rank_3_in_function(layouts):
    x = random_array((2, 4, 6), seed=12)
    fn = tf.function(lambda t: tf.math.top_k(t, k=2).values)
    check_op(fn, "TopKV2", [x], layouts, host_inputs=[((), [2])])


@pytest.mark.parametrize("layouts", layout_params((4, 6), (4,)))
def test_in_top_k_every_layout(layouts):
    targets = np.array([0, 5, 2, 3], np.int32)
    check_op(lambda p, t: tf.math.in_top_k(t, p, k=2), "InTopKV2", [_X, targets], layouts,
             host_inputs=[((), [2])])


def test_top_k_uneven_batch_keeps_rows_sharded():
    # 5 rows over x=2 (blocks of 3 and 2): the rows stay sharded, the ranked axis whole.
    x = random_array((5, 6), seed=13)
    values = tf.math.top_k(to_dtensor(x, layout_of("[x,y]", MESH_2X2)), k=2).values
    assert_dtensor_equal(tf.math.top_k(x, k=2).values, layout_of("[x,*]", MESH_2X2), values)
