"""What TensorFlow's own helpers and tests reach for beyond the public API: TensorFlow ops'
`layout=` arguments and `api._dtensor_device()` (issue 25, "Drop-in, part 2").

Each scenario runs under TensorFlow's DTensor and under tf_dtensor (see harness.py) and the
observations are compared. `api` is `tensorflow.dtensor.python.api` or `tf_dtensor.api`.
"""

from __future__ import annotations

import pytest

import harness

_SETUP = """
if IMPL == "tf":
    from tensorflow.dtensor.python import api
else:
    from tf_dtensor import api
mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4)])
xs = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
ys = dtensor.Layout([dtensor.UNSHARDED, "y"], mesh)
rep = dtensor.Layout.replicated(mesh, 2)

def L(tensor):
    layout = dtensor.fetch_layout(tensor)
    return {"specs": list(layout.sharding_specs), "mesh": layout.mesh}
"""

SCENARIOS = {
    "tf_ops_take_layout": _SETUP + """
for name, make in [
        ("ones", lambda: tf.ones([4, 2], layout=xs)),
        ("zeros", lambda: tf.zeros([4, 2], dtype=tf.int32, layout=ys)),
        ("fill", lambda: tf.fill([4, 2], 2.5, layout=xs)),
        ("ones_like", lambda: tf.ones_like(dtensor.call_with_layout(tf.ones, rep, [2, 2]),
                                           layout=ys)),
        ("zeros_like", lambda: tf.zeros_like(dtensor.call_with_layout(tf.ones, xs, [4, 2]),
                                             layout=rep))]:
    out = make()
    emit(name + "_layout", L(out))
    emit(name + "_components", dtensor.unpack(out))
""",
    "device_view_default_layout_and_mesh": _SETUP + """
device = api._dtensor_device()
with device._default_layout(xs):
    z = tf.zeros([4, 2])
emit("default_layout", L(z))
emit("default_layout_components", dtensor.unpack(z))
with device._experimental_default_mesh(mesh), tf.device(dtensor.device_name()):
    o = tf.ones([3])
emit("default_mesh", L(o))
packed = device.pack([tf.constant([1., 2.])] * 4, dtensor.Layout.replicated(mesh, 1))
emit("is_dtensor", device.is_dtensor(packed))
emit("fetch_layout", device.fetch_layout(packed))
emit("unpack", device.unpack(packed))
""",
    "device_view_stats_count_function_cache": _SETUP + """
api.reset_dtensor_device(is_async=False)
device = api._dtensor_device()
@tf.function
def double(t):
    return t * 2.0
t = dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))
first = dict(device._get_stats())
double(t)
after_one = dict(device._get_stats())
double(t)
after_two = dict(device._get_stats())
hit, miss = "function_manager.hit", "function_manager.miss"
emit("first_call_misses", after_one[miss] > first[miss])
emit("second_call_hits", after_two[hit] - after_one[hit] == 1)
emit("second_call_no_miss", after_two[miss] == after_one[miss])
emit("keys", sorted(k for k in after_two if k.startswith("function_manager.")))
""",
    # TensorFlow's tests match these errors by class and by a key phrase of the message.
    "eager_only_functions_raise_in_functions": _SETUP + """
t = dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))
for name, body in [("pack", lambda x: dtensor.pack([x] * 4, rep)),
                   ("unpack", lambda x: dtensor.unpack(x)),
                   ("fetch_layout", lambda x: dtensor.fetch_layout(x)),
                   ("is_dtensor", lambda x: dtensor.is_dtensor(x))]:
    try:
        tf.function(body)(t if name != "pack" else tf.ones([4, 2]))
        emit(name, "no error")
    except RuntimeError as error:
        emit(name, "must be called eagerly" in str(error))
""",
    "key_phrases_of_messages": _SETUP + """
t = dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))
try:
    dtensor.DVariable(t, layout=rep)
except tf.errors.InvalidArgumentError as error:
    emit("conflicting_layout", "Conflicting layout are provided" in str(error))
""",
    # TensorFlow keeps a Fourier transform's shardings (moved to other axes), not gathered.
    "fft_shardings_move": _SETUP + """
mesh3 = dtensor.create_mesh([("b", 2), ("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(8)])
U = dtensor.UNSHARDED
cases = [("fft", tf.signal.fft, [U, U, "y"]), ("fft2d", tf.signal.fft2d, [U, "x", "y"]),
         ("fft2d_b", tf.signal.fft2d, ["b", "x", "y"]), ("ifft2d", tf.signal.ifft2d, [U, "x", "y"]),
         ("ifft2d_last", tf.signal.ifft2d, [U, U, "x"]), ("fft3d", tf.signal.fft3d, ["b", "x", "y"])]
value = tf.complex(tf.reshape(tf.range(4 * 8 * 8, dtype=tf.float32), [4, 8, 8]) % 7, 1.0)
for name, fn, specs in cases:
    t = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh3, 3))
    t = dtensor.relayout(t, dtensor.Layout(specs, mesh3))
    for mode, run in (("eager", fn), ("function", tf.function(fn))):
        out = run(t)
        emit(name + "_" + mode, dtensor.fetch_layout(out).sharding_specs)
    emit(name + "_first_block", dtensor.unpack(out)[0])
""",
    # Microbatching: a loop's accumulator, started from zeros, keeps its terms' sharding.
    "loop_accumulator_stays_sharded": _SETUP + """
t = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x", "y"], mesh), shape=[4, 4])
@tf.function
def accumulate(a):
    acc = tf.zeros_like(a)
    for i in tf.range(3):
        acc += a * tf.cast(i, tf.float32)
    return acc
out = accumulate(t)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "cond_merges_branch_shardings": _SETUP + """
t = dtensor.call_with_layout(tf.ones, rep, shape=[4, 4])
@tf.function
def pick(a, p):
    return tf.cond(p, lambda: dtensor.relayout(a * 2.0, xs), lambda: dtensor.relayout(a * 3.0, ys))
for flag in (True, False):
    out = pick(t, tf.constant(flag))
    emit(f"layout_{flag}", L(out))
    emit(f"components_{flag}", dtensor.unpack(out))
""",
    "relayout_with_match": _SETUP + """
t = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x", "y"], mesh), shape=[4, 4])
match_first = dtensor.Layout([dtensor.MATCH, dtensor.UNSHARDED], mesh)
emit("specs", match_first.sharding_specs)
emit("eager", L(dtensor.relayout(t, match_first)))
out = tf.function(lambda a: dtensor.relayout(a * 2.0, dtensor.Layout([dtensor.UNSHARDED, dtensor.MATCH], mesh)))(t)
emit("function", L(out))
emit("components", dtensor.unpack(out))
""",
}

suite = harness.Suite(SCENARIOS)
# In a process of its own: TensorFlow's device keeps a default mesh that an earlier
# scenario's scope set.
no_mesh_suite = harness.Suite({"no_default_mesh": _SETUP + """
try:
    with tf.device(dtensor.device_name()):
        tf.ones([2]).numpy()
except tf.errors.InvalidArgumentError as error:
    emit("no_default_mesh", "No default mesh has been registered to DTensor" in str(error))
"""})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_as_tensorflow(name):
    suite.check(name)


def test_no_default_mesh_message_has_tensorflows_phrase():
    no_mesh_suite.check("no_default_mesh")


# TensorFlow's DTensor refuses `tf.ones_like(regular_tensor, layout=...)` ("OnesLike got a
# regular tensor ... but was expecting a DTensor"); tf_dtensor gives the DTensor asked for.
ours_only = harness.Suite({"like_of_a_regular_tensor": _SETUP + """
out = tf.ones_like(tf.constant([[1., 2.], [3., 4.]]), layout=ys)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
"""})


def test_like_ops_of_a_regular_tensor_take_layout():
    events = dict(ours_only.events("ours", "like_of_a_regular_tensor"))
    assert events["layout"]["specs"] == ["unsharded", "y"]
    assert [c["shape"] for c in events["components"]] == [[2, 1]] * 4
    assert all(c["values"] == [1.0, 1.0] for c in events["components"])
