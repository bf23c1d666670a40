"""The DTensor overview guide, step by step, with tf_dtensor.

Every step of TensorFlow's "DTensor concepts" guide, with `from tf_dtensor import dtensor`
in place of `from tensorflow.experimental import dtensor`. Runs on 6 virtual CPUs:

    python examples/overview.py
"""

import tensorflow as tf

import tf_dtensor
from tf_dtensor import dtensor

print('TensorFlow version:', tf.__version__)


def configure_virtual_cpus(ncpu):
    phy_devices = tf.config.list_physical_devices('CPU')
    tf.config.set_logical_device_configuration(phy_devices[0], [
        tf.config.LogicalDeviceConfiguration(),
    ] * ncpu)


configure_virtual_cpus(6)
DEVICES = [f'CPU:{i}' for i in range(6)]
print(tf.config.list_logical_devices('CPU'))

print("\n## Mesh")
mesh_1d = dtensor.create_mesh([('x', 6)], devices=DEVICES)
print(mesh_1d)
mesh_2d = dtensor.create_mesh([('x', 3), ('y', 2)], devices=DEVICES)
print(mesh_2d)

print("\n## Layout")
layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh_1d)
print(layout)
layout = dtensor.Layout([dtensor.UNSHARDED, 'x'], mesh_1d)
print(layout)
layout = dtensor.Layout(['y', 'x'], mesh_2d)
print(layout)
layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2d)
print(layout)


def dtensor_from_array(arr, layout, shape=None, dtype=None):
    """Convert a DTensor from something that looks like an array or Tensor."""
    if shape is not None or dtype is not None:
        arr = tf.constant(arr, shape=shape, dtype=dtype)

    # replicate the input to the mesh
    a = dtensor.copy_to_mesh(arr, layout=dtensor.Layout.replicated(layout.mesh, rank=layout.rank))
    # shard the copy to the desirable layout
    return dtensor.relayout(a, layout=layout)


print("\n## Anatomy of a DTensor")
mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED], mesh)
my_first_dtensor = dtensor_from_array([0, 1], layout)
print(my_first_dtensor)
print("global shape:", my_first_dtensor.shape)
print("dtype:", my_first_dtensor.dtype)

print("\n## Layout and fetch_layout")
print(dtensor.fetch_layout(my_first_dtensor))
assert layout == dtensor.fetch_layout(my_first_dtensor)

print("\n## Component tensors, pack and unpack")
for component_tensor in dtensor.unpack(my_first_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)

packed_dtensor = dtensor.pack(
    [[0, 1], [0, 1], [0, 1],
     [0, 1], [0, 1], [0, 1]],
    layout=layout
)
print(packed_dtensor)

print("\n## Sharding a DTensor to a Mesh")
mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
fully_sharded_dtensor = dtensor_from_array(
    tf.reshape(tf.range(6), (3, 2)),
    layout=dtensor.Layout(["x", "y"], mesh))
for raw_component in dtensor.unpack(fully_sharded_dtensor):
    print("Device:", raw_component.device, ",", raw_component)

fully_replicated_dtensor = dtensor_from_array(
    tf.reshape(tf.range(6), (3, 2)),
    layout=dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh))
for component_tensor in dtensor.unpack(fully_replicated_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)

hybrid_sharded_dtensor = dtensor_from_array(
    tf.reshape(tf.range(6), (3, 2)),
    layout=dtensor.Layout(['x', dtensor.UNSHARDED], mesh))
for component_tensor in dtensor.unpack(hybrid_sharded_dtensor):
    print("Device:", component_tensor.device, ",", component_tensor)
tf_dtensor.debug.visualize(hybrid_sharded_dtensor)

print("\n## Tensor.numpy() and sharded DTensor")
print(fully_replicated_dtensor.numpy())
try:
    fully_sharded_dtensor.numpy()
except tf.errors.UnimplementedError:
    print("got an error as expected for fully_sharded_dtensor")
try:
    hybrid_sharded_dtensor.numpy()
except tf.errors.UnimplementedError:
    print("got an error as expected for hybrid_sharded_dtensor")

print("\n## DTensor as operands: fully replicated")
mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=layout)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=layout)
c = tf.matmul(a, b)  # runs 6 identical matmuls in parallel on 6 devices
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)
print("components:")
for component_tensor in dtensor.unpack(c):
    print(component_tensor.device, component_tensor.numpy())

print("\n## Sharding operands along the contracted axis")
mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
a_layout = dtensor.Layout([dtensor.UNSHARDED, 'x'], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=a_layout)
b_layout = dtensor.Layout(['x', dtensor.UNSHARDED], mesh)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=b_layout)
c = tf.matmul(a, b)
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)

print("\n## Additional sharding")
a_layout = dtensor.Layout(['y', 'x'], mesh)
a = dtensor_from_array([[1, 2, 3], [4, 5, 6]], layout=a_layout)
b_layout = dtensor.Layout(['x', dtensor.UNSHARDED], mesh)
b = dtensor_from_array([[6, 5], [4, 3], [2, 1]], layout=b_layout)
c = tf.matmul(a, b)
print('Sharding spec:', dtensor.fetch_layout(c).sharding_specs)
print("components:")
for component_tensor in dtensor.unpack(c):
    print(component_tensor.device, component_tensor.numpy())

print("\n## DTensor as output: one op")
help(dtensor.call_with_layout)
ones = dtensor.call_with_layout(tf.ones, dtensor.Layout(['x', 'y'], mesh), shape=(6, 4))
print(ones)

print("\n## DTensor as output: several ops in a tf.function")
ones = dtensor.call_with_layout(
    tf.function(tf.random.stateless_normal),
    dtensor.Layout(['x', 'y'], mesh),
    shape=(6, 4),
    seed=(1, 1))
print(ones)
ones = dtensor.call_with_layout(
    tf.function(tf.ones),
    dtensor.Layout(['x', 'y'], mesh),
    shape=(6, 4))
print(ones)

print("\n## From tf.Variable to dtensor.DVariable")
mesh = dtensor.create_mesh([("x", 6)], devices=DEVICES)
layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
v = dtensor.DVariable(
    initial_value=dtensor.call_with_layout(
        tf.function(tf.random.stateless_normal),
        layout=layout,
        shape=tf.TensorShape([64, 32]),
        seed=[1, 1],
        dtype=tf.float32))
print(v.handle)
assert layout == dtensor.fetch_layout(v)

a = dtensor.call_with_layout(tf.ones, layout=layout, shape=(64, 32))
b = v + a  # add DVariable and DTensor
print(b)

v.assign(a)  # assign a DTensor to a DVariable
print(a)

# variable's layout is immutable.
another_mesh = dtensor.create_mesh([("x", 3), ("y", 2)], devices=DEVICES)
b = dtensor.call_with_layout(tf.ones,
                             layout=dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], another_mesh),
                             shape=(64, 32))
try:
    v.assign(b)
except Exception as error:  # noqa: BLE001 -- the guide catches everything here
    print("exception raised")
    print("  ", type(error).__name__, str(error).splitlines()[0][:200])
