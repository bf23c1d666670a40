"""TensorFlow context resets: the DTensor device belongs to its context.

Test suites (TensorFlow's DTensor test base among them), notebooks and
`initialize_accelerator_system(experimental_reset_context=True)` reset TensorFlow's eager
context and re-create logical devices. TensorFlow deletes the DTensor device with the old
context; tf_dtensor registers a new one on the next use and never touches the deleted one.
Each program runs in its own process: a reset would invalidate the tensors other tests in
this process hold.
"""

from __future__ import annotations

import json
import os
import textwrap

from dtensor_testing import run_python

_PRELUDE = """
import gc, json, resource, sys
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tf_dtensor import dtensor, _core, _device

def configure(n):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
"""


def _run(program: str, timeout: int = 300) -> dict:
    """Runs `program` in a fresh process and returns the JSON it printed last."""
    result = run_python(_PRELUDE + textwrap.dedent(program),
                        env={"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")},
                        timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_fifty_resets_run_eager_ops_functions_and_variables():
    """Every kind of reset, 50 times: eager ops, a tf.function with a DVariable, relayout,
    scopes that enclose a reset; no crash, no hang, no DTensor left behind."""
    out = _run("""
        def step(v, x):
            v.assign_add(tf.reduce_sum(x, axis=0))
            return tf.matmul(x, tf.transpose(x)), v.read_value()

        rss = []
        for i in range(50):
            how = i % 3
            if how == 0:
                context._reset_context(); configure(8)
            elif how == 1:
                context.context().ensure_uninitialized(); configure(4 if i % 2 else 8)
            else:
                context._reset_context()
                dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=8)
            n = len(tf.config.list_logical_devices("CPU"))
            mesh = dtensor.create_mesh([("x", n)], devices=[f"CPU:{d}" for d in range(n)])
            replicated = dtensor.Layout.replicated(mesh, 2)
            x = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x", dtensor.UNSHARDED], mesh),
                                         shape=(8, 3))
            assert float(tf.reduce_sum(x)) == 24.0
            with dtensor.run_on(mesh):
                v = dtensor.DVariable(dtensor.call_with_layout(
                    tf.zeros, dtensor.Layout([dtensor.UNSHARDED], mesh), shape=(3,)))
            # A tf.function traced in one context is not callable in the next (plain
            # TensorFlow's behaviour too), so each context traces its own.
            prod, value = tf.function(step)(v, x)
            assert dtensor.fetch_layout(prod).sharding_specs == ["x", dtensor.UNSHARDED]
            np.testing.assert_array_equal(dtensor.relayout(prod, replicated).numpy(),
                                          np.full((8, 8), 3.0))
            np.testing.assert_array_equal(value.numpy(), np.full((3,), 8.0))
            # A scope entered before a reset keeps its mesh and stays balanced after it
            # (TensorFlow's own device scope does not survive the reset).
            with dtensor.run_on(mesh):
                context._reset_context(); configure(n)
                assert dtensor.get_default_mesh() == mesh
                y = dtensor.call_with_layout(tf.ones, replicated, shape=(2, 2))
                assert dtensor.fetch_layout(y) == replicated
            assert dtensor.get_default_mesh() is None
            if how == 2:
                dtensor.shutdown_accelerator_system()
            del x, v, prod, value, y
            gc.collect()
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        print(json.dumps({"rss_kb": rss, "live_dtensors": _core.num_live_dtensors()}))
    """)
    # TensorFlow may keep the inputs of the last op it ran in a per-thread cache; one
    # record per reset (50 here) would mean ours leak.
    assert out["live_dtensors"] <= 2
    # TensorFlow keeps each replaced context alive when fast-path ops ran in it (its own
    # DTensor grows by ~4.6 MB per reset here, plain TensorFlow ~0.4 MB, tf_dtensor
    # ~1.3 MB); a leak of our own (every DTensor, every expanded function) grows faster.
    rss = out["rss_kb"]
    per_reset_kb = (rss[-1] - rss[10]) / (len(rss) - 11)
    assert per_reset_kb < 4096, f"memory grows by {per_reset_kb:.0f} KB per reset"


