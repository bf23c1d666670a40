"""PyTorch's DTensor walk-through with placements, on 4 virtual CPUs.

Every flow of "PyTorch DTensor explained" in tf_dtensor: the all-gather check, row-wise,
column-wise and replicated placements on a 1-D mesh, `[Replicate(), Shard(0)]` on a 2x2
mesh, `from_local`, the `redistribute` chain, `distribute_module` on a two-layer module,
and Partial -> Replicate / Partial -> Shard. Each check prints `ok: ...`:

    python examples/placements.py
"""

import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

from tf_dtensor import debug  # noqa: E402
from tf_dtensor.placements import (Partial, Replicate, Shard, distribute_module,  # noqa: E402
                                   distribute_parameter, distribute_tensor, from_local,
                                   full_tensor, init_device_mesh, named_parameters,
                                   placements_of, redistribute, to_local)


def check(what: str, condition: bool) -> None:
    print(f"ok: {what}" if condition else f"FAILED: {what}")
    if not condition:
        sys.exit(1)


def same(a, b) -> bool:
    return bool(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5))


# --- The all-gather check: shard a big tensor, gather the shards, compare -------------
mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
big_tensor = tf.random.stateless_normal([100000, 88], seed=[41, 0])
my_dtensor = distribute_tensor(big_tensor, mesh, [Shard(dim=0)])
for idx, block in enumerate(to_local(my_dtensor)):
    print(f"cur rank: {idx} holds a block of shape {block.shape.as_list()}")
# The all-gather: redistribute to Replicate() gathers every block on every device.
gathered = to_local(redistribute(my_dtensor, [Replicate()]))
if all(same(res, big_tensor) for res in gathered):
    print("Success!!!")
else:
    print(gathered[0], big_tensor)
    print("Exist bug!!!")
    sys.exit(1)

# --- Row-wise, column-wise and replicated placements on a 1-D mesh ---------------------
big_tensor = tf.random.stateless_normal([888, 12], seed=[0, 1])
rowwise_placement = [Shard(0)]
colwise_placement = [Shard(1)]
replica_placement = [Replicate()]
rowwise_tensor = distribute_tensor(big_tensor, mesh, rowwise_placement)
colwise_tensor = distribute_tensor(big_tensor, mesh, colwise_placement)
replica_tensor = distribute_tensor(big_tensor, mesh, replica_placement)
check("row-wise: 4 blocks of [222, 12]",
      [b.shape.as_list() for b in to_local(rowwise_tensor)] == [[222, 12]] * 4)
check("column-wise: 4 blocks of [888, 3]",
      [b.shape.as_list() for b in to_local(colwise_tensor)] == [[888, 3]] * 4)
check("replicated: every device holds the whole [888, 12]",
      all(same(b, big_tensor) for b in to_local(replica_tensor)))
check("placements_of(rowwise_tensor) == (Shard(0),)",
      placements_of(rowwise_tensor) == (Shard(0),))
check("full_tensor of each is the original",
      all(same(full_tensor(t), big_tensor)
          for t in (rowwise_tensor, colwise_tensor, replica_tensor)))

# Uneven: 5 rows over 4 devices are cut like torch.chunk (2, 2, 1, 0); a mean is right.
uneven = distribute_tensor(tf.range(5.0), mesh, [Shard(0)])
check("uneven Shard(0) of 5 rows: blocks of 2, 2, 1, 0",
      [int(b.shape[0]) for b in to_local(uneven)] == [2, 2, 1, 0])
check("mean over uneven blocks is 2.0", same(full_tensor(tf.reduce_mean(uneven)), 2.0))

# --- Sharding and replication together on a 2x2 mesh -----------------------------------
mesh_2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
spec = [Replicate(), Shard(0)]  # replicate over x, shard axis 0 over y
partial_replica = distribute_tensor(big_tensor, mesh_2d, spec)
debug.visualize(partial_replica)
blocks = to_local(partial_replica)
check("[Replicate(), Shard(0)] on 2x2: blocks of [444, 12]",
      [b.shape.as_list() for b in blocks] == [[444, 12]] * 4)
check("[Replicate(), Shard(0)]: devices (0, y) and (1, y) hold the same rows",
      same(blocks[0], blocks[2]) and same(blocks[1], blocks[3])
      and same(tf.concat(blocks[:2], 0), big_tensor))

