"""Shared pytest setup: 8 virtual CPUs, the standard meshes and the DTensor assertions.

The host CPU is split into 8 logical CPUs when this file is imported, before any test
touches the TensorFlow runtime; it can be done only once per process.
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

NUM_VIRTUAL_CPUS = 8


def _configure_virtual_cpus() -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured and len(configured) == NUM_VIRTUAL_CPUS:
        return
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_CPUS)


_configure_virtual_cpus()


def _configure_logical_gpus() -> None:
    """A visible GPU is split into 8 logical GPUs (1 GiB each), as TensorFlow's own DTensor
    tests do, for the `gpu` tests; TensorFloat-32 is turned off so float32 matmuls and
    convolutions compare with a float32 reference."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    memory = int(os.environ.get("TF_DTENSOR_TEST_GPU_MB", "1024"))
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory)] * NUM_VIRTUAL_CPUS)
    tf.config.experimental.enable_tensor_float_32_execution(False)


_configure_logical_gpus()

# Imported after the CPU split: the meshes below name CPU:0..CPU:7.
import dtensor_testing  # noqa: E402
from tf_dtensor import _device as dtensor_device  # noqa: E402
from tf_dtensor import dtensor  # noqa: E402


@pytest.fixture
def mesh_1d():
    """`x=2` over CPU:0, CPU:1."""
    return dtensor_testing.MESH_1D


@pytest.fixture
def mesh_2x2():
    """`x=2, y=2` over CPU:0..CPU:3 (first dimension outermost)."""
    return dtensor_testing.MESH_2X2


@pytest.fixture
def mesh_8():
    """`x=8` over CPU:0..CPU:7."""
    return dtensor_testing.MESH_8


@pytest.fixture
def lenient_mode():
    """Strict mode off for one test (ops without rule run replicated), whatever
    TF_DTENSOR_STRICT says; the previous mode is restored."""
    previous = dtensor_device.get().strict
    dtensor.set_strict_mode(False)
    try:
        yield
    finally:
        dtensor.set_strict_mode(previous)


@pytest.fixture
def strict_mode():
    """Turns strict mode on for one test and always turns it off again."""
    dtensor.set_strict_mode(True)
    try:
        yield
    finally:
        dtensor.set_strict_mode(False)