def test_test_base_that_resets_between_cases():
    """The pattern of TensorFlow's DTensor test base: reset and re-create devices in
    setUp, shut down and reset in tearDown, scopes in every case."""
    out = _run("""
        import unittest

        class Case(tf.test.TestCase):
            def setUp(self):
                super().setUp()
                context._reset_context()
                configure(4)
                dtensor.initialize_accelerator_system("CPU")
                self.mesh = dtensor.create_mesh([("x", 2), ("y", 2)],
                                                devices=[f"CPU:{d}" for d in range(4)])

            def tearDown(self):
                dtensor.shutdown_accelerator_system()
                context._reset_context()
                super().tearDown()

        for k in range(12):
            def case(self, k=k):
                layout = dtensor.Layout(["x", "y"], self.mesh)
                with dtensor.run_on(self.mesh):
                    a = dtensor.call_with_layout(tf.fill, layout, [4, 4], float(k))
                b = tf.function(lambda t: t * 2.0)(a)
                self.assertEqual(dtensor.fetch_layout(b), layout)
                self.assertAllEqual(
                    dtensor.relayout(b, dtensor.Layout.replicated(self.mesh, 2)).numpy(),
                    np.full((4, 4), 2.0 * k))
            setattr(Case, f"test_{k:02d}", case)

        suite = unittest.TestSuite(Case(f"test_{k:02d}") for k in range(12))
        result = unittest.TextTestRunner(stream=sys.stderr).run(suite)
        print(json.dumps({"run": result.testsRun, "failures": len(result.failures),
                          "errors": [str(e[1])[-500:] for e in result.errors]}))
    """)
    assert out == {"run": 12, "failures": 0, "errors": []}


def test_dtensor_from_before_a_reset_is_refused_clearly():
    out = _run("""
        configure(4)
        mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{d}" for d in range(4)])
        x = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=(8,))
        context._reset_context(); configure(4)
        try:
            tf.reduce_sum(x)
            print(json.dumps({"raised": None}))
        except tf.errors.InvalidArgumentError as e:
            print(json.dumps({"raised": str(e)}))
    """)
    assert "made before the reset" in out["raised"]
    assert "'Sum'" in out["raised"]


def test_a_dvariable_from_before_a_reset_says_it_did_not_survive_it():
    # Read first thing after a reset, before the new context has a DTensor device,
    # TensorFlow copies the handle off the mesh; the refusal told the user to do what
    # they had done ("Read it first (`v.read_value()`)") and never named the reset.
    out = _run("""
        configure(4)
        mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{d}" for d in range(4)])
        v = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, dtensor.Layout(["x"], mesh),
                                                       shape=(8,)))
        context._reset_context(); configure(4)
        raised = []
        for use in (v.read_value, lambda: v.assign_add(tf.ones((8,)))):
            try:
                use()
                raised.append(None)
            except tf.errors.OpError as e:
                raised.append(str(e))
        print(json.dumps({"raised": raised}))
    """)
    for message in out["raised"]:
        assert message is not None
        assert "context was reset" in message and "make it again" in message, message


def test_a_function_traced_before_a_reset_names_both_causes():
    # The old tf.function still runs in the old context; the DTensor is the new context's.
    out = _run("""
        configure(4)
        mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{d}" for d in range(4)])
        f = tf.function(lambda t: tf.reduce_sum(t))
        f(dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=(8,)))
        context._reset_context(); configure(4)
        mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{d}" for d in range(4)])
        x = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=(8,))
        assert float(tf.function(lambda t: tf.reduce_sum(t))(x)) == 8.0  # a new one runs
        try:
            f(x)
            print(json.dumps({"raised": None}))
        except tf.errors.InvalidArgumentError as e:
            print(json.dumps({"raised": str(e)}))
    """)
    assert "traced before the reset" in out["raised"], out


