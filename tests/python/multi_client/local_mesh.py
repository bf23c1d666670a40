"""One client of a multi-client run: a mesh of this client's own devices by short names
("CPU:0" is this client's first CPU), and Keras across processes (every client's device
named distinctly; a DeviceMesh over several clients' devices refused, naming the fix).
Prints `OK local mesh <client>`."""

import numpy as np
import tensorflow as tf

from tf_dtensor import _cluster, dtensor

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
assert all(f"/task:{me}/" in d for d in mesh.local_devices()), mesh.local_devices()
t = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=[4])
np.testing.assert_array_equal(dtensor.unpack(tf.reduce_sum(t))[0].numpy(), 4.0)

import keras  # noqa: E402

devices = keras.distribution.list_devices()
assert len(set(devices)) == len(devices) == 2 * clients, devices
try:
    with keras.distribution.DataParallel(devices=devices).scope():
        keras.layers.Dense(2).build((None, 3))
    raise AssertionError("a Keras mesh over several clients was accepted")
except NotImplementedError as error:
    assert "several processes' devices" in str(error), error
with keras.distribution.DataParallel(devices=[d for d in devices if f"/task:{me}/" in d]).scope():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    assert dtensor.fetch_layout(layer.kernel.value).mesh.local_devices() == mesh.local_devices()
print(f"OK local mesh {me}", flush=True)
_cluster.barrier("local mesh test done", 60_000)
