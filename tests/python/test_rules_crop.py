"""Numerical checks of cc/rules/crop_rules.cc: CropAndResize (`tf.image.crop_and_resize`)
and its gradients, against one plain device:

    crop_and_resize(image [*,*,*,y], boxes [x,*], box_ind [x]) -> crops [x,*,*,y]
    grad image: each device scatters its boxes -> partial(x) [*,*,*,y]
    grad boxes: each box's gradient sums over the channels -> partial(y) [x,*]

The expected layouts are derived here, independently of the C++ rule: the channels keep
the image's channel sharding (unless a device would get no channel), the boxes keep the
sharding of boxes or box_ind on a mesh dimension the channels do not take; the image's
batch, height and width are read whole.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (LOWERINGS, MESH_1D, MESH_2X2, assert_dtensor_equal, check_op,
                             collective_lowering, layout_of, reassemble, run_without_fallback,
                             to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=[f"CPU:{i}" for i in range(8)])

_RNG = np.random.default_rng(3)
IMAGE = _RNG.uniform(0.0, 1.0, size=(3, 7, 6, 4)).astype(np.float32)
IMAGE_3C = IMAGE[..., :3].copy()  # 3 channels: uneven over 2, a device without any over 4
BOXES = np.array([[0.0, 0.0, 1.0, 1.0], [0.1, 0.2, 0.7, 0.9], [0.5, 0.5, 1.0, 1.0],
                  [0.2, 0.0, 0.4, 0.3], [0.9, 0.8, 0.1, 0.2]], np.float32)  # 5: uneven
BOX_IND = np.array([0, 2, 1, 1, 0], np.int32)
CROP = (3, 4)

CASES = [  # mesh, image, boxes, box_ind
    (MESH_1D, "[*,*,*,x]", "[*,*]", "[*]"),
    (MESH_1D, "[*,*,*,*]", "[x,*]", "[x]"),
    (MESH_1D, "[x,*,*,*]", "[*,*]", "[x]"),
    (MESH_1D, "[*,*,*,x]", "[x,*]", "[x]"),
    (MESH_2X2, "[*,*,*,y]", "[x,*]", "[x]"),
    (MESH_2X2, "[x,y,*,*]", "[*,*]", "[*]"),
    (MESH_2X2, "[*,x,y,*]", "[y,*]", "[*]"),
    (MESH_2X2, "[x,*,*,y]", "[x,*]", "[*]"),
    (MESH_2X4, "[*,*,*,y]", "[x,*]", "[x]"),
    (MESH_2X4, "[*,*,*,x]", "[y,*]", "[y]"),
    (MESH_2X4, "[y,*,x,*]", "[*,*]", "[y]"),
]
PARAMS = [pytest.param(mesh, image, boxes, index, id=f"{image}-{boxes}-{index}@{mesh.dim_names}")
          for mesh, image, boxes, index in CASES]


def _crop_layout(mesh, image_spec, boxes_spec, index_spec, channels):
    """The crops' layout: channels from the image when every device gets one, boxes from
    boxes (then box_ind) on a mesh dimension the channels did not take."""
    image, boxes, index = (layout_of(s, mesh).sharding_specs
                           for s in (image_spec, boxes_spec, index_spec))
    c = image[3]
    # Blocks of ceil(channels / k): the last of k devices gets none when the others hold all.
    if c != UNSHARDED and -(-channels // mesh.dim_size(c)) * (mesh.dim_size(c) - 1) >= channels:
        c = UNSHARDED
    n = UNSHARDED
    for s in (boxes[0], index[0]):
        if n == UNSHARDED and s != UNSHARDED and s != c:
            n = s
    return Layout([n, UNSHARDED, UNSHARDED, c], mesh)


def _crop_and_grads(image, boxes, box_ind, method):
    with tf.GradientTape() as tape:
        tape.watch([image, boxes])
        crops = tf.image.crop_and_resize(image, boxes, box_ind, CROP, method=method)
        loss = tf.reduce_sum(crops * crops)
    return (crops,) + tuple(tape.gradient(loss, [image, boxes]))


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("image_array", [IMAGE, IMAGE_3C], ids=["c4", "c3"])
@pytest.mark.parametrize("mesh,image_spec,boxes_spec,index_spec", PARAMS)
def test_crop_and_resize_and_gradients(mesh, image_spec, boxes_spec, index_spec, image_array,
                                       traced, method):
    expected = [t.numpy() for t in _crop_and_grads(
        tf.constant(image_array), tf.constant(BOXES), tf.constant(BOX_IND), method)]
    image = to_dtensor(image_array, layout_of(image_spec, mesh))
    boxes = to_dtensor(BOXES, layout_of(boxes_spec, mesh))
    box_ind = to_dtensor(BOX_IND, layout_of(index_spec, mesh))
    fn = tf.function(_crop_and_grads, reduce_retracing=False) if traced else _crop_and_grads
    crops, image_grad, boxes_grad = run_without_fallback(fn, image, boxes, box_ind, method)
    assert_dtensor_equal(expected[0], _crop_layout(mesh, image_spec, boxes_spec, index_spec,
                                                   image_array.shape[3]), crops)
    for want, got in ((expected[1], image_grad), (expected[2], boxes_grad)):
        assert tuple(got.shape) == want.shape and got.dtype == tf.float32
        np.testing.assert_allclose(reassemble(got), want, rtol=1e-4, atol=1e-5)


GRADS = _RNG.uniform(-1.0, 1.0, size=(5,) + CROP + (4,)).astype(np.float32)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("grads_spec,boxes_spec,expected_spec", [
    ("[x,*,*,y]", "[x,*]", "[*,*,*,y]"),     # summed over the boxes' x
    ("[*,*,*,y]", "[*,*]", "[*,*,*,y]"),     # channels alone: no communication
    ("[*,x,*,*]", "[y,*]", "[*,*,*,*]"),     # crop rows read whole
    ("[y,*,*,x]", "[*,*]", "[*,*,*,x]"),     # 5 boxes over 4 (one device has 1)
], ids=lambda s: s)
def test_grad_image(grads_spec, boxes_spec, expected_spec, lowering):
    image_size = list(IMAGE.shape)
    expected = tf.raw_ops.CropAndResizeGradImage(grads=GRADS, boxes=BOXES, box_ind=BOX_IND,
                                                 image_size=image_size, T=tf.float32).numpy()
    grads = to_dtensor(GRADS, layout_of(grads_spec, MESH_2X4))
    boxes = to_dtensor(BOXES, layout_of(boxes_spec, MESH_2X4))
    with collective_lowering(lowering):
        got = run_without_fallback(lambda: tf.raw_ops.CropAndResizeGradImage(
            grads=grads, boxes=boxes, box_ind=BOX_IND, image_size=image_size, T=tf.float32))
    assert_dtensor_equal(expected, layout_of(expected_spec, MESH_2X4), got)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("grads_spec,image_spec,expected_spec", [
    ("[x,*,*,y]", "[*,*,*,*]", "[x,*]"),     # channels summed over y
    ("[*,*,*,*]", "[x,*,*,y]", "[*,*]"),
    ("[y,*,*,x]", "[*,*,*,x]", "[y,*]"),     # 5 boxes over 4
], ids=lambda s: s)
def test_grad_boxes(grads_spec, image_spec, expected_spec, lowering):
    expected = tf.raw_ops.CropAndResizeGradBoxes(grads=GRADS, image=IMAGE, boxes=BOXES,
                                                 box_ind=BOX_IND).numpy()
    grads = to_dtensor(GRADS, layout_of(grads_spec, MESH_2X4))
    image = to_dtensor(IMAGE, layout_of(image_spec, MESH_2X4))
    with collective_lowering(lowering):
        got = run_without_fallback(lambda: tf.raw_ops.CropAndResizeGradBoxes(
            grads=grads, image=image, boxes=BOXES, box_ind=BOX_IND))
    assert_dtensor_equal(expected, layout_of(expected_spec, MESH_2X4), got)


def test_grad_boxes_stays_pending_in_function(mesh_2x2):
    # Inside tf.function the channels' sum is left pending; the function's result is read
    # summed, as on one device.
    grads = to_dtensor(GRADS, layout_of("[x,*,*,y]", mesh_2x2))
    image = to_dtensor(IMAGE, layout_of("[*,*,*,y]", mesh_2x2))

    @tf.function
    def boxes_grad(g, i):
        return 2.0 * tf.raw_ops.CropAndResizeGradBoxes(grads=g, image=i, boxes=BOXES,
                                                       box_ind=BOX_IND)

    expected = 2.0 * tf.raw_ops.CropAndResizeGradBoxes(grads=GRADS, image=IMAGE, boxes=BOXES,
                                                       box_ind=BOX_IND).numpy()
    got = run_without_fallback(boxes_grad, grads, image)
    np.testing.assert_allclose(reassemble(got), expected, rtol=1e-5, atol=1e-5)
    assert dtensor.fetch_layout(got).sharding_specs[0] == "x"


@pytest.mark.parametrize("mesh,image_spec,boxes_spec,index_spec", PARAMS)
def test_explain_agrees_with_execution(mesh, image_spec, boxes_spec, index_spec):
    layouts = [layout_of(s, mesh) for s in (image_spec, boxes_spec, index_spec)]
    check_op(lambda i, b, n: tf.image.crop_and_resize(i, b, n, CROP), "CropAndResize",
             [IMAGE, BOXES, BOX_IND], layouts, host_inputs=[([2], list(CROP))])
