"""Collectives lowered as TensorFlow's collective ops (cc/spmd/collective_ops_lowering.cc),
forced on the 8 virtual CPUs; behaviours both lowerings (cc/spmd/lowering.h) must share; and
the refusal of meshes whose devices are partly in other processes.

    sum([x,*], axis=0) -> partial(x) -> CollectiveReduceV2(Add) on every device -> [*]
    [*,x] -> [*,*]: transpose, CollectiveGatherV2 along axis 0, transpose back
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, cpus, layout_of,
                             random_array, reassemble, to_dtensor)
import dtensor_testing
from tf_dtensor import config, debug, dtensor
from tf_dtensor.dtensor import Layout, Mesh, create_mesh

# Devices in reverse order: TF ranks a group by device index, the mesh by coordinate, so
# the gathered pieces must be put back in mesh order.
MESH_REVERSED = create_mesh([("x", 4)], devices=list(reversed(cpus(4))))
MESH_2X4 = create_mesh([("x", 2), ("y", 4)], devices=cpus(8))

REDUCTIONS = {"sum": tf.reduce_sum, "max": tf.reduce_max, "min": tf.reduce_min,
              "prod": tf.reduce_prod}


@pytest.fixture
def collective_ops():
    """Collectives run as TF collective ops for one test."""
    config.set_collective_lowering("ops")
    try:
        yield
    finally:
        config.set_collective_lowering("")


@pytest.fixture(params=["shared", "copies", "ops"])
def lowering(request):
    """Each lowering in turn, for one test."""
    config.set_collective_lowering(request.param)
    try:
        yield request.param
    finally:
        config.set_collective_lowering("")


def _data(shape, low=0.5, high=1.5, seed=3):
    return random_array(shape, np.float32, low, high, seed=seed)


def test_policy_setter_round_trips_and_rejects_unknown_names():
    before = config.collective_lowering()
    config.set_collective_lowering("ops")
    assert config.collective_lowering() == "ops"
    config.set_collective_lowering("")
    assert config.collective_lowering() == before
    with pytest.raises(ValueError, match="expected `auto`, `shared`, `copies` or `ops`"):
        config.set_collective_lowering("nccl")


def test_the_lowering_a_mesh_takes_follows_the_policy(monkeypatch):
    # NCCL is for GPU meshes only: asking for it changes nothing on CPUs.
    monkeypatch.setenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1")
    try:
        config.set_collective_lowering("auto")
        assert config.collective_lowering(MESH_8) == "shared"
        config.set_collective_lowering("ops")
        assert config.collective_lowering(MESH_8) == "ops"
        assert config.collective_lowering() == "ops"
        config.set_collective_lowering("copies")
        assert config.collective_lowering(MESH_8) == "copies"
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("mesh, spec, axis", [
    (MESH_8, "x,*", 0), (MESH_1D, "x,*", None), (MESH_2X2, "x,y", 0), (MESH_2X2, "x,y", None),
    (MESH_2X4, "y,x", 1), (MESH_REVERSED, "*,x", 1)],
    ids=["8[x,*]-0", "2[x,*]-all", "2x2[x,y]-0", "2x2[x,y]-all", "2x4[y,x]-1", "rev[*,x]-1"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_reduction_over_sharded_axes(collective_ops, name, mesh, spec, axis, traced):
    fn = REDUCTIONS[name]
    value = _data((8, 8))
    expected = fn(value, axis=axis).numpy()
    run = tf.function(lambda t: fn(t, axis=axis)) if traced else (lambda t: fn(t, axis=axis))
    actual = run(to_dtensor(value, layout_of(spec, mesh)))
    layout = tf_dtensor.fetch_layout(actual)
    np.testing.assert_allclose(tf_dtensor.unpack(tf_dtensor.relayout(
        actual, Layout.replicated(mesh, layout.rank)))[0].numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_matmul_with_a_sharded_contraction(collective_ops, traced):
    # [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]
    a, b = _data((16, 1024), seed=0), _data((1024, 8), seed=1)
    run = tf.function(tf.matmul) if traced else tf.matmul
    actual = run(to_dtensor(a, layout_of("*,x", MESH_8)), to_dtensor(b, layout_of("x,*", MESH_8)))
    assert_dtensor_equal(a @ b, layout_of("*,*", MESH_8), actual)


@pytest.mark.parametrize("mesh, source, target", [
    (MESH_8, "x,*", "*,*"), (MESH_8, "x,*", "*,x"), (MESH_2X2, "x,y", "y,x"),
    (MESH_2X4, "x,y", "y,x"), (MESH_2X4, "*,y", "*,*"), (MESH_REVERSED, "x,*", "*,*"),
    (MESH_REVERSED, "*,x", "x,*")],
    ids=["8[x,*]-[*,*]", "8[x,*]-[*,x]", "2x2[x,y]-[y,x]", "2x4[x,y]-[y,x]", "2x4[*,y]-[*,*]",
         "rev[x,*]-[*,*]", "rev[*,x]-[x,*]"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_relayout(collective_ops, mesh, source, target, traced):
    value = _data((8, 8))
    target_layout = layout_of(target, mesh)
    run = tf.function(lambda t: tf_dtensor.relayout(t, target_layout)) if traced else (
        lambda t: tf_dtensor.relayout(t, target_layout))
    actual = run(to_dtensor(value, layout_of(source, mesh)))
    assert_dtensor_equal(value, target_layout, actual)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_gradient_through_collectives(collective_ops, traced):
    # loss = sum((a @ b)^2) with the contraction sharded: the forward pass all-reduces,
    # the backward pass gathers.
    a, b = _data((16, 1024), seed=0), _data((1024, 8), seed=1)

    def grads(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            loss = tf.reduce_sum(tf.square(tf.matmul(x, y)))
        return tape.gradient(loss, [x, y])

    expected = grads(tf.constant(a), tf.constant(b))
    run = tf.function(grads) if traced else grads
    da, db = run(to_dtensor(a, layout_of("*,x", MESH_8)), to_dtensor(b, layout_of("x,*", MESH_8)))
    for want, got in zip(expected, (da, db)):
        whole = tf_dtensor.relayout(got, Layout.replicated(MESH_8, 2))
        np.testing.assert_allclose(tf_dtensor.unpack(whole)[0].numpy(), want.numpy(), rtol=1e-4)


def test_integer_all_reduce(collective_ops):
    value = np.arange(16, dtype=np.int32).reshape(8, 2)
    actual = tf.reduce_sum(to_dtensor(value, layout_of("x,*", MESH_8)), axis=0)
    assert_dtensor_equal(value.sum(axis=0).astype(np.int32), layout_of("*", MESH_8), actual)


# Devices in no monotone order: TF ranks the y-group of x=0 (CPU:3,1,7,5) as y=1,0,3,2 and
# that of x=1 (CPU:0,2,6,4) as y=0,1,3,2, so a ring sum adds the terms in another order in
# each group.
MESH_2X4_PERMUTED = create_mesh([("x", 2), ("y", 4)],
                                devices=[f"CPU:{i}" for i in [3, 1, 7, 5, 0, 2, 6, 4]])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_replicas_of_a_sum_agree_on_a_permuted_device_list(collective_ops, traced):
    # Regression: the replicas over x of a sum over y differed in the last bits (each
    # y-group added its terms in TF's rank order). The groups now gather and add in mesh
    # order. The values are compared with a tolerance (a sum of 64 terms of both signs
    # cancels), the replicas bit for bit.
    mesh = MESH_2X4_PERMUTED
    a, b = random_array((16, 64), seed=0), random_array((64, 16), seed=1)

    def program(x, y):
        product = tf.matmul(x, y)   # [*,y] @ [y,*] -> partial(y) -> all-reduce -> [*,*]
        return product, tf.reduce_sum(x, axis=1), tf.reduce_mean(x, axis=1), tf.reduce_prod(
            x[:, :8] * 0.5 + 1.0, axis=1)

    expected = program(tf.constant(a), tf.constant(b))
    run = tf.function(program) if traced else program
    outputs = run(to_dtensor(a, layout_of("*,y", mesh)), to_dtensor(b, layout_of("y,*", mesh)))
    for want, got in zip(expected, outputs):
        assert dtensor.fetch_layout(got) == Layout.replicated(mesh, want.shape.rank)
        assert got.dtype == want.dtype and got.shape == want.shape
        replicas = [c.numpy() for c in dtensor.unpack(got)]
        for device, replica in zip(mesh.local_devices(), replicas):
            np.testing.assert_array_equal(replica, replicas[0], err_msg=device)
        np.testing.assert_allclose(replicas[0], want.numpy(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Meshes whose local devices are a subset of their global devices
# ---------------------------------------------------------------------------------------

def _local_subset_mesh() -> Mesh:
    # Global devices 0..7, of which this process holds 0..3.
    return Mesh(["x"], np.arange(8), [0, 1, 2, 3], cpus(4))


@pytest.mark.parametrize("policy", ["", "ops"], ids=["default", "ops"])
def test_local_subset_mesh_sum_is_refused_not_a_partial_sum(policy):
    # Regression: reduce_sum of 8 ones returned 4.0 (only the local partial sums).
    config.set_collective_lowering(policy)
    try:
        mesh = _local_subset_mesh()
        ones = tf_dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=[8])
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match=r"(?s)all-reduce.*holds 4 of the 8 devices of mesh\(x=8\)"
                                 r".*mesh of this process's devices"):
            tf_dtensor.unpack(tf.reduce_sum(ones))[0].numpy()
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("policy", ["", "ops"], ids=["default", "ops"])
def test_local_subset_mesh_relayout_to_replicated_is_refused_not_a_crash(policy):
    # Regression: the all-gather passed null handles for the missing pieces and crashed.
    config.set_collective_lowering(policy)
    try:
        mesh = _local_subset_mesh()
        ones = tf_dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=[8])
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match=r"all-gather axis 0 of a \[x\] @ mesh\(x=8\) value"):
            tf_dtensor.relayout(ones, Layout.replicated(mesh, 1))
    finally:
        config.set_collective_lowering("")


def test_local_subset_mesh_is_refused_inside_tf_function():
    mesh = _local_subset_mesh()
    ones = tf_dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=[8])
    with pytest.raises(tf.errors.FailedPreconditionError, match="holds 4 of the 8 devices"):
        tf.function(tf.reduce_sum)(ones)


def test_local_subset_mesh_runs_local_ops():
    # Ops that need no collective still run on the local shards.
    mesh = _local_subset_mesh()
    ones = tf_dtensor.call_with_layout(tf.ones, Layout(["x"], mesh), shape=[8])
    doubled = ones * 2.0
    assert [c.numpy().tolist() for c in tf_dtensor.unpack(doubled)] == [[2.0]] * 4


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.uint32, np.uint64,
                                   np.complex64, np.complex128, tf.bfloat16.as_numpy_dtype],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_gather_of_dtypes_the_collective_ops_lack(collective_ops, dtype, traced):
    # CollectiveGatherV2 takes float, half, double, int32 and int64 only: the others
    # travel cast or bitcast to one of those.
    value = (np.arange(64).reshape(8, 8) % 3).astype(dtype)
    if np.dtype(dtype).kind == "c":
        value = value + 1j * value.T
    target = layout_of("*,*", MESH_2X4)
    run = tf.function(lambda t: tf_dtensor.relayout(t, target)) if traced else (
        lambda t: tf_dtensor.relayout(t, target))
    assert_dtensor_equal(value, target, run(to_dtensor(value, layout_of("y,x", MESH_2X4))))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.uint32, np.complex64,
                                   tf.bfloat16.as_numpy_dtype],
                         ids=lambda d: np.dtype(d).name)
def test_sum_of_dtypes_the_collective_ops_lack(collective_ops, dtype):
    value = (np.arange(16).reshape(8, 2) % 3).astype(dtype)
    actual = tf.reduce_sum(to_dtensor(value, layout_of("x,*", MESH_8)), axis=0)
    assert_dtensor_equal(value.sum(axis=0).astype(dtype), layout_of("*", MESH_8), actual)


def test_uint64_sums_and_products_wrap_as_numpy_does(collective_ops):
    # CollectiveReduceV2 has no uint64 kernel: sums and products travel bitcast as int64
    # (the same bits modulo 2^64), maxima and minima as a gather. The values straddle 2^63,
    # where a cast to int64 would be wrong.
    value = np.array([[2**63 + 5, 7], [2**63 - 1, 3], [2**64 - 2, 1], [9, 2**62]] * 2,
                     dtype=np.uint64)
    sharded = to_dtensor(value, layout_of("x,*", MESH_8))
    with np.errstate(over="ignore"):
        for reduce, expected in [(tf.reduce_sum, value.sum(axis=0, dtype=np.uint64)),
                                 (tf.reduce_prod, value.prod(axis=0, dtype=np.uint64)),
                                 (tf.reduce_max, value.max(axis=0)),
                                 (tf.reduce_min, value.min(axis=0))]:
            assert_dtensor_equal(expected, layout_of("*", MESH_8), reduce(sharded, axis=0))


def test_a_dtype_no_collective_op_takes_is_refused_by_name(collective_ops):
    words = tf_dtensor.relayout(
        tf_dtensor.copy_to_mesh(tf.constant([str(i) for i in range(8)]), layout_of("*", MESH_8)),
        layout_of("x", MESH_8))
    with pytest.raises(tf.errors.UnimplementedError,
                       match=r"TfDTensorRelayout.*\[x\] @ mesh\(x=8\).*cannot all-gather a "
                             r"tensor of dtype string\. Cast it first"):
        tf_dtensor.relayout(words, layout_of("*", MESH_8))
    # The refusal comes before any collective runs: the next one works.
    assert_dtensor_equal(np.full([2], 8.0, np.float32), layout_of("*", MESH_8),
                         tf.reduce_sum(to_dtensor(np.ones([8, 2], np.float32),
                                                  layout_of("x,*", MESH_8)), axis=0))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=lambda d: np.dtype(d).name)
def test_mean_of_complex_values(collective_ops, dtype):
    # A pending mean (partial(x:mean)) of complex values reduces as its real and imaginary
    # parts, as the sum does (the fuzzer's FFT2D, IFFT and ComplexAbs cases of a partial
    # mean input failed under the collective ops).
    value = (np.arange(16).reshape(8, 2) % 5 + 1j * (np.arange(16).reshape(8, 2) % 3)).astype(dtype)
    actual = tf.reduce_mean(to_dtensor(value, layout_of("x,*", MESH_8)), axis=0)
    assert_dtensor_equal(value.mean(axis=0).astype(dtype), layout_of("*", MESH_8), actual)
    pending = Layout(["unsharded"], MESH_8, partial={"x": "mean"})
    terms = [value[i] for i in range(8)]
    # Each device holds one term; the value is their mean.
    mean_of_terms = tf_dtensor.pack(terms, pending)
    assert_dtensor_equal(value.mean(axis=0).astype(dtype), layout_of("*", MESH_8),
                         tf_dtensor.relayout(mean_of_terms, layout_of("*", MESH_8)))


def test_any_and_all_over_a_sharded_axis(collective_ops):
    value = np.zeros((8, 2), dtype=np.bool_)
    value[3, 0] = True
    sharded = to_dtensor(value, layout_of("x,*", MESH_8))
    assert_dtensor_equal(value.any(axis=0), layout_of("*", MESH_8),
                         tf.reduce_any(sharded, axis=0))
    assert_dtensor_equal(value.all(axis=0), layout_of("*", MESH_8),
                         tf.reduce_all(sharded, axis=0))


@pytest.mark.parametrize("source, target", [("*,*,y", "y,*,*"), ("y,x,*", "*,x,y"),
                                            ("*,x,*", "x,*,*"), ("x,*,*", "*,*,x")],
                         ids=lambda s: f"[{s}]")
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_to_all_of_rank_3(collective_ops, source, target, traced):
    # One CollectiveAllToAllV2 moves the mesh axis between tensor axes.
    value = _data((8, 4, 8))
    target_layout = layout_of(target, MESH_2X4)
    run = tf.function(lambda t: tf_dtensor.relayout(t, target_layout)) if traced else (
        lambda t: tf_dtensor.relayout(t, target_layout))
    assert_dtensor_equal(value, target_layout, run(to_dtensor(value, layout_of(source, MESH_2X4))))


def test_all_to_all_of_bool_takes_the_gather_path(collective_ops):
    value = np.arange(64).reshape(8, 8) % 3 == 0
    target = layout_of("*,x", MESH_8)
    assert_dtensor_equal(value, target, tf_dtensor.relayout(to_dtensor(value, layout_of("x,*", MESH_8)),
                                                            target))


MESH_4 = create_mesh([("x", 4)], devices=cpus(4))


@pytest.mark.parametrize("mesh,specs", [(MESH_4, ["x", "unsharded"]),
                                        (MESH_4, ["unsharded", "x"]),
                                        (MESH_2X2, ["y", "x"])],
                         ids=lambda v: v.short() if isinstance(v, Mesh) else "-".join(v))
@pytest.mark.parametrize("shape", [(5, 6), (7, 5)], ids=str)
def test_uneven_shards_gather_through_collective_ops(collective_ops, mesh, specs, shape):
    # Pieces are padded to the chunk size for CollectiveGatherV2 and trimmed after it.
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    sharded = to_dtensor(value, Layout(specs, mesh))
    replicated = Layout.replicated(mesh, 2)
    for relayout in (tf_dtensor.dtensor.relayout, tf.function(tf_dtensor.dtensor.relayout)):
        assert_dtensor_equal(value, replicated, relayout(sharded, replicated))
    summed = tf.function(lambda t: tf.reduce_sum(t, axis=0))(sharded)
    np.testing.assert_allclose(reassemble(summed), value.sum(axis=0))


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_partial_values_reduce_through_collective_ops(collective_ops, op):
    value = _data((4, 6))
    partial = to_dtensor(value, Layout(["unsharded", "unsharded"], MESH_2X2, partial={"y": op}))
    assert_dtensor_equal(value, Layout.replicated(MESH_2X2, 2),
                         tf_dtensor.dtensor.relayout(partial, Layout.replicated(MESH_2X2, 2)))
    if op == "sum":
        # Partial -> sharded over the same dimension (reduce-scatter).
        assert_dtensor_equal(value, Layout(["y", "unsharded"], MESH_2X2),
                             tf_dtensor.dtensor.relayout(partial, Layout(["y", "unsharded"], MESH_2X2)))


@pytest.mark.parametrize("mesh,source,target", [
    (MESH_2X2, (["x", "unsharded"], {"y": "sum"}), ["x", "y"]),
    (MESH_2X2, (["unsharded", "unsharded"], {"x": "mean"}), ["unsharded", "x"]),
    (MESH_REVERSED, (["unsharded", "unsharded"], {"x": "sum"}), ["x", "unsharded"]),
    (MESH_REVERSED, (["unsharded", "unsharded"], {"x": "max"}), ["unsharded", "x"]),
], ids=["2x2-rows-sharded", "2x2-mean", "reversed-axis0", "reversed-axis1-max"])
def test_partial_to_sharded_through_collective_ops(collective_ops, mesh, source, target):
    # A reduce-scatter is an all-reduce then a slice: TF's CollectiveReduceScatterV2 has no
    # CPU implementation ("did not find collective implementation"), only NCCL's.
    value = _data((4, 8))
    specs, partial = source
    partial_value = to_dtensor(value, Layout(specs, mesh, partial=partial))
    for relayout in (tf_dtensor.dtensor.relayout, tf.function(tf_dtensor.dtensor.relayout)):
        assert_dtensor_equal(value, Layout(target, mesh), relayout(partial_value, Layout(target, mesh)))


# ---------------------------------------------------------------------------------------
# Behaviours both lowerings share
# ---------------------------------------------------------------------------------------

def _run(fn, traced):
    return tf.function(fn) if traced else fn


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_gather_of_an_empty_tensor_returns_it(lowering, traced):
    # Known defect 1: under the ops lowering CollectiveGatherV2 of [1,0] pieces killed the
    # process (SIGSEGV). TF's DTensor returns the empty tensor.
    mesh = create_mesh([("x", 4)], devices=cpus(4))
    t = tf_dtensor.dtensor.copy_to_mesh(tf.zeros([4, 0]), Layout(["x", "unsharded"], mesh))
    target = Layout.replicated(mesh, 2)
    actual = _run(lambda v: tf_dtensor.relayout(v, target), traced)(t)
    assert_dtensor_equal(np.zeros([4, 0], np.float32), target, actual)


@pytest.mark.parametrize("collective, shape, source, target", [
    ("all-gather", (4, 0), (["x", "unsharded"], None), ["unsharded", "unsharded"]),
    ("all-gather", (0, 4), (["unsharded", "x"], None), ["unsharded", "unsharded"]),
    ("all-to-all", (4, 0), (["x", "unsharded"], None), ["unsharded", "x"]),
    ("all-to-all", (0, 8), (["x", "unsharded"], None), ["unsharded", "x"]),
    ("all-reduce", (0, 4), (["unsharded", "unsharded"], {"x": "sum"}), ["unsharded", "unsharded"]),
    ("all-reduce", (4, 0), (["unsharded", "unsharded"], {"x": "max"}), ["unsharded", "unsharded"]),
    ("reduce-scatter", (4, 0), (["unsharded", "unsharded"], {"x": "sum"}), ["x", "unsharded"]),
    ("reduce-scatter", (0, 4), (["unsharded", "unsharded"], {"x": "sum"}), ["unsharded", "x"]),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_collectives_of_empty_tensors_return_empty_tensors(lowering, collective, shape, source,
                                                           target, traced):
    specs, partial = source
    value = np.zeros(shape, np.float32)
    t = to_dtensor(value, Layout(specs, MESH_4, partial=partial) if partial else
                   Layout(specs, MESH_4))
    target_layout = Layout(target, MESH_4)
    actual = _run(lambda v: tf_dtensor.relayout(v, target_layout), traced)(t)
    assert_dtensor_equal(value, target_layout, actual)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_sum_over_an_empty_sharded_axis_is_zeros(lowering, traced):
    # [x,*] of shape [0, 3]: every block is empty; the all-reduce of the partial sums
    # still gives the zeros of shape [3].
    t = to_dtensor(np.zeros((0, 3), np.float32), layout_of("x,*", MESH_4))
    actual = _run(lambda v: tf.reduce_sum(v, axis=0), traced)(t)
    assert_dtensor_equal(np.zeros(3, np.float32), layout_of("*", MESH_4), actual)


def _packed_partial(terms, specs, partial, mesh):
    """A value pending a reduction over mesh dim `d` (the one key of `partial`) whose term
    at coordinate i along d is terms[i]; the other specs shard it evenly."""
    (dim, _), = partial.items()
    components = []
    for location in mesh.local_device_locations():
        block = terms[location[dim]]
        for axis, spec in enumerate(specs):
            if spec != "unsharded":
                block = np.split(block, mesh.dim_size(spec), axis=axis)[location[spec]]
        components.append(block)
    return tf_dtensor.pack(components, Layout(specs, mesh, partial=partial))


@pytest.mark.parametrize("mesh, shape, source, target", [
    (MESH_4, (8, 6), (["unsharded", "unsharded"], {"x": "sum"}), ["x", "unsharded"]),
    (MESH_4, (5, 6), (["unsharded", "unsharded"], {"x": "sum"}), ["x", "unsharded"]),
    (MESH_4, (6, 8), (["unsharded", "unsharded"], {"x": "mean"}), ["unsharded", "x"]),
    (MESH_2X2, (4, 6), (["x", "unsharded"], {"y": "sum"}), ["x", "y"]),
    (MESH_REVERSED, (8, 4), (["unsharded", "unsharded"], {"x": "max"}), ["x", "unsharded"]),
], ids=["4-sum-axis0", "4-sum-uneven", "4-mean-axis1", "2x2-rows-sharded", "reversed-max"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_reduce_scatter_matches_one_device(lowering, mesh, shape, source, target, traced):
    # [*,*] +partial(x) -> [x,*]. Each device's term is a different value, so the reduced
    # value is checked against the reduction on one device, not against a replica.
    specs, partial = source
    (dim, op), = partial.items()
    terms = [_data(shape, seed=10 + i) for i in range(mesh.dim_size(dim))]
    combine = {"sum": np.sum, "mean": np.mean, "max": np.max}[op]
    expected = combine(np.stack(terms), axis=0)
    packed = _packed_partial(terms, specs, partial, mesh)
    target_layout = Layout(target, mesh)
    actual = _run(lambda v: tf_dtensor.relayout(v, target_layout), traced)(packed)
    assert_dtensor_equal(expected, target_layout, actual)


def test_forcing_collective_ops_on_cpus_changes_the_matmul_plan_consistently():
    # A product larger than its operands with a sharded contraction (x^T @ dy): with shared
    # buffers the operands are gathered ([*,*] @ [*,*], no all-reduce); without them (the
    # ops lowering, as on GPUs) the partial products are all-reduced. The plan follows the
    # lowering that runs it, also for an op already planned (and cached) under the other.
    a, b = _data((16, 1024), seed=0), _data((1024, 8), seed=1)
    layouts = [layout_of("*,x", MESH_1D), layout_of("x,*", MESH_1D)]
    config.set_collective_lowering("shared")
    try:
        plan = debug.explain("MatMul", layouts, [[8, 2], [2, 8]])
        assert [l.short() for l in plan["inputs"]] == ["[*,*] @ mesh(x=2)"] * 2
        assert not [c for c in plan["collectives"] if "all-reduce" in c]
        shared = tf.matmul(to_dtensor(a, layouts[0]), to_dtensor(b, layouts[1]))
        assert_dtensor_equal(a @ b, layout_of("*,*", MESH_1D), shared)
        config.set_collective_lowering("ops")
        plan = debug.explain("MatMul", layouts, [[8, 2], [2, 8]])
        assert [l.short() for l in plan["inputs"]] == ["[*,x] @ mesh(x=2)", "[x,*] @ mesh(x=2)"]
        assert plan["collectives"] == ["all-reduce(sum) of output 0 over x"]
        for run in (tf.matmul, tf.function(tf.matmul)):
            ops = run(to_dtensor(a, layouts[0]), to_dtensor(b, layouts[1]))
            assert_dtensor_equal(a @ b, layout_of("*,*", MESH_1D), ops)
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("made_under, used_under", [("shared", "ops"), ("ops", "shared")])
def test_variable_made_under_one_lowering_is_refused_under_another(mesh_1d, made_under,
                                                                   used_under):
    # Under the shared lowering the devices holding one block share one variable; under
    # ops each has its own. Used across a switch, an update was applied once per device
    # (a replicated assign_add of 1 added 2): now refused, naming the fix.
    layout = dtensor.Layout.replicated(mesh_1d, 1)
    with dtensor_testing.collective_lowering(made_under):
        v = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, layout, shape=(2,)))
    with dtensor_testing.collective_lowering(used_under):
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="created under a collective lowering.*before creating"):
            v.assign_add(dtensor.call_with_layout(tf.ones, layout, shape=(2,)))
        # Reading is fine under either.
        np.testing.assert_array_equal(dtensor.unpack(v.read_value())[1].numpy(), [0, 0])
    with dtensor_testing.collective_lowering(made_under):
        v.assign_add(dtensor.call_with_layout(tf.ones, layout, shape=(2,)))
        np.testing.assert_array_equal(dtensor.unpack(v.read_value())[1].numpy(), [1, 1])
    # A variable with no replicas (every mesh dimension shards it) moves freely.
    sharded = dtensor.Layout(["x"], mesh_1d)
    with dtensor_testing.collective_lowering(made_under):
        w = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, sharded, shape=(2,)))
    with dtensor_testing.collective_lowering(used_under):
        w.assign_add(dtensor.call_with_layout(tf.ones, sharded, shape=(2,)))
    np.testing.assert_array_equal([c.numpy() for c in dtensor.unpack(w.read_value())],
                                  [[1], [1]])


def test_uneven_gather_in_a_function_knows_its_block_shapes(collective_ops):
    # [y,*,x,*] of [5,4,4,4] gathered along x inside a tf.function: the blocks are uneven
    # along y, and TF's gather leaves its first axis unknown; the result's blocks get their
    # static shapes back, which MatrixSetDiagV2's shape function needs (the fuzzer's case).
    rng = np.random.RandomState(0)
    matrices, diagonals = rng.rand(5, 4, 4, 4), rng.rand(5, 4, 2, 3)

    def set_band(a, b):
        return tf.raw_ops.MatrixSetDiagV2(input=a, diagonal=b, k=[-2, -1])

    got = tf.function(set_band)(to_dtensor(matrices, layout_of("y,*,x,*", MESH_2X2)),
                                to_dtensor(diagonals, layout_of("y,x,*,*", MESH_2X2)))
    np.testing.assert_allclose(reassemble(got), set_band(matrices, diagonals).numpy())


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_product_of_complex_values(collective_ops, traced):
    # CollectiveReduceV2 has no complex product, and a product does not split into real and
    # imaginary parts: the blocks are gathered and multiplied where they land (the fuzzer's
    # UnsortedSegmentProd case).
    data = (np.arange(1, 9) + 1j * (np.arange(8) % 3)).astype(np.complex64)
    ids = np.array([0, 1, 2, 0, 1, 2, 0, 1], np.int32)

    def prod(d, i):
        return tf.math.unsorted_segment_prod(d, i, num_segments=3)

    run = tf.function(prod) if traced else prod
    for ids_layout in ("x", "*"):
        got = run(to_dtensor(data, layout_of("x", MESH_8)),
                  to_dtensor(ids, layout_of(ids_layout, MESH_8)))
        np.testing.assert_allclose(reassemble(got), prod(data, ids).numpy(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_product_of_complex_values_with_an_empty_block(collective_ops, dtype, traced):
    # [x,y] of [5,3] on 2x4: one device of each y group holds no column. The product over x
    # goes by gather, with the empty block padded; the padded results were discarded twice
    # (free(): corrupted unsorted chunks, the process aborted).
    value = (np.arange(15).reshape(5, 3) % 3 + 1 + 1j * (np.arange(15).reshape(5, 3) % 2)
             ).astype(dtype)
    run = _run(lambda t: tf.reduce_prod(t, axis=0), traced)
    for _ in range(3):
        got = run(to_dtensor(value, layout_of("x,y", MESH_2X4)))
        assert_dtensor_equal(tf.reduce_prod(value, axis=0), layout_of("y", MESH_2X4), got)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_mean_of_a_uint64_partial(lowering, traced):
    # TF's collective ops have no uint64, and int64 bits divide differently: the ops
    # lowering gathers the terms and TF's Mean kernel takes their mean, as one device does
    # (a sum past 2^64 wraps first). It was refused ("cannot all-reduce a tensor of dtype
    # uint64").
    terms = [np.array([2**63 + 7, 2**64 - 1], np.uint64), np.array([5, 2**64 - 3], np.uint64)]
    want = tf.reduce_mean(tf.constant(np.stack(terms)), axis=0)
    layout = Layout(["unsharded"], MESH_2X4, partial={"x": "mean"})
    packed = dtensor.pack([terms[location["x"]] for location in MESH_2X4.local_device_locations()],
                          layout)
    target = layout_of("*", MESH_2X4)
    got = _run(lambda t: dtensor.relayout(t, target), traced)(packed)
    assert_dtensor_equal(want, target, got)


# The copies lowering's all-reduce in its two forms (TF_DTENSOR_COPIES_ALL_REDUCE): through
# each group's leader (two hops), or direct (every device reduces the partials copied to it
# itself, one hop); "auto" takes direct where it copies no more, at most two partials.
# p: distinct partials per group, g: devices per group.
ALL_REDUCE_CASES = {
    "8-p8-g8": (MESH_8, "x,*"),      # every device a partial: auto = leader
    "2x4-p2-g8": (MESH_2X4, "x,*"),  # two partials, four replicas of each: auto = direct
    "2x4-p2-g2": (MESH_2X4, "x,y"),  # result sharded over y: groups of two: auto = direct
}


@pytest.fixture
def copies_all_reduce(monkeypatch):
    """The copies lowering, with the all-reduce form set by the returned function."""
    config.set_collective_lowering("copies")

    def set_form(form):
        monkeypatch.setenv("TF_DTENSOR_COPIES_ALL_REDUCE", form)
    try:
        yield set_form
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("form", ["auto", "direct", "leader"])
@pytest.mark.parametrize("case", list(ALL_REDUCE_CASES))
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "prod"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_copies_all_reduce_forms_match_one_device(copies_all_reduce, form, case, reduction,
                                                  traced):
    copies_all_reduce(form)
    mesh, source = ALL_REDUCE_CASES[case]
    value = _data((8, 8))
    reduce = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max,
              "prod": tf.reduce_prod}[reduction]
    fn = _run(lambda v: reduce(v, axis=0), traced)
    actual = fn(to_dtensor(value, layout_of(source, mesh)))
    expected = reduce(tf.constant(value), axis=0).numpy()
    # reassemble fails where two replicas of one block differ in any bit.
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-5)
    assert dtensor.fetch_layout(actual) == layout_of(source.split(",")[1], mesh)


def _spmd_function_def(name):
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    names = [n for n in context.context().list_function_names()
             if "tfd_spmd" in n and name in n]
    assert names, "no SPMD function found"
    return context.context().get_function_def(max(names, key=lambda n: int(n.rsplit("_", 1)[1])))


def _spmd_op_counts(name):
    """How many nodes of each op the newest SPMD function of `name` holds."""
    return collections.Counter(node.op for node in _spmd_function_def(name).node_def)


@pytest.mark.parametrize("form, case, reducers", [
    ("auto", "8-p8-g8", 1), ("auto", "2x4-p2-g8", 8), ("auto", "2x4-p2-g2", 8),
    ("direct", "8-p8-g8", 8), ("leader", "2x4-p2-g8", 1), ("leader", "2x4-p2-g2", 4)])
def test_copies_all_reduce_form_shows_in_the_graph(copies_all_reduce, form, case, reducers):
    # The AddN ops of the SPMD function: one per group's leader, or one on every device.
    copies_all_reduce(form)
    mesh, source = ALL_REDUCE_CASES[case]

    @tf.function
    def column_sums_for_the_form_test(v):
        return tf.reduce_sum(v, axis=0)

    value = _data((8, 8))
    np.testing.assert_allclose(
        reassemble(column_sums_for_the_form_test(to_dtensor(value, layout_of(source, mesh)))),
        value.sum(axis=0), rtol=1e-5)
    fdef = _spmd_function_def("column_sums_for_the_form_test")
    assert sum(1 for n in fdef.node_def if n.op == "AddN") == reducers


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_copies_reduce_scatter_moves_pieces_not_the_whole(copies_all_reduce, traced):
    # [*,*] partial(x) -> [x,*] on 4 devices: device k adds up piece k of the four partials
    # (AddN of [2,6] pieces on every device), where an all-reduce then a slice would add up
    # the whole [8,6] at a leader.
    copies_all_reduce("leader")
    terms = [_data((8, 6), seed=20 + i) for i in range(4)]
    packed = _packed_partial(terms, ["unsharded", "unsharded"], {"x": "sum"}, MESH_4)
    target = Layout(["x", "unsharded"], MESH_4)

    def scatter_for_the_piece_test(v):
        return tf_dtensor.relayout(v, target)

    fn = tf.function(scatter_for_the_piece_test) if traced else scatter_for_the_piece_test
    assert_dtensor_equal(np.sum(np.stack(terms), axis=0), target, fn(packed))
    if traced:
        fdef = _spmd_function_def("scatter_for_the_piece_test")
        adds = [n for n in fdef.node_def if n.op == "AddN"]
        assert len(adds) == 4 and sum(1 for n in fdef.node_def if n.op == "SplitV") == 4


# The copies lowering's cuts and joins (TF_DTENSOR_COPIES_PIECES): "transpose" gathers a
# leader's pieces in one DynamicStitch (and a Transpose where axes come before the joined
# one) and cuts a reduce-scatter's partials with a Transpose where axes come before the cut
# one; "split" uses ConcatV2 and SplitV.
PIECES_CASES = {
    "gather-rows": (MESH_8, (16, 64), ("x,*", None), "*,*",
                    {"DynamicStitch": 1, "Transpose": 0, "ConcatV2": 0}),
    "gather-columns": (MESH_8, (16, 64), ("*,x", None), "*,*",
                       {"DynamicStitch": 1, "Transpose": 1, "ConcatV2": 0}),
    "gather-2x4-groups": (MESH_2X4, (8, 64), ("x,y", None), "x,*",
                          {"DynamicStitch": 2, "Transpose": 2, "ConcatV2": 0}),
    "scatter-columns": (MESH_4, (8, 64), ("*,*", {"x": "sum"}), "*,x",
                        {"Transpose": 4, "SplitV": 0, "Split": 4}),
    "scatter-rows": (MESH_4, (16, 64), ("*,*", {"x": "sum"}), "x,*",
                     {"Transpose": 0, "SplitV": 0, "Split": 4}),
}
SPLIT_FORM = {"gather-rows": {"ConcatV2": 1, "DynamicStitch": 0},
              "gather-columns": {"ConcatV2": 1, "DynamicStitch": 0},
              "gather-2x4-groups": {"ConcatV2": 2, "DynamicStitch": 0},
              "scatter-columns": {"SplitV": 4, "Transpose": 0},
              "scatter-rows": {"SplitV": 4, "Transpose": 0}}


@pytest.mark.parametrize("form", ["transpose", "split"])
@pytest.mark.parametrize("case", list(PIECES_CASES))
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_copies_pieces_forms_of_gather_and_scatter(monkeypatch, form, case, traced):
    monkeypatch.setenv("TF_DTENSOR_COPIES_PIECES", form)
    config.set_collective_lowering("copies")
    try:
        mesh, shape, (source, partial), target, ops = PIECES_CASES[case]
        target_layout = layout_of(target, mesh)
        if partial:
            terms = [_data(shape, seed=30 + i) for i in range(mesh.dim_size("x"))]
            expected = np.sum(np.stack(terms), axis=0)
            specs = ["unsharded" if s == "*" else s for s in source.split(",")]
            value = _packed_partial(terms, specs, partial, mesh)
        else:
            expected = _data(shape, seed=30)
            value = to_dtensor(expected, layout_of(source, mesh))

        def pieces_for_the_form_test(v):
            return tf_dtensor.relayout(v, target_layout)

        fn = tf.function(pieces_for_the_form_test) if traced else pieces_for_the_form_test
        assert_dtensor_equal(expected, target_layout, fn(value))
        if traced:
            counts = _spmd_op_counts("pieces_for_the_form_test")
            want = ops if form == "transpose" else SPLIT_FORM[case]
            assert {op: counts.get(op, 0) for op in want} == want
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("case", ["gather-columns", "gather-2x4-groups", "scatter-columns"])
def test_copies_pieces_of_int32_keep_the_split_form(monkeypatch, case):
    """int32 never takes the folded forms: a GPU's int32 lives in host memory, and folded
    int32 gathers and all-to-alls were wrong on an H200 (block_pieces.cc, Foldable)."""
    monkeypatch.setenv("TF_DTENSOR_COPIES_PIECES", "transpose")
    config.set_collective_lowering("copies")
    try:
        mesh, shape, (source, partial), target, _ = PIECES_CASES[case]
        target_layout = layout_of(target, mesh)
        if partial:
            terms = [(_data(shape, seed=40 + i) * 100).astype(np.int32)
                     for i in range(mesh.dim_size("x"))]
            expected = np.sum(np.stack(terms), axis=0, dtype=np.int32)
            specs = ["unsharded" if s == "*" else s for s in source.split(",")]
            value = _packed_partial(terms, specs, partial, mesh)
        else:
            expected = (_data(shape, seed=40) * 100).astype(np.int32)
            value = to_dtensor(expected, layout_of(source, mesh))

        @tf.function
        def int32_pieces_for_the_form_test(v):
            return tf_dtensor.relayout(v, target_layout)

        result = int32_pieces_for_the_form_test(value)
        assert result.dtype == tf.int32
        assert_dtensor_equal(expected, target_layout, result)
        counts = _spmd_op_counts("int32_pieces_for_the_form_test")
        assert {op: counts.get(op, 0) for op in SPLIT_FORM[case]} == SPLIT_FORM[case]
    finally:
        config.set_collective_lowering("")


# The copies lowering on a device whose copies block until done (GPUs) makes the copies of
# one collective at once, from a thread each (EagerBuilder::ShareAll). Forced on here for
# the virtual CPUs (TF_DTENSOR_DISPATCH_THREADS=on), whose copies take the same path.
@pytest.mark.parametrize(
    "mesh, source, target",
    [(MESH_8, "x,*", "*,*"), (MESH_8, "x,*", "*,x"), (MESH_8, "*,x", "x,*"),
     (MESH_2X4, "x,y", "y,x"), (MESH_2X4, "*,y", "*,*"), (MESH_REVERSED, "x,*", "*,x")],
    ids=["8[x,*]-[*,*]", "8[x,*]-[*,x]", "8[*,x]-[x,*]", "2x4[x,y]-[y,x]", "2x4[*,y]-[*,*]",
         "rev[x,*]-[*,x]"])
def test_copies_of_one_collective_made_at_once_are_right(monkeypatch, mesh, source, target):
    monkeypatch.setenv("TF_DTENSOR_DISPATCH_THREADS", "on")
    config.set_collective_lowering("copies")
    try:
        value = _data((8, 16))
        target_layout = layout_of(target, mesh)
        moved = tf_dtensor.relayout(to_dtensor(value, layout_of(source, mesh)), target_layout)
        assert_dtensor_equal(value, target_layout, moved)
        # An all-reduce (sum over the sharded axis 0) and a mean: copies to each group's
        # leader, then to its replicas.
        sharded = to_dtensor(value, layout_of(source, mesh))
        np.testing.assert_allclose(reassemble(tf.reduce_sum(sharded, axis=0)),
                                   value.sum(axis=0), rtol=1e-5)
        np.testing.assert_allclose(reassemble(tf.reduce_mean(sharded, axis=[0, 1])),
                                   value.mean(), rtol=1e-5)
        # copy_to_mesh: one host value onto every device at once.
        replicated = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(mesh, 2))
        for component in dtensor.unpack(replicated):
            np.testing.assert_array_equal(component.numpy(), value)
    finally:
        config.set_collective_lowering("")


def _context_handle():
    from tensorflow.python.eager import context
    return context.context()._handle


@pytest.mark.parametrize("policy", ["shared", "copies", "ops"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("columns", [2, 64])
def test_a_step_that_fails_on_one_device_leaves_collectives_usable(policy, traced, columns):
    # One device's block holds a NaN, so `check_numerics` fails there while the others go
    # on to the all-reduce. The step's cancellation can abort TF's collective executor, or
    # mark the all-reduce's group cancelled in TF's resolver, and either fails every later
    # collective of the process ("Restart your program to reset", "group is cancelled").
    # Which happens is a race; with 64 columns the group is cancelled in nearly every run
    # on this machine, and the next step failed before collective_recovery.cc. The failed
    # step must leave neither, under any lowering.
    config.set_collective_lowering(policy)
    try:
        def step(x):
            return tf.reduce_sum(tf.debugging.check_numerics(x, "step input"), axis=0)

        run = tf.function(step) if traced else step
        value = _data((8, columns))
        broken = value.copy()
        broken[5, 1] = np.nan
        layout = layout_of("x,*", MESH_8)
        for _ in range(2):
            renewals = tf_dtensor._core.collective_renewals()
            with pytest.raises(tf.errors.InvalidArgumentError, match="step input"):
                reassemble(run(to_dtensor(broken, layout)))
            # The collective-ops lowering renews TF's collective state after a failed
            # function; an eager step fails before its all-reduce is issued.
            expected = 1 if (policy == "ops" and traced) else 0
            assert tf_dtensor._core.collective_renewals() - renewals == expected
            assert not tf_dtensor._core.collectives_aborted(_context_handle())
            np.testing.assert_allclose(reassemble(run(to_dtensor(value, layout))),
                                       value.sum(axis=0), rtol=1e-5)
            assert_dtensor_equal(value, layout_of("*,*", MESH_8),
                                 tf_dtensor.relayout(to_dtensor(value, layout),
                                                     layout_of("*,*", MESH_8)))
    finally:
        config.set_collective_lowering("")


def test_renewals_do_not_leave_threads_behind(collective_ops):
    # Each collective executor manager runs its collectives on a work queue of its own
    # threads. A renewal that kept the managers it replaced alive left about ten idle
    # threads per failed step (436 threads after 40): the replaced one must go.
    import os
    layout = layout_of("x,*", MESH_8)
    step = tf.function(lambda x: tf.reduce_sum(tf.debugging.check_numerics(x, "s"), axis=0))
    value = _data((8, 64))
    broken = value.copy()
    broken[5, 1] = np.nan

    def fail_and_run():
        with pytest.raises(tf.errors.InvalidArgumentError):
            step(to_dtensor(broken, layout))
        np.testing.assert_allclose(reassemble(step(to_dtensor(value, layout))),
                                   value.sum(axis=0), rtol=1e-5)

    for _ in range(3):  # the work queues of the first managers fill up
        fail_and_run()
    threads = len(os.listdir("/proc/self/task"))
    renewals = tf_dtensor._core.collective_renewals()
    for _ in range(20):
        fail_and_run()
    assert tf_dtensor._core.collective_renewals() - renewals == 20
    assert len(os.listdir("/proc/self/task")) - threads < 10


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_collectives_aborted_by_tensorflow_are_renewed_before_the_next_collective(
        collective_ops, traced):
    # `abort_collective_ops` (what TF's own fault handling calls on a lost peer) leaves TF's
    # collective executor aborted until the context is reset; TF's DTensor then fails every
    # collective ("Restart your program to reset"). Tensors, variables and functions made
    # before must survive the renewal and keep their values.
    from tensorflow.python.eager import context
    layout = layout_of("x,*", MESH_8)
    value = _data((8, 3))
    kept = to_dtensor(value, layout)
    variable = dtensor.DVariable(to_dtensor(value, layout))
    step = (tf.function if traced else (lambda f: f))(lambda x: tf.reduce_sum(x, axis=0))
    np.testing.assert_allclose(reassemble(step(kept)), value.sum(axis=0), rtol=1e-5)
    renewals = tf_dtensor._core.collective_renewals()
    context.context().abort_collective_ops(tf.errors.UNAVAILABLE, "a peer was lost")
    assert tf_dtensor._core.collectives_aborted(_context_handle())
    for _ in range(2):
        np.testing.assert_allclose(reassemble(step(kept)), value.sum(axis=0), rtol=1e-5)
        np.testing.assert_allclose(reassemble(step(variable.read_value())),
                                   value.sum(axis=0), rtol=1e-5)
    assert tf_dtensor._core.collective_renewals() - renewals == 1
    assert not tf_dtensor._core.collectives_aborted(_context_handle())
    assert_dtensor_equal(value, layout_of("*,*", MESH_8),
                         tf_dtensor.relayout(kept, layout_of("*,*", MESH_8)))
    np.testing.assert_allclose(reassemble(variable.read_value()), value)
