"""What TensorFlow's own DTensor tests rely on (issue 25, measured with tools/tf_suite.py):
SparseTensor components in `pack`, constants under a mesh scope, the function cache
forgetting deleted functions, Mesh details, TensorFlow's key phrases in our messages, and
the config/accelerator names its test utilities read."""

from __future__ import annotations

import copy
import gc
import pickle

import numpy as np
import pytest
import tensorflow as tf

import dtensor_testing
from tf_dtensor import api, config, dtensor
from tf_dtensor.layout import Layout
from tf_dtensor.mesh import Mesh


# --- SparseTensor components --------------------------------------------------------------

def _sparse_blocks(value, layout):
    dense = dtensor.unpack(dtensor_testing.to_dtensor(value, layout))
    return [tf.sparse.from_dense(tf.identity(block)) for block in dense]


def test_pack_sparse_components_is_the_dense_dtensor(mesh_2x2):
    value = np.arange(24, dtype=np.float32).reshape(6, 4) * (np.arange(24).reshape(6, 4) % 3 == 0)
    layout = Layout(["x", "unsharded"], mesh_2x2)
    blocks = _sparse_blocks(value, layout)
    packed = dtensor.pack(blocks, layout)

    assert dtensor.fetch_layout(packed) == layout
    assert packed.shape == (6, 4) and packed.dtype == tf.float32
    dense = tf.identity(packed)
    assert dtensor.fetch_layout(dense) == layout
    np.testing.assert_array_equal(dtensor_testing.reassemble(dense), value)
    # unpack gives back the SparseTensors that were packed.
    unpacked = dtensor.unpack(packed)
    assert all(isinstance(t, tf.SparseTensor) for t in unpacked)
    for got, want in zip(unpacked, blocks):
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.values, want.values)

    @tf.function
    def f(x, y):
        return tf.identity(x), tf.matmul(x, y, transpose_b=True)

    ident, product = f(packed, packed)
    assert dtensor.fetch_layout(ident) == layout
    assert not any(isinstance(t, tf.SparseTensor) for t in dtensor.unpack(ident))
    np.testing.assert_array_equal(dtensor_testing.reassemble(ident), value)
    np.testing.assert_allclose(dtensor_testing.reassemble(product), value @ value.T)


def test_pack_sparse_refuses_mixed_and_unequal_components(mesh_1d):
    layout = Layout.replicated(mesh_1d, 2)
    sparse = tf.sparse.from_dense(tf.ones([2, 2]))
    with pytest.raises(TypeError, match="Cannot Pack SparseTensors with Tensors"):
        dtensor.pack([sparse, tf.ones([2, 2])], layout)
    with pytest.raises(TypeError, match="All input SparseTensors to Pack must be same shape"):
        dtensor.pack([sparse, tf.sparse.from_dense(tf.ones([2, 3]))], layout)


# --- constants under a mesh scope ---------------------------------------------------------

def test_constant_under_run_on_stays_regular_and_joins_the_mesh_when_used(mesh_1d):
    with dtensor.run_on(mesh_1d):
        c = tf.constant([1.0, 2.0])
        assert not dtensor.is_dtensor(c)  # as in TensorFlow's DTensor
        doubled = c + c  # an op on the DTensor device puts it on the mesh
        ones = tf.ones([2])
    assert dtensor.fetch_layout(doubled) == Layout.replicated(mesh_1d, 1)
    np.testing.assert_array_equal(doubled.numpy(), [2.0, 4.0])
    assert dtensor.fetch_layout(ones) == Layout.replicated(mesh_1d, 1)
    # call_with_layout still returns its constant in the layout asked for.
    sharded = dtensor.call_with_layout(tf.constant, Layout(["x"], mesh_1d), [1.0, 2.0])
    assert dtensor.fetch_layout(sharded) == Layout(["x"], mesh_1d)
    np.testing.assert_array_equal(dtensor_testing.reassemble(sharded), [1.0, 2.0])


