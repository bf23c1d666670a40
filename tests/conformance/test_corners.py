"""Behaviour in the corners that code written for TensorFlow's DTensor relies on.

Each scenario runs once under `tensorflow.experimental.dtensor` and once under tf_dtensor
(see harness.py) and the observations are compared: values, layouts and error classes.
"""

from __future__ import annotations

import pytest

import harness

_MESHES = """
mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4)])
mesh_1d = dtensor.create_mesh([("x", 2)], devices=["CPU:4", "CPU:5"], mesh_name="other")
xs = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
rep = dtensor.Layout.replicated(mesh, 2)

def L(tensor):
    # Sharding specs and mesh only: `Layout.type` is compared by the layout scenarios.
    layout = dtensor.fetch_layout(tensor)
    return None if layout is None else {"specs": list(layout.sharding_specs), "mesh": layout.mesh}
"""

SCENARIOS = {
    # --- nested scopes ---
    "nested_default_meshes": _MESHES + """
emit("outside", dtensor.get_default_mesh())
with dtensor.default_mesh(mesh):
    emit("outer", dtensor.get_default_mesh())
    with dtensor.default_mesh(mesh_1d):
        emit("inner", dtensor.get_default_mesh())
        emit("inner_layout", L(tf.ones([2]) + 1.0))
    emit("outer_again", dtensor.get_default_mesh())
    emit("outer_layout", L(tf.ones([2, 2])))
emit("after", dtensor.get_default_mesh())
""",
    "nested_call_with_layout_in_default_mesh": _MESHES + """
x1 = dtensor.Layout(["x"], mesh_1d)
with dtensor.default_mesh(mesh):
    out = dtensor.call_with_layout(tf.ones, x1, shape=(4,))
    emit("mesh_during", dtensor.get_default_mesh())
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "nested_call_with_layout_in_call_with_layout": _MESHES + """
def outer():
    inner = dtensor.call_with_layout(tf.ones, rep, shape=(4, 2))
    return inner * 2.0
out = dtensor.call_with_layout(outer, xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    # --- call_with_layout of raw generated ops and of functions without DTensor inputs ---
    "cwl_gen_fill": _MESHES + """
from tensorflow.python.ops import gen_array_ops
out = dtensor.call_with_layout(gen_array_ops.fill, xs, dims=[4, 2], value=2.5)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "cwl_stateless_uniform_replicated": _MESHES + """
out = dtensor.call_with_layout(tf.random.stateless_uniform, rep, shape=[4, 2], seed=[1, 2])
emit("layout", L(out))
emit("value", dtensor.unpack(out)[0])
emit("single_device", tf.random.stateless_uniform([4, 2], seed=[1, 2]))
""",
    "cwl_zeros_with_dtype": _MESHES + """
out = dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2), dtype=tf.int32)
emit("layout", L(out))
emit("dtype", out.dtype)
emit("components", dtensor.unpack(out))
""",
    "cwl_ones_positional_shape": _MESHES + """
out = dtensor.call_with_layout(tf.ones, xs, [4, 6], tf.float64)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "cwl_none_layout_is_a_plain_call": _MESHES + """
out = dtensor.call_with_layout(tf.ones, None, shape=(2,))
emit("is_dtensor", dtensor.is_dtensor(out))
emit("value", out)
""",
    "cwl_inside_tf_function": _MESHES + """
@tf.function
def make():
    return dtensor.call_with_layout(tf.ones, xs, shape=(4, 2)) * 3.0
with dtensor.default_mesh(mesh):
    out = make()
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "default_mesh_of_a_non_mesh": """
with dtensor.default_mesh("not a mesh"):
    pass
""",
    "relayout_of_constants_in_tf_function": _MESHES + """
@tf.function
def make():
    return (dtensor.relayout(tf.zeros([4, 2]), xs),
            dtensor.relayout(tf.constant([[1.0, 2.0], [3.0, 4.0]]), xs))
with dtensor.default_mesh(mesh):
    zeros, pair = make()
for name, out in [("zeros", zeros), ("pair", pair)]:
    emit(name + "_layout", L(out))
    emit(name, dtensor.unpack(out))
""",
    # --- fetch_layout / check_layout / is_dtensor of odd inputs ---
    "fetch_layout_of_a_list": "emit('layout', dtensor.fetch_layout([1.0, 2.0]))",
    "fetch_layout_of_numpy": "emit('layout', dtensor.fetch_layout(np.zeros([2])))",
    "fetch_layout_of_none": "emit('layout', dtensor.fetch_layout(None))",
    "fetch_layout_of_a_regular_tensor": "emit('layout', dtensor.fetch_layout(tf.zeros([2])))",
    "fetch_layout_of_python_scalars": """
