"""Values that ops size or index by inside tf.function (shapes, bounds, counts), found by
trying real training programs:

- a DVariable's shape (`VariableShape`, which TF's gradients of gathers and of while loops
  read) is the constant global shape, as `tf.shape` of a DTensor is;
- a small integer constant passed into a cond branch or a called function is a constant
  there too (cc/graph/control_flow.cc), but a loop variable is not, though it starts from
  one;
- an op whose shape or bounds are known only at run time (data-dependent sizes, a loop
  counter) runs as one device would where none of its inputs is sharded
  (cc/rules/dispatch.cc), and is refused with the reason where one is;
- pending sums of booleans (a ScatterNd of bools with sharded indices) reduce as a logical
  or under every lowering.
Each is checked against the same program on one plain device.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, assert_values_equal,
                             layout_of, reassemble, to_dtensor)
from tf_dtensor import config, dtensor
from tf_dtensor.dtensor import Layout


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_variable_shape_of_a_dvariable_is_its_global_shape(traced):
    v = dtensor.DVariable(to_dtensor(np.zeros([8, 3], np.float32), layout_of("[x,*]", MESH_8)))

    def shape():
        return resource_variable_ops.variable_shape(v.handle, out_type=tf.int64)

    got = (tf.function(shape) if traced else shape)()
    np.testing.assert_array_equal(reassemble(got) if dtensor.is_dtensor(got) else got.numpy(),
                                  [8, 3])


def test_gradient_of_a_while_loop_reading_a_dvariable():
    # TF sizes the gradient's zeros with VariableShape of the handle out of the loop (the
    # gradient of a Keras RNN under a distribution); it was refused as a shape not known.
    mesh = dtensor.create_mesh([("b", 2)], devices=["CPU:0", "CPU:1"])
    w0 = np.full([3, 3], 0.1, np.float32)
    w = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(w0), Layout.replicated(mesh, 2)))
    plain = tf.Variable(w0)

    def loss_and_grad(w):
        with tf.GradientTape() as tape:
            _, h = tf.while_loop(lambda i, h: i < 5,
                                 lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                                 (0, tf.ones([2, 3])))
            loss = tf.reduce_sum(h)
        return loss, tape.gradient(loss, w)

    want_loss, want_grad = tf.function(loss_and_grad)(plain)
    loss, grad = tf.function(loss_and_grad)(w)
    assert_values_equal(want_loss.numpy(), reassemble(loss))
    assert_dtensor_equal(want_grad.numpy(), Layout.replicated(mesh, 2), grad)


def test_a_constant_passed_into_a_cond_branch_sizes_its_ops():
    # The branch packs its ScatterNd's shape from an argument the caller passes a constant
    # (a variable's shape): the branch reads it as that constant.
    x = to_dtensor(np.arange(8, dtype=np.float32), layout_of("[x]", MESH_8))
    ids = np.array([[1], [3], [3], [6]], np.int32)

    def scatter(x, flag):
        shape = tf.shape(x)
        return tf.cond(flag,
                       lambda: tf.scatter_nd(ids, tf.ones([4]), tf.stack([shape[0]])),
                       lambda: tf.zeros(tf.stack([shape[0]])))

    for flag in (True, False):
        want = scatter(tf.constant(np.arange(8, dtype=np.float32)), tf.constant(flag)).numpy()
        assert_values_equal(want, reassemble(tf.function(scatter)(x, tf.constant(flag))))


def test_a_loop_counter_started_from_a_constant_still_counts():
    # Loop variables change every iteration: the constant the counter starts from is not
    # passed into the body as a constant (the loop ran forever when it was).
    x = dtensor.copy_to_mesh(tf.reshape(tf.range(24.0), [12, 2]), Layout.replicated(MESH_8, 2))

    @tf.function
    def sum_of_slices(x):
        body = lambda i, a: (i + 1, a + tf.reduce_sum(x[i * 4:(i + 1) * 4]))  # noqa: E731
        return tf.while_loop(lambda i, a: i < 3, body, (0, 0.0))[1]

    assert_values_equal(np.float32(276.0), reassemble(sum_of_slices(x)))


def test_slice_with_run_time_bounds_of_a_replicated_tensor():
    value = np.arange(24, dtype=np.float32).reshape(12, 2)
    x = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(MESH_8, 2))
    got = tf.function(lambda x, i: x[i:i + 2])(x, tf.constant(3))
    assert_dtensor_equal(value[3:5], Layout.replicated(MESH_8, 2), got)


def test_slice_with_run_time_bounds_of_a_sharded_tensor_gathers_the_cut_axis():
    # As TF's DTensor: the cut axis is gathered, the other keeps its sharding.
    value = np.arange(48, dtype=np.float32).reshape(12, 4)
    x = to_dtensor(value, layout_of("[x,y]", MESH_2X2))
    got = tf.function(lambda x, i: x[i:i + 2])(x, tf.constant(3))
    assert_dtensor_equal(value[3:5], layout_of("[*,y]", MESH_2X2), got)


@pytest.mark.parametrize("spec", ["[x,*]", "[*,x]", "[x,y]"])
def test_a_loop_indexing_a_sharded_tensor_by_its_counter_and_its_gradient(spec):
    value = (np.arange(64, dtype=np.float32).reshape(8, 8) - 30.0) / 50.0
    mesh = MESH_8 if "y" not in spec else MESH_2X2

    @tf.function
    def loss_and_grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            h = tf.zeros([8])
            for i in tf.range(8):
                h = tf.tanh(h + t[i])           # StridedSlice with a run-time begin
            loss = tf.reduce_sum(h * h)
        return loss, tape.gradient(loss, t)     # StridedSliceGrad with one

    want_loss, want_grad = loss_and_grad(tf.constant(value))
    loss, grad = loss_and_grad(to_dtensor(value, layout_of(spec, mesh)))
    np.testing.assert_allclose(reassemble(loss), want_loss.numpy(), rtol=1e-5)
    np.testing.assert_allclose(reassemble(grad), want_grad.numpy(), rtol=1e-5, atol=1e-6)
    # The indexed axis is gathered; the other keeps its sharding.
    assert dtensor.fetch_layout(grad).sharding_specs[1] == layout_of(spec, mesh).sharding_specs[1]


@pytest.mark.parametrize("op", ["slice", "pad", "strided_update"])
def test_slice_pad_and_slice_update_with_run_time_operands_of_sharded_tensors(op):
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    fns = {
        "slice": lambda x, k: tf.slice(x, tf.stack([k, 0]), [2, 8]),
        "pad": lambda x, k: tf.pad(x, [[k, 0], [0, 1]]),
        "strided_update": lambda x, k: tf.raw_ops.TensorStridedSliceUpdate(
            input=x, begin=tf.reshape(k, [1]), end=tf.reshape(k + 1, [1]), strides=[1],
            value=-tf.ones([8]), shrink_axis_mask=1),
    }
    fn = tf.function(fns[op])
    want = fn(tf.constant(value), tf.constant(2)).numpy()
    k = dtensor.copy_to_mesh(tf.constant(2), Layout.replicated(MESH_2X2, 0))
    got = fn(to_dtensor(value, layout_of("[x,y]", MESH_2X2)), k)
    np.testing.assert_array_equal(reassemble(got), want)


def test_a_hash_table_lookup_of_sharded_keys_in_function():
    # In a function TF infers no shape for a captured table's lookup (Keras' StringLookup):
    # it was taken for a scalar whose blocks were [2,4]; it has the keys' shape.
    keys = to_dtensor(np.array([[b"a", b"b", b"c", b"d"]] * 2), layout_of("[x,y]", MESH_2X2))
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(["a", "b"], [1, 2]), -1)
    lookup = (lambda k: tf.reduce_sum(table.lookup(k), axis=1))
    got = tf.function(lookup)(keys)
    np.testing.assert_array_equal(reassemble(got), [1, 1])  # 1 + 2 - 1 - 1


@pytest.mark.parametrize("lowering", ["shared", "copies", "ops"])
def test_a_hash_table_lookup_of_sharded_string_keys_runs_per_device_under_every_lowering(
        lowering):
    # Each device looks up its own block of keys where the table lives; the values keep
    # the keys' layout. Under the `ops` lowering (meshes across processes) the keys were
    # all-gathered first, which TF's collective ops cannot do for strings
    # ("cannot all-gather a tensor of dtype string").
    words = np.array([[b"a", b"b", b"c", b"d"], [b"b", b"b", b"a", b"e"]])
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(["a", "b", "e"], [1, 2, 5]), -1)
    config.set_collective_lowering(lowering)
    try:
        keys = to_dtensor(words, layout_of("[x,y]", MESH_2X2))
        got = tf.function(lambda k: table.lookup(k) * 10)(keys)
        assert_dtensor_equal(table.lookup(tf.constant(words)).numpy() * 10,
                             layout_of("[x,y]", MESH_2X2), got)
    finally:
        config.set_collective_lowering("")


def test_a_host_value_of_unknown_rank_is_refused_with_the_fix_not_taken_for_a_scalar():
    x = to_dtensor(np.ones([2, 4], np.float32), layout_of("[x,y]", MESH_2X2))
    v = tf.Variable(tf.ones([3]), shape=tf.TensorShape(None))
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="not even its rank.*ensure_shape.*read_value"):
        tf.function(lambda x: x[0, :3] * v)(x)


def test_reshape_of_a_data_dependent_size_to_a_given_shape_in_function():
    # The element count of boolean_mask's result is known only at run time; it was refused
    # as "the element counts differ".
    value = np.random.RandomState(4).randn(8, 8).astype(np.float32)

    @tf.function
    def packed(x):
        flat = tf.boolean_mask(tf.reshape(x, [-1]), tf.reshape(x > 0, [-1]))
        return tf.reshape(tf.concat([flat, tf.zeros([64 - tf.size(flat)])], 0), [8, 8])

    got = packed(to_dtensor(value, layout_of("[x,y]", MESH_2X2)))
    np.testing.assert_array_equal(reassemble(got), packed(tf.constant(value)).numpy())


def test_fill_of_a_data_dependent_size_runs_replicated():
    value = np.array([3.0, -1.0, 2.0, 0.0, 5.0, -2.0, 1.0, 4.0], np.float32)
    x = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(MESH_8, 1))

    @tf.function
    def ones_per_positive(x):
        return tf.ones(tf.shape(tf.where(x > 0))[:1]) * 2.0

    got = ones_per_positive(x)
    np.testing.assert_array_equal(reassemble(got), np.full([5], 2.0, np.float32))


def test_gradient_of_boolean_mask_of_a_sharded_variable_in_function():
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    value = np.arange(12, dtype=np.float32).reshape(6, 2)
    v = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(value),
                                               Layout(["x", dtensor.UNSHARDED], mesh)))

    @tf.function
    def loss_and_grad():
        with tf.GradientTape() as tape:
            kept = tf.boolean_mask(v, v[:, 0] > 3.0)
            loss = tf.reduce_sum(kept * kept)
        return loss, tape.gradient(loss, v)

    loss, grad = loss_and_grad()
    keep = value[:, 0] > 3.0
    assert_values_equal(np.float32((value[keep] ** 2).sum()), reassemble(loss))
    np.testing.assert_allclose(reassemble(grad), np.where(keep[:, None], 2 * value, 0.0))


@pytest.mark.parametrize("lowering", ["shared", "copies", "ops"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_scatter_nd_of_booleans_with_sharded_indices(lowering, traced):
    # Each device scatters its own indices; the pending "sum" of booleans is an or.
    config.set_collective_lowering(lowering)
    try:
        ids = np.array([[1], [3], [3], [6], [0], [6], [2], [3]], np.int32)
        indices = to_dtensor(ids, layout_of("[x,*]", MESH_8))
        updates = to_dtensor(np.ones([8], bool), layout_of("[x]", MESH_8))

        def scatter(i, u):
            return tf.logical_or(tf.scatter_nd(i, u, [8]), tf.zeros([8], tf.bool))

        got = (tf.function(scatter) if traced else scatter)(indices, updates)
        want = scatter(tf.constant(ids), tf.ones([8], tf.bool)).numpy()
        np.testing.assert_array_equal(reassemble(got), want)
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_segment_sum_of_sharded_rows_with_ids_of_run_time_length(traced):
    # The ids' length is known only at run time; the segment axis is contracted, so its
    # sizes must agree with the rows': the ids are cut as the rows are (they were left
    # whole beside [x,*] rows: "data.shape = [4,3] does not start with [32]").
    rows = np.arange(96, dtype=np.float32).reshape(32, 3)
    ids = (np.arange(32) * 7 % 10).astype(np.int32)

    def segment_sums(x, ids):
        kept = tf.gather(ids, tf.squeeze(tf.where(ids >= 0), 1))
        return tf.math.unsorted_segment_sum(x * 2.0, kept, 10)

    want = segment_sums(tf.constant(rows), tf.constant(ids)).numpy()
    x = to_dtensor(rows, layout_of("[x,*]", MESH_8))
    i = dtensor.copy_to_mesh(tf.constant(ids), Layout.replicated(MESH_8, 1))
    got = (tf.function(segment_sums) if traced else segment_sums)(x, i)
    np.testing.assert_allclose(reassemble(got), want)


def _batches_of_unknown_size(rows: int, columns: int, batch: int):
    """An iterator of the batches of a regular dataset (the last one partial), whose size a
    function reading it with `next` knows only at run time."""
    value = (np.arange(rows * columns, dtype=np.float32).reshape(rows, columns) - 7.0) / 9.0
    return iter(tf.data.Dataset.from_tensor_slices(value).batch(batch))


GRADIENTS = {
    # The gradient of x * y with both of run-time size sums over the axes that
    # BroadcastGradientArgs gives at run time (none here): it was refused ("'Sum' needs its
    # reduction axes (input 1) as a constant integer tensor ... only known when the
    # function runs"), which a gated layer trained in a loop over a dataset met.
    "gate": lambda x: tf.tanh(x) * tf.sigmoid(x * 2.0),
    # Broadcast against a row made from the batch: the gradient sums over axis 0.
    "scale": lambda x: x * tf.reduce_mean(x, axis=0, keepdims=True),
}

REDUCTIONS = {
    # Over the axes longer than 3, known only at run time: axis 0 of the full batches, no
    # axis of the last one.
    "sum": lambda x: tf.reduce_sum(x, _long_axes(x), keepdims=True),
    "max": lambda x: tf.reduce_max(x, _long_axes(x), keepdims=True),
    "mean": lambda x: tf.reduce_mean(x, _long_axes(x), keepdims=True),
    "cumsum": lambda x: tf.cumsum(x, axis=tf.size(_long_axes(x)) - 1),
    # The reduction (replicated, of run-time size 1 along the reduced axes) broadcast
    # against the sharded input: it was cut as if it had the input's size, each device
    # but the first got no row, and the product lost its rows (4 rows became 1) or failed.
    "sum_times_x": lambda x: tf.reduce_sum(x, _long_axes(x), keepdims=True) * x,
    "x_minus_max": lambda x: x - tf.reduce_max(x, _long_axes(x), keepdims=True),
}


def _long_axes(x):
    return tf.cast(tf.where(tf.shape(x) > 3)[:, 0], tf.int32)


def _steps_match_one_device(step, layout, lowering, steps=3):
    """`step(iterator, to_mesh)` on batches of unknown size, plain and on `layout`'s mesh
    under `lowering`: every result's global value equals the plain one."""
    plain = tf.function(step)
    iterator = _batches_of_unknown_size(10, 4, 4)
    want = [[t.numpy() for t in plain(iterator, lambda x, spec=None: x)]
            for _ in range(steps)]
    config.set_collective_lowering(lowering)
    try:
        sharded = tf.function(step)
        iterator = _batches_of_unknown_size(10, 4, 4)
        for expected in want:
            with dtensor.run_on(layout.mesh):
                got = sharded(iterator, lambda x, spec=None: dtensor.relayout(
                    x, layout_of(spec, layout.mesh) if spec else layout))
            for e, g in zip(expected, got):
                np.testing.assert_allclose(reassemble(g), e, rtol=1e-5, atol=1e-6)
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("lowering", ["shared", "copies", "ops"])
@pytest.mark.parametrize("spec", ["[x,*]", "[x,y]"])
@pytest.mark.parametrize("fn", sorted(GRADIENTS))
def test_gradients_summed_over_run_time_axes_of_sharded_values(fn, spec, lowering):
    # The sharded input of the gradient's Sum is gathered (any of its axes may be reduced)
    # and each device runs it as one device would. On 8 devices the last batch of 2 rows
    # leaves six devices an empty block.
    def step(iterator, to_mesh):
        x = to_mesh(next(iterator))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = GRADIENTS[fn](x)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, x)

    mesh = MESH_8 if spec == "[x,*]" else MESH_2X2
    _steps_match_one_device(step, layout_of(spec, mesh), lowering)


