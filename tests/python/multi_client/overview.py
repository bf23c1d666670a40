"""One client of a multi-client run (tests/python/test_multi_client.py starts it through
`tf_dtensor.launch`): the overview's steps on a mesh spanning every client, each sharded
result checked against numpy on the whole values, which every client can make (seeded).
Prints `OK overview` at the end; any mismatch raises."""

import os

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from tf_dtensor import dtensor

LOCAL = int(os.environ.get("TFD_TEST_LOCAL_CPUS", "2"))
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=LOCAL)
me, clients = dtensor.client_id(), dtensor.num_clients()
n = LOCAL * clients
assert dtensor.num_global_devices("CPU") == n
assert dtensor.local_devices("CPU")[0].task == me
mesh = dtensor.create_distributed_mesh([("x", n)], device_type="CPU")
assert mesh.num_local_devices() == LOCAL and mesh.size == n
assert list(mesh.local_device_ids()) == list(range(me * LOCAL, me * LOCAL + LOCAL))

rng = np.random.RandomState(0)
a = rng.rand(2 * n, n).astype(np.float32)
b = rng.rand(n, 2 * n).astype(np.float32)
X, R = "x", dtensor.UNSHARDED


def place(value, specs, on=mesh):
    """`value` laid out as `specs`: this client's components, cut from the whole value."""
    layout = dtensor.Layout(specs, on)
    return dtensor.pack(_blocks(value, layout), layout)


def _blocks(value, layout):
    on = layout.mesh
    blocks = []
    for device_id in on.local_device_ids():
        coords = on.device_location(device_id)
        index = []
        for axis, spec in enumerate(layout.sharding_specs):
            if spec == R:
                index.append(slice(None))
                continue
            parts = on.dim_size(spec)
            k = coords[on.dim_names.index(spec)]
            size = value.shape[axis] // parts
            index.append(slice(k * size, (k + 1) * size))
        blocks.append(value[tuple(index)])
    return blocks


def whole(t):
    """The global value of a DTensor whose layout is replicated: every local component."""
    parts = [c.numpy() for c in dtensor.unpack(t)]
    for p in parts[1:]:
        np.testing.assert_allclose(p, parts[0], rtol=1e-5)
    return parts[0]


def check_local(t, expected, specs, what):
    """Each local component equals its block of `expected`."""
    layout = dtensor.fetch_layout(t)
    assert list(layout.sharding_specs) == list(specs), (what, layout)
    assert tuple(t.shape) == expected.shape, (what, t.shape, expected.shape)
    for got, want in zip(dtensor.unpack(t), _blocks(expected, layout)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=what)


# pack/unpack: this client's components; the global shape.
ta = place(a, [X, R])
assert tuple(ta.shape) == a.shape
assert len(dtensor.unpack(ta)) == LOCAL
check_local(ta, a, [X, R], "pack")

# Elementwise, then a sum over the sharded axis (an all-reduce across clients), eagerly
# and inside tf.function.
check_local(ta * 2 + 1, a * 2 + 1, [X, R], "elementwise")
np.testing.assert_allclose(whole(tf.reduce_sum(ta, axis=0)), a.sum(axis=0), rtol=1e-5)
f = tf.function(lambda t: tf.reduce_sum(tf.sin(t), axis=0))
np.testing.assert_allclose(whole(f(ta)), np.sin(a).sum(axis=0), rtol=1e-5)

# A matmul contracting a sharded axis: partial sums all-reduced across clients.
tb = place(b, [R, X])
tat = place(a.T.copy(), [R, X])
mm = tf.function(lambda p, q: tf.matmul(p, q, transpose_b=True))
np.testing.assert_allclose(whole(mm(tat, tat)), a.T @ a, rtol=1e-4)
np.testing.assert_allclose(whole(tf.matmul(tat, tat, transpose_b=True)), a.T @ a, rtol=1e-4)
check_local(tf.matmul(ta, b), a @ b, [X, R], "row-parallel matmul")

# Every relayout transition on the 1-D mesh: all-gather, all-to-all, slicing.
for src, dst in (([X, R], [R, R]), ([X, R], [R, X]), ([R, X], [X, R]), ([R, R], [X, R]),
                 ([R, R], [R, X])):
    t = place(a, src)
    check_local(dtensor.relayout(t, dtensor.Layout(dst, mesh)), a, dst, f"relayout {src}->{dst}")
    g = tf.function(lambda v, dst=dst: dtensor.relayout(v, dtensor.Layout(dst, mesh)))
    check_local(g(t), a, dst, f"relayout {src}->{dst} in tf.function")

# A 2-D mesh: clients along x, each client's devices along y.
mesh2 = dtensor.create_distributed_mesh([("x", clients), ("y", LOCAL)], device_type="CPU")
c = rng.rand(2 * clients * LOCAL, 2 * clients * LOCAL).astype(np.float32)
tc = place(c, ["x", "y"], mesh2)
check_local(dtensor.relayout(tc, dtensor.Layout(["y", "x"], mesh2)), c, ["y", "x"], "[x,y]->[y,x]")
check_local(dtensor.relayout(tc, dtensor.Layout([R, "y"], mesh2)), c, [R, "y"], "[x,y]->[*,y]")
np.testing.assert_allclose(whole(tf.reduce_sum(tc)), c.sum(), rtol=1e-4)
s = tf.reduce_sum(tc, axis=0)  # over x: across clients; stays sharded over y
check_local(s, c.sum(axis=0), ["y"], "sum over x")

# The clients' program check keeps a few epochs of keys in the coordination service's
# key-value store, not one key per checked step: after 48 more eager all-reduces (checked
# steps), the first step's key is gone.
for _ in range(48):
    tf.reduce_sum(ta)
try:
    context.context().get_config_key_value(
        "tf_dtensor/program/" + "_".join(str(c) for c in range(clients)) + f"/0/0/{me}",
        timeout_in_ms=100)
    raise AssertionError("the program check's first key is still held")
except tf.errors.DeadlineExceededError:
    pass

dtensor.barrier(mesh, "overview-done", 60_000)
print("OK overview", me, flush=True)