emit("int", dtensor.fetch_layout(3))
emit("string", dtensor.fetch_layout("x"))
""",
    "fetch_layout_of_a_tf_variable": "dtensor.fetch_layout(tf.Variable(1.0))",
    "fetch_layout_in_tf_function": "tf.function(lambda: dtensor.fetch_layout(tf.ones([2])))()",
    "check_layout_of_none": _MESHES + "dtensor.check_layout(None, xs)",
    "check_layout_of_a_list": _MESHES + "dtensor.check_layout([1.0, 2.0], xs)",
    "fetch_layout_of_a_dvariable": _MESHES + """
v = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2)))
emit("layout", L(v))
""",
    "check_layout_mismatch": _MESHES + """
t = dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2))
dtensor.check_layout(t, xs)
emit("same", True)
dtensor.check_layout(t, rep)
""",
    "check_layout_of_a_regular_tensor": _MESHES + "dtensor.check_layout(tf.zeros([4, 2]), xs)",
    "is_dtensor_of_odd_inputs": _MESHES + """
t = dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2))
for name, value in [("none", None), ("int", 3), ("list", [1, 2]), ("numpy", np.zeros(2)),
                    ("string", "x"), ("tensor", tf.zeros([2])), ("variable", tf.Variable(1.0)),
                    ("dtensor", t), ("dvariable", dtensor.DVariable(t))]:
    emit(name, dtensor.is_dtensor(value))
""",
    # --- relayout / copy_to_mesh errors ---
    "relayout_rank_mismatch": _MESHES + """
t = dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2))
dtensor.relayout(t, dtensor.Layout(["x"], mesh))
""",
    "relayout_of_a_list": _MESHES + """
out = dtensor.relayout([[1.0, 2.0], [3.0, 4.0]], xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "copy_to_mesh_rank_mismatch": _MESHES + "dtensor.copy_to_mesh(tf.zeros([4]), xs)",
    # --- pack / unpack errors ---
    "pack_wrong_component_count": _MESHES + "dtensor.pack([tf.zeros([2, 2])] * 3, xs)",
    "pack_mismatched_shapes": _MESHES + """
dtensor.pack([tf.zeros([2, 2])] * 3 + [tf.zeros([3, 2])], xs)
""",
    "pack_mismatched_dtypes": _MESHES + """
dtensor.pack([tf.zeros([2, 2])] * 3 + [tf.zeros([2, 2], tf.int32)], xs)
""",
    "pack_rank_mismatch": _MESHES + "dtensor.pack([tf.zeros([4])] * 4, xs)",
    "unpack_of_a_regular_tensor": "dtensor.unpack(tf.zeros([2]))",
    "unpack_of_a_list": "dtensor.unpack([1.0, 2.0])",
    "unpack_of_none": "dtensor.unpack(None)",
    "relayout_of_none": _MESHES + "dtensor.relayout(None, xs)",
    "pack_in_tf_function": _MESHES + """
tf.function(lambda: dtensor.pack([tf.zeros([2, 2])] * 4, xs))()
""",
    "copy_to_mesh_of_a_dtensor": _MESHES + """
t = dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))
out = dtensor.copy_to_mesh(t, rep)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "pack_unpack_in_tf_function": _MESHES + """
t = dtensor.call_with_layout(tf.zeros, xs, shape=(4, 2))
tf.function(lambda: dtensor.unpack(t))()
""",
    # --- asynchronous execution ---
    "async_execution": _MESHES + """
from tensorflow.python.eager import context
tf.config.experimental.set_synchronous_execution(False)
try:
    a = dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))
    b = tf.reduce_sum(a * 3.0, axis=0)
    c = dtensor.relayout(a + 1.0, rep)
    context.async_wait()
    emit("sum", b)
    emit("sum_layout", L(b))
    emit("relayout", dtensor.unpack(c)[3])
finally:
    tf.config.experimental.set_synchronous_execution(True)
