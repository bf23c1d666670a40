"""Every dtype TensorFlow's DTensor supports, as users meet it, against one plain device.

For each dtype (the floats, complex numbers, signed and unsigned integers, bool), under each
collective lowering: relayouts in every direction (slicing, all-gather, all-to-all,
reduce-scatter and all-reduce of pending sums), reductions over sharded axes, elementwise
and contracting ops inside tf.function, gradients of the float and complex types, special
values (NaN, infinities, -0.0, denormals, integer wraparound) and empty tensors. Values,
dtype, global shape and (for relayouts) layout must be one device's; where one device has no
kernel for the dtype, the DTensor op fails with the same kind of error, naming op and dtype.

    [x,y] -> [y,x]: all-to-all;  [*,*] +partial(x) -> [x,*]: reduce-scatter
    sum([x,y] of [5,3], axis=0) -> partial(x) -> all-reduce -> [y] (one y block empty)
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from dtensor_testing import (LOWERINGS, MESH_2X2, assert_dtensor_equal, collective_lowering,
                             cpus, layout_of, reassemble, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
COMPLEX = [tf.complex64, tf.complex128]
INTEGERS = [tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64]
DTYPES = FLOATS + COMPLEX + INTEGERS + [tf.bool]
# The dtypes TF's CPU MatMul kernel takes.
MATMUL_DTYPES = FLOATS + COMPLEX + [tf.int32, tf.int64]
# Tolerances of the floats whose sums a sharded axis adds in another order.
TOLERANCE = {tf.float16: 1e-2, tf.bfloat16: 5e-2}


def _value(dtype: tf.DType, shape, seed: int = 0) -> np.ndarray:
    """Small integers (exact in every dtype's sums of a few terms), as `dtype`."""
    rng = np.random.default_rng(seed)
    if dtype == tf.bool:
        return rng.random(shape) < 0.5
    ints = rng.integers(0 if dtype.is_unsigned else -3, 4, size=shape)
    if dtype.is_complex:
        ints = ints + 1j * rng.integers(-2, 3, size=shape)
    return ints.astype(dtype.as_numpy_dtype)


def _assert_same(expected, actual, dtype: tf.DType, what: str) -> None:
    """The DTensor `actual` holds one device's `expected`: dtype, global shape and values
    (NaN where it has NaN, the same infinities)."""
    expected = np.asarray(expected.numpy() if isinstance(expected, tf.Tensor) else expected)
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype.name}, expected {dtype.name}"
    assert tuple(actual.shape) == expected.shape, (
        f"{what}: shape {tuple(actual.shape)}, expected {expected.shape}")
    got = reassemble(actual)
    if dtype.is_floating or dtype.is_complex:
        wide = np.complex128 if dtype.is_complex else np.float64
        tolerance = TOLERANCE.get(dtype, 1e-6)
        np.testing.assert_allclose(got.astype(wide), expected.astype(wide), rtol=tolerance,
                                   atol=tolerance, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def _reductions(dtype: tf.DType):
    if dtype == tf.bool:
        return {"any": tf.reduce_any, "all": tf.reduce_all}
    out = {"sum": tf.reduce_sum, "prod": tf.reduce_prod, "mean": tf.reduce_mean}
    if not dtype.is_complex:
        out.update({"min": tf.reduce_min, "max": tf.reduce_max})
    return out


# Relayouts of [R, C] on 2x4: slicing, all-to-all, all-gather, and mixed steps.
RELAYOUTS = [("*,*", "x,y"), ("x,y", "y,x"), ("y,x", "*,*"), ("x,y", "*,y"), ("*,y", "y,*")]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_relayouts_and_reductions_of_every_dtype(lowering, dtype):
    """Eagerly on 2x4, shapes even ([8,4]) and uneven ([5,3]: a y block is empty)."""
    with collective_lowering(lowering):
        for shape in [(8, 4), (5, 3)]:
            value = _value(dtype, shape)
            for source, target in RELAYOUTS:
                t = to_dtensor(value, layout_of(source, MESH_2X4))
                target_layout = layout_of(target, MESH_2X4)
                assert_dtensor_equal(value, target_layout, dtensor.relayout(t, target_layout))
            t = to_dtensor(value, layout_of("x,y", MESH_2X4))
            back = dtensor.pack(dtensor.unpack(t), dtensor.fetch_layout(t))
            assert_dtensor_equal(value, layout_of("x,y", MESH_2X4), back)
            for name, reduce in _reductions(dtype).items():
                for axis in (0, None):
                    _assert_same(reduce(value, axis=axis), reduce(t, axis=axis), dtype,
                                 f"{name} over axis {axis} of {shape}")
            if dtype != tf.bool and not dtype.is_complex:
                _assert_same(tf.math.argmax(value, 0), tf.math.argmax(t, 0), tf.int64,
                             f"argmax over axis 0 of {shape}")
                _assert_same(tf.math.argmin(value, 1), tf.math.argmin(t, 1), tf.int64,
                             f"argmin over axis 1 of {shape}")
            if dtype != tf.bool:
                _assert_same(tf.cumsum(value, 0), tf.cumsum(t, 0), dtype,
                             f"cumsum over axis 0 of {shape}")


def _packed_terms(terms, layout: Layout):
    """A value pending a reduction over x (the layout's partial dim) of `terms`."""
    return dtensor.pack([terms[location["x"]] for location in
                         layout.mesh.local_device_locations()], layout)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != tf.bool], ids=lambda d: d.name)
