"""Eager local ops run with TF's own cached kernels on CPU devices (cc/eager/kernel_cache.h).

The cache skips TF's per-call eager dispatch, never the kernel: on each device the kernel
TensorFlow would run for the op runs. So each test checks results against plain
TensorFlow on one device bit for bit where the op is elementwise (the same kernel on the
same elements), and that the path was taken (or, where it must not be, that it was not).
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from dtensor_testing import MESH_2X2, MESH_8, assert_dtensor_equal, layout_of, random_array, \
    reassemble, run_python, to_dtensor
from tf_dtensor import _device, dtensor
from tf_dtensor.dtensor import Layout


def plain(fn, *arrays):
    """`fn` on one plain device (CPU:0), as numpy."""
    with tf.device("CPU:0"):
        return fn(*[tf.constant(a) for a in arrays]).numpy()


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("spec", ["[*,*]", "[x,*]", "[x,y]", "[*,y]"])
@pytest.mark.parametrize("fn", [tf.add, tf.multiply, tf.math.divide_no_nan, tf.maximum],
                         ids=lambda f: f.__name__)
def test_elementwise_ops_run_with_cached_kernels_bit_for_bit(spec, fn):
    device = _device.get()
    layout = layout_of(spec, MESH_2X2)
    a, b = random_array((4, 6), seed=1), random_array((4, 6), seed=2)
    da, db = to_dtensor(a, layout), to_dtensor(b, layout)
    before = device.num_direct_kernel_runs
    got = fn(da, db)
    assert device.num_direct_kernel_runs > before
    expected = plain(fn, a, b)
    assert_dtensor_equal(expected, layout, got)
    assert bits(dtensor.unpack(got)[0].numpy()) == bits(
        expected[tuple(slice(0, n) for n in dtensor.unpack(got)[0].shape)])


@pytest.mark.parametrize("spec,mesh", [("[x,*]", MESH_8), ("[x,y]", MESH_2X2), ("[*,*]", MESH_8)])
def test_inputs_are_never_overwritten(spec, mesh):
    # TF kernels may write their output into an input buffer that nothing else holds
    # (forwarding). Fresh results, held once, go into ops that could do that; each must
    # keep its value.
    layout = layout_of(spec, mesh)
    a = random_array((8, 4), seed=8)
    x = to_dtensor(a, layout)
    y = x * 2.0
    results = [tf.nn.relu(y), tf.negative(y), tf.exp(y), y + 1.0, tf.square(y)]
    assert_dtensor_equal(a * 2.0, layout, y)
    for got, expected in zip(results, [np.maximum(a * 2, 0), -a * 2, np.exp(a * 2), a * 2 + 1,
                                       (a * 2) ** 2]):
        assert_dtensor_equal(expected.astype(np.float32), layout, got)


def test_each_distinct_shard_runs_one_kernel():
    # [x,*] on 8 devices: 8 distinct shards, 8 kernel runs per op (a replicated op runs once,
    # its result shared).
    device = _device.get()
    a = random_array((16, 4), seed=3)
    sharded = to_dtensor(a, layout_of("[x,*]", MESH_8))
    replicated = to_dtensor(a, Layout.replicated(MESH_8, 2))
    tf.nn.relu(sharded)
    tf.nn.relu(replicated)
    before = device.num_direct_kernel_runs
    assert_dtensor_equal(np.maximum(a, 0), layout_of("[x,*]", MESH_8), tf.nn.relu(sharded))
    assert device.num_direct_kernel_runs == before + 8
    assert_dtensor_equal(np.maximum(a, 0), Layout.replicated(MESH_8, 2), tf.nn.relu(replicated))
    assert device.num_direct_kernel_runs == before + 9


def test_kernels_are_keyed_by_attributes_and_types():
    # One op name, several attribute values and input types: each gets its own kernel.
    value = np.array([[4.5, -6.0], [8.25, 9.0]], np.float32)
    dx = to_dtensor(value, layout_of("[x,*]", MESH_2X2))
    for dtype in (tf.int32, tf.float64, tf.int32, tf.bool, tf.float16):
        got = tf.cast(dx, dtype)
        assert got.dtype == dtype
        assert_dtensor_equal(plain(lambda t: tf.cast(t, dtype), value),
                             layout_of("[x,*]", MESH_2X2), got)
    ints = to_dtensor(np.arange(8, dtype=np.int64).reshape(4, 2), layout_of("[x,*]", MESH_2X2))
    assert_dtensor_equal(np.arange(8).reshape(4, 2) * 2, layout_of("[x,*]", MESH_2X2),
                         ints + ints)


def test_several_outputs_and_host_arguments():
    device = _device.get()
    a = random_array((4, 6), seed=4)
    rows = to_dtensor(a, layout_of("[x,*]", MESH_2X2))
    before = device.num_direct_kernel_runs
    columns = tf.unstack(rows, axis=1)  # Unpack: six outputs per kernel run
    assert device.num_direct_kernel_runs == before + 2
    for i, column in enumerate(columns):
        assert_dtensor_equal(a[:, i], layout_of("[x]", MESH_2X2), column)
    assert_dtensor_equal(a.sum(axis=1), layout_of("[x]", MESH_2X2), tf.reduce_sum(rows, axis=1))
    assert_dtensor_equal(a.T, layout_of("[*,x]", MESH_2X2), tf.transpose(rows, [1, 0]))


def test_kernel_errors_are_tfs_with_the_op_and_device():
    # The kernel's own error (code and message), as TFE_Execute gives it, with our context.
    x = to_dtensor(np.array([[4, 6], [8, 9]], np.int32), layout_of("[x,*]", MESH_2X2))
    zero = to_dtensor(np.array([[1, 0], [1, 1]], np.int32), layout_of("[x,*]", MESH_2X2))
    with tf.device("CPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError) as plain_error:
            tf.math.floordiv(tf.constant([[4, 6]]), tf.constant([[1, 0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="FloorDiv") as ours:
        tf.math.floordiv(x, zero)
    assert "Integer division by zero" in str(plain_error.value)
    assert "Integer division by zero" in str(ours.value)
    # The device is usable afterwards, and the same op with valid inputs runs.
    assert_dtensor_equal(np.array([[4, 6], [8, 9]], np.int32), layout_of("[x,*]", MESH_2X2),
                         tf.math.floordiv(x, x * 0 + 1))


def test_asynchronous_execution_runs_through_tensorflow():
    # In an asynchronous scope TF queues ops; their inputs may not exist yet, so local ops
    # go through TFE_Execute there, and results are the same.
    device = _device.get()
    a = random_array((4, 6), seed=5)
    da = to_dtensor(a, layout_of("[x,y]", MESH_2X2))
    with context.execution_mode(context.ASYNC):
        assert context.context().is_async()
        before = device.num_direct_kernel_runs
        got = da * da + da
        for _ in range(5):
            got = got * 1.0
        assert device.num_direct_kernel_runs == before
    assert_dtensor_equal(a * a + a, layout_of("[x,y]", MESH_2X2), got)


PLACEMENT_LOG_PROGRAM = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.debugging.set_log_device_placement(True)  # TF reads it when its context starts
from tf_dtensor import _device, dtensor
mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
x = dtensor.pack([tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])],
                 dtensor.Layout(["x"], mesh))
y = x + x
y = y + x
print("direct", _device.get().num_direct_kernel_runs)
print("values", [t.numpy().tolist() for t in dtensor.unpack(y)])
"""