@pytest.mark.parametrize("lowering", ["copies", "ops"])
@pytest.mark.parametrize("fn", sorted(REDUCTIONS))
def test_reductions_and_scans_over_run_time_axes_of_sharded_values(fn, lowering):
    def step(iterator, to_mesh):
        return (REDUCTIONS[fn](to_mesh(next(iterator))),)

    _steps_match_one_device(step, layout_of("[x,y]", MESH_2X2), lowering)


@pytest.mark.parametrize("lowering", ["copies", "ops"])
def test_shape_of_a_sharded_batch_of_run_time_size_under_every_lowering(lowering):
    # Under the `ops` lowering the all-gather of pieces whose size is known only at run
    # time gave a value of 0 rows (tf.shape said [0, 4] for 8 rows, a silent wrong answer)
    # and a batch that left some devices fewer rows aborted the collective ("Shape
    # mismatch in the collective instance"); sizes now go round before the gather.
    def step(iterator, to_mesh):
        x = to_mesh(next(iterator))
        return tf.shape(x), tf.reduce_sum(x, 0), to_mesh(x, "[*,x]")

    _steps_match_one_device(step, layout_of("[x,*]", MESH_8), lowering)


@pytest.mark.parametrize("lowering", ["copies", "ops"])
def test_a_host_value_of_run_time_size_one_broadcasts_against_a_sharded_batch(lowering):
    # `r` is made on the host from the batch before it goes to the mesh: of size 1 along
    # axis 0 for the full batches, of the batch's size for the last, known only at run time.
    def step(iterator, to_mesh):
        x = next(iterator)
        r = tf.reduce_sum(x, _long_axes(x), keepdims=True)
        return (to_mesh(x) * r,)

    _steps_match_one_device(step, layout_of("[x,*]", MESH_8), lowering)


