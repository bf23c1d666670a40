"""Values on several meshes: copy_to_mesh/relayout between meshes, and tf.functions whose
ops run on more than one mesh (a host mesh feeding a compute mesh, two disjoint meshes).

A value crosses meshes whole: gathered on its mesh, handed to every device of the other
mesh, sliced there, so any pair of layouts works:
  [x,*] @ mesh(x=4) -> [y,z] @ mesh(y=2,z=2)   all-gather on x, move, slice on y and z.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import assert_dtensor_equal, case_id, cpus, layout_of
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

# Two disjoint meshes over the 8 virtual CPUs, and a one-device "host" mesh.
MESH_A = dtensor.create_mesh([("x", 4)], devices=cpus(8)[:4])
MESH_B = dtensor.create_mesh([("y", 2), ("z", 2)], devices=cpus(8)[4:])
HOST = dtensor.create_mesh([("h", 1)], devices=cpus(1))

VALUE = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)

MOVES = [(layout_of(a, MESH_A), layout_of(b, MESH_B))
         for a in ("*,*", "x,*", "*,x") for b in ("*,*", "y,*", "y,z", "z,y")]


def place(value, layout):
    return dtensor.copy_to_mesh(tf.constant(value), layout)


@pytest.mark.parametrize("source,target", MOVES, ids=[case_id(m) for m in MOVES])
def test_relayout_between_meshes_keeps_the_value(source, target):
    moved = dtensor.relayout(place(VALUE, source), target)
    assert_dtensor_equal(VALUE, target, moved)
    back = dtensor.copy_to_mesh(moved, source)
    assert_dtensor_equal(VALUE, source, back)


@pytest.mark.parametrize("source,target", MOVES[:6], ids=[case_id(m) for m in MOVES[:6]])
def test_relayout_between_meshes_inside_a_function(source, target):
    @tf.function
    def move(t):
        return dtensor.relayout(t * 2.0, target) + 1.0

    out = move(place(VALUE, source))
    assert_dtensor_equal(VALUE * 2.0 + 1.0, target, out)


def test_function_with_arguments_on_two_meshes():
    a_layout, b_layout = layout_of("x,*", MESH_A), layout_of("y,z", MESH_B)

    @tf.function
    def step(a, b):
        on_b = dtensor.relayout(tf.nn.relu(a - 10.0), b_layout)
        return on_b * b, tf.reduce_sum(a, axis=0)

    product, column_sums = step(place(VALUE, a_layout), place(VALUE + 1.0, b_layout))
    assert_dtensor_equal(np.maximum(VALUE - 10.0, 0.0) * (VALUE + 1.0), b_layout, product)
    assert_dtensor_equal(VALUE.sum(axis=0), layout_of("*", MESH_A), column_sums)


def test_host_mesh_feeds_a_batch_sharded_matmul():
    """The input pipeline's pattern: batches on a host mesh, weights on the compute mesh."""
    weights = np.linspace(-1.0, 1.0, 4 * 3, dtype=np.float32).reshape(4, 3)
    w = dtensor.DVariable(place(weights, layout_of("*,*", MESH_A)))
    batch_layout = layout_of("x,*", MESH_A)

    @tf.function
    def forward(batch):
        return tf.matmul(dtensor.relayout(batch, batch_layout), w)

    out = forward(place(VALUE, layout_of("*,*", HOST)))
    assert_dtensor_equal(VALUE @ weights, layout_of("x,*", MESH_A), out)


def test_op_with_inputs_on_two_meshes_is_refused_with_a_fix():
    a = place(VALUE, layout_of("x,*", MESH_A))
    b = place(VALUE, layout_of("y,*", MESH_B))

    @tf.function
    def add(p, q):
        return p + q

    with pytest.raises(tf.errors.InvalidArgumentError, match="two meshes.*copy_to_mesh"):
        add(a, b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="different meshes"):
        a + b


def test_replicated_scalar_from_another_mesh_joins_the_op():
    a = place(VALUE, layout_of("x,*", MESH_A))
    scale = place(np.float32(3.0), Layout([], MESH_B))

    @tf.function
    def scaled(t, s):
        return t * s

    assert_dtensor_equal(VALUE * 3.0, layout_of("x,*", MESH_A), scaled(a, scale))


def test_variable_handle_does_not_move_between_meshes():
    v = dtensor.DVariable(place(VALUE, layout_of("x,*", MESH_A)))
    moved = dtensor.relayout(v.read_value(), layout_of("y,*", MESH_B))
    assert_dtensor_equal(VALUE, layout_of("y,*", MESH_B), moved)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_gradient_returns_to_the_mesh_and_layout_of_the_input(in_function):
    a_layout, b_layout = layout_of("x,*", MESH_A), layout_of("*,z", MESH_B)
    a = place(VALUE, a_layout)

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = tf.reduce_sum(dtensor.relayout(t * t, b_layout) * 3.0)
        return tape.gradient(loss, t)

    g = tf.function(grad)(a) if in_function else grad(a)
    assert_dtensor_equal(6.0 * VALUE, a_layout, g)


def test_relayout_like_inside_a_function_follows_another_mesh():
    like = place(np.zeros((8, 4), np.float32), layout_of("y,z", MESH_B))

    @tf.function
    def follow(t, other):
        return dtensor.relayout_like(t + 1.0, other)

    out = follow(place(VALUE, layout_of("x,*", MESH_A)), like)
    assert_dtensor_equal(VALUE + 1.0, layout_of("y,z", MESH_B), out)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_replicated_shape_from_another_mesh_moves_in_both_paths(in_function):
    """A value the op reads as a host argument (Reshape's shape) moves whole to the op's
    mesh, eagerly and inside a tf.function alike (one mesh chooser serves both)."""
    a = place(VALUE, layout_of("*,*", MESH_A))
    shape = place(np.array([4, 8], np.int32), layout_of("*", MESH_B))

    def reshape(t, s):
        return tf.reshape(t, s)

    out = tf.function(reshape)(a, shape) if in_function else reshape(a, shape)
    assert_dtensor_equal(VALUE.reshape(4, 8), layout_of("*,*", MESH_A), out)
