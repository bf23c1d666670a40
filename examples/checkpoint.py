"""Checkpointing DVariables with `tf.train.Checkpoint`, on 6 virtual CPUs.

A model trained with its kernel sharded `[*,x]` over 6 devices is saved, then restored
into a model on a 2x3 mesh with another layout, and into a plain `tf.Variable`:

    python examples/checkpoint.py
"""

import tempfile

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 6)

from tf_dtensor import dtensor  # noqa: E402

DEVICES = [f"CPU:{i}" for i in range(6)]
mesh_1d = dtensor.create_mesh([("x", 6)], devices=DEVICES)
mesh_2d = dtensor.create_mesh([("x", 2), ("y", 3)], devices=DEVICES)


class Dense(tf.Module):
    def __init__(self, kernel_layout, bias_layout):
        super().__init__()
        self.kernel = dtensor.DVariable(tf.zeros([4, 6]), layout=kernel_layout)
        self.bias = dtensor.DVariable(tf.zeros([6]), layout=bias_layout)


source = Dense(dtensor.Layout([dtensor.UNSHARDED, "x"], mesh_1d), dtensor.Layout(["x"], mesh_1d))
kernel = np.random.default_rng(0).standard_normal([4, 6]).astype(np.float32)
source.kernel.assign(dtensor.copy_to_mesh(kernel, source.kernel.layout))
source.bias.assign(dtensor.copy_to_mesh(tf.range(6.0), source.bias.layout))

directory = tempfile.mkdtemp()
manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=source), directory, max_to_keep=2)
path = manager.save()
print("saved:", sorted(tf.train.load_checkpoint(path).get_variable_to_shape_map().items()))

# The same checkpoint, restored into another mesh and layout.
target = Dense(dtensor.Layout(["x", "y"], mesh_2d), dtensor.Layout.replicated(mesh_2d, 1))
tf.train.Checkpoint(model=target).restore(path).assert_consumed()
print("restored layout:", target.kernel.layout.short())
components = dtensor.unpack(target.kernel.read_value())
print("kernel block on CPU:0:", components[0].numpy().tolist())
assert np.array_equal(components[0].numpy(), kernel[:2, :2])

# ...and into a plain variable of the same shape.
plain = tf.Module()
plain.kernel = tf.Variable(tf.zeros([4, 6]))
plain.bias = tf.Variable(tf.zeros([6]))
tf.train.Checkpoint(model=plain).restore(path).assert_consumed()
print("plain bias:", plain.bias.numpy().tolist())
assert np.array_equal(plain.kernel.numpy(), kernel)
