"""Devices, clients and meshes: create_mesh and the accelerator-system calls.

The clients and their devices (`jobs`, `client_id`, `local_devices`, ...) are read from
TensorFlow's DTensor environment variables by `_clients.py` and re-exported here, where
TensorFlow's DTensor has them. With several clients, `initialize_accelerator_system` makes
this process one client of the cluster on TensorFlow's distributed runtime (`_cluster.py`,
which also says who can reach its server).
"""

from __future__ import annotations

import logging
import numbers
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import device as tf_device

from tf_dtensor import _cluster, _tpu
from tf_dtensor._clients import (  # noqa: F401  (TensorFlow's DTensor has them in config)
    _DEVICE_TYPES, _DT_CLIENT_ID, _DT_HEARTBEAT_ENABLED, _DT_JOB_NAME, _DT_JOBS,
    _DT_NUM_CLIENTS, _client_devices, _gpu_use_nccl_communication, _this_clients, client_id,
    full_job_name, gpu_use_nccl_communication, heartbeat_enabled, is_gpu_present,
    is_local_mode, is_tpu_present, job_name, jobs, local_devices, num_clients,
    num_global_devices, num_local_devices, preferred_device_type, use_multi_device_mode)
from tf_dtensor._errors import MeshError
from tf_dtensor._tpu import create_tpu_mesh  # noqa: F401  (re-exported by dtensor.py)
from tf_dtensor.mesh import Mesh

# The device type given to `initialize_accelerator_system`, None when not initialized.
_initialized_device_type: Optional[str] = None
# TensorFlow's DTensor resets the eager context in `shutdown_accelerator_system`; tf_dtensor
# keeps it (tensors and meshes made before stay usable) and resets it only when a later
# `initialize_accelerator_system` needs a device configuration the running context lacks.
_reset_owed = False
# (job name, jobs, client id) of the cluster this process joined, if any.
_cluster_jobs: Optional[tuple] = None


def create_mesh(mesh_dims: Union[List[Tuple[str, int]], Dict[str, int], None] = None,
                mesh_name: str = "",
                devices: Optional[List[Union[tf_device.DeviceSpec, str]]] = None,
                device_type: Optional[str] = None,
                use_xla_spmd: bool = False) -> Mesh:
    """Creates a single-client mesh, as `tf.experimental.dtensor.create_mesh` does.

    Args:
      mesh_dims: `[(name, size), ...]` or `{name: size}`; defaults to `[("x", n)]` over all
        devices.
      mesh_name: optional name.
      devices: the devices in mesh order (first dimension outermost); default: all local
        devices of `device_type`.
      device_type: used when `devices` is not given; default `CPU` (as in TensorFlow's
        DTensor, also on machines with accelerators).
      use_xla_spmd: recorded in the mesh.

    Example:
      >>> mesh = create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    """
    if devices is None:
        devices = local_devices(device_type or "CPU")
        if not devices:
            raise MeshError(
                f"create_mesh: this host has no {device_type or 'CPU'} devices to build the "
                f"mesh from (device_type={device_type or 'CPU'!r}). Use a device type it has "
                f"(`tf.config.list_logical_devices()`), or pass `devices=`.")
    elif isinstance(devices, (str, bytes)) or hasattr(devices, "to_string"):
        # Iterated, "CPU:0" would be five devices named by its letters.
        raise MeshError(f"create_mesh: `devices` must be a list of devices; got the single "
                        f"device {devices!r}. Did you mean [{devices!r}]?")
    device_names = [_this_clients(d) for d in devices]
    if device_type is not None and device_names:
        # As TensorFlow's DTensor: a `device_type` that the given devices do not have is a
        # mistake, not a hint to ignore.
        wanted = device_type.upper()
        other = [d for d in device_names if _device_type_of(d) not in ("", wanted)]
        if other:
            raise MeshError(f"create_mesh: `device_type={device_type!r}` conflicts with the "
                            f"devices given ({other[0]!r} is a "
                            f"{_device_type_of(other[0])} device; Conflicting devices and "
                            f"device_type). Leave `device_type` out when passing `devices`, or "
                            f"pass {wanted} devices.")
    if mesh_dims is None:
        mesh_dims = [("x", len(device_names))]
    elif isinstance(mesh_dims, dict):
        mesh_dims = list(mesh_dims.items())
    mesh_dims = _mesh_dim_pairs(mesh_dims)
    if len(mesh_dims) == 1 and mesh_dims[0][1] == -1:
        # As in TensorFlow's DTensor: a single dimension of size -1 takes every device.
        mesh_dims = [(mesh_dims[0][0], len(device_names))]
    names = [name for name, _ in mesh_dims]
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"Mesh dimension {i} is named {name!r} ({type(name).__name__}); "
                            f"mesh dimensions are named by strings, e.g. ('x', 2).")
    sizes = [_dim_size(name, size) for name, size in mesh_dims]
    for name, size in zip(names, sizes):
        if size <= 0:
            raise MeshError(f"Mesh dimension `{name}` has size {size}; sizes must be positive "
                            f"(a dimension of size 1 keeps a name with no split), e.g. "
                            f"({name!r}, 2).")
    total = int(np.prod(sizes)) if sizes else 1
    if total != len(device_names):
        raise MeshError(f"Mesh dims {list(mesh_dims)} hold {total} devices but "
                        f"{len(device_names)} devices were given; the product of the sizes must "
                        f"equal the number of devices (the number of devices must be equal "
                        f"to total size of the mesh). Give {total} devices, or sizes whose "
                        f"product is {len(device_names)} (a single dimension of size -1 "
                        f"takes every device).")
    ids = np.arange(total).reshape(sizes)
    mesh = Mesh(names, ids, list(range(total)), device_names, mesh_name,
                use_xla_spmd=use_xla_spmd)
    # Whether the devices exist is checked at the mesh's first use (`_device.check_mesh`):
    # programs (and TensorFlow's tests) build meshes before they split the host into
    # logical devices.
    return mesh


