"""The fuzzer's op table, continued: convolutions and pooling (NHWC / NDHWC).

Imported by fuzz_ops.py after `op` is defined; see there for how an entry is written.
"""

from __future__ import annotations

import tensorflow as tf

from fuzz_engine import H, T, Call, Drawer
from fuzz_ops import op

# ---------------------------------------------------------------------------------------
# Convolutions and pooling (NHWC / NDHWC)
# ---------------------------------------------------------------------------------------

def _window(d: Drawer, spatial: int, equal_strides: bool = False):
    """(image shape, window, strides, padding) for `spatial` spatial dims."""
    window = [d.int(1, 3) for _ in range(spatial)]
    image = [d.int(w, w + 5) for w in window]
    strides = [d.int(1, 2) for _ in range(spatial)]
    if equal_strides:
        strides = [strides[0]] * spatial
    return image, window, strides, d.choice(["SAME", "VALID"])


def _conv(d: Drawer, spatial: int, depthwise: bool = False):
    image, window, strides, padding = _window(d, spatial, equal_strides=depthwise)
    batch, channels, out = d.size(1, 4), d.size(1, 4), d.size(1, 4)
    dtype = d.dtype()
    x = d.array([batch] + image + [channels], dtype)
    w = d.array(window + [channels, out], dtype)
    attrs = {"strides": [1] + strides + [1], "padding": padding}
    if spatial == 2 and not depthwise and d.bool():
        rates = [d.int(1, 2), d.int(1, 2)]
        # The dilated window must fit the image (graph shape inference refuses it otherwise).
        if all((w - 1) * r + 1 <= s for w, r, s in zip(window, rates, image)):
            attrs["dilations"] = [1] + rates + [1]
            if rates != [1, 1]:
                attrs["strides"] = [1, 1, 1, 1]
    return x, w, attrs



_CONVS = {2: (tf.raw_ops.Conv2D, "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"),
          3: (tf.raw_ops.Conv3D, "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2")}

for _spatial, (_forward, _name, _input_grad, _filter_grad) in _CONVS.items():
    @op(_name)
    def _(d, _spatial=_spatial):
        x, w, attrs = _conv(d, _spatial)
        # TensorFlow's CPU convolution gradients refuse dilations.
        dilated = any(r != 1 for r in attrs.get("dilations", []))
        return Call([T(x), T(w)], attrs, grad=not dilated, tol=1e-4)

    @op(_input_grad, grad=False)
    def _(d, _spatial=_spatial, _forward=_forward):
        x, w, attrs = _conv(d, _spatial)
        y = _forward(input=x, filter=w, **attrs)
        dy = d.array(y.shape, x.dtype)
        return Call([H(list(x.shape), tf.int32), T(w), T(dy)], attrs, tol=1e-4)

    @op(_filter_grad, grad=False)
    def _(d, _spatial=_spatial, _forward=_forward):
        x, w, attrs = _conv(d, _spatial)
        y = _forward(input=x, filter=w, **attrs)
        dy = d.array(y.shape, x.dtype)
        return Call([T(x), H(list(w.shape), tf.int32), T(dy)], attrs, tol=1e-4)


def _depthwise(d: Drawer):
    x, w, attrs = _conv(d, 2, depthwise=True)
    return x, w, attrs, tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **attrs)


@op("DepthwiseConv2dNative")
def _(d):
    x, w, attrs, _ = _depthwise(d)
    return Call([T(x), T(w)], attrs, tol=1e-4)


@op("DepthwiseConv2dNativeBackpropInput", grad=False)
def _(d):
    x, w, attrs, y = _depthwise(d)
    return Call([H(list(x.shape), tf.int32), T(w), T(d.array(y.shape, x.dtype))],
                attrs, tol=1e-4)


@op("DepthwiseConv2dNativeBackpropFilter", grad=False)
def _(d):
    x, w, attrs, y = _depthwise(d)
    return Call([T(x), H(list(w.shape), tf.int32), T(d.array(y.shape, x.dtype))],
                attrs, tol=1e-4)


def _pool(d: Drawer, spatial: int):
    image, window, strides, padding = _window(d, spatial)
    # The 3-D pools have no float64 CPU kernels.
    x = d.array([d.size(1, 4)] + image + [d.size(1, 4)], d.dtype() if spatial == 2 else tf.float32)
    return x, {"ksize": [1] + window + [1], "strides": [1] + strides + [1], "padding": padding}


_POOLS = {"MaxPool": (2, tf.raw_ops.MaxPool), "AvgPool": (2, tf.raw_ops.AvgPool),
          "MaxPool3D": (3, tf.raw_ops.MaxPool3D), "AvgPool3D": (3, tf.raw_ops.AvgPool3D)}