def test_device_handle_is_invalidated_when_tensorflow_deletes_the_device():
    """Python keeps a flag, not just a pointer: a call on a deleted device raises."""
    out = _run("""
        configure(2)
        old = _device.get()
        context._reset_context(); configure(2)
        gc.collect()
        new = _device.get()
        try:
            old.push_default_mesh(None)
            raised = False
        except RuntimeError:
            raised = True
        print(json.dumps({"old_alive": old.alive, "new_alive": new.alive, "raised": raised,
                          "live_devices": _core.num_live_devices()}))
    """)
    assert out == {"old_alive": False, "new_alive": True, "raised": True, "live_devices": 1}


def test_a_mesh_is_checked_again_after_a_reset_to_fewer_devices():
    out = _run("""
        configure(8)
        mesh = dtensor.create_mesh([("x", 8)], devices=[f"CPU:{d}" for d in range(8)])
        layout = dtensor.Layout(["x"], mesh)
        assert float(tf.reduce_sum(dtensor.call_with_layout(tf.ones, layout, shape=(16,)))) == 16
        context._reset_context(); configure(4)
        try:
            dtensor.call_with_layout(tf.ones, layout, shape=(16,))
            print(json.dumps({"raised": None}))
        except ValueError as e:
            print(json.dumps({"raised": str(e)}))
    """)
    assert "CPU:4` of mesh(x=8) does not exist: this host has 4" in out["raised"], out


def test_a_mesh_used_before_a_reset_is_checked_again_at_its_first_use_after_it():
    """`check_mesh` answered from what it had checked in the old context until an op of the
    new one registered the device: a mesh used before a reset to fewer devices made a
    DTensor on devices that no longer exist, and only `unpack` failed ("CPU:2 unknown
    device"). TensorFlow's DTensor returns a regular tensor there."""
    out = _run("""
        configure(8)
        mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{d}" for d in range(4)])
        layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
        dtensor.relayout(dtensor.copy_to_mesh(tf.ones([4, 2]), dtensor.Layout.replicated(mesh, 2)),
                         layout)
        context._reset_context(); configure(2)
        try:
            dtensor.call_with_layout(tf.ones, layout, shape=(4, 2))
            print(json.dumps({"raised": None}))
        except ValueError as e:
            print(json.dumps({"raised": type(e).__name__ + ": " + str(e)}))
    """)
    assert "MeshError: Device `/job:localhost/replica:0/task:0/device:CPU:2` of mesh(x=2,y=2) " \
        "does not exist: this host has 2" in out["raised"], out


def test_collectives_renewed_after_a_failed_step_in_each_context():
    """A failed step under the collective-ops lowering renews TensorFlow's collective
    executor manager of its context (cc/eager/collective_recovery.h); the renewed manager
    belongs to the context it was made for. Failures, renewals and resets in turn, with
    the number of devices changing: each context's next steps are right, nothing crashes."""
    out = _run("""
        from tf_dtensor import config
        config.set_collective_lowering("ops")
        results = []
        for i in range(6):
            context._reset_context(); configure(8 if i % 2 else 4)
            n = len(tf.config.list_logical_devices("CPU"))
            mesh = dtensor.create_mesh([("x", n)], devices=[f"CPU:{d}" for d in range(n)])
            layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
            step = tf.function(
                lambda x: tf.reduce_sum(tf.debugging.check_numerics(x, "step input"), axis=0))
            value = np.ones((n, 64), np.float32)
            broken = value.copy()
            broken[n - 1, 3] = np.nan
            before = _core.collective_renewals()
            try:
                step(dtensor.pack(np.split(broken, n), layout))
                results.append("no error")
            except tf.errors.InvalidArgumentError:
                pass
            renewed = _core.collective_renewals() - before
            context.context().abort_collective_ops(tf.errors.UNAVAILABLE, "test")
            for _ in range(2):
                got = dtensor.relayout(step(dtensor.pack(np.split(value, n), layout)),
                                       dtensor.Layout.replicated(mesh, 1))
                results.append([renewed, float(got.numpy().sum()) == 64.0 * n])
        print(json.dumps({"results": results,
                          "renewals": _core.collective_renewals()}))
    """)
    assert out["results"] == [[1, True]] * 12
    assert out["renewals"] == 12  # one after each failed step, one after each abort
