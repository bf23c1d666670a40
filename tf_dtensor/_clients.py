"""Clients and their devices, as TensorFlow's DTensor reads them from the environment.

Clients are described by the environment variables of TensorFlow's DTensor, read when
asked and with the same defaults and errors:

- `DTENSOR_JOBS`: comma-separated `host:port` of every client; unset means one local client.
- `DTENSOR_CLIENT_ID`: this client's index in `DTENSOR_JOBS` (default 0).
- `DTENSOR_JOB_NAME`: the TensorFlow job name (default `localhost` for one client, else
  `worker`).
- `DTENSOR_ENABLE_HEARTBEAT`: `true`/`1` (default) or anything else.
- `DTENSOR_GPU_USE_NCCL_COMMUNICATION`: non-zero asks for one logical GPU per physical GPU.

`DTENSOR_NUM_CLIENTS` is not read (TensorFlow's DTensor no longer reads it either): the
number of clients is the number of jobs. The public functions are `config`'s (re-exported
there); this module reads, it starts nothing.
"""

from __future__ import annotations

import os
from typing import List, Optional, Union

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import device as tf_device

from tf_dtensor import _tpu

_DEVICE_TYPES = ("CPU", "GPU", "TPU")

# The environment variables, under TensorFlow's names for them.
_DT_CLIENT_ID = "DTENSOR_CLIENT_ID"
_DT_NUM_CLIENTS = "DTENSOR_NUM_CLIENTS"
_DT_JOB_NAME = "DTENSOR_JOB_NAME"
_DT_JOBS = "DTENSOR_JOBS"
_DT_HEARTBEAT_ENABLED = "DTENSOR_ENABLE_HEARTBEAT"


def jobs() -> List[str]:
    """The jobs (`host:port`) of all clients, from `DTENSOR_JOBS`; `[]` for a local run.

    Example:
      >>> jobs()  # DTENSOR_JOBS unset
      []

    Raises:
      ValueError: BNS job names (`/bns/...`) that are not sorted by task id.
    """
    value = os.environ.get("DTENSOR_JOBS")
    if value is None:
        return []
    names = value.split(",")
    if any(name.startswith("/bns/") for name in names):
        if names != sorted(names, key=_bns_task_id):
            raise ValueError(f"Unexpected DTENSOR_JOBS content {value}. Sort entries in "
                             f"DTENSOR_JOBS because cluster construction relies on the order.")
    return names


def _bns_task_id(job: str) -> Union[int, str]:
    # '/bns/cell/user/job/3:port' -> 3; names without a numeric task sort as strings.
    task = job.rsplit("/")[-1].rsplit(":")[0]
    try:
        return int(task)
    except ValueError:
        return job


def num_clients() -> int:
    """How many clients take part: the number of `DTENSOR_JOBS` entries, 1 when unset.

    Example:
      >>> num_clients()
      1
    """
    return len(jobs()) or 1


def client_id() -> int:
    """This client's id, from `DTENSOR_CLIENT_ID` (0 when unset).

    Example:
      >>> client_id()
      0

    Raises:
      ValueError: the id is negative or not below `num_clients()`.
    """
    value = int(os.environ.get("DTENSOR_CLIENT_ID", "0"))
    if value < 0:
        raise ValueError(f"Environment variable DTENSOR_CLIENT_ID must be >= 0, got {value}.")
    if value >= num_clients():
        raise ValueError(f"Environment variable DTENSOR_CLIENT_ID must be < {num_clients()} "
                         f"(the number of DTENSOR_JOBS entries), got {value}.")
    return value


def job_name() -> str:
    """The TensorFlow job name of every client: `DTENSOR_JOB_NAME`, or `localhost`/`worker`.

    Example:
      >>> job_name()
      'localhost'
    """
    return os.environ.get("DTENSOR_JOB_NAME", "localhost" if num_clients() == 1 else "worker")


def full_job_name(task_id: Optional[int] = None) -> str:
    """`<job>/replica:0/task:<task_id>` for this client (default) or another task.

    Example:
      >>> full_job_name()
      'localhost/replica:0/task:0'

    Raises:
      ValueError: a `task_id` other than 0 in a single-client run.
    """
    if task_id is None:
        task_id = client_id()
    if num_clients() == 1 and task_id != 0:
        raise ValueError(f"Unexpected task ID {task_id} in local runs: a single client is "
                         f"task 0.")
    return f"{job_name()}/replica:0/task:{task_id}"