def _device_type_of(name: str) -> str:
    """"CPU" for "CPU:0" or a full name; "" for a name that does not parse (the mesh refuses
    it, naming it)."""
    try:
        return (tf_device.DeviceSpec.from_string(name).device_type or "").upper()
    except ValueError:
        return ""


def _mesh_dim_pairs(mesh_dims) -> List[Tuple[Any, Any]]:
    """`mesh_dims` as a list of (name, size) pairs; any other shape is a TypeError naming it
    (`create_mesh("x")`, `create_mesh(["x", "y"])` and `[("x", 2, 1)]` once failed inside
    tuple unpacking, with a message that named neither `create_mesh` nor `mesh_dims`)."""
    usage = ("create_mesh: `mesh_dims` must be a list of (name, size) pairs such as "
             "[('x', 2), ('y', 4)], or a dict {'x': 2, 'y': 4}")
    if isinstance(mesh_dims, (str, bytes)):
        raise TypeError(f"{usage}; got the string {mesh_dims!r}. Did you mean "
                        f"[({mesh_dims!r}, -1)] (one dimension over every device)?")
    try:
        pairs = list(mesh_dims)
    except TypeError:
        raise TypeError(f"{usage}; got {mesh_dims!r} ({type(mesh_dims).__name__}).") from None
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"{usage}; entry {i} is {pair!r}.")
    return [tuple(pair) for pair in pairs]


def _dim_size(name: str, size) -> int:
    """A mesh dimension size as an int; 2.5 or "2" is refused rather than truncated (a
    TypeError, as in TensorFlow's DTensor); an integral float such as 2.0 is taken."""
    if isinstance(size, (bool, str, bytes)) or not np.isscalar(size) or \
            not isinstance(size, (numbers.Integral, numbers.Real)) or float(size) != int(size):
        raise TypeError(f"Mesh dimension `{name}` has size {size!r}; sizes are whole numbers "
                        f"of devices, e.g. ({name!r}, 2).")
    return int(size)


