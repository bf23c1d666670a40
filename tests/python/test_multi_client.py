"""Several clients on loopback: each test starts its clients (tests/python/multi_client/*.py)
through `tf_dtensor.launch`, as a user would, with a time limit so that a hang fails the
test instead of CI. The client programs check every sharded result against numpy or plain
TensorFlow on one device themselves and print `OK ...`; here the exit codes and those
lines are checked.

The ServerDef and launcher pieces that need no second process are tested directly.
"""

from __future__ import annotations

import io
import os
import re
import sys

import pytest

from tf_dtensor import _cluster, launch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_client")


def _run(script: str, nproc: int, timeout: float = 150, grace: float = 30, env=None):
    out = io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    # The clients import tf_dtensor as this process does (an installed package, or the
    # checkout on PYTHONPATH).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(launch.__file__))] +
        [p for p in saved.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        code = launch.run(nproc, [sys.executable, os.path.join(HERE, script)], timeout=timeout,
                          grace=grace, out=out)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue()


def _tail(text: str) -> str:
    lines = [l for l in text.splitlines()
             if "W0000" not in l and "I0000" not in l and "Extension modules:" not in l]
    return "\n".join(lines[-40:])


@pytest.mark.multi_client
@pytest.mark.parametrize("nproc,local", [(2, 2), (4, 1)])
def test_overview_across_clients(nproc, local):
    """pack/unpack of this client's components, elementwise ops, sums and contracted
    matmuls (all-reduces across clients), every relayout transition on a 1-D mesh and
    on a 2-D mesh (clients x local devices), eagerly and in tf.function, and barrier."""
    code, out = _run("overview.py", nproc, env={"TFD_TEST_LOCAL_CPUS": str(local)})
    assert code == 0, _tail(out)
    for k in range(nproc):
        assert f"[client {k}] OK overview {k}" in out, _tail(out)


@pytest.mark.multi_client
def test_functions_freed_by_one_client_only_keep_the_clients_in_step():
    """Client 0 frees each tf.function after its call, the other keeps them: the clients'
    comparison before each first run must not depend on where an expansion lives. Then
    more live functions than one process caches, and a shutdown and a new start."""
    code, out = _run("short_lived.py", 2, timeout=120,
                     env={"TF_DTENSOR_PROGRAM_CHECK_TIMEOUT_S": "30"})
    assert code == 0, _tail(out)
    for k in range(2):
        assert f"[client {k}] OK short-lived {k}" in out, _tail(out)


@pytest.mark.multi_client
def test_training_step_across_clients_matches_one_device():
    code, out = _run("train.py", 2)
    assert code == 0, _tail(out)
    losses = re.findall(r"OK train \d ([0-9.]+)", out)
    assert len(losses) == 2 and losses[0] == losses[1], _tail(out)


@pytest.mark.multi_client
def test_placements_seed_flow_across_clients():
    """init_device_mesh spans the clients; to_local is this client's blocks; the all-gather
    check; from_local of every rank's shard and full_tensor."""
    code, out = _run("placements.py", 2)
    assert code == 0, _tail(out)
    for k in range(2):
        assert f"[client {k}] Success!!! {k}" in out and f"[client {k}] OK placements {k}" in out


@pytest.mark.multi_client
def test_a_lost_client_fails_the_others_naming_it():
    """The last client exits abruptly after one all-reduce; the survivor's next collective
    fails within the heartbeat timeout with an error naming the lost task."""
    code, out = _run("lost_client.py", 2, timeout=120, grace=60, env={"TFD_TEST_MODE": "exit"})
    assert code == 3, _tail(out)  # the lost client's own exit code comes first
    lost = re.search(r"\[client 0\] LOST ([0-9.]+) (\w+): (.*)", out)
    assert lost, _tail(out)
    assert float(lost.group(1)) < _cluster.HEARTBEAT_TIMEOUT_S + 20, lost.group(0)
    assert "task:1" in lost.group(3), lost.group(0)
    assert "NOT LOST" not in out


@pytest.mark.multi_client
def test_a_client_stopped_by_an_exception_fails_the_others_at_once_naming_it():
    """The last client raises while the other waits in a tf.function's all-reduce: its
    uncaught exception is reported to the cluster, so the survivor fails within seconds
    with UnavailableError naming the client and the exception (unreported, it failed after
    the 30 s shutdown barrier with an InternalError about the barrier)."""
    code, out = _run("lost_client.py", 2, timeout=120, grace=60, env={"TFD_TEST_MODE": "raise"})
    assert code == 1, _tail(out)
    lost = re.search(r"\[client 0\] LOST ([0-9.]+) (\w+): (.*)", out)
    assert lost, _tail(out)
    assert float(lost.group(1)) < 15, lost.group(0)
    assert lost.group(2) == "UnavailableError", lost.group(0)
    assert "Client 1 stopped on an uncaught RuntimeError: a mistake in this client" in \
        lost.group(3), lost.group(0)
    assert "NOT LOST" not in out


@pytest.mark.multi_client
@pytest.mark.parametrize("mode", ["shapes", "functions", "bodies"])
def test_clients_running_different_programs_get_an_error_saying_how(mode):
    """Before the first run of a tf.function on a mesh that spans clients, the clients
    compare what they run (through the coordination service): a client that runs the
    function on other shapes, or another function, or the same function on the same inputs
    expanded to other collectives (a captured relayout target), makes every client fail
    with an error naming both programs, instead of a hang in the function's collectives."""
    code, out = _run("mismatch.py", 2, timeout=120, env={"TFD_TEST_MODE": mode})
    assert code == 0, _tail(out)
    for k in range(2):
        found = re.search(rf"\[client {k}\] MISMATCH (\w+): (.*)", out)
        assert found, _tail(out)
        assert found.group(1) == "FailedPreconditionError", found.group(0)
        message = found.group(2)
        assert "run different programs" in message and f"client {1 - k}" in message, message
        if mode == "shapes":
            assert "[8, 4]" in message and "[4, 4]" in message, message
        elif mode == "functions":
            assert "'__inference_total'" in message and "'__inference_largest'" in message, message
        else:
            assert "'__inference_regathered'" in message, message
            assert "all-gather over x of float32[4, 4] [x,*] -> [*,*]" in message, message
            assert "all-to-all over x of float32[4, 4] [x,*] -> [*,x]" in message, message


@pytest.mark.multi_client
def test_eager_collectives_of_other_blocks_are_told_apart():
    """A full reduction to a scalar (a loss) is the same collective on every client: the
    comparison also names the op's global input shapes and the mesh's devices, so blocks
    of other shapes (or meshes of other sizes) fail on both clients instead of hanging."""
    code, out = _run("mismatch.py", 2, timeout=120, env={"TFD_TEST_MODE": "eager_shapes"})
    assert code == 0, _tail(out)
    for k in range(2):
        found = re.search(rf"\[client {k}\] MISMATCH (\w+): (.*)", out)
        assert found and found.group(1) == "FailedPreconditionError", _tail(out)
        assert "float32[4, 4]" in found.group(2) and "float32[8, 4]" in found.group(2), found


@pytest.mark.multi_client
def test_a_clients_own_mesh_by_short_names_and_keras_across_clients():
    code, out = _run("local_mesh.py", 2, timeout=150)
    assert code == 0, _tail(out)
    for k in range(2):
        assert f"[client {k}] OK local mesh {k}" in out, _tail(out)


@pytest.mark.multi_client
def test_a_client_that_never_calls_the_function_times_out_with_a_message():
    code, out = _run("mismatch.py", 2, timeout=120,
                     env={"TFD_TEST_MODE": "missing", "TF_DTENSOR_PROGRAM_CHECK_TIMEOUT_S": "5"})
    assert code == 0, _tail(out)
    found = re.search(r"\[client 0\] MISMATCH (\w+): (.*)", out)
    assert found and found.group(1) == "DeadlineExceededError", _tail(out)
    assert "Client 1 did not reach" in found.group(2), found.group(0)


@pytest.mark.multi_client
def test_eager_collectives_are_compared_by_default():
    """Every eager collective on a mesh spanning clients is compared first (unless
    TF_DTENSOR_CHECK_EAGER_COLLECTIVES=0): a client that takes a maximum where the other
    takes a sum makes both fail naming both collectives (unchecked, each would wait in its
    own all-reduce forever)."""
    code, out = _run("mismatch.py", 2, timeout=120, env={"TFD_TEST_MODE": "eager"})
    assert code == 0, _tail(out)
    for k in range(2):
        found = re.search(rf"\[client {k}\] MISMATCH (\w+): (.*)", out)
        assert found and found.group(1) == "FailedPreconditionError", _tail(out)
        message = found.group(2)
        assert "run different programs" in message, message
        assert "eager all-reduce(sum) over x" in message and "'Sum'" in message, message
        assert "eager all-reduce(max) over x" in message and "'Max'" in message, message


def test_server_def_names_every_client_and_the_leader():
    definition = _cluster.server_def("worker", ["127.0.0.1:1234", "127.0.0.1:1235"], 1,
                                     heartbeat=True, nccl=False)
    assert definition.job_name == "worker" and definition.task_index == 1
    assert definition.port == 1235
    assert dict(definition.cluster.job[0].tasks) == {0: "127.0.0.1:1234", 1: "127.0.0.1:1235"}
    experimental = definition.default_session_config.experimental
    assert experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    assert experimental.coordination_config.service_leader == "/job:worker/replica:0/task:0"
    assert (experimental.coordination_config.heartbeat_timeout_in_ms ==
            _cluster.HEARTBEAT_TIMEOUT_S * 1000)
    # The logical CPUs of this process (conftest: 8) travel with it.
    assert definition.default_session_config.device_count["CPU"] == 8


def test_server_def_refuses_a_job_without_port():
    with pytest.raises(ValueError, match="entry 1 is 'somehost'"):
        _cluster.server_def("worker", ["127.0.0.1:1234", "somehost"], 0, True, False)


def test_launch_environment_and_ports():
    ports = launch.free_ports(3)
    assert len(set(ports)) == 3
    env = launch.client_env(2, ports, base={})
    assert env["DTENSOR_JOBS"] == ",".join(f"127.0.0.1:{p}" for p in ports)
    assert env["DTENSOR_CLIENT_ID"] == "2" and env["DTENSOR_NUM_CLIENTS"] == "3"
    assert env["DTENSOR_JOB_NAME"] == "worker"
    # One client starts no server and keeps TensorFlow's one-client job name.
    assert "DTENSOR_JOB_NAME" not in launch.client_env(0, ports[:1], base={})


def test_launch_stops_the_others_when_one_fails(tmp_path):
    script = tmp_path / "one_fails.py"
    script.write_text("import os, time\n"
                      "if os.environ['DTENSOR_CLIENT_ID'] == '1':\n"
                      "    raise SystemExit(5)\n"
                      "time.sleep(600)\n")
    out = io.StringIO()
    code = launch.run(2, [sys.executable, str(script)], timeout=120, grace=1, out=out)
    assert code == 5
    assert "client 1 exited with 5" in out.getvalue()


@pytest.mark.multi_client
@pytest.mark.parametrize("writers,readers", [(2, 4), (2, 1), (4, 2)])
def test_checkpoints_written_by_n_clients_restore_on_m(writers, readers, tmp_path):
    """N clients write DVariables of several layouts (one 2-D mesh, an uneven one) through
    tf.train.Checkpoint and sharded_save, each client its own blocks, client 0 merging;
    M clients (or one process) read them into other layouts. The values are checked
    against numpy on every client, and the files hold the global values."""
    for phase, clients in (("save", writers), ("restore", readers)):
        code, out = _run("checkpoint.py", clients, env={
            "TFD_TEST_PHASE": phase, "TFD_TEST_DIR": str(tmp_path),
            "TFD_TEST_LOCAL_CPUS": str(4 // clients)})
        assert code == 0, _tail(out)
        for k in range(clients):
            assert f"[client {k}] OK checkpoint {phase} {k}" in out, _tail(out)


@pytest.mark.multi_client
def test_dtensor_dataset_across_clients():
    """Each client reads its share of every global batch (a 1-D mesh over every device and a
    2-D mesh, batch over clients); the global values match numpy, eagerly and through
    `next(iterator)` inside tf.function, and a for loop over the dataset inside a
    function (its iterator stays one host resource through the loop)."""
    code, out = _run("dataset.py", 2)
    assert code == 0, _tail(out)
    for k in range(2):
        assert f"[client {k}] OK dataset {k}" in out, _tail(out)
        assert f"[client {k}] OK dataset functions {k}" in out, _tail(out)


@pytest.mark.multi_client
def test_a_port_in_use_is_named_in_the_error():
    import socket
    import subprocess
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    other = launch.free_ports(1)[0]
    env = dict(os.environ, DTENSOR_JOBS=f"127.0.0.1:{port},127.0.0.1:{other}",
               DTENSOR_CLIENT_ID="0", DTENSOR_JOB_NAME="worker", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(launch.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    code = ("from tf_dtensor import dtensor\n"
            "try:\n"
            "    dtensor.initialize_accelerator_system('CPU', num_logical_cpu_devices=2)\n"
            "except Exception as e:\n"
            "    print('RAISED', type(e).__name__, e)\n")
    try:
        # Run from the client scripts' folder: `python -c` puts its working directory first
        # on sys.path, and the checkout's root holds an unbuilt tf_dtensor where the
        # package is installed.
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                text=True, timeout=120, cwd=HERE)
    finally:
        held.close()
    assert f"RAISED UnknownError Client 0 could not start TensorFlow's server on " \
           f"127.0.0.1:{port}" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "the port is in use" in result.stdout
