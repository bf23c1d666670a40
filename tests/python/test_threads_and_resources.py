"""Threads and resources, found by trying tf_dtensor as users would: a scope opened in one
thread leaves other threads' ops alone, and repeated calls release what they hold (the
expansion cache's dropped functions, fetch_layout's text)."""

from __future__ import annotations

import gc
import json
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from dtensor_testing import MESH_8, cpus, layout_of, reassemble
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

MESH_4 = dtensor.create_mesh([("b", 4)], devices=cpus(4))


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_layout_scope_in_one_thread_leaves_another_threads_ops_alone():
    # Thread B ran call_with_layout (a layout scope) in a loop; thread A's copy_to_mesh,
    # relayout and arithmetic came back on B's mesh and sharding, silently.
    source = tf.range(8.0)
    target = Layout(["b"], MESH_4)
    stop = threading.Event()
    errors = []

    def scopes():
        try:
            while not stop.is_set():
                dtensor.call_with_layout(tf.ones, Layout(["x"], MESH_8), shape=[8])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    other = threading.Thread(target=scopes)
    other.start()
    wrong = []
    try:
        for _ in range(150):
            replicated = dtensor.copy_to_mesh(source, Layout.replicated(MESH_4, 1))
            for got, want in ((replicated, Layout.replicated(MESH_4, 1)),
                              (dtensor.relayout(replicated, target), target),
                              (replicated * 2.0, Layout.replicated(MESH_4, 1))):
                if dtensor.fetch_layout(got) != want:
                    wrong.append(dtensor.fetch_layout(got).to_string())
    finally:
        stop.set()
        other.join()
    assert not errors and not wrong, (errors, wrong[:3])
    np.testing.assert_array_equal(reassemble(dtensor.relayout(replicated, target)), np.arange(8.0))


def test_a_default_mesh_in_one_thread_is_not_another_threads():
    seen = {}
    ready, done = threading.Event(), threading.Event()

    def inside():
        with dtensor.run_on(MESH_4):
            ready.set()
            done.wait(30)

    other = threading.Thread(target=inside)
    other.start()
    try:
        assert ready.wait(30)
        ones = dtensor.call_with_layout(tf.ones, Layout(["x"], MESH_8), shape=[8])
        seen["mesh"] = dtensor.fetch_layout(ones).mesh
    finally:
        done.set()
        other.join()
    assert seen["mesh"] == MESH_8


def test_fetch_layout_does_not_keep_its_text():
    # Every call leaked the layout's text (~450 bytes for 8 devices).
    t = dtensor.call_with_layout(tf.ones, Layout(["x"], MESH_8), shape=[8])
    for _ in range(2000):
        dtensor.fetch_layout(t)
    gc.collect()
    before = _rss_kib()
    for _ in range(20000):
        dtensor.fetch_layout(t)
    gc.collect()
    assert _rss_kib() - before < 4 * 1024  # the leak was ~9 MiB


def test_expansions_dropped_from_the_full_cache_leave_the_context():
    # Called with more input shapes than the cache holds (256), every expansion stayed
    # registered in the context: memory grew by ~800 KiB a call, without bound.
    @tf.function(reduce_retracing=False)
    def double(x):
        return x * 2.0

    layout = Layout(["x", dtensor.UNSHARDED], MESH_8)
    for n in range(1, 301):
        out = double(dtensor.call_with_layout(tf.ones, layout, shape=[8, n]))
    np.testing.assert_array_equal(reassemble(out), np.full([8, 300], 2.0, np.float32))
    # Its own expansions only: those of earlier tests' functions leave when their cache
    # entries are dropped, which this test's 300 calls need not all reach.
    spmd = [name for name in context.context().list_function_names()
            if "_tfd_spmd_" in name and name.startswith("__inference_double_")]
    assert len(spmd) <= 260, len(spmd)