def test_a_reduction_over_run_time_axes_without_keepdims_says_to_keep_them():
    # TF infers no rank for its result; the message named only fixed-shape inputs and
    # tf.Variables, neither of which is the cause here.
    def step(iterator, to_mesh):
        x = to_mesh(next(iterator))
        return (tf.reduce_sum(x, _long_axes(x)),)

    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"output 0 of 'Sum' is unknown, even its rank.*keepdims=True"):
        _steps_match_one_device(step, layout_of("[x,*]", MESH_8), "copies", steps=1)


@pytest.mark.parametrize("lowering", ["copies", "ops"])
@pytest.mark.parametrize("axis", [0, 1])
def test_gradient_of_a_concat_of_batches_of_run_time_size_in_strict_mode(axis, lowering):
    # TF keeps the gradient's ConcatOffset (where each input starts in the output) when
    # the sizes are known only at run time; it had no rule, so strict mode refused the
    # step ("'ConcatOffset' has no tf_dtensor rule"; found by the program fuzzer). The
    # offsets come from the global shapes, computed on every device.
    def step(iterator, to_mesh):
        x = to_mesh(next(iterator))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.concat([tf.tanh(x), x * x], axis=axis)
            loss = tf.reduce_sum(tf.sin(y))
        return y, tape.gradient(loss, x)

    dtensor.set_strict_mode(True)
    try:
        _steps_match_one_device(step, layout_of("[x,*]", MESH_8), lowering)
    finally:
        dtensor.set_strict_mode(False)
