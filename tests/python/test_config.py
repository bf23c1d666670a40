"""Tests of tf_dtensor/config.py and tf_dtensor/_tpu.py: client queries under TensorFlow's
environment variables, the accelerator-system calls and the TPU entry points.

What TensorFlow's DTensor does for the same calls is compared in
tests/conformance/test_corners.py; these tests cover tf_dtensor's own answers (refusals,
and the calls TensorFlow's DTensor refuses after its runtime has started).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dtensor import config, dtensor

_ENV = ("DTENSOR_JOBS", "DTENSOR_CLIENT_ID", "DTENSOR_JOB_NAME", "DTENSOR_ENABLE_HEARTBEAT",
        "DTENSOR_NUM_CLIENTS", "DTENSOR_GPU_USE_NCCL_COMMUNICATION")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    # After a shutdown, an initialize that asks for other logical CPUs resets TensorFlow's
    # context (as TensorFlow's DTensor does at shutdown); these tests must not do that to
    # the shared test process, so each starts as if no shutdown had happened.
    monkeypatch.setattr(config, "_reset_owed", False)
    yield
    # A test that initialized the accelerator system leaves it shut down.
    try:
        dtensor.shutdown_accelerator_system()
    except ValueError:
        pass


def test_single_client_defaults():
    assert dtensor.jobs() == []
    assert dtensor.num_clients() == 1
    assert dtensor.client_id() == 0
    assert dtensor.job_name() == "localhost"
    assert dtensor.full_job_name() == "localhost/replica:0/task:0"
    assert dtensor.heartbeat_enabled() is True


def test_two_jobs(monkeypatch):
    monkeypatch.setenv("DTENSOR_JOBS", "host:1000,host:1001")
    monkeypatch.setenv("DTENSOR_CLIENT_ID", "1")
    assert dtensor.jobs() == ["host:1000", "host:1001"]
    assert dtensor.num_clients() == 2
    assert dtensor.client_id() == 1
    assert dtensor.job_name() == "worker"
    assert dtensor.full_job_name() == "worker/replica:0/task:1"
    assert dtensor.full_job_name(0) == "worker/replica:0/task:0"


def test_num_clients_ignores_the_removed_variable(monkeypatch):
    # TensorFlow's DTensor counts DTENSOR_JOBS entries; DTENSOR_NUM_CLIENTS is not read.
    monkeypatch.setenv("DTENSOR_NUM_CLIENTS", "4")
    assert dtensor.num_clients() == 1


@pytest.mark.parametrize("value, message", [("2", r"must be < 2.*got 2"),
                                            ("-1", r"must be >= 0, got -1")])
def test_client_id_out_of_range(monkeypatch, value, message):
    monkeypatch.setenv("DTENSOR_JOBS", "host:1000,host:1001")
    monkeypatch.setenv("DTENSOR_CLIENT_ID", value)
    with pytest.raises(ValueError, match=message):
        dtensor.client_id()


def test_full_job_name_of_another_task_in_a_local_run():
    with pytest.raises(ValueError, match="Unexpected task ID 1 in local runs"):
        dtensor.full_job_name(1)


def test_unsorted_bns_jobs(monkeypatch):
    monkeypatch.setenv("DTENSOR_JOBS", "/bns/cell/job/1:port,/bns/cell/job/0:port")
    with pytest.raises(ValueError, match="Sort entries in DTENSOR_JOBS"):
        dtensor.jobs()


@pytest.mark.parametrize("value, enabled", [("true", True), ("1", True), ("TRUE", True),
                                            ("false", False), ("0", False), ("yes", False)])
def test_heartbeat(monkeypatch, value, enabled):
    monkeypatch.setenv("DTENSOR_ENABLE_HEARTBEAT", value)
    assert dtensor.heartbeat_enabled() is enabled


def test_job_name_from_the_environment(monkeypatch):
    monkeypatch.setenv("DTENSOR_JOB_NAME", "trainer")
    assert dtensor.full_job_name() == "trainer/replica:0/task:0"
    assert dtensor.local_devices("CPU")[1].to_string() == "/job:trainer/replica:0/task:0/device:CPU:1"


def test_local_devices_of_an_unknown_type():
    with pytest.raises(ValueError, match="XPU is not CPU, GPU, or TPU"):
        dtensor.local_devices("XPU")


# --- accelerator system ------------------------------------------------------------------

def test_initialize_after_the_runtime_started_keeps_the_devices():
    # TensorFlow's DTensor raises ValueError here; tf_dtensor accepts what needs no change.
    tf.constant(1.0) + 1.0
    assert dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=8) == "CPU"
    mesh = dtensor.create_mesh([("x", -1)])
    assert mesh.shape() == [8]
    ones = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=(16,))
    assert float(tf.reduce_sum(ones)) == 16.0


def test_initialize_with_other_cpus_after_the_runtime_started():
    tf.constant(1.0) + 1.0
    with pytest.raises(ValueError, match=r"already been initialized with 8 logical CPUs.*"
                                         r"experimental_reset_context=True"):
        dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=3)
    # The failed call left the system uninitialized.
    with pytest.raises(ValueError, match="not initialized"):
        dtensor.shutdown_accelerator_system()


def test_initialize_twice():
    dtensor.initialize_accelerator_system("CPU")
    with pytest.raises(ValueError, match="already been initialized"):
        dtensor.initialize_tpu_system("CPU")
    dtensor.shutdown_tpu_system()
    assert dtensor.initialize_accelerator_system("cpu") == "CPU"


def test_initialize_with_several_clients_checks_the_jobs_before_joining(monkeypatch):
    """With several clients, initialization joins the cluster (tests/python/
    test_multi_client.py starts real ones); a malformed job is refused before any server
    starts, and the system stays uninitialized."""
    monkeypatch.setenv("DTENSOR_JOBS", "localhost:1000,somehost")
    with pytest.raises(ValueError, match="entry 1 is 'somehost'; each entry is host:port"):
        dtensor.initialize_multi_client("CPU")
    assert not config.is_initialized()


def test_initialize_multi_client_with_one_job_is_local(monkeypatch):
    monkeypatch.setenv("DTENSOR_JOBS", "localhost:1000")
    assert dtensor.initialize_multi_client("CPU") == "CPU"
    assert dtensor.num_clients() == 1 and dtensor.job_name() == "localhost"


def test_initialize_unknown_device_type():
    with pytest.raises(ValueError, match="Unknown device_type XPU"):
        dtensor.initialize_accelerator_system("xpu")


def test_initialize_tpu_without_tpus():
    with pytest.raises(tf.errors.NotFoundError, match="no valid TPUs found"):
        dtensor.initialize_accelerator_system("TPU")


def test_initialize_gpu_with_fewer_cpus_than_gpus():
    gpus = dtensor.num_local_devices("GPU")
    if gpus == 0:
        # No GPU: nothing to be fewer than; the call succeeds as TensorFlow's does.
        assert dtensor.initialize_accelerator_system("GPU") == "GPU"
        return
    with pytest.raises(ValueError, match="num_logical_cpu_devices"):
        dtensor.initialize_accelerator_system("GPU", num_logical_cpu_devices=gpus - 1)


def test_shutdown_waits_for_asynchronous_work(mesh_2x2):
    dtensor.initialize_accelerator_system("CPU")
    tf.config.experimental.set_synchronous_execution(False)
    try:
        t = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x", "y"], mesh_2x2), shape=(4, 4))
        total = tf.reduce_sum(t * 2.0)
        dtensor.shutdown_accelerator_system()
    finally:
        tf.config.experimental.set_synchronous_execution(True)
    np.testing.assert_allclose(total.numpy(), 32.0)


# --- TPU entry points --------------------------------------------------------------------

def test_create_tpu_mesh_without_tpus():
    with pytest.raises(ValueError, match="needs an initialized TPU system"):
        dtensor.create_tpu_mesh(["x", "y"], [2, 2], "tpu_mesh")


@pytest.mark.parametrize("kwargs, message", [
    ({"ring_dims": 3}, r"ring_dims=3"),
    ({"ring_axes": ["x", "y"]}, r"permutation of \['core', 'x', 'y', 'z'\]"),
    ({"ring_bounds": [1, 2]}, r"4 elements in `ring_bounds`"),
])
def test_create_tpu_mesh_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dtensor.create_tpu_mesh(["x", "y"], [2, 2], "tpu_mesh", **kwargs)
