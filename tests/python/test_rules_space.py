"""Numerical checks of cc/rules/space_rules.cc: SpaceToBatchND / BatchToSpaceND (what
dilated convolutions run around their convolution) and SpaceToDepth / DepthToSpace.

    space_to_batch([*,*,*,y], block [2,2]) -> [*,*,*,y]          (channels: local)
    space_to_batch([x,*,*,*] of [4,..], block [2,2]) -> all-to-all -> [x,*,*,*]
    atrous_conv2d([x,*,*,*], rate 2) -> [x,*,*,*]                 (no gathered batch)
    depth_to_space([x,*,*,y]) -> [x,*,*,*]

Each case is checked against one device (values, dtype, global shape and the layout
`debug.explain` predicts), in strict mode, eagerly, in tf.function and through gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, check_op, explain_plan,
                             layout_of, random_array, reassemble, run_without_fallback,
                             to_dtensor)
from tf_dtensor import dtensor


def _space_to_batch(block, paddings):
    def fn(x):
        return tf.space_to_batch_nd(x, block, paddings)
    return fn


def _batch_to_space(block, crops):
    def fn(x):
        return tf.batch_to_space(x, block, crops)
    return fn


def _hosts(block, edges):
    return [([len(block)], list(block)), ([len(block), 2], [e for pair in edges for e in pair])]


# (mesh, input spec, input shape, block, paddings, expected output spec)
SPACE_TO_BATCH = [
    (MESH_1D, "[x,*,*,*]", (4, 4, 6, 3), [2, 2], [[0, 0], [0, 0]], "[x,*,*,*]"),
    (MESH_1D, "[x,*,*,*]", (2, 5, 6, 3), [2, 2], [[1, 0], [1, 1]], "[x,*,*,*]"),
    (MESH_2X2, "[x,*,*,y]", (4, 4, 4, 4), [2, 2], [[0, 0], [0, 0]], "[x,*,*,y]"),
    (MESH_2X2, "[y,*,*,*]", (2, 4, 4, 3), [2, 2], [[2, 2], [2, 2]], "[y,*,*,*]"),
    (MESH_2X2, "[*,*,*,x]", (3, 4, 4, 4), [2, 2], [[0, 0], [0, 0]], "[*,*,*,x]"),
    (MESH_1D, "[x,*,*]", (4, 6, 3), [2], [[0, 0]], "[x,*,*]"),  # one spatial axis (conv1d)
    # The batch is gathered: 3 elements over x=2, 3 block offsets over x=2.
    (MESH_1D, "[x,*,*,*]", (3, 4, 4, 3), [2, 2], [[0, 0], [0, 0]], "[*,*,*,*]"),
    (MESH_1D, "[x,*,*,*]", (4, 3, 4, 3), [3, 1], [[0, 0], [0, 0]], "[*,*,*,*]"),
    # Spatial axes are gathered; a block of 1 with no padding keeps its axis.
    (MESH_2X2, "[*,x,*,*]", (2, 4, 4, 3), [2, 2], [[0, 0], [0, 0]], "[*,*,*,*]"),
    (MESH_2X2, "[*,*,x,*]", (2, 4, 4, 3), [2, 1], [[0, 0], [0, 0]], "[*,*,x,*]"),
    (MESH_2X2, "[x,*,*,*]", (4, 4, 4, 3), [1, 1], [[0, 0], [0, 0]], "[x,*,*,*]"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,spec,shape,block,paddings,out", SPACE_TO_BATCH)
def test_space_to_batch(mesh, spec, shape, block, paddings, out, in_function):
    fn = _space_to_batch(block, paddings)
    layout = layout_of(spec, mesh)
    actual = check_op(tf.function(fn) if in_function else fn, "SpaceToBatchND",
                      [random_array(shape)], [layout], _hosts(block, paddings))
    assert dtensor.fetch_layout(actual) == layout_of(out, mesh)


# (mesh, input spec, input shape, block, crops, expected output spec)
BATCH_TO_SPACE = [
    (MESH_1D, "[x,*,*,*]", (8, 2, 3, 3), [2, 2], [[0, 0], [0, 0]], "[x,*,*,*]"),
    (MESH_1D, "[x,*,*,*]", (8, 3, 3, 3), [2, 2], [[1, 0], [0, 1]], "[x,*,*,*]"),
    (MESH_2X2, "[x,*,*,y]", (8, 2, 2, 4), [2, 2], [[0, 0], [0, 0]], "[x,*,*,y]"),
    (MESH_2X2, "[*,*,*,y]", (4, 2, 2, 4), [2, 2], [[0, 0], [0, 0]], "[*,*,*,y]"),
    # One element per block offset: it cannot be split over x=2.
    (MESH_1D, "[x,*,*,*]", (4, 2, 2, 3), [2, 2], [[0, 0], [0, 0]], "[*,*,*,*]"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,spec,shape,block,crops,out", BATCH_TO_SPACE)
def test_batch_to_space(mesh, spec, shape, block, crops, out, in_function):
    fn = _batch_to_space(block, crops)
    actual = check_op(tf.function(fn) if in_function else fn, "BatchToSpaceND",
                      [random_array(shape)], [layout_of(spec, mesh)], _hosts(block, crops))
    assert dtensor.fetch_layout(actual) == layout_of(out, mesh)


def test_batch_sharded_space_to_batch_plans_one_all_to_all():
    plan = explain_plan("SpaceToBatchND", [layout_of("[x,*,*,y]", MESH_2X2)], [[4, 4, 4, 4]],
                        _hosts([2, 2], [[0, 0], [0, 0]]))
    assert plan["outputs"] == [layout_of("[x,*,*,y]", MESH_2X2)]
    assert any("all-to-all over x" in line for line in plan["collectives"]), plan["collectives"]
    assert not any("all-gather" in line for line in plan["collectives"]), plan["collectives"]


def _grads(fn):
    def run(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            y = fn(*args)
            weights = tf.cast(tf.reshape(tf.range(tf.size(y)), tf.shape(y)) % 7, y.dtype)
            loss = tf.reduce_sum(y * weights)
        return [y, loss] + tape.gradient(loss, list(args))
    return run


X = random_array((4, 8, 8, 4), seed=1)
# (name, fn, arrays, input specs (None: plain tensor), the result's expected spec)
MODELS = [
    ("atrous_conv2d", lambda x, w: tf.nn.atrous_conv2d(x, w, 2, "SAME"),
     [X, random_array((3, 3, 4, 6), seed=2)], ["[x,*,*,*]", None], "[x,*,*,*]"),
    ("atrous_conv2d_valid", lambda x, w: tf.nn.atrous_conv2d(x, w, 2, "VALID"),
     [X, random_array((3, 3, 4, 6), seed=3)], ["[x,*,*,*]", None], "[x,*,*,*]"),
    ("convolution_dilated_channels", lambda x, w: tf.nn.convolution(x, w, padding="SAME",
                                                                     dilations=2),
     [X, random_array((3, 3, 4, 6), seed=4)], ["[*,*,*,x]", "[*,*,x,*]"], "[*,*,*,*]"),
    ("depthwise_dilated", lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME",
                                                              dilations=[2, 2]),
     [X, random_array((3, 3, 4, 2), seed=5)], ["[x,*,*,*]", None], "[x,*,*,*]"),
    ("convolution_1d_dilated", lambda x, w: tf.nn.convolution(x, w, padding="SAME",
                                                              dilations=[2]),
     [random_array((4, 12, 4), seed=6), random_array((3, 4, 5), seed=7)],
     ["[x,*,*]", None], "[x,*,*]"),
    ("depth_to_space", lambda x: tf.nn.depth_to_space(x, 2), [X], ["[x,*,*,y]"], "[x,*,*,*]"),
    ("space_to_depth", lambda x: tf.nn.space_to_depth(x, 2), [X], ["[x,y,*,*]"], "[x,*,*,*]"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name,fn,arrays,specs,out", MODELS, ids=[m[0] for m in MODELS])
def test_dilated_convolutions_and_pixel_shuffles_with_gradients(name, fn, arrays, specs, out,
                                                                 in_function):
    mesh = MESH_2X2
    run = _grads(fn)
    expected = [v.numpy() for v in run(*[tf.constant(a) for a in arrays])]
    inputs = [to_dtensor(a, layout_of(s, mesh)) if s else tf.constant(a)
              for a, s in zip(arrays, specs)]
    actual = run_without_fallback(tf.function(run) if in_function else run, *inputs)
    assert_dtensor_equal(expected[0], layout_of(out, mesh), actual[0])
    for e, a, s in zip(expected[2:], actual[2:], specs):
        assert tuple(a.shape) == e.shape
        np.testing.assert_allclose(reassemble(a), e, rtol=1e-4, atol=1e-4)
        if s and s == out and not in_function:
            # The input's gradient keeps the input's (batch) sharding (inside tf.function
            # the layouts are tf_dtensor's choice: the loss's weights are replicated there,
            # and so is the gradient that flows back from them).
            assert dtensor.fetch_layout(a) == layout_of(s, mesh)
    np.testing.assert_allclose(reassemble(actual[1]), expected[1], rtol=1e-4)


def test_space_to_batch_refuses_a_bad_block_shape():
    with pytest.raises(ValueError, match="'SpaceToBatchND' needs a block_shape"):
        explain_plan("SpaceToBatchND", [layout_of("[x,*,*,*]", MESH_1D)], [[4, 4, 4, 3]],
                     [([3], [2, 2, 2]), ([2, 2], [0, 0, 0, 0])])
