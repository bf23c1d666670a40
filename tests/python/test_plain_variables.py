"""Variables next to DTensors: plain tf.Variables inside tf.function, and the layouts an
eager tape gives variables' gradients.

TensorFlow places an op with a physical device's resource input on that device and copies
the DTensor inputs there, so a function that captured a plain variable (a Keras layer made
without a distribution, Keras' Dropout seed) gathered its sharded inputs on one device, or
was refused. The DTensor device now takes such calls, as TensorFlow's DTensor does
(`shall_pin_to_this_device`); the variable stays where it lives, its handle gives the
function its value's shape, and an op on it runs there once, with its DTensor inputs whole
(cc/graph/function_expansion.cc, EmitOnPlainResource). Each case is checked against the
same program on one plain device.

Eagerly, a tape gives each DVariable's gradient in the variable's layout (an eager assign
keeps a DVariable's layout, so an optimizer's update needs it), and a plain variable's
gradient that sharded ops made whole (its update runs where it lives).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import MESH_8, assert_values_equal, layout_of, reassemble, to_dtensor
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

X = np.arange(32, dtype=np.float32).reshape(8, 4) / 8.0


@pytest.mark.parametrize("spec", ["[x,*]", "[*,*]", "[*,x]"])
def test_a_captured_plain_variable_is_read_beside_a_dtensor(spec):
    x = to_dtensor(X, layout_of(spec, MESH_8))
    v = tf.Variable(np.full([4], 3.0, np.float32))
    got = tf.function(lambda x: x * v + 1.0)(x)
    # The result stays on the mesh (it ran on the DTensor device, not on v's CPU).
    assert dtensor.fetch_layout(got) == layout_of(spec, MESH_8)
    assert_values_equal(X * 3.0 + 1.0, reassemble(got))


def test_a_plain_variable_assigned_in_a_function_changes_once():
    x = to_dtensor(X, layout_of("[x,*]", MESH_8))
    counter = tf.Variable(0, dtype=tf.int64)
    total = tf.Variable(0.0)

    @tf.function
    def step(x):
        counter.assign_add(1)
        total.assign_add(tf.reduce_sum(x))  # a sharded sum, whole before it is added
        return x * 2.0

    for _ in range(3):
        got = step(x)
    assert counter.numpy() == 3
    np.testing.assert_allclose(total.numpy(), 3 * X.sum(), rtol=1e-6)
    assert_values_equal(X * 2.0, reassemble(got))
    assert not dtensor.is_dtensor(counter.handle)


@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]"])
def test_a_plain_variable_read_and_assigned_in_a_tf_range_loop_matches_one_device(spec):
    # A tf.range loop passes the variable's handle through as a loop variable; the rounds
    # that read the body's layouts copied that host handle to the mesh, and failed naming an
    # internal placeholder ("TensorFlow infers no shape for it").
    def program(scale, matrix, total):
        def step(x):
            for _ in tf.range(3):
                scale.assign_add(0.5)
                x = x * scale + matrix
                total.assign_add(tf.reduce_sum(x))
            return x
        return tf.function(step)

    variables = lambda: (tf.Variable(1.5), tf.Variable(X / 4.0), tf.Variable(0.0))
    ref = variables()
    want = program(*ref)(tf.constant(X)).numpy()
    got_vars = variables()
    got = program(*got_vars)(to_dtensor(X, layout_of(spec, MESH_8)))
    assert dtensor.fetch_layout(got) == layout_of(spec, MESH_8)
    assert_values_equal(want, reassemble(got))
    for mine, theirs in zip(got_vars, ref):
        assert not dtensor.is_dtensor(mine.handle)
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5)


def test_a_keras_optimizer_built_inside_a_tf_range_loop_matches_one_device():
    keras = pytest.importorskip("keras")
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

    def train(w, x):
        optimizer = keras.optimizers.Adam(0.05)  # its step count is a plain variable

        @tf.function
        def steps(x):
            for _ in tf.range(3):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.square(tf.matmul(x, w)))
                optimizer.apply_gradients([(tape.gradient(loss, w), w)])
            return loss
        return steps(x)

    ref = tf.Variable(w0)
    want = train(ref, tf.constant(X)).numpy()
    w = dtensor.DVariable(to_dtensor(w0, layout_of("[*,x]", MESH_8)))
    got = train(w, to_dtensor(X, layout_of("[x,*]", MESH_8)))
    np.testing.assert_allclose(reassemble(got), want, rtol=1e-5)
    np.testing.assert_allclose(reassemble(w.read_value()), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_a_seed_read_from_a_plain_variable_gives_one_devices_numbers():
    x = to_dtensor(X, layout_of("[x,*]", MESH_8))
    seed = tf.Variable([1, 2], dtype=tf.int64)
    fn = tf.function(lambda x: tf.random.stateless_uniform([8, 4], seed=seed) + x)
    want = tf.random.stateless_uniform([8, 4], seed=[1, 2]).numpy() + X
    assert_values_equal(want, reassemble(fn(x)))


def test_training_a_plain_variable_beside_a_dvariable_matches_one_device():
    mesh = MESH_8
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    b0 = np.array([0.5, -0.5, 0.25], np.float32)
    y = np.tanh(X @ w0)

    def train(w, b, x, steps=3):
        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.tanh(tf.matmul(x, w) + b) - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.5 * gw)
            b.assign_sub(0.5 * gb)  # a gradient summed over sharded rows, into a plain b
            return loss
        return [float(step(x)) for _ in range(steps)]

    want = train(tf.Variable(w0 * 0.5), tf.Variable(b0), tf.constant(X))
    w = dtensor.DVariable(to_dtensor(w0 * 0.5, layout_of("[*,x]", mesh)))
    b = tf.Variable(b0)
    got = train(w, b, to_dtensor(X, layout_of("[x,*]", mesh)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    ref_w, ref_b = tf.Variable(w0 * 0.5), tf.Variable(b0)
    train(ref_w, ref_b, tf.constant(X))
    np.testing.assert_allclose(b.numpy(), ref_b.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reassemble(w.read_value()), ref_w.numpy(), rtol=1e-5, atol=1e-6)


def test_keras_dropout_made_without_a_distribution_runs_on_sharded_inputs():
    keras = pytest.importorskip("keras")
    x = to_dtensor(np.ones([8, 4], np.float32), layout_of("[x,*]", MESH_8))
    drop = keras.layers.Dropout(0.5, seed=3)  # its seed generator holds a plain variable
    got = tf.function(lambda x: drop(x, training=True))(x)
    assert dtensor.fetch_layout(got) == layout_of("[x,*]", MESH_8)
    values = reassemble(got)
    # Kept values are scaled by 1/(1-rate); some are dropped, some kept.
    assert set(np.unique(values)) <= {0.0, 2.0} and 0 < (values == 0).sum() < values.size


def test_an_explicit_placement_without_a_resource_is_still_kept():
    # TensorFlow's rule for ops placed explicitly on a physical device stands: a replicated
    # DTensor is copied there and the result is a plain tensor.
    x = to_dtensor(X, layout_of("[*,*]", MESH_8))
    with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        got = tf.identity(x)
    assert not dtensor.is_dtensor(got)
    np.testing.assert_array_equal(got.numpy(), X)


def test_a_side_effect_without_a_rule_runs_once_with_its_value_whole(tmp_path):
    x = to_dtensor(X, layout_of("[x,*]", MESH_8))
    prefix = str(tmp_path / "raw")

    @tf.function
    def save(x):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["t"], shape_and_slices=[""],
                          tensors=[x * 2.0])
        return x

    save(x)
    np.testing.assert_array_equal(tf.train.load_checkpoint(prefix).get_tensor("t"), X * 2.0)


MESH_4X2 = dtensor.create_mesh([("batch", 4), ("model", 2)],
                               devices=[f"CPU:{i}" for i in range(8)])


def test_an_eager_tape_gives_each_dvariable_its_own_layout():
    rng = np.random.RandomState(0)
    a, b, xv = (rng.randn(4, 6).astype(np.float32), rng.randn(6, 2).astype(np.float32),
                rng.randn(8, 4).astype(np.float32))
    w1 = dtensor.DVariable(to_dtensor(a, layout_of("[*,model]", MESH_4X2)))
    w2 = dtensor.DVariable(to_dtensor(b, layout_of("[*,*]", MESH_4X2)))
    x = to_dtensor(xv, layout_of("[batch,*]", MESH_4X2))
    with tf.GradientTape() as tape:
        y = tf.matmul(tf.matmul(x, w1), w2)
        loss = tf.reduce_sum(y * y)
    g1, g2 = tape.gradient(loss, [w1, w2])
    # The backward pass leaves w2's gradient [model,*]; the tape gives it w2's layout.
    assert dtensor.fetch_layout(g1) == w1.layout and dtensor.fetch_layout(g2) == w2.layout
    ref1, ref2 = tf.Variable(a), tf.Variable(b)
    with tf.GradientTape() as tape:
        y = tf.matmul(tf.matmul(tf.constant(xv), ref1), ref2)
        loss = tf.reduce_sum(y * y)
    want1, want2 = tape.gradient(loss, [ref1, ref2])
    np.testing.assert_allclose(reassemble(g1), want1.numpy(), rtol=1e-4)
    np.testing.assert_allclose(reassemble(g2), want2.numpy(), rtol=1e-4)
    w2.assign_sub(0.1 * g2)  # refused before: [model,*] into a [*,*] DVariable
    np.testing.assert_allclose(reassemble(w2.read_value()), b - 0.1 * want2.numpy(), rtol=1e-4)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_a_keras_model_parallel_custom_loop_matches_one_device(traced):
    keras = pytest.importorskip("keras")
    from keras_testing import custom_step, model_parallel
    xv = np.random.RandomState(1).randn(8, 4).astype(np.float32)
    yv = np.zeros([8, 2], np.float32)

    def train(distribution):
        scope = distribution.scope() if distribution else __import__("contextlib").nullcontext()
        with scope:
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, name="d1"),
                                      keras.layers.Dense(2, name="d2")])
            opt = keras.optimizers.Adam(0.1)
            x, y = tf.constant(xv), tf.constant(yv)
            if distribution:
                x = keras.distribution.distribute_tensor(x, distribution.get_data_layout(x.shape))
                y = keras.distribution.distribute_tensor(y, distribution.get_data_layout(y.shape))

            step = custom_step(model, opt)
            step = tf.function(step) if traced else step
            losses = [float(reassemble(step(x, y)) if distribution else step(x, y))
                      for _ in range(3)]
            return losses, [reassemble(w.value.read_value()) if distribution else w.numpy()
                            for w in model.weights]

    # Column-parallel d1; d2 stays replicated.
    got = train(model_parallel({".*d1/kernel": (None, "model")}, shape=(4, 2)))
    want = train(None)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_an_eager_step_of_a_plain_layer_beside_a_sharded_one_matches_one_device():
    keras = pytest.importorskip("keras")
    from tf_dtensor.keras import layers as tl
    xv = np.random.RandomState(2).randn(8, 4).astype(np.float32)

    def train(sharded):
        keras.utils.set_random_seed(0)
        first = (tl.Dense(6, name="d1", kernel_layout=Layout([dtensor.UNSHARDED, "model"],
                                                              MESH_4X2))
                 if sharded else keras.layers.Dense(6, name="d1"))
        model = keras.Sequential([keras.Input((4,)), first, keras.layers.Dense(2, name="d2")])
        opt = keras.optimizers.SGD(0.1)
        x = to_dtensor(xv, layout_of("[batch,*]", MESH_4X2)) if sharded else tf.constant(xv)

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x)))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = [float(reassemble(step(x)) if sharded else step(x)) for _ in range(2)]
        losses.append(float(reassemble(tf.function(step)(x)) if sharded else tf.function(step)(x)))
        return losses

    np.testing.assert_allclose(train(True), train(False), rtol=1e-5)


def test_an_update_without_a_rule_of_a_replicated_dvariable_keeps_its_fallback():
    # A stateful op without outputs and without a rule runs once on the host, unless it
    # updates a DVariable: its state lives on the mesh (the replicated fallback runs it).
    v = dtensor.DVariable(to_dtensor(np.ones([4], np.float32), layout_of("[*]", MESH_8)))
    g = to_dtensor(np.full([4], 2.0, np.float32), layout_of("[*]", MESH_8))

    @tf.function
    def step(g):
        tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=0.5, delta=g)

    step(g)
    np.testing.assert_array_equal(reassemble(v.read_value()), np.zeros([4], np.float32))