def test_pending_reductions_of_every_dtype(lowering, dtype):
    """[*,*] +partial(x) on 2x4 to [*,*] (all-reduce) and [*,y] (reduce-scatter, uneven
    too), for each reduction a kernel of the dtype can make."""
    reductions = {"sum": tf.reduce_sum, "prod": tf.reduce_prod, "mean": tf.reduce_mean}
    if not dtype.is_complex:
        reductions.update({"min": tf.reduce_min, "max": tf.reduce_max})
    with collective_lowering(lowering):
        for shape in [(8, 4), (5, 3)]:
            terms = [_value(dtype, shape, seed=1), _value(dtype, shape, seed=2)]
            for name, reduce in reductions.items():
                packed = _packed_terms(
                    terms, Layout(["unsharded"] * 2, MESH_2X4, partial={"x": name}))
                expected = reduce(np.stack(terms), axis=0)
                for target in ["*,*", "*,y", "y,*"]:
                    got = dtensor.relayout(packed, layout_of(target, MESH_2X4))
                    _assert_same(expected, got, dtype, f"partial {name} of {shape} -> {target}")


def _names(dtype: tf.DType) -> str:
    """A pattern matching the dtype as TF's errors name it (`int8`, `DT_INT8`, `DT_HALF`)."""
    enum_name = types_pb2.DataType.Name(dtype.as_datatype_enum)
    return f"(?i)({dtype.name}|{enum_name})"


def _ops(dtype: tf.DType):
    """Ops of two [R, C] tensors, each giving one result."""
    ops = {
        "add": tf.add, "multiply": tf.multiply, "equal": tf.equal,
        "broadcast": lambda a, b: a + b[:1],
        "where": lambda a, b: tf.where(tf.equal(a, b), a, b),
        "cast": lambda a, b: tf.cast(a, tf.float32) + tf.cast(b, tf.float32),
        "gather": lambda a, b: tf.gather(a, [3, 0, 0, 1], axis=0),
        "concat": lambda a, b: tf.concat([a, b], axis=1),
        "split": lambda a, b: tf.split(a, [1, a.shape[1] - 1], axis=1)[1],
        "scatter": lambda a, b: tf.tensor_scatter_nd_update(a, [[2], [0]], b[:2]),
    }
    if dtype != tf.bool:
        ops.update({"subtract": tf.subtract, "less": tf.less, "maximum": tf.maximum,
                    "matmul": lambda a, b: tf.matmul(a, b, transpose_a=True),
                    "einsum": lambda a, b: tf.einsum("ij,ij->j", a, b)})
    return ops


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_ops_of_every_dtype_in_a_function(lowering, dtype):
    """The ops one device runs for the dtype, in one tf.function on [x,y] inputs of 2x4
    (the matmul and einsum contract the sharded rows: a pending sum). Where one device has
    no kernel (a comparison of complex numbers, an int8 matmul), the DTensor op fails
    with the same kind of error, naming the dtype."""
    a, b = _value(dtype, (8, 4), seed=3), _value(dtype, (8, 4), seed=4)
    layout = layout_of("x,y", MESH_2X4)
    expected, refused = {}, {}
    for name, op in _ops(dtype).items():
        try:
            expected[name] = op(tf.constant(a), tf.constant(b))
        except tf.errors.OpError as error:
            refused[name] = type(error)
    with collective_lowering(lowering):
        da, db = to_dtensor(a, layout), to_dtensor(b, layout)
        ops = {name: op for name, op in _ops(dtype).items() if name in expected}
        got = tf.function(lambda a, b: {name: op(a, b) for name, op in ops.items()})(da, db)
        for name, want in expected.items():
            _assert_same(want, got[name], want.dtype, name)
        if lowering == LOWERINGS[0]:
            for name, error in refused.items():
                with pytest.raises(error, match=_names(dtype)):
                    _ops(dtype)[name](da, db)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", FLOATS + COMPLEX, ids=lambda d: d.name)
