"""One client of a multi-client run: the training guide's data-parallel MLP step over a mesh
spanning every client (DVariables replicated, the batch sharded across clients), three
steps inside tf.function, the weights checked after each against the same steps on one
device with plain TensorFlow. Before the steps, every client estimates the step
(`debug.estimate`, in the same program order as a call): the estimate covers this client's
devices and plans exactly the collectives the first step then records. Prints `OK train`."""

import os

import numpy as np
import tensorflow as tf

from tf_dtensor import debug, dtensor

LOCAL = int(os.environ.get("TFD_TEST_LOCAL_CPUS", "2"))
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=LOCAL)
me, n = dtensor.client_id(), LOCAL * dtensor.num_clients()
mesh = dtensor.create_distributed_mesh([("batch", n)], device_type="CPU")

rng = np.random.RandomState(1)
sizes = [12, 16, 5]
inits = []
for i, o in zip(sizes[:-1], sizes[1:]):
    inits += [rng.uniform(-0.3, 0.3, (i, o)).astype(np.float32), np.zeros([o], np.float32)]
x_all = rng.rand(4 * n, sizes[0]).astype(np.float32)
y_all = rng.randint(0, sizes[-1], 4 * n).astype(np.int64)

variables = [dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(v),
                                                    dtensor.Layout.replicated(mesh, v.ndim)))
             for v in inits]
ids = list(mesh.local_device_ids())
x = dtensor.pack([x_all[4 * i:4 * i + 4] for i in ids], dtensor.Layout.batch_sharded(mesh, "batch", 2))
y = dtensor.pack([y_all[4 * i:4 * i + 4] for i in ids], dtensor.Layout.batch_sharded(mesh, "batch", 1))


def loss_of(params, xs, ys):
    h = xs
    for k in range(0, len(params), 2):
        h = tf.matmul(h, params[k]) + params[k + 1]
        if k + 2 < len(params):
            h = tf.nn.relu(h)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=h))


@tf.function
def step(xs, ys):
    with tf.GradientTape() as tape:
        loss = loss_of(variables, xs, ys)
    for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(0.5 * g)
    return loss


def without_line(records):
    return [(r.kind, r.reduction, r.mesh_dims, r.layout_in, r.shape, r.bytes_per_device, r.op)
            for r in records]


planned = debug.estimate(step, x, y)
local = sorted(d.rsplit("device:", 1)[-1] for d in mesh.local_devices())
assert sorted(planned.devices) == local, (planned.devices, local)
assert all(d.flops > 0 and d.argument_bytes > 0 for d in planned.devices.values()), planned
plain = [tf.Variable(v) for v in inits]
for k in range(3):
    with debug.collectives() as ledger:
        loss = step(x, y)
    if k == 0:
        assert without_line(planned.collectives) == without_line(ledger.records), (
            planned.table(), ledger.table())
        assert planned.ledger().count(kind="all-reduce", mesh_dim="batch") >= 1
    with tf.GradientTape() as tape:
        want = loss_of(plain, tf.constant(x_all), tf.constant(y_all))
    for v, g in zip(plain, tape.gradient(want, plain)):
        v.assign_sub(0.5 * g)
    for c in dtensor.unpack(loss):
        np.testing.assert_allclose(c.numpy(), want.numpy(), rtol=1e-5, err_msg=f"loss, step {k}")
    for v, p in zip(variables, plain):
        for c in dtensor.unpack(v.read_value()):
            np.testing.assert_allclose(c.numpy(), p.numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=f"weights after step {k}")
print("OK train", me, float(loss.numpy()) if hasattr(loss, "numpy") else "", flush=True)
