"""`from tf_dtensor import dtensor`: the names of `tf.experimental.dtensor` for one client."""

from __future__ import annotations

from tf_dtensor.api import (barrier, call_with_layout, check_layout, copy_to_mesh,
                            default_mesh, device_name, fetch_layout, get_default_mesh,
                            is_dtensor, pack, relayout, relayout_like, run_on, set_strict_mode,
                            unpack)
from tf_dtensor._dataset import DTensorDataset
from tf_dtensor._save_restore import (enable_save_as_bf16, name_based_restore, name_based_save,
                                      sharded_save)
from tf_dtensor.checkpoint import DTensorCheckpoint
from tf_dtensor.config import (client_id, create_distributed_mesh, create_mesh,
                               create_tpu_mesh, full_job_name, heartbeat_enabled,
                               initialize_accelerator_system, initialize_multi_client,
                               initialize_tpu_system, job_name, jobs, local_devices,
                               num_clients, num_global_devices, num_local_devices,
                               preferred_device_type, shutdown_accelerator_system,
                               shutdown_tpu_system)
from tf_dtensor.layout import MATCH, UNSHARDED, Layout, LayoutType
from tf_dtensor.mesh import Mesh
from tf_dtensor.variable import DVariable

# `LayoutType` is reachable as `dtensor.LayoutType` (TF keeps it in
# tensorflow.dtensor.python.layout, like our tf_dtensor.layout) but stays out of `__all__`,
# which lists exactly tf.experimental.dtensor's names.
__all__ = [
    "DTensorCheckpoint", "DTensorDataset", "DVariable", "Layout", "MATCH", "Mesh", "UNSHARDED",
    "barrier",
    "call_with_layout", "check_layout", "client_id", "copy_to_mesh", "create_distributed_mesh",
    "create_mesh", "create_tpu_mesh", "default_mesh", "device_name", "fetch_layout",
    "full_job_name", "get_default_mesh", "heartbeat_enabled", "initialize_accelerator_system",
    "initialize_multi_client", "initialize_tpu_system", "is_dtensor", "job_name", "jobs",
    "local_devices", "num_clients", "num_global_devices", "num_local_devices", "pack",
    "preferred_device_type", "relayout", "relayout_like", "run_on", "set_strict_mode",
    "shutdown_accelerator_system", "shutdown_tpu_system", "unpack",
    "enable_save_as_bf16", "name_based_restore", "name_based_save", "sharded_save",
]
