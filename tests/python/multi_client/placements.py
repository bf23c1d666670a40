"""One client of a multi-client run: the placements seed's flow across processes (as
`torchrun --nproc-per-node=N`): `init_device_mesh` over every client's devices,
`distribute_tensor`, `to_local` (this client's blocks), the all-gather check,
`from_local` of every rank's shard and `full_tensor`. Prints `OK placements`."""

import numpy as np
import tensorflow as tf

from tf_dtensor import dtensor
from tf_dtensor.placements import (Replicate, Shard, distribute_tensor, from_local,
                                   full_tensor, init_device_mesh, redistribute, to_local)

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, world = dtensor.client_id(), dtensor.num_global_devices("CPU")
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("x",))
assert mesh.size == world and mesh.num_local_devices() == 2

big = tf.random.stateless_normal([4 * world, 8], seed=[41, 0])
sharded = distribute_tensor(big, mesh, [Shard(dim=0)])
blocks = to_local(sharded)
assert len(blocks) == 2
for k, block in zip(mesh.local_device_ids(), blocks):
    np.testing.assert_allclose(block.numpy(), big.numpy()[4 * k:4 * k + 4], err_msg="to_local")
gathered = to_local(redistribute(sharded, [Replicate()]))
assert all(np.allclose(g.numpy(), big.numpy()) for g in gathered), "all-gather check"
print("Success!!!", me, flush=True)

# from_local: each rank passes its own shard (here: rank id filled blocks).
mine = [tf.fill([2, 3], float(k)) for k in mesh.local_device_ids()]
built = from_local(mine, mesh, [Shard(0)])
assert tuple(built.shape) == (2 * world, 3)
whole = full_tensor(built).numpy()
np.testing.assert_allclose(whole, np.repeat(np.arange(world, dtype=np.float32), 2)[:, None]
                           * np.ones([1, 3], np.float32))
dtensor.barrier(mesh, "placements-done", 60_000)
print("OK placements", me, flush=True)
