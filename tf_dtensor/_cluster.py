"""Multi-client runs on TensorFlow's own distributed runtime.

`initialize_accelerator_system` calls `start` when `DTENSOR_JOBS` names several clients:
this process becomes task `DTENSOR_CLIENT_ID` of job `DTENSOR_JOB_NAME`, with TensorFlow's
gRPC server, its coordination service (task 0 leads; every task heartbeats to it) and its
collective ops. tf_dtensor moves no data itself: collectives over other clients' devices
are issued as `CollectiveReduceV2`/`CollectiveGatherV2`/`CollectiveAllToAllV2`, which
TensorFlow's runtime completes between the processes.

A client that stops on an uncaught exception tells the others before it leaves
(`_reporting_hook`): their pending collectives fail at once with TensorFlow's
`UnavailableError` naming the client and its exception. Without it, a client leaving by an
exception first waits at the coordination service's shutdown barrier, and the others learn
of it only when that barrier times out (`shutdown_barrier_timeout_in_ms`, 30 s), from an
`InternalError` about the barrier that names neither.

Who can reach the server: TensorFlow's gRPC server listens on every network interface of
the host at the port of this client's `DTENSOR_JOBS` entry (TensorFlow binds
`0.0.0.0:<port>`, whatever host the entry names) and has no authentication. Anyone who can
reach that port can run ops in this process. `tf_dtensor.launch` names loopback addresses
only; on a shared host or network, keep the ports behind a firewall.
"""

from __future__ import annotations

import sys
from typing import List

from tensorflow.core.protobuf import cluster_pb2, tensorflow_server_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import errors

# Seconds without a heartbeat after which the coordination service declares a task lost
# and every other task's pending work fails (an error naming the lost task, not a hang).
HEARTBEAT_TIMEOUT_S = 10

_started = False


def started() -> bool:
    """Whether this process has joined a multi-client cluster."""
    return _started


def _port_of(address: str, client: int) -> int:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"DTENSOR_JOBS entry {client} is {address!r}; each entry is "
                         f"host:port, e.g. localhost:12345.")
    return int(port)


def server_def(job: str, addresses: List[str], client: int, heartbeat: bool,
               nccl: bool) -> tensorflow_server_pb2.ServerDef:
    """The ServerDef of client `client` of `addresses`: TensorFlow's server, coordination
    service and collective runtime, with this process's device configuration."""
    for i, address in enumerate(addresses):
        _port_of(address, i)
    cluster = cluster_pb2.ClusterDef()
    cluster.job.add(name=job, tasks=dict(enumerate(addresses)))
    definition = tensorflow_server_pb2.ServerDef(
        cluster=cluster, job_name=job, task_index=client, protocol="grpc",
        port=_port_of(addresses[client], client))
    # The logical devices (`set_logical_device_configuration`) live in the context's
    # config; the server makes this task's devices from the ServerDef's.
    definition.default_session_config.MergeFrom(context.context().config)
    experimental = definition.default_session_config.experimental
    leader = f"/job:{job}/replica:0/task:0"
    experimental.collective_group_leader = leader
    experimental.collective_nccl = nccl
    coordination = experimental.coordination_config
    coordination.service_type = "standalone"
    coordination.service_leader = leader
    coordination.cluster_register_timeout_in_ms = 120_000
    coordination.shutdown_barrier_timeout_in_ms = 30_000
    if heartbeat:
        coordination.heartbeat_timeout_in_ms = HEARTBEAT_TIMEOUT_S * 1000
    else:
        # The service's default, one day: a lost task is noticed only by the collectives.
        coordination.heartbeat_timeout_in_ms = 24 * 3600 * 1000
    return definition


def start(job: str, addresses: List[str], client: int, heartbeat: bool, nccl: bool) -> None:
    """Joins the cluster: starts TensorFlow's server for this task and waits (up to two
    minutes) for every other task to connect to the coordination service."""
    global _started
    from tf_dtensor import _core  # pylint: disable=import-outside-toplevel
    if _started:
        raise ValueError("This process already joined a multi-client cluster; TensorFlow's "
                         "gRPC server cannot be stopped, so a process joins at most once.")
    try:
        context.context().enable_collective_ops(
            server_def(job, addresses, client, heartbeat, nccl))
        context.ensure_initialized()
    except errors.UnknownError as error:
        if "Could not start gRPC server" not in str(error):
            raise
        raise errors.UnknownError(
            None, None,
            f"Client {client} could not start TensorFlow's server on {addresses[client]} "
            f"(DTENSOR_JOBS entry {client}): the port is in use, by another program or by "
            f"another client started with the same DTENSOR_CLIENT_ID. Free the port, or "
            f"give each client its own id and address. ({error.message})") from None
    except errors.DeadlineExceededError as error:
        raise errors.DeadlineExceededError(
            None, None,
            f"Client {client} waited for every client of {addresses} to join, and some did "
            f"not: client 0 ({addresses[0]}) holds the coordination service; check that it "
            f"started (a port in use stops it) and that every client has the same "
            f"DTENSOR_JOBS. ({error.message})") from None
    _core.set_multi_client(True)
    _started = True
    sys.excepthook = _reporting_hook(client, sys.excepthook)


def _reporting_hook(client: int, previous):
    """`sys.excepthook` for a client: reports the uncaught exception to the cluster (every
    other client's pending and next collectives fail with `UnavailableError` naming this
    client and the exception), then runs `previous` (which prints the traceback)."""

    def report_uncaught(kind, value, traceback):
        try:
            context.context().report_error_to_cluster(
                errors.UNAVAILABLE,
                f"Client {client} stopped on an uncaught {kind.__name__}: {value}")
        except Exception:  # pylint: disable=broad-except -- the exception itself matters more
            pass
        previous(kind, value, traceback)

    return report_uncaught


def barrier(name: str, timeout_in_ms: int) -> None:
    """Waits until every task has reached the barrier `name` (the coordination service's
    barrier): DeadlineExceededError after `timeout_in_ms`."""
    context.context().wait_at_barrier(name, timeout_in_ms)
