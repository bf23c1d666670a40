"""Numerical checks of cc/rules/slice_rules.cc: StridedSlice, StridedSliceGrad,
TensorStridedSliceUpdate, Slice, Pad/PadV2/MirrorPad/MirrorPadGrad, ReverseV2,
ReverseSequence and Roll.

    x[:, 1:3] of [x,y] -> gather y -> [x,*]        x[..., 0] of [x,y] -> gather y -> [x]
    tf.slice([x,*], [0,1], [-1,2]) -> [x,*]         x[:, None] of [x,*] -> [x,*,*]
    pad([x,*], [[0,0],[1,1]]) -> [x,*]              reverse([x,y], [1]) -> [x,*]
    roll([x,y], 3, axis=1) -> [x,*]                 reverse_sequence([x,y,*]) -> [x,*,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from tf_dtensor import dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, check_op, layout_of,
                             layout_params, layouts_for, random_array, reassemble,
                             cpus, run_without_fallback, spec_id, to_dtensor)

SHAPE = (4, 8)
MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")

# name -> (begin, end, strides, masks): what Python slicing of a [4, 8] tensor builds.
STRIDED_SLICES = {
    "[:,2:6]": ([0, 2], [0, 6], [1, 1], {"begin_mask": 1, "end_mask": 1}),
    "[1:3]": ([1], [3], [1], {}),
    "[...,0]": ([0, 0], [0, 1], [1, 1], {"ellipsis_mask": 1, "shrink_axis_mask": 2}),
    "[:,3]": ([0, 3], [0, 4], [1, 1], {"begin_mask": 1, "end_mask": 1, "shrink_axis_mask": 2}),
    "[:,None]": ([0, 0], [0, 0], [1, 1], {"begin_mask": 1, "end_mask": 1, "new_axis_mask": 2}),
    "[...,None]": ([0, 0], [0, 0], [1, 1], {"ellipsis_mask": 1, "new_axis_mask": 2}),
    "[None,...,1:]": ([0, 0, 1], [0, 0, 0], [1, 1, 1],
                      {"new_axis_mask": 1, "ellipsis_mask": 2, "end_mask": 4}),
    "[::2]": ([0], [0], [2], {"begin_mask": 1, "end_mask": 1}),
    "[-2:]": ([-2], [0], [1], {"end_mask": 1}),
    "[:,::-1]": ([0, 0], [0, 0], [1, -1], {"begin_mask": 3, "end_mask": 3}),
    "[0:4,0:8]": ([0, 0], [4, 8], [1, 1], {}),
    "[-100:100]": ([-100], [100], [1], {}),
    # One element per period of the stride: a sharded axis whose blocks hold whole periods
    # keeps its sharding.
    "[:,1::2]": ([0, 1], [0, 0], [1, 2], {"begin_mask": 1, "end_mask": 2}),
    "[:,0:7:2]": ([0, 0], [4, 7], [1, 2], {}),
    "[:,1:8:4]": ([0, 1], [4, 8], [1, 4], {}),
}


def _attrs(masks):
    return {m: masks.get(m, 0) for m in MASKS}


def _strided_slice(name):
    begin, end, strides, masks = STRIDED_SLICES[name]
    return lambda x: tf.strided_slice(x, begin, end, strides, **_attrs(masks))


def _slice_hosts(name):
    begin, end, strides, _ = STRIDED_SLICES[name]
    n = len(begin)
    return [([n], begin), ([n], end), ([n], strides)]


@pytest.mark.parametrize("name", list(STRIDED_SLICES))
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_strided_slice(layouts, name):
    check_op(_strided_slice(name), "StridedSlice", [random_array(SHAPE)], layouts,
             host_inputs=_slice_hosts(name), attrs=_attrs(STRIDED_SLICES[name][3]))


def _strided_slice_grad_params():
    params = []
    for name, (begin, end, strides, masks) in STRIDED_SLICES.items():
        dy_shape = tf.strided_slice(np.zeros(SHAPE, np.float32), begin, end, strides,
                                    **_attrs(masks)).shape
        for layout in layouts_for(MESH_2X2, tuple(dy_shape)):
            params.append(pytest.param(name, layout, id=f"{name}-{spec_id(layout)}"))
    return params


@pytest.mark.parametrize("name,dy_layout", _strided_slice_grad_params())
def test_strided_slice_grad(name, dy_layout):
    begin, end, strides, masks = STRIDED_SLICES[name]
    dy_shape = tf.strided_slice(np.zeros(SHAPE, np.float32), begin, end, strides,
                                **_attrs(masks)).shape

    def grad(dy):
        return tf.raw_ops.StridedSliceGrad(shape=list(SHAPE), begin=begin, end=end,
                                           strides=strides, dy=dy, **_attrs(masks))

    check_op(grad, "StridedSliceGrad", [random_array(tuple(dy_shape))], [dy_layout],
             host_inputs=[([2], list(SHAPE))] + _slice_hosts(name), attrs=_attrs(masks),
             host_first=True)


@pytest.mark.parametrize("name", ["[:,1::2]", "[:,0:7:2]"])
def test_strided_slice_of_whole_periods_keeps_the_sharding(name, mesh_2x2):
    # Blocks of 4 along the sharded axis hold two periods of 2: each device slices its own
    # block (TensorFlow's DTensor keeps these sharded too); a stride of 3 does not fit.
    layout = layout_of("*,x", mesh_2x2)
    value = random_array(SHAPE)
    got = run_without_fallback(_strided_slice(name), to_dtensor(value, layout))
    assert tf_dtensor.dtensor.fetch_layout(got) == layout
    np.testing.assert_array_equal(reassemble(got), _strided_slice(name)(value).numpy())
    odd = tf.strided_slice(to_dtensor(value, layout), [0, 0], [4, 8], [1, 3])
    assert tf_dtensor.dtensor.fetch_layout(odd) == layout_of("*,*", mesh_2x2)
    np.testing.assert_array_equal(reassemble(odd), value[:, 0:8:3])


def test_python_slicing_keeps_the_batch_sharding(mesh_2x2):
    x = random_array(SHAPE)
    t = to_dtensor(x, layout_of("[x,y]", mesh_2x2))
    out = run_without_fallback(lambda v: v[:, 1:3], t)
    assert_dtensor_equal(x[:, 1:3], layout_of("[x,*]", mesh_2x2), out)
    out = run_without_fallback(lambda v: v[..., 0], t)
    assert_dtensor_equal(x[..., 0], layout_of("[x]", mesh_2x2), out)
    out = run_without_fallback(lambda v: v[:, None], t)
    assert_dtensor_equal(x[:, None], layout_of("[x,*,y]", mesh_2x2), out)


def test_slice_gradient_keeps_the_batch_sharding(mesh_2x2):
    x = random_array(SHAPE)
    layout = layout_of("[x,*]", mesh_2x2)

    def gradient(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(v[:, 1:3] * v[:, 4:6])
        return tape.gradient(loss, v)

    expected = gradient(tf.constant(x))
    actual = run_without_fallback(gradient, to_dtensor(x, layout))
    assert_dtensor_equal(expected, layout, actual)


@pytest.mark.parametrize("begin,size", [([0, 0], [-1, -1]), ([0, 2], [4, 4]), ([1, 0], [2, -1]),
                                        ([0, 0], [4, 8]), ([2, 7], [-1, 1])],
                         ids=["all", "cols", "rows", "whole", "corner"])
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_slice(layouts, begin, size):
    check_op(lambda x: tf.slice(x, begin, size), "Slice", [random_array(SHAPE)], layouts,
             host_inputs=[([2], begin), ([2], size)])


PADDINGS = {
    "cols": [[0, 0], [1, 2]],
    "rows": [[1, 0], [0, 0]],
    "none": [[0, 0], [0, 0]],
}


@pytest.mark.parametrize("name", sorted(PADDINGS))
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_pad(layouts, name):
    paddings = PADDINGS[name]
    flat = [v for row in paddings for v in row]
    check_op(lambda x: tf.pad(x, paddings), "Pad", [random_array(SHAPE)], layouts,
             host_inputs=[([2, 2], flat)])


@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_pad_with_a_constant(layouts):
    paddings = [[0, 0], [1, 1]]
    check_op(lambda x: tf.pad(x, paddings, constant_values=7.0), "PadV2",
             [random_array(SHAPE)], layouts,
             host_inputs=[([2, 2], [0, 0, 1, 1]), ([], None)])  # paddings, constant_values


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_mirror_pad(layouts, mode):
    paddings = [[1, 1], [0, 0]]
    check_op(lambda x: tf.pad(x, paddings, mode=mode), "MirrorPad", [random_array(SHAPE)],
             layouts, host_inputs=[([2, 2], [1, 1, 0, 0])], attrs={"mode": mode})


@pytest.mark.parametrize("axes", [[0], [1], [0, 1], [-1]], ids=["0", "1", "both", "-1"])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_1D, MESH_2X2]))
def test_reverse(layouts, axes):
    check_op(lambda x: tf.reverse(x, axes), "ReverseV2", [random_array(SHAPE)], layouts,
             host_inputs=[([len(axes)], axes)])


# TensorStridedSliceUpdate: the StridedSlice rule's axes, the value following the input
# along the whole axes:  x[:, 2:6] = v with x [x,y] -> [x,*]  (v [*,*] -> [x,*]).
UPDATES = ["[:,2:6]", "[1:3]", "[...,0]", "[:,3]", "[-100:100]"]


def _slice_update(name):
    begin, end, strides, masks = STRIDED_SLICES[name]

    def fn(x, v):
        return tf.raw_ops.TensorStridedSliceUpdate(input=x, begin=begin, end=end, strides=strides,
                                                   value=v, **_attrs(masks))
    return fn


def _update_params():
    params = []
    for mesh in (MESH_1D, MESH_2X2):
        for name in UPDATES:
            value_shape = _strided_slice(name)(tf.zeros(SHAPE)).shape
            for x_layout in layouts_for(mesh, SHAPE):
                for v_layout in layouts_for(mesh, value_shape):
                    if v_layout.sharding_specs.count("*") < len(value_shape) - 1 and \
                            x_layout.sharding_specs != ["*"] * 2:
                        continue
                    ident = f"{name}-{spec_id(x_layout)}-{spec_id(v_layout)}@{mesh.short()}"
                    params.append(pytest.param(name, (x_layout, v_layout), id=ident))
    return params


@pytest.mark.parametrize("name,layouts", _update_params())
def test_tensor_strided_slice_update(name, layouts):
    value_shape = _strided_slice(name)(tf.zeros(SHAPE)).shape
    begin, end, strides, masks = STRIDED_SLICES[name]
    n = len(begin)
    plan = tf_dtensor.debug.explain(
        "TensorStridedSliceUpdate", [layouts[0], None, None, None, layouts[1]],
        [list(SHAPE), [n], [n], [n], list(value_shape)],
        int_values={1: begin, 2: end, 3: strides}, attrs=_attrs(masks))
    fn = _slice_update(name)
    arrays = [random_array(SHAPE), random_array(value_shape, seed=1)]
    expected = fn(*[tf.constant(a) for a in arrays]).numpy()
    for run in (fn, tf.function(fn)):
        actual = run_without_fallback(run, *[to_dtensor(a, l) for a, l in zip(arrays, layouts)])
        assert_dtensor_equal(expected, plan["outputs"][0], actual)


def test_tensor_strided_slice_update_uneven_rows_and_broadcast_value(mesh_2x2):
    # 5 rows over x=2 stay sharded; a [1, 2] value broadcasts over the rows.
    x, v = random_array((5, 8)), random_array((1, 2), seed=1)
    fn = lambda a, b: tf.raw_ops.TensorStridedSliceUpdate(  # noqa: E731
        input=a, begin=[0, 2], end=[0, 4], strides=[1, 1], value=b, begin_mask=1, end_mask=1)
    actual = run_without_fallback(fn, to_dtensor(x, layout_of("[x,y]", mesh_2x2)),
                                  to_dtensor(v, layout_of("[*,*]", mesh_2x2)))
    assert_dtensor_equal(fn(x, v), layout_of("[x,*]", mesh_2x2), actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("specs", [("[x,*]", "[x,*]"), ("[x,y]", "[*,*]"), ("[*,y]", "[y,*]")])
def test_tensor_strided_slice_update_gradient(specs, in_function, mesh_2x2):
    fn = _slice_update("[:,2:6]")
    x, v = random_array(SHAPE), random_array((4, 4), seed=1)

    def grads(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            loss = tf.reduce_sum(tf.square(fn(a, b)))
        return tape.gradient(loss, [a, b])

    expected = [g.numpy() for g in grads(tf.constant(x), tf.constant(v))]
    run = tf.function(grads) if in_function else grads
    actual = run_without_fallback(run, to_dtensor(x, layout_of(specs[0], mesh_2x2)),
                                  to_dtensor(v, layout_of(specs[1], mesh_2x2)))
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(reassemble(a), e, rtol=1e-5, atol=1e-6)


# An axis sharded over a mesh dimension of size 1 is in one block: its slice entries stay as
# given (they were replaced by the whole block's range, so t[..., 1] read element 0 and the
# fuzzer's cases below came out with the wrong values or shapes).
_MESH_1X4 = dtensor.create_mesh([("x", 1), ("y", 4)], devices=cpus(4))
_MESH_2X1X2 = dtensor.create_mesh([("x", 2), ("y", 1), ("z", 2)],
                                  devices=cpus(4))


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_slices_of_an_axis_sharded_over_a_size_one_mesh_dimension(in_function):
    wrap = tf.function if in_function else (lambda f: f)
    image = random_array((2, 6, 5, 3), seed=3)
    lay = layout_of("[z,x,*,y]", _MESH_2X1X2)
    got = wrap(lambda t: t[..., 1])(to_dtensor(image, lay))
    assert_dtensor_equal(image[..., 1], layout_of("[z,x,*]", _MESH_2X1X2), got)

    values = np.arange(14, dtype=np.int64).reshape(1, 2, 7, 1)
    sliced = wrap(lambda t: tf.raw_ops.StridedSlice(
        input=t, begin=[0, -2, -5, 1], end=[1, 1, 3, 1], strides=[1, 3, 1, -1], begin_mask=4))(
            to_dtensor(values, layout_of("[y,*,x,*]", _MESH_1X4)))
    want = tf.raw_ops.StridedSlice(input=values, begin=[0, -2, -5, 1], end=[1, 1, 3, 1],
                                   strides=[1, 3, 1, -1], begin_mask=4).numpy()
    assert tuple(sliced.shape) == want.shape == (1, 1, 3, 0)

    dy = random_array((1, 4), seed=4).astype(np.float32)
    grad = wrap(lambda g: tf.raw_ops.StridedSliceGrad(
        shape=[3, 5], begin=[-1, -4], end=[-1, 5], strides=[3, 1], dy=g, end_mask=1))(
            to_dtensor(dy, layout_of("[y,x]", _MESH_1X4)))
    want = tf.raw_ops.StridedSliceGrad(shape=[3, 5], begin=[-1, -4], end=[-1, 5], strides=[3, 1],
                                       dy=dy, end_mask=1).numpy()
    np.testing.assert_array_equal(reassemble(grad), want)


def test_rgb_to_hsv_gradient_with_channels_over_a_size_one_mesh_dimension():
    """The fuzzer's case: tf.image.rgb_to_hsv's gradient reads channels with t[..., k]."""
    image = random_array((2, 6, 5, 3), seed=5)
    up = random_array((2, 6, 5, 3), seed=6)
    lay = layout_of("[z,x,*,y]", _MESH_2X1X2)

    def gradient(t, u):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = tf.reduce_sum(tf.image.rgb_to_hsv(t) * u)
        return tape.gradient(loss, t)

    want = gradient(tf.constant(image), tf.constant(up)).numpy()
    got = gradient(to_dtensor(image, lay), to_dtensor(up, lay))
    np.testing.assert_allclose(reassemble(got), want, rtol=1e-6, atol=1e-6)


def test_strided_slice_update_with_an_axis_over_a_size_one_mesh_dimension():
    base = random_array((7, 8, 7), seed=7)
    value = np.zeros((7, 0, 1), base.dtype)
    kw = dict(begin=[7, 7, -1], end=[0, -8, 3], strides=[1, 1, 3], begin_mask=1, end_mask=5)
    want = tf.raw_ops.TensorStridedSliceUpdate(input=base, value=value, **kw).numpy()
    got = tf.raw_ops.TensorStridedSliceUpdate(
        input=to_dtensor(base, layout_of("[x,y,z]", _MESH_2X1X2)),
        value=to_dtensor(value, layout_of("[x,z,*]", _MESH_2X1X2)), **kw)
    np.testing.assert_array_equal(reassemble(got), want)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_mirror_pad_with_empty_blocks(mode, in_function):
    """2 rows over x=8 leave six devices empty blocks, which TF's MirrorPad kernel refuses
    even unpadded along that axis: they make their empty output blocks directly."""
    mesh_8 = dtensor.create_mesh([("x", 8)], devices=cpus(8))
    value = np.arange(12, dtype=np.int32).reshape(2, 6)
    fn = lambda t: tf.raw_ops.MirrorPad(input=t, paddings=[[0, 0], [2, 1]], mode=mode)
    got = (tf.function(fn) if in_function else fn)(to_dtensor(value, layout_of("[x,*]", mesh_8)))
    assert_dtensor_equal(fn(value).numpy(), layout_of("[x,*]", mesh_8), got)


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
@pytest.mark.parametrize("layouts", layout_params((6, 10), meshes=[MESH_1D, MESH_2X2]))
def test_mirror_pad_grad(layouts, mode):
    """The gradient of a reflect padding folds the borders back: padded axes gathered."""
    paddings = [[2, 1], [0, 0]]
    check_op(lambda g: tf.raw_ops.MirrorPadGrad(input=g, paddings=paddings, mode=mode),
             "MirrorPadGrad", [random_array((6, 10))], layouts,
             host_inputs=[([2, 2], [2, 1, 0, 0])], attrs={"mode": mode})


def _loss_and_grads(fn):
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = tf.reduce_sum(y * y)
        return [y, tape.gradient(loss, x)]
    return run


# (name, fn, input spec, the result's spec): the operation's unmoved axes keep their sharding.
GRADIENT_CASES = [
    ("reflect_pad", lambda x: tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], "REFLECT"),
     "[x,*,*,y]", "[x,*,*,y]"),
    ("symmetric_pad_of_sharded_rows", lambda x: tf.pad(x, [[0, 0], [2, 0], [0, 0], [0, 0]],
                                                      "SYMMETRIC"), "[x,y,*,*]", "[x,*,*,*]"),
    ("sobel_edges", tf.image.sobel_edges, "[x,*,*,y]", "[x,*,*,y,*]"),
    ("shifted_windows_roll", lambda x: tf.roll(x, shift=[-2, -2], axis=[1, 2]), "[x,*,*,y]",
     "[x,*,*,y]"),
    ("roll_of_a_sharded_axis", lambda x: tf.roll(x, shift=3, axis=2), "[*,*,x,y]", "[*,*,*,y]"),
    ("reverse_sequence", lambda x: tf.reverse_sequence(x[..., 0], [3, 5, 1, 6], seq_axis=1,
                                                       batch_axis=0), "[x,y,*,*]", "[x,*,*]"),
    ("reverse_sequence_batch_1", lambda x: tf.reverse_sequence(
        tf.transpose(x[..., 0], [1, 0, 2]), [3, 5, 1, 6], seq_axis=0, batch_axis=1),
     "[x,*,y,*]", "[*,x,y]"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name,fn,spec,out", GRADIENT_CASES, ids=[c[0] for c in GRADIENT_CASES])
def test_reflect_pad_roll_and_reverse_sequence_with_gradients(name, fn, spec, out, in_function,
                                                              mesh_2x2):
    x = random_array((4, 6, 6, 4))
    run = _loss_and_grads(fn)
    expected = [v.numpy() for v in run(tf.constant(x))]
    actual = run_without_fallback(tf.function(run) if in_function else run,
                                  to_dtensor(x, layout_of(spec, mesh_2x2)))
    assert_dtensor_equal(expected[0], layout_of(out, mesh_2x2), actual[0])
    assert tuple(actual[1].shape) == expected[1].shape
    np.testing.assert_allclose(reassemble(actual[1]), expected[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_1D, MESH_2X2]))
def test_roll(layouts):
    check_op(lambda x: tf.roll(x, shift=[3, -1], axis=[1, 1]), "Roll", [random_array(SHAPE)],
             layouts, host_inputs=[([2], [3, -1]), ([2], [1, 1])])


@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_1D, MESH_2X2]))
def test_reverse_sequence_with_sharded_lengths(layouts):
    lengths = np.array([8, 3, 0, 5], np.int64)
    lengths_layout = dtensor.Layout([layouts[0].sharding_specs[0]], layouts[0].mesh)
    fn = lambda x, n: tf.reverse_sequence(x, n, seq_axis=1, batch_axis=0)
    check_op(fn, "ReverseSequence", [random_array(SHAPE), lengths], [layouts[0], lengths_layout],
             attrs={"seq_dim": 1, "batch_dim": 0})


def test_reverse_sequence_names_bad_axes(mesh_2x2):
    with pytest.raises(ValueError, match="'ReverseSequence' needs distinct seq_dim and batch_dim"):
        tf_dtensor.debug.explain("ReverseSequence", [layout_of("[x,*]", mesh_2x2),
                                                     layout_of("[x]", mesh_2x2)], [[4, 8], [4]],
                                 attrs={"seq_dim": 0, "batch_dim": 0})