for _name, (_spatial, _forward) in _POOLS.items():
    @op(_name)
    def _(d, _spatial=_spatial, _name=_name):
        x, attrs = _pool(d, _spatial)
        return Call([T(x)], attrs)


@op("MaxPoolV2")
def _(d):
    x, attrs = _pool(d, 2)
    return Call([T(x), H(attrs["ksize"], tf.int32), H(attrs["strides"], tf.int32)],
                {"padding": attrs["padding"]})


for _name, _spatial, _forward in (("AvgPoolGrad", 2, tf.raw_ops.AvgPool),
                                  ("AvgPool3DGrad", 3, tf.raw_ops.AvgPool3D)):
    @op(_name, grad=False)
    def _(d, _spatial=_spatial, _forward=_forward):
        x, attrs = _pool(d, _spatial)
        y = _forward(value=x, **attrs) if _spatial == 2 else _forward(input=x, **attrs)
        return Call([H(list(x.shape), tf.int32), T(d.array(y.shape, x.dtype))], attrs)


for _name, _spatial, _forward, _grad_of_grad in (
        ("MaxPoolGrad", 2, tf.raw_ops.MaxPool, False),
        ("MaxPoolGradGrad", 2, tf.raw_ops.MaxPool, True),
        ("MaxPool3DGrad", 3, tf.raw_ops.MaxPool3D, False),
        ("MaxPool3DGradGrad", 3, tf.raw_ops.MaxPool3D, True)):
    @op(_name, grad=False)
    def _(d, _spatial=_spatial, _forward=_forward, _grad_of_grad=_grad_of_grad):
        x, attrs = _pool(d, _spatial)
        y = _forward(input=x, **attrs).numpy()
        grad = d.array(x.shape if _grad_of_grad else y.shape, x.dtype)
        return Call([T(x), T(y), T(grad)], attrs)


@op("MaxPoolGradV2", grad=False)
def _(d):
    x, attrs = _pool(d, 2)
    y = tf.raw_ops.MaxPool(input=x, **attrs).numpy()
    return Call([T(x), T(y), T(d.array(y.shape, x.dtype)), H(attrs["ksize"], tf.int32),
                 H(attrs["strides"], tf.int32)], {"padding": attrs["padding"]})


# ---------------------------------------------------------------------------------------
# Space to batch and depth (cc/rules/space_rules.cc)
# ---------------------------------------------------------------------------------------

def _blocks(d: Drawer):
    return [d.int(1, 3) for _ in range(d.int(1, 2))]


@op("SpaceToBatchND")
def _(d):
    block = _blocks(d)
    paddings, spatial = [], []
    for b in block:
        before, after = d.int(0, 2), d.int(0, 2)
        size = d.int(0, 2) * b + b - (before + after) % b
        spatial.append(size)
        paddings.append([before, after])
    shape = (d.choice([1, 2, 4, 3]), *spatial, *d.shape(0, 1, high=4))
    return Call([T(d.array(shape, d.dtype())), H(block, tf.int32), H(paddings, tf.int32)])


@op("BatchToSpaceND")
def _(d):
    block = _blocks(d)
    product = 1
    for b in block:
        product *= b
    spatial = [d.int(1, 3) for _ in block]
    crops = []
    for b, s in zip(block, spatial):
        total = d.int(0, s * b - 1)
        before = d.int(0, total)
        crops.append([before, total - before])
    shape = (product * d.choice([1, 2, 4, 3]), *spatial, *d.shape(0, 1, high=4))
    return Call([T(d.array(shape, d.dtype())), H(block, tf.int32), H(crops, tf.int32)])


@op("SpaceToDepth")
def _(d):
    block = d.int(2, 3)
    shape = (d.size(1, 4), block * d.size(1, 3), block * d.size(1, 3), d.size(1, 3))
    return Call([T(d.array(shape, d.dtype()))], {"block_size": block})


@op("DepthToSpace")
def _(d):
    block = d.int(2, 3)
    shape = (d.size(1, 4), d.size(1, 3), d.size(1, 3), block * block * d.size(1, 2))
    return Call([T(d.array(shape, d.dtype()))], {"block_size": block})


@op("MaxPoolWithArgmax")
def _(d):
    x, attrs = _pool(d, 2)
    # int64 indices: the CPU gradient kernel takes no others.
    attrs["include_batch_in_index"] = d.bool()
    return Call([T(x)], attrs)


@op("MaxPoolGradWithArgmax", grad=False)
def _(d):
    x, attrs = _pool(d, 2)
    attrs["include_batch_in_index"] = d.bool()
    out, argmax = tf.raw_ops.MaxPoolWithArgmax(input=x, **attrs)
    grad = d.array(out.shape, x.dtype)
    return Call([T(x), T(grad), T(argmax.numpy())], attrs)
