"""Ops on single-device and parted DTensors, eagerly and inside tf.function.

A single-device tensor is checked against the same computation on that one device; a
parted tensor against the computation run on each part alone (parts are never combined).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import assert_dtensor_equal
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
X = np.arange(8, dtype=np.float32).reshape(4, 2)


def single_device() -> Layout:
    return Layout.from_device(CPU0)


def components(t):
    return [c.numpy() for c in dtensor.unpack(t)]


def eager_and_function(fn):
    """The op eagerly, then inside a tf.function: both must agree."""
    return [fn, tf.function(fn)]


# ---------------------------------------------------------------------------------------
# Single-device layout
# ---------------------------------------------------------------------------------------

def test_copy_to_single_device_keeps_the_whole_value():
    sd = single_device()
    t = dtensor.copy_to_mesh(tf.constant(X), sd)
    assert dtensor.is_dtensor(t)
    assert dtensor.fetch_layout(t) == sd
    assert dtensor.fetch_layout(t).to_string() == f"maximal:true, mesh:{CPU0}"
    assert t.shape == (4, 2) and t.dtype == tf.float32
    np.testing.assert_array_equal(t.numpy(), X)
    dtensor.check_layout(t, sd)


@pytest.mark.parametrize("dtype", [tf.float32, tf.int32, tf.float64])
@pytest.mark.parametrize("op_name,op", [
    ("add_one", lambda a: a + 1),
    ("sum_axis0", lambda a: tf.reduce_sum(a, axis=0)),
    ("sum_all", lambda a: tf.reduce_sum(a)),
    ("max_axis1", lambda a: tf.reduce_max(a, axis=1)),
    ("matmul", lambda a: tf.matmul(a, a, transpose_b=True)),
    ("reshape", lambda a: tf.reshape(a, [2, 4])),
    ("zeros_like", tf.zeros_like),
])
def test_single_device_ops_match_one_device(dtype, op_name, op):
    sd = single_device()
    value = tf.constant(X, dtype=dtype)
    expected = op(value)
    t = dtensor.copy_to_mesh(value, sd)
    for fn in eager_and_function(op):
        out = fn(t)
        assert dtensor.fetch_layout(out) == sd, op_name
        assert out.dtype == expected.dtype and out.shape == expected.shape, op_name
        np.testing.assert_array_equal(out.numpy(), expected.numpy())


def test_call_with_layout_creates_on_the_single_device():
    sd = single_device()
    for fn in eager_and_function(lambda: dtensor.call_with_layout(tf.ones, sd, shape=(2, 3))):
        # A tf.function without inputs finds its mesh in the scope.
        with dtensor.run_on(sd.mesh):
            t = fn()
        assert dtensor.fetch_layout(t) == sd
        np.testing.assert_array_equal(t.numpy(), np.ones((2, 3), np.float32))


def test_single_device_pack_and_unpack_one_component():
    # TensorFlow's DTensor fails both (it counts zero devices on a single-device mesh);
    # the mesh has one device, so one component goes in and comes out.
    sd = single_device()
    t = dtensor.pack([tf.constant(X)], sd)
    assert dtensor.fetch_layout(t) == sd
    np.testing.assert_array_equal(t.numpy(), X)
    (only,) = dtensor.unpack(t)
    np.testing.assert_array_equal(only.numpy(), X)
    assert only.device == CPU0


def test_single_device_mixed_with_another_mesh_is_refused(mesh_1d):
    t = dtensor.copy_to_mesh(tf.constant(X), single_device())
    other = dtensor.copy_to_mesh(tf.constant(X), Layout.replicated(mesh_1d, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="different meshes"):
        _ = t + other


def test_relayout_between_single_device_and_a_mesh_moves_the_value(mesh_1d):
    # TF's DTensor refuses both directions ("Send and receive hosts don't match").
    sd = single_device()
    t = dtensor.copy_to_mesh(tf.constant(X), sd)
    sharded = Layout(["x", UNSHARDED], mesh_1d)
    on_mesh = dtensor.relayout(t, sharded)
    assert_dtensor_equal(X, sharded, on_mesh)
    back = dtensor.relayout(on_mesh * 2.0, sd)
    assert dtensor.fetch_layout(back) == sd
    np.testing.assert_array_equal(back.numpy(), X * 2.0)


# ---------------------------------------------------------------------------------------
# Parted layout
# ---------------------------------------------------------------------------------------

def parted_rows(mesh) -> Layout:
    return Layout(["x", UNSHARDED], mesh).to_parted()


def test_parted_made_three_ways_holds_the_same_parts(mesh_1d):
    px = parted_rows(mesh_1d)
    made = {
        "copy_to_mesh": dtensor.copy_to_mesh(tf.constant(X), px),
        "pack": dtensor.pack([X[:2], X[2:]], px),
    }
    for name, t in made.items():
        layout = dtensor.fetch_layout(t)
        assert layout == px and layout.type == dtensor.LayoutType.PARTED, name
        assert t.shape == (4, 2), name
        parts = components(t)
        np.testing.assert_array_equal(parts[0], X[:2])
        np.testing.assert_array_equal(parts[1], X[2:])
    ones = dtensor.call_with_layout(tf.ones, px, (4, 2))
    assert dtensor.fetch_layout(ones) == px
    for part in components(ones):
        np.testing.assert_array_equal(part, np.ones((2, 2), np.float32))


@pytest.mark.parametrize("axis,specs,shape", [
    (None, [], ()),
    (0, [UNSHARDED], (2,)),
    (1, ["x"], (4,)),
])
def test_parted_reductions_reduce_each_part(mesh_1d, axis, specs, shape):
    t = dtensor.copy_to_mesh(tf.constant(X), parted_rows(mesh_1d))
    for fn in eager_and_function(lambda a: tf.reduce_sum(a, axis=axis)):
        out = fn(t)
        assert dtensor.fetch_layout(out) == Layout(specs, mesh_1d).to_parted()
        assert out.shape == shape and out.dtype == tf.float32
        for part, expected in zip(components(out), (X[:2], X[2:])):
            np.testing.assert_array_equal(part, np.sum(expected, axis=axis))


def test_parted_2d_reduction_keeps_the_other_axis(mesh_2x2):
    t = dtensor.call_with_layout(tf.ones, Layout(["x", "y"], mesh_2x2).to_parted(), (4, 2))
    out = tf.reduce_sum(t, axis=0)
    assert dtensor.fetch_layout(out) == Layout(["y"], mesh_2x2).to_parted()
    assert out.shape == (2,)
    for part in components(out):
        np.testing.assert_array_equal(part, [2.0])


@pytest.mark.parametrize("op_name", ["add_one", "parted_plus_parted", "parted_plus_static",
                                     "parted_plus_other_static", "zeros_like", "times_two",
                                     "matmul_replicated"])
def test_parted_elementwise_and_matmul(mesh_1d, op_name):
    px = parted_rows(mesh_1d)
    t = dtensor.copy_to_mesh(tf.constant(X), px)
    static = dtensor.copy_to_mesh(tf.constant(X), Layout(["x", UNSHARDED], mesh_1d))
    columns = dtensor.copy_to_mesh(tf.constant(X), Layout([UNSHARDED, "x"], mesh_1d))
    weights = dtensor.copy_to_mesh(tf.ones([2, 3]), Layout.replicated(mesh_1d, 2))
    ops = {
        "add_one": (lambda a: a + 1, lambda p: p + 1),
        "parted_plus_parted": (lambda a: a + a, lambda p: p + p),
        "parted_plus_static": (lambda a: a + static, lambda p: p + p),
        # The static input is really relaid out to the parted one's layout.
        "parted_plus_other_static": (lambda a: a + columns, lambda p: p + p),
        "zeros_like": (tf.zeros_like, np.zeros_like),
        "times_two": (lambda a: a * 2, lambda p: p * 2),
        "matmul_replicated": (lambda a: tf.matmul(a, weights), lambda p: p @ np.ones((2, 3))),
    }
    op, per_part = ops[op_name]
    # Inside tf.function each device runs the function on its own parts, with static inputs
    # as their components: zeros_like is traced to a fill of the global shape there (its
    # result does not read the parts), and [*,x] does not line up with parted [x,*].
    fns = [op] if op_name in ("zeros_like", "parted_plus_other_static") else eager_and_function(op)
    for fn in fns:
        out = fn(t)
        expected = [per_part(X[:2]), per_part(X[2:])]
        assert dtensor.fetch_layout(out) == parted_rows(mesh_1d)
        assert out.shape == (4, expected[0].shape[1]) and out.dtype == tf.float32
        for part, want in zip(components(out), expected):
            np.testing.assert_array_equal(part, want)


def test_relayout_between_parted_and_static_keeps_the_parts(mesh_1d):
    static_layout = Layout(["x", UNSHARDED], mesh_1d)
    t = dtensor.copy_to_mesh(tf.constant(X), parted_rows(mesh_1d))
    static = dtensor.relayout(t, static_layout)
    assert dtensor.fetch_layout(static) == static_layout
    np.testing.assert_array_equal(np.concatenate(components(static)), X)
    back = dtensor.relayout(static, parted_rows(mesh_1d))
    assert dtensor.fetch_layout(back) == parted_rows(mesh_1d)
    np.testing.assert_array_equal(np.concatenate(components(back)), X)


def test_relayout_to_parted_inside_a_function_returns_parts(mesh_1d):
    """As eagerly (and as TensorFlow's DTensor): a tf.function returning a relayout to a
    parted layout returns parts, also through the Identity tf.function puts on results."""
    static_layout = Layout(["x", UNSHARDED], mesh_1d)
    t = dtensor.copy_to_mesh(tf.constant(X), static_layout)

    @tf.function
    def to_parts(v):
        return dtensor.relayout(v, parted_rows(mesh_1d)), tf.identity(v * 2.0)

    parts, doubled = to_parts(t)
    assert dtensor.fetch_layout(parts) == parted_rows(mesh_1d)
    assert dtensor.fetch_layout(doubled) == static_layout  # not a relayout: static
    np.testing.assert_array_equal(np.concatenate(components(parts)), X)


def test_relayout_parted_to_replicated_gathers_the_parts(mesh_1d):
    # TensorFlow's DTensor returns device 0's part on every device (its relayout drops the
    # other parts); the parts are the shards of [x,*], so the gather is the whole value.
    t = dtensor.copy_to_mesh(tf.constant(X), parted_rows(mesh_1d))
    out = dtensor.relayout(t, Layout.replicated(mesh_1d, 2))
    assert out.shape == (4, 2)
    np.testing.assert_array_equal(out.numpy(), X)


def test_parted_result_is_read_per_part(mesh_1d):
    t = dtensor.copy_to_mesh(tf.constant(X), parted_rows(mesh_1d))
    with pytest.raises(tf.errors.UnimplementedError, match="unpack"):
        t.numpy()


def test_resharding_a_part_is_refused(mesh_1d):
    whole = dtensor.copy_to_mesh(tf.constant(X), Layout.replicated(mesh_1d, 2).to_parted())
    sharded = dtensor.copy_to_mesh(tf.constant(X), Layout(["x", UNSHARDED], mesh_1d))
    with pytest.raises(tf.errors.UnimplementedError, match="parted"):
        _ = whole + sharded


def test_function_refuses_static_inputs_that_do_not_line_up_with_the_parts(mesh_1d):
    t = dtensor.copy_to_mesh(tf.constant(X), parted_rows(mesh_1d))
    columns = dtensor.copy_to_mesh(tf.constant(X), Layout([UNSHARDED, "x"], mesh_1d))
    with pytest.raises(tf.errors.UnimplementedError, match="line up"):
        tf.function(lambda a, b: a + b)(t, columns)