def test_two_threads_calling_one_function_with_tf_collective_ops():
    # Under the `ops` lowering (meshes across processes, NCCL) a function's collectives
    # have fixed instance keys: two calls at once met at the same keys ("Second consumer
    # arrived") and every later collective of the process failed.
    from dtensor_testing import collective_lowering
    with collective_lowering("ops"):
        x = dtensor.call_with_layout(tf.ones, Layout(["x"], MESH_8), shape=[8])
        total = tf.function(tf.reduce_sum)
        assert reassemble(total(x)) == 8.0
        errors, results = [], []

        def calls():
            try:
                for _ in range(30):
                    results.append(float(reassemble(total(x))))
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=calls) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert results == [8.0] * 60
        assert reassemble(total(x)) == 8.0


def test_eager_collectives_reuse_their_instance_keys():
    # Under the `ops` lowering (GPUs, NCCL) every eager collective took a fresh instance
    # key, and TensorFlow's collective runtime keeps a record of each key for the life of
    # the context: a long eager loop grew by ~1.6 KB an all-reduce and ~5 KB a relayout,
    # without bound (8 MB over 2,500 sharded matmuls).
    from tf_dtensor import _core
    from dtensor_testing import collective_lowering
    mesh = dtensor.create_mesh([("x", 4), ("y", 2)], devices=cpus(8))
    values = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    with collective_lowering("ops"):
        a = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(values), Layout.replicated(mesh, 2)),
                             Layout(["x", "y"], mesh))
        b = dtensor.relayout(a, Layout(["y", dtensor.UNSHARDED], mesh))
        target = Layout([dtensor.UNSHARDED, "x"], mesh)

        def step():
            return tf.matmul(a, b), tf.reduce_sum(a, axis=0), dtensor.relayout(a, target)

        step()
        gc.collect()
        keys, rss = _core.instance_keys_issued(), _rss_kib()
        for _ in range(300):
            product, total, moved = step()
        keys_used, grown = _core.instance_keys_issued() - keys, _rss_kib() - rss
        np.testing.assert_allclose(reassemble(product), values @ values, rtol=1e-6)
        np.testing.assert_array_equal(reassemble(total), values.sum(axis=0))
        np.testing.assert_array_equal(reassemble(moved), values)
        assert dtensor.fetch_layout(moved) == target
    assert keys_used == 0, f"{keys_used} new instance keys in 300 steps"
    assert grown < 4 * 1024, f"grew by {grown} KiB"  # ~3.5 MiB before


def test_eager_collectives_in_threads_at_once_keep_their_keys_apart():
    # Threads running the same eager collectives at once take different keys from the
    # pool: each result is right, nothing hangs, and the pool stays as small as the
    # number of steps that ran at once.
    from tf_dtensor import _core
    from dtensor_testing import collective_lowering
    values = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    with collective_lowering("ops"):
        x = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(values), Layout.replicated(MESH_8, 2)),
                             Layout(["x", dtensor.UNSHARDED], MESH_8))
        keys = _core.instance_keys_issued()
        errors, results = [], []

        def steps():
            try:
                for _ in range(40):
                    results.append(reassemble(tf.reduce_sum(x, axis=0)).tolist())
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=steps) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not errors, errors[0]
        assert results == [values.sum(axis=0).tolist()] * 160
        assert _core.instance_keys_issued() - keys <= 4