# --- from_local, then the redistribute chain -------------------------------------------
local_tensor = tf.random.stateless_normal([8, 8], seed=[2, 3])
rowwise_tensor = from_local(local_tensor, mesh, rowwise_placement)
check("from_local: one [8, 8] block per device makes a [32, 8] tensor",
      rowwise_tensor.shape.as_list() == [32, 8]
      and same(full_tensor(rowwise_tensor), tf.tile(local_tensor, [4, 1])))
colwise_tensor = redistribute(rowwise_tensor, colwise_placement)
replica_tensor = redistribute(colwise_tensor, replica_placement)
check("redistribute: Shard(0) -> Shard(1) -> Replicate() keeps the value",
      placements_of(colwise_tensor) == (Shard(1),)
      and placements_of(replica_tensor) == (Replicate(),)
      and [b.shape.as_list() for b in to_local(colwise_tensor)] == [[32, 2]] * 4
      and same(full_tensor(replica_tensor), full_tensor(rowwise_tensor)))
with tf.GradientTape() as tape:
    tape.watch(local_tensor)
    loss = tf.reduce_sum(redistribute(from_local(local_tensor, mesh, [Shard(0)]),
                                      [Replicate()]) * 2.0)
check("gradients flow through from_local and redistribute (4 blocks x 2.0)",
      same(tape.gradient(loss, local_tensor), tf.fill([8, 8], 8.0)))


# --- distribute_module on the two-layer module ------------------------------------------
class Linear(tf.Module):
    """PyTorch's nn.Linear: weight [out, in], y = x @ weight^T + bias."""

    def __init__(self, n_in, n_out, seed):
        super().__init__()
        self.weight = tf.Variable(tf.random.stateless_normal([n_out, n_in], seed=[seed, 0]))
        self.bias = tf.Variable(tf.random.stateless_normal([n_out], seed=[seed, 1]))

    def __call__(self, x):
        return tf.matmul(x, self.weight, transpose_b=True) + self.bias


class MyModule(tf.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = Linear(8, 8, seed=1)
        self.fc2 = Linear(8, 8, seed=2)

    def __call__(self, x):
        return tf.nn.relu(self.fc1(x) + self.fc2(x))


def shard_params(mod_name, mod, mesh):
    col_linear_placement = [Shard(0)]
    # shard fc1 and fc2
    if isinstance(mod, Linear):
        for name, _ in named_parameters(mod, recurse=False):
            distribute_parameter(mod, name, mesh, col_linear_placement)


x = tf.random.stateless_normal([4, 8], seed=[5, 5])
expected = MyModule()(x)
sharded_module = distribute_module(MyModule(), mesh, partition_fn=shard_params)
check("distribute_module: fc1/fc2 weights are Shard(0) DVariables",
      placements_of(sharded_module.fc1.weight) == (Shard(0),)
      and placements_of(sharded_module.fc2.bias) == (Shard(0),))
check("distribute_module: same output as unsharded", same(full_tensor(sharded_module(x)),
                                                          expected))

# --- Partial -> Replicate and Partial -> Shard -------------------------------------------
terms = [tf.fill([4, 2], float(i + 1)) for i in range(4)]  # device i holds i + 1
pending = from_local(terms, mesh, [Partial()])
debug.visualize(pending)
check("Partial(): the value is the sum of the terms (1 + 2 + 3 + 4)",
      same(full_tensor(pending), tf.fill([4, 2], 10.0)))
replicated = redistribute(pending, [Replicate()])
check("Partial -> Replicate: an all-reduce; every device holds 10",
      all(same(b, tf.fill([4, 2], 10.0)) for b in to_local(replicated)))
scattered = redistribute(pending, [Shard(0)])
check("Partial -> Shard(0): a reduce-scatter; each device holds one summed row",
      [b.shape.as_list() for b in to_local(scattered)] == [[1, 2]] * 4
      and same(full_tensor(scattered), tf.fill([4, 2], 10.0)))
mean = redistribute(from_local(terms, mesh, [Partial("mean")]), [Replicate()])
check("Partial('mean') -> Replicate: 2.5", same(full_tensor(mean), tf.fill([4, 2], 2.5)))
print("all placement flows ran")
