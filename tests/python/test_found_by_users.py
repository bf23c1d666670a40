"""Defects found by trying tf_dtensor as users would (placements, partial values, meshes,
lifecycle), each checked against one plain device or the documented behaviour.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from dtensor_testing import (MESH_2X2, MESH_8, cpus, layout_of, reassemble, run_python,
                             to_dtensor)
from tf_dtensor import _device as dtensor_device
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout
from tf_dtensor.placements import (Partial, Replicate, Shard, distribute_tensor, from_local,
                                   full_tensor, init_device_mesh, placements_of, redistribute,
                                   to_local)

X = np.arange(16, dtype=np.float32).reshape(4, 4)


# --- Partial placements ------------------------------------------------------------------

def test_partial_takes_pytorchs_avg_and_refuses_unknown_reductions_at_once():
    assert Partial("avg") == Partial("mean") and str(Partial("avg")) == "P(mean)"
    with pytest.raises(ValueError, match="'bogus' is not one of"):
        Partial("bogus")


@pytest.mark.parametrize("source,target", [
    ([Partial(), Partial()], [Partial(), Replicate()]),          # reduce over y only
    ([Partial(), Replicate()], [Partial(), Partial()]),          # a pending sum over y added
    ([Partial(), Replicate()], [Replicate(), Partial()]),        # the sum moves from x to y
    ([Shard(0), Partial("sum")], [Shard(0), Partial("max")]),   # sum reduced, a max made
    ([Partial("max"), Partial("max")], [Replicate(), Partial("max")]),
])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_redistribute_between_partial_placements_keeps_the_targets(source, target, traced):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    t = distribute_tensor(tf.constant(X), mesh, source)
    if traced:
        layout = Layout.from_placements(mesh, target, 2)
        got = tf.function(lambda t: dtensor.relayout(t, layout))(t)
    else:
        got = redistribute(t, target)
    assert placements_of(got) == tuple(target)  # (R, R) before: the target's partial dropped
    np.testing.assert_array_equal(full_tensor(got).numpy(), X)


def test_sum_and_max_over_two_mesh_dimensions_apply_in_mesh_order_on_every_path():
    # Terms 0, 5 / 5, 0 on (x, y): the max over y of the sums over x is 5; the sum over x
    # of the maxes over y would be 10. Every path gives full_tensor's 5.
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    terms = [tf.constant([v, v], tf.float32) for v in (0.0, 5.0, 5.0, 0.0)]
    p = from_local(terms, mesh, [Partial("sum"), Partial("max")])
    assert full_tensor(p).numpy().tolist() == [5.0, 5.0]
    for target in ([Shard(0), Replicate()], [Replicate(), Shard(0)],
                   [Replicate(), Partial("max")], [Partial("sum"), Replicate()]):
        assert full_tensor(redistribute(p, target)).numpy().tolist() == [5.0, 5.0], target


def test_to_local_takes_a_dvariable_as_full_tensor_does():
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    v = dtensor.DVariable(distribute_tensor(tf.range(8.0), mesh, [Shard(0)]))
    assert [b.numpy().tolist() for b in to_local(v)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_dvariable_made_from_a_partial_value_holds_the_reduced_value():
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    p = from_local([tf.constant([1.0, 2.0])] * 4, mesh, [Partial("sum")])
    v = dtensor.DVariable(p)
    assert not v.layout.is_partial
    np.testing.assert_array_equal(reassemble(v.read_value()), [4.0, 8.0])
    with pytest.raises(ValueError, match="holds values, not pending reductions"):
        dtensor.DVariable(tf.zeros([2]), layout=dtensor.fetch_layout(p))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("shape,mesh", [((4, 2), "x4"), ((5,), "2x2"), ((4, 2), "2x2")])
def test_gather_from_a_row_sharded_string_table(traced, shape, mesh):
    mesh = (init_device_mesh("cpu", (4,), mesh_dim_names=("x",)) if mesh == "x4"
            else init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y")))
    words = np.array([f"w{i}" for i in range(int(np.prod(shape)))], object).reshape(shape)
    placements = [Shard(0)] + [Replicate()] * (len(mesh.dim_names) - 1)
    table = distribute_tensor(tf.constant(words), mesh, placements)
    ids = tf.constant([3, 0, 2, 3])
    gather = lambda t: tf.gather(t, ids)
    got = (tf.function(gather) if traced else gather)(table)
    got = np.vectorize(lambda b: b.decode())(reassemble(got))
    np.testing.assert_array_equal(got, words[[3, 0, 2, 3]].astype(str))


# --- meshes ------------------------------------------------------------------------------

def test_a_mesh_without_devices_is_refused_like_tensorflows():
    with pytest.raises(ValueError, match="Empty list of devices not allowed"):
        dtensor.Mesh(["x"], np.arange(4), [], [])


def test_ops_on_a_mesh_of_other_processes_alone_raise_instead_of_crashing():
    remote = [f"/job:worker/replica:0/task:1/device:CPU:{i}" for i in range(4)]
    mesh = dtensor.Mesh(["x"], np.arange(4), [], [], global_devices=remote)
    assert mesh.is_remote()
    layout = Layout(["x"], mesh)
    for make in (lambda: dtensor.call_with_layout(tf.ones, layout, shape=(4,)),
                 lambda: dtensor.copy_to_mesh(tf.ones([4]), Layout.replicated(mesh, 1))):
        with pytest.raises(tf.errors.InvalidArgumentError, match="belong to other processes"):
            make()


def test_two_meshes_of_the_same_shape_are_told_apart_in_the_error():
    a = dtensor.create_mesh([("x", 4)], devices=cpus(4), mesh_name="m1")
    b = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4, 8)],
                            mesh_name="m2")
    x = dtensor.call_with_layout(tf.ones, Layout(["x"], a), shape=(8,))
    y = dtensor.call_with_layout(tf.ones, Layout(["x"], b), shape=(8,))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'m1' on CPU:0.*'m2' on CPU:4"):
        x + y


def test_pack_reads_a_generator_of_components():
    layout = layout_of("[x]", MESH_8)
    t = dtensor.pack((tf.constant([float(i)]) for i in range(8)), layout)
    np.testing.assert_array_equal(reassemble(t), np.arange(8.0))


# --- lifecycle ---------------------------------------------------------------------------

def _spmd_functions():
    return sum("_tfd_spmd_" in name for name in context.context().list_function_names())


def test_the_spmd_functions_of_deleted_tf_functions_leave_the_context():
    x = to_dtensor(X, layout_of("[x,y]", MESH_2X2))
    tf.function(lambda t: t * 3.0)(x)  # the sweep runs on the next new expansion
    gc.collect()
    before = _spmd_functions()
    for k in range(20):
        f = tf.function(lambda t: t + float(k))
        np.testing.assert_array_equal(reassemble(f(x)), X + k)
        del f
        gc.collect()
    # Each new function's expansion sweeps the deleted ones' SPMD functions away.
    assert _spmd_functions() <= before + 2


def test_pytorchs_device_mesh_keyword_is_taken():
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    t = distribute_tensor(tf.range(8.0), device_mesh=mesh, placements=[Shard(0)])
    assert placements_of(t) == (Shard(0),)
    back = from_local(to_local(t), device_mesh=mesh, placements=[Shard(0)])
    np.testing.assert_array_equal(full_tensor(back).numpy(), np.arange(8.0))
    with pytest.raises(TypeError, match="needs a mesh"):
        distribute_tensor(tf.range(8.0), placements=[Shard(0)])


def test_a_first_use_inside_autograph_code_leaves_the_device_usable(tmp_path):
    # AutoGraph converted tf_dtensor's device set-up when a tf.function (or a Dataset.map)
    # was the first to use it: the device was registered, tf_dtensor never learnt it, and
    # every later DTensor call failed ("already registered as a custom device"). AutoGraph
    # converts only code whose source it can read: the program is a file.
    script = tmp_path / "first_use.py"
    script.write_text("""
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
from tf_dtensor import _device as dtensor_device
from tf_dtensor import dtensor
mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
layout = dtensor.Layout(["x"], mesh)