def test_gradients_of_float_and_complex_dtypes(lowering, dtype):
    """d/da sum(a^T a * 2) and d/da max(sum(a^2, 0)) with a [x,y] on 2x4, eagerly and in
    tf.function: the contraction and the reductions over the sharded rows."""
    a = _value(dtype, (8, 4), seed=5)

    def grads(t):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(t)
            contracted = tf.reduce_sum(tf.matmul(t, t, transpose_a=True) * tf.cast(2, dtype))
            if dtype.is_complex:
                squared = tf.reduce_sum(tf.abs(tf.reduce_sum(t * t, axis=0)))
            else:
                squared = tf.reduce_max(tf.reduce_sum(t * t, axis=0))
        return tape.gradient(contracted, t), tape.gradient(squared, t)

    expected = grads(tf.constant(a))
    with collective_lowering(lowering):
        t = to_dtensor(a, layout_of("x,y", MESH_2X4))
        for mode, fn in [("eager", grads), ("function", tf.function(grads))]:
            for i, (want, got) in enumerate(zip(expected, fn(t))):
                _assert_same(want, got, dtype, f"{mode} gradient {i}")


def _special(dtype: tf.DType, shape, seed: int) -> np.ndarray:
    """NaN, infinities, signed zeros, denormals and ordinary values; for integers their
    extremes, so that sums and products wrap."""
    rng = np.random.default_rng(seed)
    if dtype.is_floating:
        tiny = 9.2e-41 if dtype == tf.bfloat16 else float(
            np.finfo(dtype.as_numpy_dtype).smallest_subnormal)
        pool = [np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, 1.0, -2.0, 3.5]
        return rng.choice(pool, size=shape).astype(dtype.as_numpy_dtype)
    info = np.iinfo(dtype.as_numpy_dtype)
    pool = np.array([info.min, info.max, info.max - 1, info.min + 1, 0, 1, 2],
                    dtype.as_numpy_dtype)
    return rng.choice(pool, size=shape)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS, ids=lambda d: d.name)
def test_special_values_over_sharded_axes(lowering, dtype):
    """Sums, products, extremes, their positions and cumulative sums of special values
    over axes sharded on 2x4 (even and uneven) are one device's: NaN where it has NaN, the
    same infinities, integer sums and products wrapped exactly."""
    reductions = {"sum": tf.reduce_sum, "prod": tf.reduce_prod, "max": tf.reduce_max,
                  "min": tf.reduce_min,
                  "argmax": lambda t, axis: tf.math.argmax(t, axis if axis is not None else 0),
                  "cumsum": lambda t, axis: tf.cumsum(t, axis if axis is not None else 0)}
    with collective_lowering(lowering):
        for shape in [(8, 4), (5, 3)]:
            value = _special(dtype, shape, seed=6)
            t = to_dtensor(value, layout_of("x,y", MESH_2X4))
            assert_dtensor_equal(value, layout_of("y,x", MESH_2X4),
                                 dtensor.relayout(t, layout_of("y,x", MESH_2X4)))
            for name, reduce in reductions.items():
                for axis in (0, None):
                    expected = reduce(value, axis=axis)
                    _assert_same(expected, reduce(t, axis=axis), expected.dtype,
                                 f"{name} over axis {axis} of {shape}")


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_empty_tensors_of_every_dtype(lowering, dtype):
    """Tensors with a dimension of 0 relayout, reduce and contract to one device's (empty
    or identity-filled) results."""
    with collective_lowering(lowering):
        for shape in [(0, 4), (8, 0)]:
            value = _value(dtype, shape)
            t = to_dtensor(value, layout_of("x,y", MESH_2X2))
            for target in ["*,*", "x,*", "*,x"]:
                assert_dtensor_equal(value, layout_of(target, MESH_2X2),
                                     dtensor.relayout(t, layout_of(target, MESH_2X2)))
            for name, reduce in _reductions(dtype).items():
                for axis in (0, None):
                    expected = reduce(value, axis=axis)
                    _assert_same(expected, reduce(t, axis=axis), dtype,
                                 f"{name} over axis {axis} of {shape}")
            if dtype in MATMUL_DTYPES:
                _assert_same(tf.matmul(value, value, transpose_a=True),
                             tf.matmul(t, t, transpose_a=True), dtype,
                             f"matmul of {shape}")