def test_constants_converted_beside_dtensors_of_several_meshes_stay_regular(mesh_1d, mesh_2x2):
    # `tf.nn.embedding_lookup(table, ids)` converts numpy ids under `colocate_with(table)`,
    # on the DTensor device. With several meshes seen that constant was refused ("no mesh
    # is set"; found by the program fuzzer); TensorFlow's DTensor keeps it a regular tensor
    # once it has seen any mesh, and the gather puts it on the table's mesh.
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    for mesh in (mesh_1d, mesh_2x2):
        sharded = dtensor_testing.to_dtensor(table, Layout([mesh.dim_names[0], "unsharded"], mesh))
        with tf.device(dtensor.device_name()):
            c = tf.constant([1.0, 2.0])
        assert not dtensor.is_dtensor(c) and "CPU:0" in c.device, c.device
        ids = np.array([[3, 0], [1, 1]], np.int32)
        looked_up = tf.nn.embedding_lookup(sharded, ids)
        assert dtensor.fetch_layout(looked_up).mesh == mesh
        np.testing.assert_array_equal(dtensor_testing.reassemble(looked_up), table[ids])


# --- the function cache -------------------------------------------------------------------

def test_function_cache_forgets_deleted_functions(mesh_1d):
    device = api._dtensor_device()
    x = dtensor.copy_to_mesh(tf.ones([4, 2]), Layout.replicated(mesh_1d, 2))
    gc.collect()  # functions of earlier tests go first, so only these three count below
    before = device._get_stats()
    for _ in range(3):
        @tf.function
        def fn(v):
            return tf.reduce_sum(v)
        assert float(fn(x).numpy()) == 8.0
    during = device._get_stats()
    assert during["function_manager.miss"] - before["function_manager.miss"] == 3
    del fn
    gc.collect()
    after = device._get_stats()
    assert after["function_manager.size"] == before["function_manager.size"]


# --- Mesh details --------------------------------------------------------------------------