def create_distributed_mesh(mesh_dims: Union[List[Tuple[str, int]], Dict[str, int]],
                            mesh_name: str = "",
                            local_devices: Optional[List[Union[tf_device.DeviceSpec, str]]] = None,  # pylint: disable=redefined-outer-name
                            device_type: Optional[str] = None,
                            use_xla_spmd: bool = False) -> Mesh:
    """A mesh over the devices of every client; with one client it equals `create_mesh`.

    Every client calls it with the same `mesh_dims`; `local_devices` (default: all of this
    client's devices of `device_type`) are this client's share, the same number on each
    client. Global device ids run client by client: client `c` holds ids
    `c * n ... c * n + n - 1` for `n` local devices, as in TensorFlow's DTensor.

    Args:
      mesh_dims: `[(name, size), ...]` or `{name: size}`, outermost first.
      mesh_name: the mesh's name.
      local_devices: this client's devices (default: all of `device_type`).
      device_type: the type of the default devices (default: CPU, as in TensorFlow's
        DTensor, also where there are accelerators).
      use_xla_spmd: recorded in the mesh.

    Example:
      >>> mesh = create_distributed_mesh([("batch", num_global_devices("CPU"))])

    Raises:
      MeshError: sizes whose product is not the number of global devices.
      ValueError: local devices of another client or of mixed types.
    """
    if num_clients() == 1:
        return create_mesh(mesh_dims, mesh_name, local_devices, device_type, use_xla_spmd)
    if isinstance(mesh_dims, dict):
        mesh_dims = list(mesh_dims.items())
    names = [name for name, _ in mesh_dims]
    sizes = [_dim_size(name, size) for name, size in mesh_dims]
    if local_devices is None:
        # CPU, as TensorFlow's DTensor defaults it (and create_mesh here), not the
        # preferred type: a GPU client would otherwise build a GPU mesh where TF builds a
        # CPU one.
        device_type = (device_type or "CPU").upper()
        local_devices = _client_devices(device_type)
    local_names = [tf_device.DeviceSpec.from_string(d).to_string() if isinstance(d, str)
                   else d.to_string() for d in local_devices]
    mine = f"/job:{full_job_name()}/"
    for name in local_names:
        if not name.startswith(mine):
            raise ValueError(f"create_distributed_mesh takes this client's devices only "
                             f"(those of /job:{full_job_name()}); got {name}.")
    total = int(np.prod(sizes)) if sizes else 1
    if total != len(local_names) * num_clients():
        raise MeshError(f"Mesh dims {list(mesh_dims)} hold {total} devices but the "
                        f"{num_clients()} clients have {len(local_names) * num_clients()} "
                        f"({len(local_names)} each); the product of the sizes must equal the "
                        f"number of global devices.")
    ids = np.arange(total).reshape(sizes)
    first = client_id() * len(local_names)
    return Mesh(names, ids, list(range(first, first + len(local_names))), local_names,
                mesh_name, use_xla_spmd=use_xla_spmd)