@tf.function
def f(x):
    return dtensor.relayout(x, layout)

f.get_concrete_function(tf.TensorSpec([4], tf.float32))
with dtensor.run_on(mesh):
    got = f(tf.range(4.0))
print("after:", dtensor.relayout(got, dtensor.Layout.replicated(mesh, 1)).numpy().tolist())
""")
    result = run_python(f"import runpy; runpy.run_path({str(script)!r})")
    assert "after: [0.0, 1.0, 2.0, 3.0]" in result.stdout, result.stdout + result.stderr


def test_a_loaded_saved_model_takes_dtensors(tmp_path):
    # The restored function reads its captured variable inside a nested call, whose
    # handle carried no shape: the read was taken for a scalar ("'MatMul' needs matrices").
    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))

        @tf.function
        def f(self, x):
            return tf.matmul(x, self.w)

    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    module = Module()
    module.f(tf.constant(x))  # traced for plain tensors only, as a serving export is
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    got = loaded.f(to_dtensor(x, layout_of("[x,*]", MESH_2X2)))
    np.testing.assert_allclose(reassemble(got), x @ np.arange(12, dtype=np.float32).reshape(4, 3))


def test_a_checkpoint_restores_a_keras_optimizer_slot_on_a_mesh(tmp_path):
    # TF infers no shape for the restored tensor that a tf.function assigns to the slot's
    # DVariable: the restore was refused.
    import keras
    w = dtensor.DVariable(dtensor.copy_to_mesh(tf.ones([4, 2]), Layout.replicated(MESH_2X2, 2)))
    optimizer = keras.optimizers.Adam(0.1)
    x = to_dtensor(np.ones([8, 4], np.float32), layout_of("[x,*]", MESH_2X2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    slot = optimizer.variables[2]
    saved = reassemble(slot.value.read_value())
    checkpoint = tf.train.Checkpoint(slot=slot)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    slot.assign(tf.zeros_like(slot.value))
    checkpoint.restore(path).assert_consumed()
    np.testing.assert_allclose(reassemble(slot.value.read_value()), saved)
    assert np.abs(saved).sum() > 0


def test_a_keras_optimizer_steps_a_sharded_dvariable_as_one_device():
    # Its slots were made replicated (Keras reads a reference variable's `_layout`), and
    # the first update of the sharded weight was refused.
    import keras
    value = np.arange(32, dtype=np.float32).reshape(8, 4) / 10.0
    x = np.ones([16, 8], np.float32)

    def step(w, x):
        optimizer = keras.optimizers.Adam(0.1)
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        return optimizer

    want = tf.Variable(value)
    step(want, tf.constant(x))
    w = dtensor.DVariable(to_dtensor(value, layout_of("[*,y]", MESH_2X2)))
    optimizer = step(w, to_dtensor(x, layout_of("[x,*]", MESH_2X2)))
    assert dtensor.fetch_layout(optimizer.variables[2].value).sharding_specs == ["unsharded", "y"]
    np.testing.assert_allclose(reassemble(w.read_value()), want.numpy(), rtol=1e-5, atol=1e-7)


# --- program features around sharded values (autodiff, host arguments) ------------------

_ROWS5 = np.arange(20, dtype=np.float32).reshape(5, 4) / 7.0


@pytest.mark.parametrize("op", [
    lambda a: tf.reduce_sum(tf.sin(a), axis=1),
    lambda a: tf.reduce_mean(a, axis=0),
    lambda a: tf.transpose(a),
    lambda a: tf.math.cumsum(a, axis=0, exclusive=True),
    lambda a: a[1:4, ::2],
    lambda a: tf.reshape(a, [10, 2]),
], ids=["sum", "mean", "transpose", "cumsum", "strided_slice", "reshape"])
@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]", "[*,*]"])
def test_forward_accumulator_gives_eager_jvps_of_sharded_values(op, spec):
    # Eagerly, TF computes each op's JVP with a tf.function that takes the op's inputs as
    # arguments, its axes and shapes too: they were refused as values known only at run
    # time ("'Sum' needs its reduction axes (input 1) as a constant integer tensor").
    def jvp(a):
        with tf.autodiff.ForwardAccumulator(a, tf.ones_like(a) * 0.5) as accumulator:
            y = op(a)
        return y, accumulator.jvp(y)

    want = jvp(tf.constant(_ROWS5))
    got = jvp(to_dtensor(_ROWS5, layout_of(spec, dtensor.create_mesh([("x", 4)],
                                                                       devices=cpus(4)))))
    for w, g in zip(want, got):
        assert tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype
        np.testing.assert_allclose(reassemble(g), w.numpy(), rtol=1e-6, atol=1e-6)


def test_a_function_taking_its_reduction_axis_as_a_tensor_reads_each_calls_value():
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = to_dtensor(_ROWS5, layout_of("[x,*]", mesh))
    total = tf.function(lambda a, axis: tf.reduce_sum(a, axis))
    for axis in ([1], [0], 1):  # a new value is a new expansion, never a stale one
        want = tf.reduce_sum(_ROWS5, axis).numpy()
        np.testing.assert_allclose(reassemble(total(x, tf.constant(axis))), want, rtol=1e-6)


@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]"])
def test_an_eager_tape_differentiates_a_function_taking_its_axis_as_a_tensor(spec):
    # The backward function gets the shapes the forward one saved as replicated DTensors,
    # whose values its Reshape needs ("The shape of output 0 of 'Reshape' is unknown").
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    total = tf.function(lambda a, axis: tf.reduce_sum(tf.sin(a) * a, axis))

    def loss_and_gradient(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            y = total(a, tf.constant([1]))
            s = tf.reduce_sum(y * tf.range(5.0))
        return y, tape.gradient(s, a)

    want = loss_and_gradient(tf.constant(_ROWS5))
    got = loss_and_gradient(to_dtensor(_ROWS5, layout_of(spec, mesh)))
    for w, g in zip(want, got):
        assert tuple(g.shape) == tuple(w.shape)
        np.testing.assert_allclose(reassemble(g), w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_host_step_counter_passed_in_does_not_expand_the_function_again():
    # Only a function that cannot be expanded without them keys on host values.
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = to_dtensor(_ROWS5, layout_of("[x,*]", mesh))
    step = tf.function(lambda a, n: a * tf.cast(n, tf.float32))
    step(x, tf.constant(0))
    before = dtensor_device.get().function_cache_stats()
    for n in range(1, 4):
        np.testing.assert_allclose(reassemble(step(x, tf.constant(n))), _ROWS5 * n)
    after = dtensor_device.get().function_cache_stats()
    assert (after["hit"], after["miss"]) == (before["hit"] + 3, before["miss"])


def test_a_function_failing_for_a_reason_values_cannot_fix_is_expanded_once():
    # With a small integer input, a failed expansion was tried again with the input's value
    # (twice the time of the failing call); axes given sharded fail whatever the values.
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = to_dtensor(_ROWS5, layout_of("[x,*]", mesh))
    axes = dtensor.pack([tf.constant([1])] * 4, layout_of("[x]", mesh))
    total = tf.function(lambda a, axes, n: tf.reduce_sum(a, axes) * tf.cast(n, tf.float32))
    before = dtensor_device.get().function_cache_stats()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"'Sum' needs its reduction axes \(input 1\).*got a sharded"):
        total(x, axes, tf.constant(2))
    after = dtensor_device.get().function_cache_stats()
    assert after["miss"] == before["miss"] + 1


@pytest.mark.parametrize("spec,mesh", [("[*,*]", "x4"), ("[x,*]", "x4"), ("[x,y]", "2x2")])
def test_python_callbacks_in_a_function_run_once_on_the_whole_value(spec, mesh):
    # tf.py_function and tf.numpy_function inside a tf.function were planned as ops of
    # every device and refused ("The shape of output 0 of 'EagerPyFunc' is unknown"); they
    # run once, on the host, as eagerly, and `tf.ensure_shape` takes their result onto the
    # mesh.
    mesh = (dtensor.create_mesh([("x", 4)], devices=cpus(4)) if mesh == "x4" else MESH_2X2)
    seen = []

    def doubled(b):
        seen.append(np.asarray(b).shape)
        return np.asarray(b) * np.float32(2.0)

    def body(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            y = tf.ensure_shape(tf.py_function(lambda b: tf.sin(b), [a * 2], tf.float32), [5, 4])
            s = tf.reduce_sum(y * a)
        z = tf.ensure_shape(tf.numpy_function(doubled, [a], tf.float32), [5, 4]) + a
        return s, tape.gradient(s, a), z

    want = tf.function(body)(tf.constant(_ROWS5))
    seen.clear()
    got = tf.function(body)(to_dtensor(_ROWS5, layout_of(spec, mesh)))
    assert seen == [(5, 4)]  # one call, with the whole value
    for w, g in zip(want, got):
        assert tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype
        np.testing.assert_allclose(reassemble(g), w.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec,mesh", [("[x,*]", "x4"), ("[*,x]", "x4"), ("[x,y]", "2x2")])
def test_enable_check_numerics_checks_a_function_on_sharded_values(spec, mesh):
    # tf.debugging.enable_check_numerics puts a DebugNumericSummaryV2 after every float
    # output inside a tf.function; it had no rule and TF infers no shape for it, so every
    # function on DTensors failed ("The shape of output 0 of 'DebugNumericSummaryV2' is
    # unknown"). (An eager op, the call included, with a sharded float result still fails
    # under it: TF's eager check reads each result whole with NumPy, also on TF's DTensor.)
    mesh = (dtensor.create_mesh([("x", 4)], devices=cpus(4)) if mesh == "x4" else MESH_2X2)
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

    def body(a, w):
        with tf.GradientTape() as tape:
            tape.watch(w)
            y = tf.reduce_sum(tf.nn.relu(a @ w) ** 2)
        return y, tf.reduce_sum(tf.square(tape.gradient(y, w)))  # replicated results

    want = tf.function(body)(tf.constant(_ROWS5 - 1.0), tf.constant(w))
    x = to_dtensor(_ROWS5 - 1.0, layout_of(spec, mesh))
    wd = to_dtensor(w, Layout.replicated(mesh, 2))
    tf.debugging.enable_check_numerics()
    try:
        got = tf.function(body)(x, wd)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match='Detected Infinity or NaN in output 0 of graph op "Log"'):
            tf.function(lambda a: tf.math.log(a) * 2.0)(x)
    finally:
        tf.debugging.disable_check_numerics()
    for wanted, g in zip(want, got):
        np.testing.assert_allclose(reassemble(g), wanted.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", [2, 3, 4, 5, 8])
def test_debug_numeric_summaries_of_sharded_values_are_one_devices(mode):
    # Mode 8 (the check's): each block's -inf, +inf and NaN slots add up; the others count
    # and name the whole tensor.
    value = _ROWS5.copy()
    value[1, 2], value[4, 0] = np.inf, np.nan
    summary = tf.function(lambda a: tf.raw_ops.DebugNumericSummaryV2(
        input=a, tensor_debug_mode=mode, tensor_id=7))
    want = summary(tf.constant(value)).numpy()
    got = summary(to_dtensor(value, layout_of("[x,y]", MESH_2X2)))
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(reassemble(got), want)


def test_reading_a_partial_value_whole_names_its_pending_reductions_not_shards():
    # Found by the API sweep: tf.py_function of a partial value said "it is sharded".
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    p = from_local([tf.constant([1.0, 2.0])] * 4, mesh, [Partial("sum")])
    with pytest.raises(tf.errors.UnimplementedError,
                       match=r"\+partial\(x:sum\).*: it holds pending reductions .*every term"):
        tf.py_function(lambda y: y * 2, [p], tf.float32)
    whole = dtensor.relayout(p, Layout.replicated(dtensor.fetch_layout(p).mesh, 1))
    assert tf.py_function(lambda y: y * 2, [whole], tf.float32).numpy().tolist() == [8.0, 16.0]