def test_mesh_coords_wrap_around_like_tensorflow(mesh_2x2):
    for device_id in range(3 * mesh_2x2.size):
        expected = [(device_id // 2) % 2, device_id % 2]
        np.testing.assert_array_equal(mesh_2x2.coords(device_id).numpy(), expected)


def test_mesh_renamed_through_name_attribute_pickles(mesh_2x2):
    renamed = copy.copy(mesh_2x2)
    renamed._name = "other"
    assert renamed.name == "other" and mesh_2x2.name != "other"
    assert renamed != mesh_2x2
    assert pickle.loads(pickle.dumps(renamed)) == renamed


def test_host_mesh_of_an_accelerator_mesh_has_no_name():
    ids = np.arange(2)
    gpu = Mesh(["x"], ids, [0, 1], ["/device:GPU:0", "/device:GPU:1"], mesh_name="named")
    host = gpu.host_mesh()
    assert host == Mesh(["x"], ids, [0, 1], ["/device:CPU:0", "/device:CPU:1"])
    assert host.name == ""


# --- TensorFlow's key phrases --------------------------------------------------------------

def test_messages_carry_tensorflows_key_phrases(mesh_1d, mesh_2x2):
    with pytest.raises(ValueError, match="Expect `mesh` to be `Mesh`"):
        with dtensor.default_mesh(None):
            pass
    layout = Layout.replicated(mesh_1d, 1)
    variable = dtensor.DVariable(dtensor.copy_to_mesh(tf.ones([2]), layout))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Variable input is not supported"):
        dtensor.pack([variable, variable], layout)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Neither layout nor DTensor initial value are provided"):
        dtensor.DVariable(1.0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Packed layout should have the same rank"):
        dtensor.pack([tf.constant(1.0)] * 2, layout)
    with pytest.raises(ValueError, match="FetchLayout expects a tensor placed on the layout"):
        dtensor.fetch_layout(tf.ones([2]))
    with pytest.raises(TypeError, match="Expecting a Tensor"):
        dtensor.unpack([1, 2])
    with pytest.raises(ValueError, match="must be equal to total size of the mesh"):
        dtensor.create_mesh([("x", 8)], devices=["CPU:0", "CPU:1"])
    with pytest.raises(ValueError, match="Mesh dimensions must be unique"):
        Layout(["x", "x"], mesh_2x2)
    with pytest.raises(ValueError, match="A dimension sharding must either be a valid mesh"):
        Layout(["nope"], mesh_1d)
    with pytest.raises(ValueError, match="mesh is not a valid Mesh object"):
        Layout(["x"], "mesh")
    with pytest.raises(ValueError, match="Duplicate devices found in mesh specification"):
        Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:0"])


# --- config and accelerator names its test utilities read -------------------------------

def test_config_names_of_tensorflows_test_utilities(monkeypatch):
    assert (config._DT_CLIENT_ID, config._DT_NUM_CLIENTS, config._DT_JOB_NAME, config._DT_JOBS,
            config._DT_HEARTBEAT_ENABLED) == (
        "DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS", "DTENSOR_JOB_NAME", "DTENSOR_JOBS",
        "DTENSOR_ENABLE_HEARTBEAT")
    assert config.is_tpu_present() is False
    assert config.is_gpu_present() == bool(tf.config.list_physical_devices("GPU"))
    assert config.use_multi_device_mode() is True
    assert config.is_local_mode() is True
    monkeypatch.setenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1")
    assert config.gpu_use_nccl_communication() is True
    monkeypatch.setenv(config._DT_JOBS, "localhost:1,localhost:2")
    assert config.is_local_mode() is False


def test_is_initialized_and_set_initialized():
    was = config.is_initialized()
    previous = config._initialized_device_type
    try:
        config.set_initialized("cpu")
        assert config.is_initialized() and config._initialized_device_type == "CPU"
        config.set_initialized(None)
        assert not config.is_initialized()
    finally:
        config._initialized_device_type = previous
    assert config.is_initialized() == was


def test_reset_does_not_create_a_device_and_restarts_the_stats(mesh_1d):
    device = api._dtensor_device()
    x = dtensor.copy_to_mesh(tf.ones([2]), Layout.replicated(mesh_1d, 1))

    @tf.function
    def f(v):
        return v * 2.0

    f(x)
    f(x)
    api._reset()
    assert device._get_stats()["function_manager.hit"] == 0
    assert device.is_async


def test_reset_context_warning_is_logged():
    # In a fresh process: resetting this one's context would drop the 8 virtual CPUs the
    # other tests use.
    result = dtensor_testing.run_python("""
import logging
import tensorflow as tf
from tf_dtensor import dtensor
tf.constant(1.0)  # the runtime starts
with_warning = []
class Catch(logging.Handler):
    def emit(self, record):
        with_warning.append(record.getMessage())
logging.getLogger().addHandler(Catch(level=logging.WARNING))
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=4,
                                      experimental_reset_context=True)
assert any("experimental_reset_context" in m for m in with_warning), with_warning
assert len(tf.config.list_logical_devices("CPU")) == 4
print("ok")
""")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


# --- placement details TensorFlow's tests rely on -----------------------------------------

def test_op_without_dtensor_input_runs_on_the_one_mesh_seen():
    # In a fresh process, where the device has seen exactly one mesh (TensorFlow's DTensor
    # picks its single registered mesh); a second mesh makes the choice ambiguous again.
    result = dtensor_testing.run_python("""
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4)
from tf_dtensor import dtensor
a = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
b = dtensor.create_mesh([("y", 2)], devices=["CPU:2", "CPU:3"])
try:
    with tf.device(dtensor.device_name()):
        tf.ones([2])
    raise SystemExit("no mesh seen yet, but the op ran")
except tf.errors.InvalidArgumentError as e:
    assert "No default mesh has been registered to DTensor" in str(e)
try:   # a constant too, as in TensorFlow's DTensor
    with tf.device(dtensor.device_name()):
        tf.constant(3.0)
    raise SystemExit("no mesh seen yet, but the constant was taken")
except tf.errors.InvalidArgumentError as e:
    assert "No default mesh has been registered to DTensor" in str(e)
dtensor.pack([tf.ones([1])] * 2, dtensor.Layout(["x"], a))
with tf.device(dtensor.device_name()):
    ones = tf.ones([2]) * tf.constant(3.0)
assert dtensor.fetch_layout(ones) == dtensor.Layout.replicated(a, 1), dtensor.fetch_layout(ones)
assert ones.numpy().tolist() == [3.0, 3.0]
dtensor.copy_to_mesh(tf.ones([2]), dtensor.Layout.replicated(b, 1))
try:
    with tf.device(dtensor.device_name()):
        tf.ones([2])
    raise SystemExit("two meshes seen, but the op picked one")
except tf.errors.InvalidArgumentError as e:
    assert "has seen several meshes (mesh(x=2) and mesh(y=2))" in str(e), str(e)
print("ok")
""")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_fetch_layout_of_a_plain_variable_made_on_the_device(mesh_1d):
    layout = Layout.replicated(mesh_1d, 1)
    value = dtensor.relayout([1.0, 2.0], layout)
    # The variable's ops have no DTensor input: they need a mesh (TensorFlow's tests get
    # one as the single mesh its device has seen; this process has seen many).
    with dtensor.default_mesh(mesh_1d), tf.device(dtensor.device_name()):
        variable = tf.Variable(value)
    assert dtensor.fetch_layout(variable) == layout
    dtensor.check_layout(variable, layout)
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])


def test_dataset_iterates_eagerly_under_a_default_mesh(mesh_2x2):
    images = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    layout = Layout(["x", "y"], mesh_2x2)
    with dtensor.default_mesh(mesh_2x2):
        # Built and iterated in the scope, as TensorFlow's tests do: tf.data's ops stay on
        # the host.
        dataset = tf.data.Dataset.from_tensors(images).repeat()
        d_dataset = dtensor.DTensorDataset(dataset=dataset, global_batch_size=4, mesh=mesh_2x2,
                                           layouts=Layout(["x", "unsharded", "y"], mesh_2x2),
                                           batch_dim="x")
        batch = next(iter(d_dataset))
    del layout
    assert dtensor.fetch_layout(batch) == Layout(["x", "unsharded", "y"], mesh_2x2)
    np.testing.assert_array_equal(dtensor_testing.reassemble(batch), np.stack([images] * 4))


def test_pack_sparse_components_live_on_their_devices(mesh_2x2):
    layout = Layout.replicated(mesh_2x2, 2)
    component = tf.sparse.from_dense(tf.constant([[0.0, 1.0], [2.0, 0.0]]))
    # Under the device's scope with no mesh set, as TensorFlow's tests pack.
    with tf.device(dtensor.device_name()):
        packed = dtensor.pack([component] * 4, layout)
    assert dtensor.fetch_layout(packed) == layout
    unpacked = dtensor.unpack(packed)
    for device, got in zip(mesh_2x2.local_devices(), unpacked):
        assert tf.DeviceSpec.from_string(got.values.device).device_index == \
            tf.DeviceSpec.from_string(device).device_index
        np.testing.assert_array_equal(tf.sparse.to_dense(got), [[0.0, 1.0], [2.0, 0.0]])


def test_copy_to_mesh_takes_a_replicated_layout_of_any_rank(mesh_1d):
    # TensorFlow's DTensor copies a matrix with a scalar replicated layout (its own tests do).
    got = dtensor.copy_to_mesh(tf.constant([[0, 1], [2, 3]]), Layout.replicated(mesh_1d, 0))
    assert dtensor.fetch_layout(got) == Layout.replicated(mesh_1d, 2)
    np.testing.assert_array_equal(got.numpy(), [[0, 1], [2, 3]])
    # A sharded layout of the wrong rank is still an error.
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank"):
        dtensor.copy_to_mesh(tf.ones([2, 2]), Layout(["x"], mesh_1d))


def test_relayout_of_a_python_value_under_the_device_scope(mesh_1d):
    # TensorFlow's tests relayout Python lists inside `tf.device(dtensor.device_name())`
    # before any mesh is set: the value is made on the host and copied onto the layout.
    layout = Layout(["x"], mesh_1d)
    with tf.device(dtensor.device_name()):
        got = dtensor.relayout([1.0, 2.0], layout)
        copied = dtensor.copy_to_mesh(np.array([3, 4]), Layout.replicated(mesh_1d, 1))
    assert dtensor.fetch_layout(got) == layout
    np.testing.assert_array_equal(dtensor_testing.reassemble(got), [1.0, 2.0])
    np.testing.assert_array_equal(copied.numpy(), [3, 4])


def test_relayout_of_a_variable_relayouts_its_value(mesh_1d):
    variable = dtensor.DVariable(dtensor.copy_to_mesh([1.0, 2.0], Layout.replicated(mesh_1d, 1)))
    got = dtensor.relayout(variable, Layout(["x"], mesh_1d))
    assert dtensor.fetch_layout(got) == Layout(["x"], mesh_1d)
    assert dtensor.fetch_layout(variable) == Layout.replicated(mesh_1d, 1)
    np.testing.assert_array_equal(dtensor_testing.reassemble(got), [1.0, 2.0])


def test_unpack_refuses_variables_and_regular_tensors(mesh_1d):
    variable = dtensor.DVariable(dtensor.copy_to_mesh([1.0, 2.0], Layout.replicated(mesh_1d, 1)))
    with pytest.raises(TypeError, match=r"Expecting a Tensor.*read_value"):
        dtensor.unpack(variable)
    assert [c.numpy().tolist() for c in dtensor.unpack(variable.read_value())] == [[1.0, 2.0]] * 2
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="DTensorUnpack expects a tensor placed on the DTensor device"):
        dtensor.unpack(tf.ones([2]))