emit("after", tf.reduce_sum(dtensor.call_with_layout(tf.ones, xs, shape=(4, 2))))
""",
}

# Where TensorFlow's DTensor is wrong: these run on both (the reference's answer is checked
# too, so a fixed TensorFlow shows up here) and tf_dtensor's answer is asserted.
OURS_ONLY = {
    # TF's DTensor refuses an axis that the mesh does not divide (3 rows over x=2); ours
    # cuts it like torch.chunk: 2 rows, then 1.
    "relayout_indivisible": _MESHES + """
out = dtensor.relayout(tf.reshape(tf.range(6.0), [3, 2]), xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    "copy_to_mesh_indivisible": _MESHES + """
out = dtensor.copy_to_mesh(tf.reshape(tf.range(6.0), [3, 2]), xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    # TF's DTensor fails (UnknownError from its SPMD expansion) to move a sharded tensor to
    # another mesh; ours gathers it, hands it over and slices it there.
    "relayout_across_meshes": _MESHES + """
t = dtensor.copy_to_mesh(tf.reshape(tf.range(8.0), (4, 2)), xs)
moved = dtensor.relayout(t, dtensor.Layout(["x", dtensor.UNSHARDED], mesh_1d))
emit("layout", L(moved))
emit("components", dtensor.unpack(moved))
""",
    # TF's default-mesh scope has no try/finally: an exception in the body leaves the mesh
    # set for the rest of the process. Ours restores the enclosing mesh.
    "default_mesh_restored_after_an_error": _MESHES + """
try:
    with dtensor.default_mesh(mesh):
        raise KeyError("boom")
except KeyError:
    pass
emit("after", dtensor.get_default_mesh())
emit("plain", dtensor.is_dtensor(tf.ones([2]) + 1.0))
""",
    # A function whose ops have no DTensor input: TF refuses to broadcast the [4,2]
    # constant (UnimplementedError); ours replicates it and slices the result.
    "cwl_function_of_constants": _MESHES + """
def build():
    return tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]) * 2.0 + 1.0
out = dtensor.call_with_layout(build, xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    # TF gives the rank-2 default layout to tf.range's rank-1 output (UnknownError).
    "cwl_function_of_range": _MESHES + """
out = dtensor.call_with_layout(lambda: tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]), xs)
emit("layout", L(out))
emit("components", dtensor.unpack(out))
""",
    # TF refuses stateful random ops ("not supported in DTensor", UnknownError); ours runs
    # them per device with the op's seeds, so replicas of one block agree.
    "cwl_gen_random_uniform": _MESHES + """
from tensorflow.python.ops import gen_random_ops
out = dtensor.call_with_layout(gen_random_ops.random_uniform, xs, shape=[8, 4],
                               dtype=tf.float32, seed=1, seed2=2)
emit("layout", L(out))
emit("shape", out.shape)
emit("components", dtensor.unpack(out))
""",
    # Sharded stateless random: TF fails (its default layout reaches the rank-1 seed
    # tensors, UnknownError); ours gives the single-device value, sliced.
    "cwl_stateless_normal_sharded": _MESHES + """
out = dtensor.call_with_layout(tf.random.stateless_normal, xs, shape=[4, 2], seed=[3, 4])
emit("layout", L(out))
emit("components", dtensor.unpack(out))
emit("single_device", tf.random.stateless_normal([4, 2], seed=[3, 4]))
""",
    # TF crashes the process (segmentation fault) on an empty list.
    "pack_no_components": _MESHES + "dtensor.pack([], xs)",
}

# Client queries under TensorFlow's environment variables; they run before anything starts
# TensorFlow's runtime (one process per library).
_ENV = """
import os
def attempt(key, fn):
    try:
        emit(key, fn())
    except Exception as error:  # the class is what is compared
        emit(key + "_error", type(error).__name__)
def under(env, keys):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for key in keys:
            attempt(key, getattr(dtensor, key))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
"""
_QUERIES = ["jobs", "num_clients", "client_id", "job_name", "full_job_name",
            "heartbeat_enabled"]

