"""Numerical checks of cc/rules/shape_rules.cc: Reshape, Transpose, ExpandDims, Squeeze,
Shape, ShapeN, Size, Rank, BroadcastGradientArgs, InvertPermutation, BroadcastTo and Tile.

    Shape/Size/Rank([x,*] of [8,4]) -> the GLOBAL values, replicated
    broadcast_to([x] of [8], [4,8]) -> [*,x]       tile([x,*], [1,3]) -> [x,*]
    transpose([x,y], perm=[1,0]) -> [y,x]
    expand_dims([x,*], 1) -> [x,*,*]        squeeze([x,*,*] of [8,1,4], [1]) -> [x,*]
    [B,T,D] [x,*,*] -> [B*T,D] [x,*]      [B*T,D] [x,*] -> [B,T,D] [x,*,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, check_op,
                             is_replicated, layout_of, layout_params, random_array,
                             reassemble, run_without_fallback, spec_params, to_dtensor)
from tf_dtensor import dtensor


def _reshape_to(target):
    return lambda x: tf.reshape(x, target)


# (shape, target, every layout?): the -1 forms run on a subset.
RESHAPES = [
    ((8, 4), [32], True),
    ((8, 4), [2, 4, 4], True),
    ((2, 4, 4), [8, 4], True),
    ((8, 4), [-1], False),
    ((8, 4), [4, -1], False),
    ((2, 4, 4), [-1, 4], False),
]


def _reshape_params():
    params = []
    for shape, target, every in RESHAPES:
        some = ("[x,y]",) if len(shape) == 2 else ("[x,*,y]",)
        cases = layout_params(shape, meshes=[MESH_2X2]) if every else spec_params(MESH_2X2, some)
        if every:
            cases += layout_params(shape, meshes=[MESH_1D],
                                   select=lambda c: not is_replicated(c[0]))
        for param in cases:
            suffix = f"{list(shape)}->{target}".replace(" ", "")
            params.append(pytest.param(param.values[0], shape, target,
                                       id=f"{param.id}-{suffix}"))
    return params


@pytest.mark.parametrize("layouts,shape,target", _reshape_params())
def test_reshape(layouts, shape, target):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    check_op(_reshape_to(target), "Reshape", [x], layouts, host_inputs=[([len(target)], target)])


# Golden plans from the header of shape_rules.cc.
@pytest.mark.parametrize("spec,shape,target,expected", [
    pytest.param("[x,*,*]", [2, 4, 4], [8, 4], "[x,*]", id="[x,*,*]-[2,4,4]->[8,4]"),
    pytest.param("[x,*]", [8, 4], [2, 4, 4], "[x,*,*]", id="[x,*]-[8,4]->[2,4,4]"),
    pytest.param("[x,*]", [8, 4], [32], "[x]", id="[x,*]-[8,4]->[32]"),
    pytest.param("[*,x]", [8, 4], [32], "[*]", id="[*,x]-[8,4]->[32]"),
    pytest.param("[x,y]", [8, 4], [8, 2, 2], "[x,y,*]", id="[x,y]-[8,4]->[8,2,2]"),
])
def test_reshape_plan(spec, shape, target, expected, mesh_2x2):
    plan = tf_dtensor.debug.explain("Reshape", [layout_of(spec, mesh_2x2), None],
                                    [shape, [len(target)]], int_values={1: target})
    assert plan["outputs"] == [layout_of(expected, mesh_2x2)]


def test_reshape_element_count_mismatch_names_the_op(mesh_2x2):
    with pytest.raises(ValueError, match=r"(?s)Reshape.*element counts differ"):
        tf_dtensor.debug.explain("Reshape", [layout_of("[x,*]", mesh_2x2), None],
                                 [[8, 4], [1]], int_values={1: [31]})


@pytest.mark.parametrize("layouts", layout_params((4, 8)))
def test_transpose_2d(layouts):
    check_op(lambda x: tf.transpose(x, [1, 0]), "Transpose", [random_array((4, 8))], layouts,
             host_inputs=[([2], [1, 0])])


PERMS = [[2, 0, 1], [1, 0, 2], [0, 2, 1]]


@pytest.mark.parametrize("perm", PERMS, ids=[str(p).replace(" ", "") for p in PERMS])
@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,y,*]",), ("[*,x,y]",), ("[y,*,x]",), ("[*,*,*]",), ("[x,*,*]",)))
def test_transpose_3d(layouts, perm):
    check_op(lambda x: tf.transpose(x, perm), "Transpose", [random_array((2, 4, 8))], layouts,
             host_inputs=[([3], perm)])


def test_transpose_plan_swaps_specs(mesh_2x2):
    plan = tf_dtensor.debug.explain("Transpose", [layout_of("[x,y]", mesh_2x2), None],
                                    [[4, 8], [2]], int_values={1: [1, 0]})
    assert plan["outputs"] == [layout_of("[y,x]", mesh_2x2)]
    assert plan["collectives"] == []


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",), ("[*,x]",),
                                                ("[*,*]",)))
def test_expand_dims(layouts, axis):
    check_op(lambda x: tf.expand_dims(x, axis), "ExpandDims", [random_array((4, 8))], layouts,
             host_inputs=[([], [axis])])


@pytest.mark.parametrize("squeeze_dims", [[1], []], ids=["axis1", "all"])
@pytest.mark.parametrize("layouts", layout_params((8, 1, 4), meshes=[MESH_2X2]))
def test_squeeze(layouts, squeeze_dims):
    def fn(x):
        return tf.squeeze(x, axis=squeeze_dims or None)

    check_op(fn, "Squeeze", [random_array((8, 1, 4))], layouts,
             attrs={"squeeze_dims": squeeze_dims})


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[y,x]",), ("[x,*]",), ("[y,*]",)))
def test_squeeze_of_a_sharded_size_one_axis_gathers_it(layouts):
    # Found by the fuzzer: [y,x] of [1,3] left CPU:1 an empty block along the squeezed
    # axis, which TF cannot squeeze; the axis is gathered first.
    for fn in (lambda x: tf.squeeze(x, axis=[0]), tf.function(lambda x: tf.squeeze(x, axis=[0]))):
        check_op(fn, "Squeeze", [random_array((1, 3))], layouts, attrs={"squeeze_dims": [0]})


@pytest.mark.parametrize("shape", [(1, 3), (3, 2)], ids=["drops-axis0", "drops-nothing"])
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[*,x]",), ("[x,*]",)))
def test_squeeze_without_axes_of_uneven_blocks(layouts, shape):
    # Found by the fuzzer: without axes every device dropped the size-1 axes of its own
    # block ([1,3] as [*,x] has a block [1,1]; [3,2] as [x,*] a block [1,2]), which
    # segfaulted in a tf.function; the local op is given the global axes.
    for fn in (tf.squeeze, tf.function(lambda x: tf.squeeze(x))):
        check_op(fn, "Squeeze", [random_array(shape)], layouts, attrs={"squeeze_dims": []})


def test_squeeze_plan(mesh_2x2):
    plan = tf_dtensor.debug.explain("Squeeze", [layout_of("[x,*,*]", mesh_2x2)], [[8, 1, 4]],
                                    attrs={"squeeze_dims": [1]})
    assert plan["outputs"] == [layout_of("[x,*]", mesh_2x2)]


SHAPE_OPS = {
    "Shape": (tf.shape, np.array([8, 4], np.int32)),
    "Shape-int64": (lambda x: tf.shape(x, out_type=tf.int64), np.array([8, 4], np.int64)),
    "Size": (lambda x: tf.raw_ops.Size(input=x), np.array(32, np.int32)),
    "Rank": (lambda x: tf.raw_ops.Rank(input=x), np.array(2, np.int32)),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,x]",)) + spec_params(
    MESH_1D, ("[x,*]",)))
def test_shape_ops_return_global_values(layouts, name):
    fn, expected = SHAPE_OPS[name]
    (layout,) = layouts
    out = fn(to_dtensor(random_array((8, 4)), layout))
    assert_dtensor_equal(expected, dtensor.Layout.replicated(layout.mesh, expected.ndim), out)
    op_name = name.split("-")[0]
    assert check_op(fn, op_name, [random_array((8, 4))], layouts) is not None


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[*,x]",)))
def test_python_size_and_rank_are_global(layouts):
    (layout,) = layouts
    x = to_dtensor(random_array((8, 4)), layout)
    assert int(tf.size(x)) == 32
    assert int(tf.rank(x)) == 2
    assert x.shape == (8, 4)


# Reshapes that gradients make: keep_dims shapes, scalars to [1, 1], and back.
GRADIENT_RESHAPES = [
    ((8,), [8, 1], "[x]", "[x,*]"),
    ((8, 1), [8], "[x,*]", "[x]"),
    ((), [1, 1], "[]", "[*,*]"),
    ((8, 4), [8, 4, 1], "[x,y]", "[x,y,*]"),
    ((1, 4), [4], "[*,y]", "[y]"),
    ((4,), [1, 4], "[y]", "[*,y]"),
    ((8, 1, 4), [8, 4], "[x,*,y]", "[x,y]"),
]


@pytest.mark.parametrize("shape,target,spec,expected", GRADIENT_RESHAPES,
                         ids=[f"{c[2]}{list(c[0])}->{c[1]}".replace(" ", "")
                              for c in GRADIENT_RESHAPES])
def test_gradient_reshapes_keep_the_sharding(shape, target, spec, expected, mesh_2x2):
    x = random_array(shape)
    out = check_op(lambda t: tf.reshape(t, target), "Reshape", [x], [layout_of(spec, mesh_2x2)],
                   host_inputs=[([len(target)], target)])
    assert dtensor.fetch_layout(out) == layout_of(expected, mesh_2x2)


SHAPE_PAIRS = [
    ([8, 4], [4]), ([4], [8, 4]), ([8, 4], [8, 4]), ([8, 1], [1, 4]), ([2, 1, 4], [8, 1]),
    ([], [8, 4]), ([1, 1], [1]), ([8, 4], [1, 1]),
]


@pytest.mark.parametrize("s0,s1", SHAPE_PAIRS,
                         ids=[f"{a}-{b}".replace(" ", "") for a, b in SHAPE_PAIRS])
@pytest.mark.parametrize("host", [False, True], ids=["dtensor", "host"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=["i32", "i64"])
def test_broadcast_gradient_args(s0, s1, dtype, host, mesh_2x2):
    expected = tf.raw_ops.BroadcastGradientArgs(s0=tf.constant(s0, dtype),
                                                s1=tf.constant(s1, dtype))
    args = [tf.constant(s, dtype) for s in (s0, s1)]
    if not host:
        args = [to_dtensor(a, layout_of("[*]", mesh_2x2)) for a in args]

    def fn():
        with dtensor.run_on(mesh_2x2):
            return tf.raw_ops.BroadcastGradientArgs(s0=args[0], s1=args[1])

    actual = run_without_fallback(fn)
    for want, got in zip(expected, actual):
        assert_dtensor_equal(want, layout_of("[*]", mesh_2x2), got)


def test_broadcast_gradient_args_of_a_sharded_shape(mesh_2x2):
    # Not a constant: gathered, then run on every device.
    s0 = to_dtensor(np.array([8, 1, 4, 1], np.int64), layout_of("[x]", mesh_2x2))
    s1 = to_dtensor(np.array([1, 4, 1], np.int64), layout_of("[*]", mesh_2x2))
    r0, r1 = run_without_fallback(lambda: tf.raw_ops.BroadcastGradientArgs(s0=s0, s1=s1))
    assert_dtensor_equal(np.array([1, 3], np.int64), layout_of("[*]", mesh_2x2), r0)
    assert_dtensor_equal(np.array([0, 1, 3], np.int64), layout_of("[*]", mesh_2x2), r1)


def test_broadcast_gradient_args_rejects_incompatible_shapes(mesh_2x2):
    s0 = to_dtensor(np.array([8, 4], np.int32), layout_of("[*]", mesh_2x2))
    s1 = to_dtensor(np.array([3], np.int32), layout_of("[*]", mesh_2x2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):
        tf.raw_ops.BroadcastGradientArgs(s0=s0, s1=s1)


def test_invert_permutation(mesh_2x2):
    perm = to_dtensor(np.array([2, 0, 3, 1], np.int32), layout_of("[*]", mesh_2x2))
    out = run_without_fallback(tf.math.invert_permutation, perm)
    assert_dtensor_equal(np.array([1, 3, 0, 2], np.int32), layout_of("[*]", mesh_2x2), out)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a permutation"):
        tf.math.invert_permutation(to_dtensor(np.array([0, 0], np.int32),
                                              layout_of("[*]", mesh_2x2)))


def test_shape_n_gives_global_shapes(mesh_2x2):
    a = to_dtensor(random_array((8, 4)), layout_of("[x,y]", mesh_2x2))
    b = to_dtensor(random_array((2, 4, 6)), layout_of("[*,x,*]", mesh_2x2))
    sa, sb = run_without_fallback(lambda: tf.shape_n([a, b]))
    assert_dtensor_equal(np.array([8, 4], np.int32), layout_of("[*]", mesh_2x2), sa)
    assert_dtensor_equal(np.array([2, 4, 6], np.int32), layout_of("[*]", mesh_2x2), sb)


BROADCASTS = [((8,), [4, 8]), ((4, 1), [4, 8]), ((1, 8), [4, 8]), ((), [4, 8]),
              ((4, 8), [4, 8]), ((8,), [2, 4, 8])]


@pytest.mark.parametrize("shape,target", BROADCASTS,
                         ids=[f"{list(a)}->{b}".replace(" ", "") for a, b in BROADCASTS])
@pytest.mark.parametrize("mesh", [MESH_1D, MESH_2X2], ids=["mesh(x=2)", "mesh(x=2,y=2)"])
def test_broadcast_to(mesh, shape, target):
    for (layout,) in (p.values[0] for p in layout_params(shape, meshes=[mesh])):
        check_op(lambda t: tf.broadcast_to(t, target), "BroadcastTo", [random_array(shape)],
                 [layout], host_inputs=[([len(target)], target)])


@pytest.mark.parametrize("shape,spec,target", [((4,), "[x]", [4]), ((1, 1), "[*,x]", [7, 1, 1, 1]),
                                               ((3, 5), "[x,*]", [2, 3, 5])])
def test_broadcast_to_gathers_an_uneven_axis(shape, spec, target):
    # Found by the fuzzer: the local shape argument is one per op, so an unevenly sharded
    # input axis (4 over x=8, 1 over x=2) is gathered instead of refused.
    mesh = MESH_8 if shape == (4,) else MESH_1D
    for fn in (lambda t: tf.broadcast_to(t, target), tf.function(lambda t: tf.broadcast_to(t, target))):
        check_op(fn, "BroadcastTo", [random_array(shape)], [layout_of(spec, mesh)],
                 host_inputs=[([len(target)], target)])


@pytest.mark.parametrize("spec", ["[x,*]", "[*,y]", "[x,y]", "[y,x]"])
def test_broadcast_to_honours_the_requested_layout(spec, mesh_2x2):
    # Broadcast axes take the requested sharding directly: each device fills its own block.
    row = random_array((8,))
    layout = layout_of(spec, mesh_2x2)
    value = to_dtensor(row, layout_of("[*]", mesh_2x2))
    out = run_without_fallback(
        lambda: dtensor.call_with_layout(tf.broadcast_to, layout, value, [4, 8]))
    assert_dtensor_equal(np.broadcast_to(row, (4, 8)), layout, out)
    plan = tf_dtensor.debug.explain("BroadcastTo", [layout_of("[*]", mesh_2x2), None],
                                    [[8], [2]], int_values={1: [4, 8]}, requested=layout)
    assert plan["outputs"][0].sharding_specs[0] == layout.sharding_specs[0]


MULTIPLES = [[1, 1], [1, 3], [2, 1], [2, 2]]


@pytest.mark.parametrize("multiples", MULTIPLES, ids=[str(m).replace(" ", "") for m in MULTIPLES])
@pytest.mark.parametrize("layouts", layout_params((4, 8)))
def test_tile(layouts, multiples):
    check_op(lambda t: tf.tile(t, multiples), "Tile", [random_array((4, 8))], layouts,
             host_inputs=[([2], multiples)])


def test_tile_of_a_reduced_scalar_on_a_large_mesh(mesh_8):
    # reduce_mean's gradient: the scalar is reshaped to [1] and tiled to the batch.
    grad = to_dtensor(np.array([0.5], np.float32), layout_of("[*]", mesh_8))
    out = run_without_fallback(lambda g: tf.tile(g, [16]), grad)
    assert_dtensor_equal(np.full((16,), 0.5, np.float32), layout_of("[*]", mesh_8), out)


def test_transpose_with_a_repeated_axis_names_the_permutation(mesh_2x2):
    # Regression: perm [0, 0] planned the invalid layout [x,x] and failed in TF's kernel.
    x = to_dtensor(np.ones((4, 4), np.float32), layout_of("[x,y]", mesh_2x2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 0\] names axis 0 twice"):
        tf.transpose(x, [0, 0])


@pytest.mark.parametrize("axis,message", [(7, r"axis 7, out of range .* from -2 to 1"),
                                          (0, r"only drop axes of size 1, but axis 0 .* size 4")])
def test_squeeze_of_a_bad_axis_names_it(axis, message, mesh_2x2):
    # Regression: an out-of-range axis was written past the end of a vector (UB).
    x = to_dtensor(np.ones((4, 4), np.float32), layout_of("[x,y]", mesh_2x2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tf.squeeze(x, [axis])


@pytest.mark.parametrize("reduce", ["max", "sum", "mean"])
@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]", "[x,y]"])
def test_gradient_of_a_reduction_over_a_tensor_axis_needs_no_fallback(strict_mode, reduce,
                                                                     spec):
    # TF builds the gradient's reduced shape with DynamicStitch, which had no rule: in strict
    # mode it was refused ("'DynamicStitch' has no rule"), otherwise it ran replicated.
    value = (np.arange(48, dtype=np.float32).reshape(8, 6) - 20.0) / 7.0
    mesh = MESH_2X2 if "y" in spec else MESH_8
    fn = {"max": tf.reduce_max, "sum": tf.reduce_sum, "mean": tf.reduce_mean}[reduce]

    @tf.function
    def loss_and_grad(x, axis):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(fn(x, axis=axis)))
        return loss, tape.gradient(loss, x)

    for axis in (0, 1):
        want_loss, want_grad = loss_and_grad(tf.constant(value), tf.constant(axis))
        loss, grad = loss_and_grad(to_dtensor(value, layout_of(spec, mesh)), tf.constant(axis))
        np.testing.assert_allclose(reassemble(loss), want_loss.numpy(), rtol=1e-5)
        np.testing.assert_allclose(reassemble(grad), want_grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_dynamic_stitch_of_sharded_data_and_of_index_vectors(traced, mesh_2x2):
    # Index vectors (the values computed while planning) and rows of sharded data (gathered,
    # stitched on every device), against one device; an index no input gives is 0, as TF's.
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)

    def stitch(data):
        small = tf.dynamic_stitch([tf.constant([0, 3]), tf.constant([1])],
                                  [tf.constant([5, 6]), tf.constant([7])])
        merged = tf.dynamic_stitch([tf.constant([[2, 0], [1, 3]]), tf.constant([4, 5])],
                                   [tf.reshape(data[:4], [2, 2, 4]), data[4:]])
        return small, merged

    fn = tf.function(stitch) if traced else stitch
    want_small, want_merged = fn(tf.constant(rows))
    with dtensor.run_on(mesh_2x2):
        small, merged = fn(to_dtensor(rows, layout_of("[x,y]", mesh_2x2)))
    np.testing.assert_array_equal(reassemble(small), want_small.numpy())
    np.testing.assert_array_equal(reassemble(merged), want_merged.numpy())