def test_placement_logging_runs_through_tensorflow():
    # TF's dispatch logs where each op runs; while it does, local ops go through it, so
    # each shard's op is in the log.
    result = run_python(PLACEMENT_LOG_PROGRAM, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "direct 0" in result.stdout
    assert "values [[3.0, 6.0], [9.0, 12.0]]" in result.stdout
    assert re.search(r"Executing op AddV2 in device \S*CPU:1", result.stderr), result.stderr[-2000:]


def test_stateful_ops_run_through_tensorflow():
    # A variable's update is stateful and takes a resource: never a cached kernel.
    device = _device.get()
    layout = layout_of("[x,*]", MESH_2X2)
    v = dtensor.DVariable(to_dtensor(np.zeros((4, 2), np.float32), layout))
    ones = to_dtensor(np.ones((4, 2), np.float32), layout)
    v.assign_add(ones)
    before = device.num_direct_kernel_runs
    v.assign_add(ones)
    assert device.num_direct_kernel_runs == before
    assert_dtensor_equal(np.full((4, 2), 2.0, np.float32), layout, v.read_value())


def run_in_threads(*work):
    """Runs each function on its own thread; fails with what any of them raised."""
    failures = []

    def guarded(fn):
        try:
            fn()
        except Exception as error:  # noqa: BLE001 -- reported below
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_threads_share_the_cache():
    a = random_array((8, 4), seed=6)
    layout = layout_of("[x,y]", MESH_2X2)
    da = to_dtensor(a, layout)

    def work(k):
        y = da
        for _ in range(50):
            y = y * 1.0 + float(k)
        np.testing.assert_allclose(reassemble(y), a + 50.0 * k, rtol=1e-5)

    run_in_threads(*[lambda k=k: work(k) for k in range(4)])


def test_threads_keep_their_kernels_while_the_cache_is_cleared():
    # LeakyRelu's alpha is an attribute: each value is a new kernel per device, so two
    # threads fill the cache (4,096 kernels) and clear it several times while a third
    # runs one op over and over. A kernel in use stays alive until its run ends.
    a = random_array((16, 4), seed=9)
    layout = layout_of("[x,*]", MESH_8)
    da = to_dtensor(a, layout)

    def fill(first):
        for k in range(first, first + 700):
            alpha = k / 1000.0
            got = tf.nn.leaky_relu(da, alpha=alpha)
            if k % 97 == 0:
                assert_dtensor_equal(np.where(a > 0, a, a * np.float32(alpha)), layout, got)

    def repeat():
        for _ in range(1500):
            got = tf.nn.relu(da)
        assert_dtensor_equal(np.maximum(a, 0), layout, got)

    run_in_threads(lambda: fill(1), lambda: fill(701), repeat)


def onednn_enabled() -> bool:
    from tensorflow.python.util import _pywrap_util_port
    return _pywrap_util_port.IsMklEnabled()


@pytest.mark.parametrize("fn", [tf.nn.softmax, lambda x: tf.transpose(x, [1, 0]),
                                lambda x: tf.concat([x, x], axis=1)],
                         ids=["softmax", "transpose", "concat"])
def test_ops_onednn_rewrites_keep_tensorflows_dispatch(fn):
    # TFE_Execute runs an eager op as a one-node function, whose graph goes through
    # oneDNN's rewrite pass: Softmax, Transpose, ConcatV2 (among others) then run oneDNN's
    # kernels, and softmax's results differ from Eigen's in the last bits. Those ops keep
    # TF's dispatch while oneDNN is on, so each shard matches plain TF's bit for bit.
    device = _device.get()
    a = random_array((32, 64), seed=10)
    layout = layout_of("[x,*]", MESH_8)
    da = to_dtensor(a, layout)
    fn(da)
    before = device.num_direct_kernel_runs
    got = fn(da)
    if onednn_enabled():
        assert device.num_direct_kernel_runs == before
    blocks = np.split(a, 8)
    expected = [plain(fn, block) for block in blocks]
    for component, want in zip(dtensor.unpack(got), expected):
        assert bits(component.numpy()) == bits(want)