def test_eager_collective_ops_in_an_asynchronous_context():
    # With `tf.config.experimental.set_synchronous_execution(False)`, every thread's ops
    # went to the context's one asynchronous executor, which runs its queue in order: the
    # first device's collective op waited there for its peers, queued behind it, and the
    # first eager all-gather or all-reduce under the `ops` lowering hung the process.
    from dtensor_testing import run_python
    result = run_python(textwrap.dedent("""
        import json, threading
        import numpy as np, tensorflow as tf
        from tf_dtensor import dtensor
        from tf_dtensor.dtensor import Layout
        tf.config.experimental.set_synchronous_execution(False)
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
        mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{d}" for d in range(4)])
        values = np.arange(64.0, dtype=np.float32).reshape(8, 8)
        a = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(values), Layout.replicated(mesh, 2)),
                             Layout(["x", "y"], mesh))
        def unpacked(t):
            return dtensor.unpack(dtensor.relayout(t, Layout.replicated(mesh, t.shape.rank)))[0]
        def step():
            b = dtensor.relayout(a, Layout(["y", "*"], mesh))
            return (unpacked(tf.matmul(a, b)).numpy().tolist(),
                    unpacked(tf.reduce_sum(a, axis=0)).numpy().tolist())
        out = {"alone": [step() for _ in range(3)], "threads": []}
        def steps():
            for _ in range(5):
                out["threads"].append(step())
        threads = [threading.Thread(target=steps) for _ in range(3)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps(out))
    """), env={"TF_DTENSOR_COLLECTIVES": "ops", "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    values = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    want = [(values @ values).tolist(), values.sum(axis=0).tolist()]
    assert len(out["alone"]) == 3 and len(out["threads"]) == 15
    for product, total in out["alone"] + out["threads"]:
        np.testing.assert_allclose(product, want[0], rtol=1e-6)
        np.testing.assert_array_equal(total, want[1])


def test_meshes_used_once_are_not_kept():
    # The check that a mesh's devices exist remembered every mesh it had passed: a program
    # that made a new mesh per step (new dimension names) kept each one, about 3 KB.
    from tf_dtensor.mesh import Mesh
    for i in range(600):
        mesh = dtensor.create_mesh([(f"once{i}", 2), ("b", 4)], devices=cpus(8))
        packed = dtensor.pack([tf.fill([1, 2], float(i))] * 8, Layout([f"once{i}", "b"], mesh))
    np.testing.assert_array_equal(reassemble(packed), np.full([2, 8], 599.0, np.float32))
    del mesh, packed
    gc.collect()
    alive = sum(1 for o in gc.get_objects()  # (other tests' meshes may have no dimension)
                if isinstance(o, Mesh) and o.dim_names and o.dim_names[0].startswith("once"))
    assert alive <= 300, f"{alive} of 600 meshes still alive"
    # A mesh over a device this host lacks is still refused after the first ones passed.
    missing = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:99"])
    with pytest.raises(ValueError, match="CPU:99"):
        dtensor.pack([tf.ones([1])] * 2, Layout(["x"], missing))


@pytest.mark.parametrize("lowering", ["auto", "ops"])
def test_eager_ops_on_the_same_devices_from_several_threads(lowering):
    # 8 threads relaying out and slicing DTensors on a mesh of CPU:4-7. TF runs an op it
    # does not run directly as a one-op function, and on a CPU device other than the host
    # the inputs that live on the host (SplitV's sizes, ConcatV2's axis, Slice's begin and
    # size) reach two such runs at once by the same _Send/_Recv keys: inputs crossed
    # ("ConcatV2 ... [4,16] and [8,8]", about 9 errors in 2,400 relayouts, and wrong values
    # where the shapes agreed). Plain TensorFlow does the same; tf_dtensor's runs on one
    # device now go one at a time.
    from dtensor_testing import collective_lowering
    mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4, 8)])
    failures = []

    def work(t):
        rows = 2 * (1 + t % 4)
        for _ in range(120):
            try:
                a = dtensor.call_with_layout(tf.fill, Layout(["x", "y"], mesh), [rows, 16],
                                             float(t))
                moved = reassemble(dtensor.relayout(a, Layout(["unsharded", "x"], mesh)))
                cut = reassemble(tf.slice(dtensor.relayout(a, Layout.replicated(mesh, 2)),
                                          [1, 2], [rows - 1, 7]))
                if moved.shape != (rows, 16) or np.any(moved != t) or \
                        cut.shape != (rows - 1, 7) or np.any(cut != t):
                    failures.append((t, "wrong value"))
            except Exception as e:  # pylint: disable=broad-except
                failures.append((t, f"{type(e).__name__}: {str(e)[:200]}"))

    with collective_lowering(lowering):
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures[:3]
