"""The start every benchmark shares: quiet TensorFlow logs and 8 virtual CPUs.

Imported first by each script in `bench/` (they run on their own and import each other),
before either DTensor, because a CPU can be split only before TensorFlow's runtime starts.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF DTensor logs every SPMD cache miss.

import tensorflow as tf  # noqa: E402

N_DEVICES = 8
DEVICES = [f"CPU:{i}" for i in range(N_DEVICES)]

_cpu = tf.config.list_physical_devices("CPU")[0]
if len(tf.config.get_logical_device_configuration(_cpu) or []) != N_DEVICES:
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration()] * N_DEVICES)