def initialize_accelerator_system(device_type: Optional[str] = None,
                                  enable_coordination_service: Optional[bool] = True,
                                  num_logical_cpu_devices: Optional[int] = None,
                                  experimental_reset_context: Optional[bool] = False,
                                  experimental_enable_megcore: Optional[bool] = False) -> str:
    """Configures the local devices for DTensor and returns the device type.

    Also exported as `initialize_tpu_system` and `initialize_multi_client`, as in
    TensorFlow's DTensor. With `DTENSOR_JOBS` unset or naming one job this is a local run.

    `num_logical_cpu_devices` splits the host CPU into that many logical CPUs, which is how
    meshes of several CPUs run on one machine. Unlike TensorFlow's DTensor, calling this
    after TensorFlow's runtime has started is fine when the devices it asks for are already
    there; when they are not, it raises ValueError, as TensorFlow's DTensor does.

    Args:
      device_type: CPU, GPU or TPU; default `preferred_device_type()`.
      enable_coordination_service: used by multi-client runs only.
      num_logical_cpu_devices: how many logical CPUs to configure.
      experimental_reset_context: reset TensorFlow's eager context first; tensors made
        before become invalid.
      experimental_enable_megcore: TPU only.

    Returns:
      The device type, upper case.

    Example:
      >>> initialize_accelerator_system("CPU", num_logical_cpu_devices=8)
      'CPU'
      >>> shutdown_accelerator_system()

    Raises:
      ValueError: already initialized (call `shutdown_accelerator_system` first), an
        unknown `device_type`, or logical devices that can no longer be configured.
      ValueError: this process already joined another cluster, or joined one and asks
        for `experimental_reset_context` (TensorFlow's server cannot be stopped, so a
        process is a client of one cluster, in one eager context).
      tf.errors.NotFoundError: `device_type="TPU"` without TPUs.
    """
    global _initialized_device_type, _reset_owed
    del enable_coordination_service, experimental_enable_megcore
    if not context.executing_eagerly():
        raise RuntimeError("initialize_accelerator_system runs eagerly; call it before and "
                           "outside any tf.function.")
    if _initialized_device_type is not None:
        raise ValueError("Accelerator system has already been initialized. Call "
                         "`shutdown_accelerator_system()` first.")
    if experimental_reset_context and _cluster.started():
        # A new eager context would start TensorFlow's server again, on the port the first
        # one still holds ("Could not start gRPC server", with this process's context gone).
        raise ValueError("initialize_accelerator_system(experimental_reset_context=True) in a "
                         "client of a multi-client cluster: resetting TensorFlow's eager "
                         "context would start TensorFlow's server again, and the first one "
                         "cannot be stopped. Leave `experimental_reset_context` False (after "
                         "`shutdown_accelerator_system()` the cluster and its devices are "
                         "kept), or start a new process.")
    if experimental_reset_context and context.context()._initialized:  # pylint: disable=protected-access
        logging.warning("initialize_accelerator_system(experimental_reset_context=True) "
                        "resets TensorFlow's eager context: tensors and variables made before "
                        "are no longer valid.")
        context.context().ensure_uninitialized()
        _reset_owed = False
    device_type = (device_type or preferred_device_type()).upper()
    if device_type not in _DEVICE_TYPES:
        raise ValueError(f"Unknown device_type {device_type}. Allowed values are CPU, GPU, "
                         f"or TPU.")
    if _gpu_use_nccl_communication():
        logical, physical = num_local_devices("GPU"), len(tf.config.list_physical_devices("GPU"))
        if logical > physical:
            raise ValueError(f"DTENSOR_GPU_USE_NCCL_COMMUNICATION is set for using NCCL, which "
                             f"needs one logical GPU per physical GPU; there are {logical} "
                             f"logical and {physical} physical GPUs.")
    if device_type == "TPU":
        _tpu.refuse_tpu_system()
    if device_type == "GPU":
        accelerators = num_local_devices("GPU")
        if num_logical_cpu_devices is None:
            num_logical_cpu_devices = max(num_local_devices("CPU"), accelerators)
        elif num_logical_cpu_devices < accelerators:
            raise ValueError(f"If set, `num_logical_cpu_devices` (={num_logical_cpu_devices}) "
                             f"must be greater than or equal to the number of local GPU "
                             f"devices (={accelerators}).")
    if num_logical_cpu_devices is not None:
        _configure_logical_cpus(num_logical_cpu_devices)
    if num_clients() > 1:
        _join_cluster()
    _initialized_device_type = device_type
    return device_type


def _join_cluster() -> None:
    """Makes this process client `client_id()` of the `DTENSOR_JOBS` cluster (once per
    process: TensorFlow's server cannot be stopped; a later initialization after a
    shutdown reuses it when the jobs are the same)."""
    global _cluster_jobs
    wanted = (job_name(), tuple(jobs()), client_id())
    if _cluster.started():
        if _cluster_jobs != wanted:
            raise ValueError(f"This process already joined the cluster {_cluster_jobs}; "
                             f"TensorFlow's server cannot be stopped, so it cannot join "
                             f"{wanted}. Start a new process.")
        return
    _cluster.start(job_name(), jobs(), client_id(), heartbeat_enabled(),
                   _gpu_use_nccl_communication())
    _cluster_jobs = wanted