def heartbeat_enabled() -> bool:
    """Whether the heartbeat service is on: `DTENSOR_ENABLE_HEARTBEAT` is `true` or `1`.

    Example:
      >>> heartbeat_enabled()  # DTENSOR_ENABLE_HEARTBEAT unset
      True
    """
    return os.environ.get("DTENSOR_ENABLE_HEARTBEAT", "true").lower() in ("true", "1")


def _gpu_use_nccl_communication() -> bool:
    return os.environ.get("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "0") != "0"


def gpu_use_nccl_communication() -> bool:
    """Whether `DTENSOR_GPU_USE_NCCL_COMMUNICATION` asks for NCCL (any value but `0`)."""
    return _gpu_use_nccl_communication()


def is_tpu_present() -> bool:
    """Whether this client sees a TPU (reads physical devices only)."""
    return _tpu.tpu_present()


def is_gpu_present() -> bool:
    """Whether this client sees a GPU (reads physical devices only)."""
    return bool(tf.config.list_physical_devices("GPU"))


def use_multi_device_mode() -> bool:
    """Always True: every tf_dtensor mesh is expanded over its devices (TensorFlow's
    `DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION` has no single-device mode here)."""
    return True


def is_local_mode() -> bool:
    """Whether this is a single-client run (`DTENSOR_JOBS` names at most one client)."""
    return num_clients() <= 1


def preferred_device_type() -> str:
    """TPU if there are TPUs, else GPU if there are GPUs, else CPU.

    Reads the physical devices, so it does not start TensorFlow's runtime.

    Example:
      >>> preferred_device_type() == ("GPU" if tf.config.list_physical_devices("GPU") else "CPU")
      True
    """
    if _tpu.tpu_present():
        return "TPU"
    if tf.config.list_physical_devices("GPU"):
        return "GPU"
    return "CPU"


def local_devices(device_type: str,
                  for_client_id: Optional[int] = None) -> List[tf_device.DeviceSpec]:
    """This client's devices of `device_type` as full DeviceSpecs, by increasing index.

    Args:
      device_type: `"CPU"`, `"GPU"` or `"TPU"` (any case).
      for_client_id: whose devices to name (default: this client's); every client is
        taken to have as many devices as this one.

    Example:
      >>> local_devices("CPU")[0].to_string()
      '/job:localhost/replica:0/task:0/device:CPU:0'

    Raises:
      ValueError: `device_type` is not CPU, GPU or TPU.
    """
    if device_type.upper() not in _DEVICE_TYPES:
        raise ValueError(f"Device type {device_type} is not CPU, GPU, or TPU.")
    if for_client_id is None:
        for_client_id = client_id()
    return [tf_device.DeviceSpec(job=job_name(), replica=0, task=for_client_id,
                                 device_type=device_type, device_index=i)
            for i in range(num_local_devices(device_type))]


# For functions whose `local_devices` parameter (TensorFlow's name) hides the function.
_client_devices = local_devices


def num_local_devices(device_type: str) -> int:
    """How many devices of `device_type` this client has (logical CPUs and GPUs count).

    Reads the configuration, so it does not start TensorFlow's runtime.

    Example:
      >>> num_local_devices("CPU")  # after splitting the CPU into 8 logical devices
      8
    """
    if device_type.upper() in ("CPU", "GPU"):
        return context.get_config().device_count[device_type.upper()]
    return len(tf.config.list_physical_devices(device_type))


def num_global_devices(device_type: str) -> int:
    """How many devices of `device_type` all clients have together.

    Example:
      >>> num_global_devices("CPU") == num_local_devices("CPU")  # one client
      True
    """
    return num_local_devices(device_type) * num_clients()


def _this_clients(device) -> str:
    """A device's name; a short one ("CPU:0") on a client of several is completed with this
    client's job and task (its own first CPU, not /job:localhost's)."""
    name = device.to_string() if hasattr(device, "to_string") else str(device)
    if num_clients() <= 1:
        return name
    spec = tf_device.DeviceSpec.from_string(name)
    if spec.job is None and spec.task is None:
        name = spec.replace(job=job_name(), replica=0, task=client_id()).to_string()
    return name