CONFIG_SCENARIOS = {
    "env_unset": _ENV + """
under({}, _QUERIES)
attempt("full_job_name_0", lambda: dtensor.full_job_name(0))
attempt("full_job_name_1", lambda: dtensor.full_job_name(1))
attempt("local_devices", lambda: [d.to_string() for d in dtensor.local_devices("cpu")])
attempt("local_devices_xpu", lambda: dtensor.local_devices("XPU"))
attempt("num_local_cpu", lambda: dtensor.num_local_devices("CPU"))
attempt("num_local_gpu", lambda: dtensor.num_local_devices("GPU"))
attempt("num_local_tpu", lambda: dtensor.num_local_devices("TPU"))
attempt("num_global_cpu", lambda: dtensor.num_global_devices("CPU"))
attempt("preferred", dtensor.preferred_device_type)
""".replace("_QUERIES", repr(_QUERIES)),
    "env_two_jobs": _ENV + """
under({"DTENSOR_JOBS": "localhost:1000,localhost:1001", "DTENSOR_CLIENT_ID": "1"}, _QUERIES)
under({"DTENSOR_JOBS": "localhost:1000,localhost:1001", "DTENSOR_CLIENT_ID": "2"}, ["client_id"])
under({"DTENSOR_JOBS": "localhost:1000", "DTENSOR_CLIENT_ID": "-1"}, ["client_id"])
under({"DTENSOR_NUM_CLIENTS": "4"}, ["num_clients", "job_name"])
under({"DTENSOR_JOBS": "/bns/a/1:p,/bns/a/0:p"}, ["jobs"])
under({"DTENSOR_JOBS": "/bns/a/0:p,/bns/a/1:p"}, ["jobs", "num_clients"])
""".replace("_QUERIES", repr(_QUERIES)),
    "env_job_name_and_heartbeat": _ENV + """
under({"DTENSOR_JOB_NAME": "trainer"}, ["job_name", "full_job_name"])
for value in ["false", "0", "TRUE", "1", "yes"]:
    under({"DTENSOR_ENABLE_HEARTBEAT": value}, ["heartbeat_enabled"])
""",
    "create_tpu_mesh_without_tpus": _ENV + """
attempt("plain", lambda: dtensor.create_tpu_mesh(["x"], [2], "m"))
attempt("ring_dims", lambda: dtensor.create_tpu_mesh(["x"], [2], "m", ring_dims=5))
attempt("ring_axes", lambda: dtensor.create_tpu_mesh(["x"], [2], "m", ring_axes=["x"]))
""",
    "create_mesh_of_size_minus_one": """
mesh = dtensor.create_mesh([("batch", -1)])
emit("mesh", mesh)
emit("default", dtensor.create_mesh())
""",
}

# Accelerator-system call sequences: each starts from a fresh process (TensorFlow's
# DTensor resets the eager context in shutdown, so nothing may follow in its process).
SEQUENCES = {
    "init_and_shutdown": _ENV + """
attempt("shutdown_first", dtensor.shutdown_accelerator_system)
attempt("init", lambda: dtensor.initialize_accelerator_system("CPU"))
attempt("init_again", lambda: dtensor.initialize_accelerator_system("CPU"))
attempt("shutdown", dtensor.shutdown_tpu_system)
attempt("shutdown_again", dtensor.shutdown_accelerator_system)
""",
    "init_tpu_without_tpus": _ENV + """
attempt("unknown_type", lambda: dtensor.initialize_accelerator_system("XPU"))
attempt("tpu", lambda: dtensor.initialize_accelerator_system("TPU"))
""",
    "init_with_reset_after_an_op": _ENV + """
emit("op", tf.constant(1.0) + 1.0)
attempt("init", lambda: dtensor.initialize_accelerator_system(
    "CPU", num_logical_cpu_devices=4, experimental_reset_context=True))
emit("num_local_cpu", dtensor.num_local_devices("CPU"))
mesh = dtensor.create_mesh([("x", 4)])
out = dtensor.call_with_layout(tf.fill, dtensor.Layout(["x"], mesh), [8], 2.0)
emit("components", dtensor.unpack(out))
emit("sum", tf.reduce_sum(out))
""",
    "init_with_cpus_then_mesh": _ENV + """
attempt("init", lambda: dtensor.initialize_multi_client("CPU", num_logical_cpu_devices=2))
emit("num_local_cpu", dtensor.num_local_devices("CPU"))
mesh = dtensor.create_mesh()
emit("mesh", mesh)
emit("sum", tf.reduce_sum(dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh),
                                                   shape=(6,))))
""",
    "reinit_with_other_cpus_after_shutdown": _ENV + """
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=4)
mesh = dtensor.create_mesh()
emit("sum4", tf.reduce_sum(dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh),
                                                    shape=(8,))))
dtensor.shutdown_accelerator_system()
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
emit("num_local_cpu", dtensor.num_local_devices("CPU"))
mesh = dtensor.create_mesh()
emit("mesh", mesh)
emit("sum2", tf.reduce_sum(dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh),
                                                    shape=(8,))))
""",
}
# Re-initialising with other logical CPUs resets the eager context under a registered
# DTensor device: that needs the device to follow context resets (the lead's change to
# tf_dtensor/_device.py). Remove from here when it lands; the test then runs as is.

