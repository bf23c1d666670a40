"""One client of a multi-client run: DTensorDataset over a mesh spanning the clients
(batch sharded over "b" = every device, and a 2-D mesh with the batch over clients and
features over local devices). Each client reads only its share of each global batch; the
DTensors' global values (gathered across clients) are checked against the global batches
numpy makes, and a sharded sum over the batch checks the data each device got; then the
same inside tf.function (`next(iterator)` per step). Prints `OK dataset` and
`OK dataset functions`."""

import numpy as np
import tensorflow as tf

from tf_dtensor import dtensor

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
n = 2 * clients
U = dtensor.UNSHARDED
rows = np.arange(16 * n * 4, dtype=np.float32).reshape(16 * n, 4)
labels = np.arange(16 * n, dtype=np.int64)
data = tf.data.Dataset.from_tensor_slices((rows, labels))
batch = 4 * n

flat = dtensor.create_distributed_mesh([("b", n)], device_type="CPU")
grid = dtensor.create_distributed_mesh([("b", clients), ("f", 2)], device_type="CPU")
cases = [
    (flat, (dtensor.Layout(["b", U], flat), dtensor.Layout(["b"], flat))),
    (grid, (dtensor.Layout(["b", "f"], grid), dtensor.Layout(["b"], grid))),
]
for mesh, layouts in cases:
    dataset = dtensor.DTensorDataset(data, mesh=mesh, layouts=layouts, global_batch_size=batch,
                                     batch_dim="b")
    seen = 0
    for step, (x, y) in enumerate(dataset):
        assert dtensor.fetch_layout(x) == layouts[0] and x.shape == (batch, 4), (x.shape,)
        whole = dtensor.relayout(x, dtensor.Layout.replicated(mesh, 2))
        np.testing.assert_array_equal(dtensor.unpack(whole)[0].numpy(),
                                      rows[step * batch:(step + 1) * batch], err_msg=f"x {step}")
        total = tf.reduce_sum(y)  # an all-reduce across the clients
        assert int(dtensor.unpack(total)[0].numpy()) == labels[step * batch:(step + 1) * batch].sum()
        seen += 1
    assert seen == len(rows) // batch, seen
    # get_next_as_optional, eagerly: typed by this client's share, not the global batch.
    optional = iter(dataset).get_next_as_optional()
    assert bool(optional.has_value())
    assert int(dtensor.unpack(tf.reduce_sum(optional.get_value()[1]))[0].numpy()) == \
        labels[:batch].sum()
    print("dataset ok on", mesh.short(), me, flush=True)
dtensor.barrier(flat, "dataset done", 60_000)
print("OK dataset", me, flush=True)

# Inside tf.function: an iterator passed in, and a loop over the dataset.
for mesh, layouts in cases:
    dataset = dtensor.DTensorDataset(data, mesh=mesh, layouts=layouts, global_batch_size=batch,
                                     batch_dim="b")

    @tf.function
    def step(iterator):
        x, y = next(iterator)
        return tf.reduce_sum(x, axis=0), tf.reduce_sum(y)

    @tf.function
    def loop():
        total = tf.constant(0, tf.int64)
        for _, y in dataset:  # noqa: B023 -- the loop runs before `dataset` changes
            total += tf.reduce_sum(y)
        return total

    iterator = iter(dataset)
    for k in range(2):
        xs, ys = step(iterator)
        want = rows[k * batch:(k + 1) * batch]
        np.testing.assert_array_equal(
            dtensor.unpack(dtensor.relayout(xs, dtensor.Layout.replicated(mesh, 1)))[0].numpy(),
            want.sum(axis=0), err_msg=f"step {k} on {mesh.short()}")
        assert int(dtensor.unpack(ys)[0].numpy()) == labels[k * batch:(k + 1) * batch].sum()
    # Every client's loop reads its share of every batch; the sum is over all clients'.
    assert int(dtensor.unpack(loop())[0].numpy()) == labels.sum(), mesh.short()
    print("dataset in tf.function ok on", mesh.short(), me, flush=True)
dtensor.barrier(flat, "dataset in functions done", 60_000)
print("OK dataset functions", me, flush=True)
