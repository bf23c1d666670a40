"""Cases that once gave a wrong answer, or an error TensorFlow's one device does not give,
found by trying tf_dtensor as users would (shared/design/known-defects.md, the "Drop-in,
part 2" issue). Each compares with the same computation on one plain device, under every
collective lowering, eagerly and in tf.function.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import LOWERINGS, MESH_8, collective_lowering, cpus
import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

NAN, INF = np.nan, np.inf
MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
MESH_1_1_2 = dtensor.create_mesh([("b", 1), ("x", 1), ("y", 2)], devices=cpus(2))


def _laid_out(value, specs, mesh):
    whole = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(mesh, len(specs)))
    return dtensor.relayout(whole, Layout(specs, mesh))


def _whole(tensor):
    layout = dtensor.fetch_layout(tensor)
    return dtensor.unpack(dtensor.relayout(tensor, Layout.replicated(layout.mesh,
                                                                     layout.rank)))[0].numpy()


def _both(fn):
    """`fn` eagerly and as a tf.function."""
    return [("eager", fn), ("function", tf.function(fn))]


# --- size-1 mesh dimensions (known defect 2) -----------------------------------------------

@pytest.mark.parametrize("lowering", LOWERINGS)
def test_fft2d_on_a_mesh_with_dimensions_of_size_one(lowering):
    rng = np.random.RandomState(0)
    value = (rng.rand(2, 4, 4) + 1j * rng.rand(2, 4, 4)).astype(np.complex64)
    with collective_lowering(lowering):
        t = _laid_out(value, ["b", "x", "y"], MESH_1_1_2)
        for mode, fn in _both(tf.signal.fft2d):
            np.testing.assert_allclose(_whole(fn(t)), np.fft.fft2(value), rtol=1e-4, atol=1e-4,
                                       err_msg=mode)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_gathering_an_axis_sharded_over_size_one_dimensions(lowering):
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    with collective_lowering(lowering):
        t = _laid_out(value, ["x", "y"], MESH_1_1_2)
        whole = dtensor.relayout(t, Layout(["unsharded", "y"], MESH_1_1_2))
        np.testing.assert_array_equal(_whole(whole), value)
        swapped = dtensor.relayout(t, Layout(["y", "x"], MESH_1_1_2))
        np.testing.assert_array_equal(_whole(swapped), value)


# --- out-of-range indices (known defect 3) -------------------------------------------------

TABLE = np.arange(32, dtype=np.float32).reshape(8, 4)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("bad", [9, 8, -1])
def test_gather_with_an_index_out_of_range_raises_as_on_one_device(lowering, bad):
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.gather(tf.constant(TABLE), [1, bad])
    with collective_lowering(lowering):
        t = _laid_out(TABLE, ["x", "y"], MESH_2X4)
        for mode, fn in _both(lambda t, i: tf.gather(t, i)):
            ids = dtensor.copy_to_mesh(tf.constant([1, bad]), Layout.replicated(MESH_2X4, 1))
            with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
                _whole(fn(t, ids))
        # In range, the same path gives the rows.
        ids = dtensor.copy_to_mesh(tf.constant([1, 7]), Layout.replicated(MESH_2X4, 1))
        np.testing.assert_array_equal(_whole(tf.gather(t, ids)), TABLE[[1, 7]])


def test_scatter_into_a_sharded_variable_out_of_range_raises():
    reference = tf.Variable(TABLE)
    with pytest.raises(tf.errors.InvalidArgumentError):
        reference.scatter_add(tf.IndexedSlices(tf.ones([1, 4]), tf.constant([8])))
    v = dtensor.DVariable(_laid_out(TABLE, ["x", "unsharded"], MESH_8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        v.scatter_add(tf.IndexedSlices(tf.ones([1, 4]), tf.constant([8])))
    v.scatter_add(tf.IndexedSlices(tf.ones([1, 4]), tf.constant([7])))
    expected = TABLE.copy()
    expected[7] += 1
    np.testing.assert_array_equal(_whole(v.read_value()), expected)


def test_segment_sum_into_sharded_segments_checks_ids_as_one_device():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = Layout(["x", "unsharded"], dtensor.create_mesh([("x", 2)], devices=cpus(2)))
    d = dtensor.copy_to_mesh(tf.constant(data), Layout.replicated(out.mesh, 2))
    ids = [0, 3, -1, 3]  # a negative id is dropped on one device
    expected = tf.math.unsorted_segment_sum(data, ids, 4).numpy()
    got = dtensor.call_with_layout(tf.math.unsorted_segment_sum, out, d, tf.constant(ids), 4)
    np.testing.assert_array_equal(_whole(got), expected)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.math.unsorted_segment_sum(data, [0, 4, 1, 1], 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        _whole(dtensor.call_with_layout(tf.math.unsorted_segment_sum, out, d,
                                        tf.constant([0, 4, 1, 1]), 4))


# --- NaN and infinities over a sharded axis (known defect 4) -------------------------------

ROWS = np.array([[1, NAN, 2, -INF], [INF, 0, -1, 3], [1, 2, 3, NAN], [INF, INF, 1, 2],
                 [-INF, -INF, -INF, -INF], [-INF, 1, 2, 3], [1, 2, 3, 4], [0, 0, 0, 0]],
                np.float32)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("specs", [["x", "y"], ["unsharded", "y"], ["y", "x"]])
@pytest.mark.parametrize("name,op", [("softmax", tf.nn.softmax),
                                     ("log_softmax", tf.nn.log_softmax)])
def test_softmax_of_rows_with_nan_and_inf_equals_one_device(lowering, specs, name, op):
    expected = op(tf.constant(ROWS)).numpy()
    with collective_lowering(lowering):
        t = _laid_out(ROWS, specs, MESH_2X4)
        for mode, fn in _both(op):
            # NaN where one device has NaN, the same infinities, and finite values to float
            # rounding (the sharded row sums add in another order).
            np.testing.assert_allclose(_whole(fn(t)), expected, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} {mode}")


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64], ids=lambda d: d.name)
def test_softmax_of_rows_with_nan_and_inf_of_other_float_dtypes(dtype):
    # TF's CPU kernel keeps the finite entries of a NaN or +inf row at 0 for float32 and
    # bfloat16 only; float16 and float64 rows are NaN throughout. The float32 behaviour
    # was made for every dtype: float16 and float64 rows came back [nan, nan, 0, 0].
    rows = tf.constant(ROWS, dtype)
    expected = tf.cast(tf.nn.softmax(rows), tf.float64).numpy()
    t = _laid_out(rows, ["unsharded", "y"], MESH_2X4)
    for mode, fn in _both(tf.nn.softmax):
        got = tf.cast(tf.constant(_whole(fn(t))), tf.float64).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-3, err_msg=mode)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_cross_entropy_of_rows_with_nan_and_inf_equals_one_device(lowering):
    labels = np.eye(4, dtype=np.float32)[[2, 0, 1, 3, 0, 2, 3, 1]]
    sparse = labels.argmax(axis=1).astype(np.int64)
    loss, backprop = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=ROWS, labels=labels)
    sloss, sbackprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=ROWS,
                                                                      labels=sparse)
    with collective_lowering(lowering):
        t = _laid_out(ROWS, ["x", "y"], MESH_2X4)
        lab = _laid_out(labels, ["x", "y"], MESH_2X4)
        got_loss, got_backprop = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=t, labels=lab)
        np.testing.assert_allclose(_whole(got_loss), loss.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(_whole(got_backprop), backprop.numpy(), rtol=1e-6, atol=1e-7)
        slab = _laid_out(sparse, ["x"], MESH_2X4)
        got_sloss, got_sbackprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=t, labels=slab)
        np.testing.assert_allclose(_whole(got_sloss), sloss.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(_whole(got_sbackprop), sbackprop.numpy(), rtol=1e-6, atol=1e-7)


# --- eager gradients of DTensors (known defect 5) ------------------------------------------

@pytest.mark.parametrize("name,fn", [
    ("sum", tf.reduce_sum),
    ("sum of an empty slice", lambda x: tf.reduce_sum(x[:, :, :3, :0])),
    ("sum of a slice", lambda x: tf.reduce_sum(x[:, :, :1, :1] * 3.0)),
])
def test_eager_gradient_of_a_dtensor_is_a_dtensor_of_its_layout(name, fn):
    value = np.random.RandomState(3).rand(4, 4, 2, 1).astype(np.float32)
    plain = tf.constant(value)
    with tf.GradientTape() as tape:
        tape.watch(plain)
        y = fn(plain)
    expected = tape.gradient(y, plain).numpy()
    layout = Layout(["x", "unsharded", "unsharded", "unsharded"],
                    dtensor.create_mesh([("x", 4)], devices=cpus(4)))
    x = _laid_out(value, layout.sharding_specs, layout.mesh)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    got = tape.gradient(y, x)
    assert dtensor.is_dtensor(got), name
    assert dtensor.fetch_layout(got) == layout, name
    np.testing.assert_array_equal(_whole(got), expected, err_msg=name)


def test_unconnected_gradient_of_a_dtensor_is_a_dtensor():
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = _laid_out(np.ones([4, 2], np.float32), ["x", "unsharded"], mesh)
    z = _laid_out(np.ones([4, 2], np.float32), ["x", "unsharded"], mesh)
    with tf.GradientTape() as tape:
        tape.watch([x, z])
        y = tf.reduce_sum(x)
    gx, gz = tape.gradient(y, [x, z], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for g in (gx, gz):
        assert dtensor.is_dtensor(g)
        assert dtensor.fetch_layout(g) == Layout(["x", "unsharded"], mesh)
    np.testing.assert_array_equal(_whole(gx), np.ones([4, 2]))
    np.testing.assert_array_equal(_whole(gz), np.zeros([4, 2]))


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_sparse_cross_entropy_with_a_label_out_of_range_raises(lowering):
    logits = np.random.RandomState(4).rand(8, 4).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 0, 1, 2], np.int64)  # 4 is no class of 4
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits, labels=labels)
    with collective_lowering(lowering):
        t = _laid_out(logits, ["x", "y"], MESH_2X4)
        lab = _laid_out(labels, ["x"], MESH_2X4)
        with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
            loss, _ = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=t, labels=lab)
            _whole(loss)


# --- pack's replicas ---------------------------------------------------------------------

def test_pack_run_check_refuses_replicas_that_differ():
    mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4))
    a, b = np.zeros([2], np.float32), np.ones([2], np.float32)
    # [x] over x=2, y=2: devices (0,0),(0,1) hold block 0, (1,0),(1,1) block 1.
    layout = Layout(["x"], mesh)
    # Without the check, as TensorFlow's DTensor: taken as given.
    dtensor.pack([a, b, a, a], layout)
    with pytest.raises(tf_dtensor.PackError, match=r"components 0 \(.*CPU:0\) and 1 .*replicated "
                                                r"over y"):
        dtensor.pack([a, b, a, a], layout, run_check=True)
    # Replicas that agree pass, and the result is the usual DTensor.
    good = dtensor.pack([a, a, b, b], layout, run_check=True)
    np.testing.assert_array_equal(_whole(good), np.concatenate([a, b]))
    # Partial dimensions hold terms, not replicas.
    dtensor.pack([a, b, a, b], Layout(["x"], mesh, partial={"y": "sum"}), run_check=True)
    # NaN equals NaN for the check.
    n = np.array([np.nan, 1], np.float32)
    dtensor.pack([n] * 4, Layout.replicated(mesh, 1), run_check=True)


def test_from_local_run_check():
    from tf_dtensor.placements import Replicate, Shard, from_local
    mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4))
    a, b = tf.zeros([2]), tf.ones([2])
    with pytest.raises(tf_dtensor.PackError, match="from_local"):
        from_local([a, b, a, a], mesh, [Shard(0), Replicate()], run_check=True)
    from_local([a, a, b, b], mesh, [Shard(0), Replicate()], run_check=True)


# --- device names ------------------------------------------------------------------------

@pytest.mark.parametrize("name,full", [
    ("/CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0"),
    ("job:localhost/replica:0/task:0/TPU:0", "/job:localhost/replica:0/task:0/device:TPU:0"),
    ("/job:localhost/replica:0/task:0/TPU:0", "/job:localhost/replica:0/task:0/device:TPU:0"),
    ("/job:localhost/task:0/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"),
    ("/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"),
])
def test_single_device_mesh_from_every_device_form_tensorflow_takes(name, full):
    """TensorFlow's DTensor accepts these forms (its own tests build meshes from them)."""
    mesh = dtensor.Mesh.from_device(name)
    assert mesh.is_single_device()
    assert mesh.single_device == full