suite = harness.Suite(SCENARIOS)
config_suite = harness.Suite(CONFIG_SCENARIOS)
sequence_suites = {name: harness.Suite({name: body}) for name, body in SEQUENCES.items()}
ours_only = harness.Suite({k: v for k, v in OURS_ONLY.items() if k != "pack_no_components"})
ours_crash = harness.Suite({"pack_no_components": OURS_ONLY["pack_no_components"]})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_as_tensorflow(name):
    suite.check(name)


@pytest.mark.parametrize("name", sorted(CONFIG_SCENARIOS))
def test_config_same_as_tensorflow(name):
    config_suite.check(name)


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_accelerator_sequence_same_as_tensorflow(name):
    sequence_suites[name].check(name)


def _values(event):
    return [float(v) for v in event["values"]]


def test_default_mesh_restored_after_an_error():
    assert ours_only.events("ours", "default_mesh_restored_after_an_error") == [
        ["after", None], ["plain", False]]
    # TensorFlow's DTensor keeps the mesh of the failed scope.
    assert ours_only.events("tf", "default_mesh_restored_after_an_error")[0][1] is not None


def test_call_with_layout_of_a_function_of_constants():
    events = dict(ours_only.events("ours", "cwl_function_of_constants"))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    expected = [[3.0, 5.0, 7.0, 9.0]] * 2 + [[11.0, 13.0, 15.0, 17.0]] * 2
    assert [_values(c) for c in events["components"]] == expected
    tf_events = ours_only.events("tf", "cwl_function_of_constants")
    assert tf_events[0][0] == "error" and "UnimplementedError" in tf_events[0][1]["classes"]


def test_relayout_across_meshes_moves_the_value():
    events = dict(ours_only.events("ours", "relayout_across_meshes"))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    assert [_values(c) for c in events["components"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ours_only.events("tf", "relayout_across_meshes")[-1][0] == "error"


@pytest.mark.parametrize("name", ["relayout_indivisible", "copy_to_mesh_indivisible"])
def test_uneven_axis_is_split_like_torch_chunk(name):
    events = dict(ours_only.events("ours", name))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    # Devices (x, y) = (0, *) hold rows 0-1, (1, *) row 2.
    assert [_values(c) for c in events["components"]] == [[0, 1, 2, 3]] * 2 + [[4, 5]] * 2
    assert ours_only.events("tf", name)[-1][0] == "error"


def test_call_with_layout_of_a_reshaped_range():
    events = dict(ours_only.events("ours", "cwl_function_of_range"))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    assert [_values(c) for c in events["components"]] == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2
    assert ours_only.events("tf", "cwl_function_of_range")[0][0] == "error"


def test_call_with_layout_of_a_stateful_random_op():
    events = dict(ours_only.events("ours", "cwl_gen_random_uniform"))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    assert events["shape"] == {"tensor_shape": [8, 4]}
    blocks = [_values(c) for c in events["components"]]
    assert all(c["shape"] == [4, 4] for c in events["components"])
    assert all(0.0 <= v < 1.0 for block in blocks for v in block)
    # Devices (x=0,y=0) and (x=0,y=1) hold the same rows; so do (x=1,y=0) and (x=1,y=1).
    assert blocks[0] == blocks[1] and blocks[2] == blocks[3]
    assert ours_only.events("tf", "cwl_gen_random_uniform")[0][0] == "error"


def test_call_with_layout_of_sharded_stateless_random_is_the_single_device_value():
    events = dict(ours_only.events("ours", "cwl_stateless_normal_sharded"))
    assert events["layout"]["specs"] == ["x", "unsharded"]
    expected = _values(events["single_device"])
    got = [_values(c) for c in events["components"]]
    assert got == [expected[:4], expected[:4], expected[4:], expected[4:]]
    assert ours_only.events("tf", "cwl_stateless_normal_sharded")[0][0] == "error"


def test_pack_of_no_components_is_a_layout_error():
    (event,) = ours_crash.events("ours", "pack_no_components")
    assert event[0] == "error"
    assert {"LayoutError", "ValueError", "InvalidArgumentError"} <= set(event[1]["classes"])
    assert "got none" in event[1]["message"]
