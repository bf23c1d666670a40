"""Devices, clients and meshes: create_mesh and the accelerator-system calls.

tf_dtensor runs one client per process here; multi-client runs use TensorFlow's own
distributed runtime and read the same environment variables as TF's DTensor
(DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import device as tf_device

from tf_dtensor import _device
from tf_dtensor._errors import MeshError
from tf_dtensor.mesh import Mesh

_initialized_device_type: Optional[str] = None


def client_id() -> int:
    """This client's id (0 for a single client)."""
    return int(os.environ.get("DTENSOR_CLIENT_ID", "0"))


def num_clients() -> int:
    """How many clients take part (1 for a single client)."""
    return int(os.environ.get("DTENSOR_NUM_CLIENTS", "1"))


def preferred_device_type() -> str:
    """TPU if there are TPUs, else GPU if there are GPUs, else CPU."""
    for device_type in ("TPU", "GPU"):
        if tf.config.list_logical_devices(device_type):
            return device_type
    return "CPU"


def local_devices(device_type: str, for_client_id: Optional[int] = None) -> List[tf_device.DeviceSpec]:
    """This client's devices of `device_type`, as DeviceSpecs."""
    del for_client_id  # One client per process: its devices are the local ones.
    return [tf_device.DeviceSpec.from_string(d.name)
            for d in tf.config.list_logical_devices(device_type.upper())]


def num_local_devices(device_type: str) -> int:
    return len(local_devices(device_type))


def num_global_devices(device_type: str) -> int:
    return num_local_devices(device_type) * num_clients()


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
      device_type: used when `devices` is not given; default `preferred_device_type()`.
      use_xla_spmd: recorded in the mesh.

    Example:
      >>> mesh = create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    """
    if devices is None:
        devices = local_devices(device_type or preferred_device_type())
    device_names = [d.to_string() if hasattr(d, "to_string") else str(d) for d in devices]
    if mesh_dims is None:
        mesh_dims = [("x", len(device_names))]
    elif isinstance(mesh_dims, dict):
        mesh_dims = list(mesh_dims.items())
    names = [name for name, _ in mesh_dims]
    sizes = [int(size) for _, size in mesh_dims]
    total = int(np.prod(sizes)) if sizes else 1
    if total != len(device_names):
        raise MeshError(f"Mesh dims {list(mesh_dims)} hold {total} devices but "
                        f"{len(device_names)} devices were given; the product of the sizes must "
                        f"equal the number of devices.")
    ids = np.arange(total).reshape(sizes)
    return Mesh(names, ids, list(range(total)), device_names, mesh_name,
                use_xla_spmd=use_xla_spmd)


def create_distributed_mesh(mesh_dims: Union[List[Tuple[str, int]], Dict[str, int]],
                            mesh_name: str = "",
                            local_devices: Optional[List[Union[tf_device.DeviceSpec, str]]] = None,  # pylint: disable=redefined-outer-name
                            device_type: Optional[str] = None,
                            use_xla_spmd: bool = False) -> Mesh:
    """The multi-client form of `create_mesh`; with one client it equals `create_mesh`."""
    if num_clients() != 1:
        raise MeshError("create_distributed_mesh with several clients needs the multi-client "
                        "runtime, which this build does not start; run one client per mesh.")
    return create_mesh(mesh_dims, mesh_name, local_devices, device_type, use_xla_spmd)


def initialize_accelerator_system(device_type: Optional[str] = None,
                                  enable_coordination_service: Optional[bool] = True,
                                  num_logical_cpu_devices: Optional[int] = None,
                                  experimental_reset_context: Optional[bool] = False,
                                  experimental_enable_megcore: Optional[bool] = False) -> str:
    """Configures the local devices and registers the DTensor device; returns the device type.

    `num_logical_cpu_devices` splits the host CPU into that many virtual CPUs (before
    TensorFlow's runtime starts), which is how meshes of several CPUs run on one machine.
    """
    global _initialized_device_type
    del enable_coordination_service, experimental_enable_megcore
    if experimental_reset_context:
        context._reset_context()  # pylint: disable=protected-access
    device_type = (device_type or preferred_device_type()).upper()
    if num_logical_cpu_devices:
        cpu = tf.config.list_physical_devices("CPU")[0]
        if not context.context()._context_handle:  # pylint: disable=protected-access
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * num_logical_cpu_devices)
        elif len(tf.config.list_logical_devices("CPU")) != num_logical_cpu_devices:
            raise RuntimeError(
                f"TensorFlow's runtime already started with "
                f"{len(tf.config.list_logical_devices('CPU'))} CPUs; "
                f"`num_logical_cpu_devices={num_logical_cpu_devices}` must be set before any "
                f"TensorFlow op runs (or pass `experimental_reset_context=True`).")
    _device.get()
    _initialized_device_type = device_type
    return device_type


def shutdown_accelerator_system() -> None:
    """Ends the accelerator system started by `initialize_accelerator_system`."""
    global _initialized_device_type
    if _initialized_device_type is None:
        raise ValueError("The accelerator system is not initialized; call "
                         "`initialize_accelerator_system()` first.")
    _initialized_device_type = None


def barrier(mesh: Mesh, barrier_name: Optional[str] = None, timeout_in_ms: Optional[int] = None) -> None:
    """Waits until every device of `mesh` has finished the work queued before it.

    Sums one value per device with an all-reduce over the whole mesh and reads the result.
    """
    del barrier_name, timeout_in_ms
    from tf_dtensor import api  # pylint: disable=import-outside-toplevel
    from tf_dtensor.layout import Layout  # pylint: disable=import-outside-toplevel
    # One element per device: [n] sharded over every mesh dimension, via a [d0, d1, ...]
    # tensor sharded axis by axis.
    ones = api.call_with_layout(tf.ones, Layout(mesh.dim_names, mesh), shape=mesh.shape())
    total = tf.reduce_sum(ones)
    if int(total.numpy()) != mesh.size:
        raise RuntimeError(f"barrier on {mesh.short()} counted {int(total.numpy())} devices, "
                           f"expected {mesh.size}.")