def _configure_logical_cpus(count: int) -> None:
    global _reset_owed
    if context.context()._initialized:  # pylint: disable=protected-access
        running = num_local_devices("CPU")  # this client's (a cluster lists the others' too)
        if running == count:
            return
        if _cluster.started():
            raise ValueError(
                f"This process joined a multi-client cluster with {running} logical CPUs; "
                f"`num_logical_cpu_devices={count}` would need a new eager context, which "
                f"would start TensorFlow's server again (it cannot be stopped). Keep "
                f"{running}, or start a new process.")
        if not _reset_owed:
            raise ValueError(
                f"TensorFlow has already been initialized with {running} logical CPUs; "
                f"`num_logical_cpu_devices={count}` must be set before any TensorFlow op "
                f"runs, or pass `experimental_reset_context=True`.")
        # TensorFlow's DTensor reset the context at shutdown; do it now that it matters.
        context.context().ensure_uninitialized()
    _reset_owed = False
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def shutdown_accelerator_system() -> None:
    """Ends the accelerator system started by `initialize_accelerator_system`.

    Also exported as `shutdown_tpu_system`. Waits for pending asynchronous work first.
    TensorFlow's DTensor also resets the eager context here; tf_dtensor keeps it, so
    tensors made before stay valid, and resets it in the next
    `initialize_accelerator_system` only if that asks for other logical devices.

    Example:
      >>> initialize_accelerator_system("CPU")
      'CPU'
      >>> shutdown_accelerator_system()

    Raises:
      ValueError: the accelerator system is not initialized.
    """
    global _initialized_device_type, _reset_owed
    try:
        context.async_wait()
    finally:
        if _initialized_device_type is None:
            raise ValueError("Accelerator system is not initialized. Call "
                             "`initialize_accelerator_system()` first.")
        _initialized_device_type = None
        _reset_owed = True


def is_initialized() -> bool:
    """Whether `initialize_accelerator_system` has run (and no shutdown since)."""
    return _initialized_device_type is not None


def set_initialized(value: Optional[str]) -> None:
    """TensorFlow's `accelerator_util.set_initialized`: record the initialized device type
    (None: not initialized) without configuring anything. For code that configured the
    devices itself, as TensorFlow's tests do."""
    global _initialized_device_type
    _initialized_device_type = value.upper() if value else None


initialize_tpu_system = initialize_accelerator_system
initialize_multi_client = initialize_accelerator_system
shutdown_tpu_system = shutdown_accelerator_system


def set_collective_lowering(policy: str) -> None:
    """Chooses how collectives (all-reduce, all-gather) run, for the whole process.

    `"auto"` (default) sums and concatenates peers' buffers directly on meshes of virtual
    CPUs of this process, moves results by device-to-device copies (an AddN or ConcatV2
    at one device of each group, then copies out) on other meshes this process holds
    whole (GPUs), and uses TensorFlow's collective ops (`CollectiveReduceV2`,
    `CollectiveGatherV2`) for meshes that span processes; `"ops"` uses the collective ops
    everywhere (to test them on CPUs), `"copies"` the copies, `"shared"` the shared
    buffers wherever they can work. `""` goes back to the default of the
    `TF_DTENSOR_COLLECTIVES` environment variable. Changing the policy drops the plans and
    expanded functions made under the old one; setting the one in force keeps them.

    Example:
      >>> set_collective_lowering("ops")
      >>> collective_lowering()
      'ops'
      >>> set_collective_lowering("")

    Raises:
      ValueError: an unknown policy.
    """
    from tf_dtensor import _core  # pylint: disable=import-outside-toplevel
    _core.set_collective_lowering(policy)


def collective_lowering(mesh=None) -> str:
    """The collective lowering policy in force: `"auto"`, `"shared"`, `"copies"` or `"ops"`.

    With a `mesh`, the lowering its collectives take under that policy: `"shared"`,
    `"copies"`, `"ops"`, or `"ops (nccl)"` where they go over NCCL
    (`DTENSOR_GPU_USE_NCCL_COMMUNICATION=1` on a GPU mesh whose local devices are distinct
    physical GPUs; logical GPUs of one physical GPU cannot use NCCL and keep the copies).

    Example:
      >>> mesh = dtensor.create_mesh([("x", 8)], device_type="CPU")
      >>> collective_lowering(mesh)
      'shared'
    """
    from tf_dtensor import _core  # pylint: disable=import-outside-toplevel
    if mesh is None:
        return _core.collective_lowering()
    return _core.collective_lowering_for(mesh._mesh)  # pylint: disable=protected-access
