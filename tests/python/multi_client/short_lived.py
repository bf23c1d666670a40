"""One client of a multi-client run (tests/python/test_multi_client.py): many short-lived
tf.functions on a mesh spanning the clients, which client 0 frees at once (and collects)
while the others keep them. Before each function's first run the clients compare what
they are about to run; that comparison once remembered the expansions it had made by
their address, so client 0, whose freed expansion's address came back, skipped a
comparison the others waited for (a hang in tests/python/multi_client/overview.py's
relayout loop, one run in twenty under load). Then more live functions than the
single-process cache holds, which must all stay cached; then the system shut down and
started again (another logical CPU count, or a reset of the eager context, refused).
Every result is checked against numpy.
Prints `OK short-lived` at the end."""

import gc

import numpy as np
import tensorflow as tf

from tf_dtensor import _device, dtensor

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
n = 2 * clients
mesh = dtensor.create_distributed_mesh([("x", n)], device_type="CPU")
a = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3)
layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
rows = a.shape[0] // n
t = dtensor.pack([a[d * rows:(d + 1) * rows] for d in mesh.local_device_ids()], layout)

kept = []
for step in range(16):
    f = tf.function(lambda v, k=step: tf.reduce_sum(v * (k + 1.0), axis=0))
    got = dtensor.unpack(f(t))[0].numpy()  # a sum over the sharded axis: an all-reduce
    np.testing.assert_allclose(got, a.sum(axis=0) * (step + 1), rtol=1e-6, err_msg=str(step))
    if me == 0:
        del f
        gc.collect()
    else:
        kept.append(f)

# More live functions than the single-process cache keeps (256): each client keeps every
# expansion on a mesh spanning the clients, so calling the first one again is a cache hit
# on each (an expansion made again would take instance keys the others do not).
mine = a[mesh.local_device_ids()[0] * rows:][:rows]  # this client's first block
many = [tf.function(lambda v, k=k: v * float(k)) for k in range(260)]
for k, g in enumerate(many):
    np.testing.assert_allclose(dtensor.unpack(g(t))[0].numpy(), mine * k, rtol=1e-6)
before = _device.get().function_cache_stats()
np.testing.assert_allclose(dtensor.unpack(many[0](t))[0].numpy(), 0 * mine)
after = _device.get().function_cache_stats()
assert (after["hit"] - before["hit"], after["miss"] - before["miss"]) == (1, 0), (before, after)

# The system shut down and started again in the same process: the cluster (whose server
# cannot be stopped) is kept, so the same configuration works again; another count of
# logical CPUs would need a new eager context and a second server, and is refused.
dtensor.shutdown_accelerator_system()
try:
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=3)
    raise AssertionError("another logical CPU count was accepted")
except ValueError as error:
    assert "start a new process" in str(error), error
# Nor a reset of the eager context: it would start the server again on its port (once
# "Could not start gRPC server", with the process's context gone).
try:
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2,
                                          experimental_reset_context=True)
    raise AssertionError("a context reset in a client was accepted")
except ValueError as error:
    assert "experimental_reset_context" in str(error) and "start a new process" in str(error)
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
mesh = dtensor.create_distributed_mesh([("x", n)], device_type="CPU")
layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
t = dtensor.pack([a[d * rows:(d + 1) * rows] for d in mesh.local_device_ids()], layout)
total = dtensor.unpack(tf.reduce_sum(t, axis=0))[0].numpy()
np.testing.assert_allclose(total, a.sum(axis=0), rtol=1e-6)

dtensor.barrier(mesh, "short-lived-done", 60_000)
print("OK short-lived", me, flush=True)