@pytest.mark.parametrize("specs, batch_dim, counts", [
    (["unsharded", "unsharded"], None, [1, 1]),
    (["x", "unsharded"], None, [2, 1]),
    (["x", "unsharded"], "x", [1, 1]),
    (["x", "y"], "x", [1, 2]),
    (["y", "x"], None, [2, 2]),
])
def test_dataset_shard_counts(specs, batch_dim, counts):
    """`input_util._shard_counts`, which TensorFlow's tests and helpers call: the pieces each
    axis is cut into on one batch replica (the batch dimension's axis is whole there)."""
    from tf_dtensor import _dataset
    layout = Layout(specs, dtensor_testing.MESH_2X2)
    assert _dataset._shard_counts(layout, batch_dim) == counts


def test_default_layout_gives_a_functions_first_result_its_layout():
    """As TensorFlow's DTensor: `_default_layout` around a call of a tf.function with two
    results lays out the first; the second keeps the layout the expansion gives it."""
    mesh = dtensor_testing.MESH_1D
    sharded = Layout.batch_sharded(mesh, "x", 1)

    @tf.function
    def two():
        t = tf.constant([[1.0], [2.0]])
        return tf.reshape(t, [-1]), tf.reshape(t, [-1]) * 2.0

    with api._dtensor_device()._default_layout(sharded):
        first, second = two()
    assert dtensor.fetch_layout(first) == sharded
    assert dtensor.fetch_layout(second) == Layout.replicated(mesh, 1)
    np.testing.assert_array_equal(
        np.concatenate([c.numpy() for c in dtensor.unpack(first)]), [1.0, 2.0])
    np.testing.assert_array_equal(dtensor.unpack(second)[1].numpy(), [2.0, 4.0])


def test_relayout_like_refuses_a_traced_tensor_under_init_scope():
    """Eager code inside a tf.function (init_scope) cannot read a traced tensor's layout:
    a TypeError with TensorFlow's phrase, as TensorFlow's DTensor raises."""
    mesh = dtensor_testing.MESH_1D
    t = dtensor.copy_to_mesh(tf.constant([1.0, 2.0]), Layout.replicated(mesh, 1))
    from tensorflow.python.framework import ops

    @tf.function
    def fn(x):
        with ops.init_scope():
            return api.relayout_like(t, x)

    with pytest.raises(TypeError, match="is out of scope and cannot be used here"):
        fn(dtensor.copy_to_mesh(tf.constant([1.0, 2.0]), Layout(["x"], mesh)))
