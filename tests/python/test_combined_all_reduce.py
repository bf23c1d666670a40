"""What the SPMD graph of a tf.function holds where devices share no buffers (GPUs; here
the "ops" and "copies" lowerings on CPUs): independent all-reduces combined into one,
dependent ones kept apart, and constants made on the device that reads them.

Each check reads the expanded function TensorFlow was given (its FunctionDef) and compares
the values with one plain device.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from dtensor_testing import MESH_2X2, MESH_8, collective_lowering
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout


def _spmd_function_def(fn):
    """The FunctionDef of the SPMD expansion of `fn` (a tf.function just called once)."""
    names = [n for n in context.context().list_function_names()
             if "tfd_spmd" in n and fn.__name__ in n]
    assert names, "no SPMD function found"
    return context.context().get_function_def(max(names, key=lambda n: int(n.rsplit("_", 1)[1])))


def _count(fdef, op):
    return sum(1 for n in fdef.node_def if n.op == op)


def _cross_device_control_edges(fdef):
    device = {n.name: n.device for n in fdef.node_def}
    return sum(1 for n in fdef.node_def for inp in n.input
               if inp.startswith("^") and device.get(inp[1:], n.device) != n.device)


def _sharded(mesh, value):
    return dtensor.pack(np.split(value, mesh.size), Layout([mesh.dim_names[0]] + ["unsharded"] *
                                                           (value.ndim - 1), mesh))


@pytest.fixture
def combine_limit():
    """Sets TF_DTENSOR_COMBINE_ALL_REDUCE_MIB for one test (read at each expansion)."""
    before = os.environ.get("TF_DTENSOR_COMBINE_ALL_REDUCE_MIB")

    def set_limit(mib):
        os.environ["TF_DTENSOR_COMBINE_ALL_REDUCE_MIB"] = str(mib)
    yield set_limit
    if before is None:
        os.environ.pop("TF_DTENSOR_COMBINE_ALL_REDUCE_MIB", None)
    else:
        os.environ["TF_DTENSOR_COMBINE_ALL_REDUCE_MIB"] = before


def _three_sums():
    def three_sums(a, b, c):
        return tf.reduce_sum(a, axis=0), tf.reduce_sum(b, axis=0), tf.reduce_sum(c, axis=0)
    three_sums.__name__ = f"three_sums_{np.random.randint(1 << 30)}"
    return tf.function(three_sums)


def test_independent_all_reduces_run_as_one(combine_limit):
    rng = np.random.RandomState(0)
    values = [rng.rand(8, 3).astype(np.float32), rng.rand(8, 2, 2).astype(np.float32),
              rng.rand(8, 5).astype(np.float32)]
    inputs = [_sharded(MESH_8, v) for v in values]
    with collective_lowering("ops"):
        fn = _three_sums()
        results = fn(*inputs)
        fdef = _spmd_function_def(fn)
        # One CollectiveReduceV2 per device for all three sums.
        assert _count(fdef, "CollectiveReduceV2") == 8
        for got, value in zip(results, values):
            for component in dtensor.unpack(got):
                np.testing.assert_allclose(component.numpy(), value.sum(axis=0), rtol=1e-6)
        combine_limit(0)  # off: one all-reduce each
        fn = _three_sums()
        fn(*inputs)
        assert _count(_spmd_function_def(fn), "CollectiveReduceV2") == 24


def test_an_all_reduce_that_reads_another_is_not_combined_with_it():
    rng = np.random.RandomState(1)
    value = rng.rand(8, 4).astype(np.float32)
    x = _sharded(MESH_8, value)

    @tf.function
    def chained(x):
        total = tf.reduce_sum(x, axis=0)          # all-reduce 1
        return tf.reduce_sum(x * total, axis=0)   # all-reduce 2 reads its result

    with collective_lowering("ops"):
        got = chained(x)
        assert _count(_spmd_function_def(chained), "CollectiveReduceV2") == 16
    np.testing.assert_allclose(dtensor.unpack(got)[0].numpy(),
                               (value * value.sum(axis=0)).sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("lowering", ["ops", "copies"])
def test_training_step_gradients_combined_and_right(lowering):
    """A data-parallel step's gradient all-reduces become one per dependency level, and
    the weights after two steps equal one device's."""
    rng = np.random.RandomState(2)
    x_value = rng.rand(16, 6).astype(np.float32)
    inits = [rng.rand(6, 4).astype(np.float32), np.zeros([4], np.float32),
             rng.rand(4, 3).astype(np.float32)]
    mesh = MESH_2X2
    with collective_lowering(lowering):
        variables = [dtensor.DVariable(dtensor.copy_to_mesh(
            tf.constant(v), Layout.replicated(mesh, v.ndim))) for v in inits]
        # [x,*] on x=2, y=2: devices (0, y) hold rows 0-7, devices (1, y) rows 8-15.
        x = dtensor.pack([x_value[:8], x_value[:8], x_value[8:], x_value[8:]],
                         Layout.batch_sharded(mesh, "x", 2))

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, variables[0]) + variables[1])
                loss = tf.reduce_sum(tf.matmul(h, variables[2]) ** 2)
            for v, g in zip(variables, tape.gradient(loss, variables)):
                v.assign_sub(0.01 * g)
            return loss

        step(x)
        step(x)
        fdef = _spmd_function_def(step)
        reducers = _count(fdef, "CollectiveReduceV2") if lowering == "ops" else _count(fdef, "AddN")
        # The three gradients: one combined all-reduce (one CollectiveReduceV2 per device
        # for the ops; for the copies, which take the direct form over two partials, one
        # AddN per device of its own and its peer's). The returned loss is a second:
        # tf.function makes the return wait for the updates (control dependencies), which
        # read the gradients' all-reduce.
        assert reducers == 8, reducers
        # Each device orders its own reads and assigns: a control edge of the traced step
        # expands into one edge per device, not one from every device to every other
        # (each of those is a _Send/_Recv pair per call), and the NoOp that makes the
        # return wait for the updates runs on every device (on the host it waited for
        # every device's assigns, and every device's return for it). No control edge
        # crosses devices, where every edge of the traced step used to cross 12 times.
        assert _cross_device_control_edges(fdef) == 0
    plain = [tf.Variable(v) for v in inits]
    for _ in range(2):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x_value, plain[0]) + plain[1])
            loss = tf.reduce_sum(tf.matmul(h, plain[2]) ** 2)
        for v, g in zip(plain, tape.gradient(loss, plain)):
            v.assign_sub(0.01 * g)
    for v, p in zip(variables, plain):
        for component in dtensor.unpack(v.read_value()):
            np.testing.assert_allclose(component.numpy(), p.numpy(), rtol=1e-5, atol=1e-6)


def test_constants_are_made_on_the_device_that_reads_them():
    """No edge from a host constant to another device's op, but for int64 arguments TF
    reads from host memory (those stay on the host)."""
    value = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = _sharded(MESH_8, value)

    @tf.function
    def scaled(x):
        return tf.reshape(x * 2.0 + 1.0, [-1, 2])

    with collective_lowering("ops"):
        got = scaled(x)
        fdef = _spmd_function_def(scaled)
    nodes = {n.name: n for n in fdef.node_def}
    crossing = []
    for n in fdef.node_def:
        for inp in n.input:
            src = nodes.get(inp.lstrip("^").split(":")[0])
            if src is not None and src.op == "Const" and src.device != n.device:
                crossing.append((src.name, n.name))
    assert not crossing, crossing
    assert dtensor.fetch_layout(got).sharding_specs[0] == "x"
    np.testing.assert_array_equal(
        np.concatenate([c.numpy() for c in dtensor.unpack(got)]), (value * 2 + 1).reshape(-1, 2))
