"""Numerical checks of cc/rules/sparse_rules.cc: a SparseTensor with a dense DTensor
(`sp * x`, `sp / x`, `tf.sparse.add(sp, x)`, `tf.sparse.reduce_sum`/`reduce_max`, and
`tf.sparse.add` of two SparseTensors with DTensor values), and the sparse
lookups recommendation models run on sharded tables (`tf.nn.embedding_lookup_sparse`,
`tf.nn.safe_embedding_lookup_sparse`: SparseSegment* and gathers, gather_rules.cc).

    sp * x [*,y] -> gather x -> values [*]       (the coordinates are global positions)
    sp([x,*] [x]) * x -> values [x]              (each device its own nonzeros)
    reduce_sum(sp([x,*] [x])) -> partial(x) -> all-reduce
    tf.sparse.add(sp, x [x,y]) -> gather -> [*,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (LOWERINGS, MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, collective_lowering, layout_of, random_array,
                             reassemble, run_without_fallback, to_dtensor)
from tf_dtensor import dtensor

_INDICES = np.array([[0, 1], [1, 3], [2, 0], [2, 3], [3, 2], [4, 1]], np.int64)
_SHAPE = (5, 4)


def _sparse(seed: int = 0) -> tf.SparseTensor:
    return tf.SparseTensor(_INDICES, random_array((len(_INDICES),), seed=seed), _SHAPE)


def _dense_layouts():
    cases = [("[x,*]", MESH_1D), ("[*,x]", MESH_1D), ("[x,y]", MESH_2X2), ("[y,*]", MESH_2X2),
             ("[*,*]", MESH_2X2)]
    return [pytest.param(layout_of(s, m), id=f"{s}@{m.short()}") for s, m in cases]


def _run(fn, in_function, *args):
    return run_without_fallback(tf.function(fn) if in_function else fn, *args)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("layout", _dense_layouts())
@pytest.mark.parametrize("dense_first", [False, True], ids=["sparse-dense", "dense-sparse"])
def test_sparse_add_dense(layout, dense_first, in_function):
    """tf.sparse.add of a SparseTensor and a sharded DTensor (SparseTensorDenseAdd) had no
    rule: strict mode refused it."""
    sp, x = _sparse(), random_array(_SHAPE, seed=1)

    def fn(d):
        return tf.sparse.add(d, sp) if dense_first else tf.sparse.add(sp, d)

    actual = _run(fn, in_function, to_dtensor(x, layout))
    assert_dtensor_equal(fn(tf.constant(x)), dtensor.Layout.replicated(layout.mesh, 2), actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("layout", _dense_layouts())
@pytest.mark.parametrize("operation", ["mul", "div", "add"])
def test_sparse_dense_cwise(layout, operation, in_function):
    """`sp * x`, `sp / x` (SparseDenseCwiseMul/Div) and SparseDenseCwiseAdd with a sharded x
    had no rule: strict mode refused them. The dense operand also broadcasts (a row)."""
    sp, x = _sparse(), random_array(_SHAPE, low=1.0, high=2.0, seed=2)
    ops = {"mul": tf.raw_ops.SparseDenseCwiseMul, "div": tf.raw_ops.SparseDenseCwiseDiv,
           "add": tf.raw_ops.SparseDenseCwiseAdd}

    def fn(d):
        return ops[operation](sp_indices=sp.indices, sp_values=sp.values,
                              sp_shape=sp.dense_shape, dense=d)

    replicated = dtensor.Layout.replicated(layout.mesh, 1)
    actual = _run(fn, in_function, to_dtensor(x, layout))
    assert_dtensor_equal(fn(tf.constant(x)), replicated, actual)
    row = x[:1]
    row_layout = dtensor.Layout([dtensor.UNSHARDED, layout.sharding_specs[1]], layout.mesh)
    actual = _run(fn, in_function, to_dtensor(row, row_layout))
    assert_dtensor_equal(fn(tf.constant(row)), replicated, actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_sparse_times_dense_gradient(in_function, mesh_2x2):
    sp, x = _sparse(), random_array(_SHAPE, low=1.0, high=2.0, seed=3)

    def grads(values, d):
        with tf.GradientTape() as tape:
            tape.watch([values, d])
            product = tf.SparseTensor(sp.indices, values, sp.dense_shape) * d
            quotient = tf.SparseTensor(sp.indices, values, sp.dense_shape) / d
            loss = tf.reduce_sum(tf.sin(product.values)) + tf.reduce_sum(quotient.values ** 2)
        return tape.gradient(loss, [values, d])

    expected = grads(sp.values, tf.constant(x))
    actual = _run(grads, in_function, sp.values, to_dtensor(x, layout_of("[x,y]", mesh_2x2)))
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == tuple(want.shape)
        assert_values_equal(want.numpy(),
                            reassemble(got) if dtensor.is_dtensor(got) else got.numpy())


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("axis,keepdims", [(1, False), (0, True), (None, False), (-1, True)],
                         ids=["1", "0-keep", "all", "-1-keep"])
def test_sparse_reduce_sum_of_dense_dtensor(axis, keepdims, in_function, mesh_2x2):
    """tf.sparse.reduce_sum of tf.sparse.from_dense(x) (SparseReduceSum on DTensor
    components) had no rule: strict mode refused it."""
    x = random_array(_SHAPE, seed=4) * (random_array(_SHAPE, seed=5) > 0)

    def fn(d):
        return tf.sparse.reduce_sum(tf.sparse.from_dense(d), axis=axis, keepdims=keepdims)

    expected = fn(tf.constant(x))
    actual = _run(fn, in_function, to_dtensor(x, layout_of("[x,y]", mesh_2x2)))
    assert_dtensor_equal(expected, dtensor.Layout.replicated(mesh_2x2, expected.shape.rank),
                         actual)


@pytest.mark.parametrize("axes", [[0], []], ids=["axis0", "no-axes"])
@pytest.mark.parametrize("nonzeros", [6, 5, 1], ids=["even", "uneven", "one"])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_sparse_reduce_sum_of_sharded_nonzeros_is_a_partial_sum(nonzeros, in_function, axes,
                                                                 mesh_2x2):
    """Components sharded over their nonzeros: each device sums its own, then an all-reduce
    (one nonzero leaves a device none). No axes reduce none (the dense value)."""
    indices, values = _INDICES[:nonzeros], random_array((nonzeros,), seed=6)

    def fn(i, v):
        return tf.raw_ops.SparseReduceSum(input_indices=i, input_values=v, input_shape=_SHAPE,
                                          reduction_axes=tf.constant(axes, tf.int32))

    expected = fn(tf.constant(indices), tf.constant(values))
    layouts = [layout_of("[x,*]", mesh_2x2), layout_of("[x]", mesh_2x2)]
    plan = tf_dtensor.debug.explain("SparseReduceSum", layouts + [None, None],
                                    [[nonzeros, 2], [nonzeros], [2], [len(axes)]],
                                    int_values={2: list(_SHAPE), 3: axes})
    assert plan["inputs"][:2] == layouts
    assert any("all-reduce(sum)" in c and "over x" in c for c in plan["collectives"]), plan
    inputs = [to_dtensor(indices, layouts[0]), to_dtensor(values, layouts[1])]
    replicated = dtensor.Layout.replicated(mesh_2x2, expected.shape.rank)
    for lowering in LOWERINGS:
        with collective_lowering(lowering):
            actual = _run(fn, in_function, *inputs)
            if in_function:   # the sum may stay pending inside the function
                actual = dtensor.relayout(actual, replicated)
            assert_dtensor_equal(expected, replicated, actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("values_spec", ["[x]", "[*]"])
def test_sparse_reduce_max_of_sharded_nonzeros(values_spec, in_function, mesh_2x2):
    """tf.sparse.reduce_max (SparseReduceMax) had no rule. Its values are negative: a
    position without a nonzero gives 0, so a per-device maximum would give 0 where a
    device holds none of a row's nonzeros; the nonzeros are read whole."""
    values = -np.abs(random_array((len(_INDICES),), seed=10)) - 0.5

    def fn(v):
        return tf.sparse.reduce_max(tf.SparseTensor(_INDICES, v, _SHAPE), axis=1)

    expected = fn(tf.constant(values))
    assert (expected.numpy() < 0).all()
    actual = _run(fn, in_function, to_dtensor(values, layout_of(values_spec, mesh_2x2)))
    assert_dtensor_equal(expected, dtensor.Layout.replicated(mesh_2x2, 1), actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("values_spec", ["[x]", "[*]"])
def test_sparse_add_of_two_sparse_dtensors(values_spec, in_function, mesh_2x2):
    """tf.sparse.add of two SparseTensors with DTensor values (SparseAdd; its gradient
    SparseAddGrad) had no rule. The sum's count of nonzeros depends on the values."""
    a_values = random_array((len(_INDICES),), seed=11)
    b_indices = np.array([[0, 1], [0, 2], [4, 1]], np.int64)
    b_values = np.array([-a_values[0], 1.0, 2.0], np.float32)   # cancels a's first nonzero

    def fn(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            total = tf.sparse.add(tf.SparseTensor(_INDICES, a, _SHAPE),
                                  tf.SparseTensor(b_indices, b, _SHAPE), threshold=1e-6)
            loss = tf.reduce_sum(total.values * total.values)
        return [total.indices, total.values] + tape.gradient(loss, [a, b])

    expected = fn(tf.constant(a_values), tf.constant(b_values))
    layout = layout_of(values_spec, mesh_2x2)
    actual = _run(fn, in_function, to_dtensor(a_values, layout),
                  to_dtensor(b_values, layout_of("[*]", mesh_2x2)))
    # 6 + 3 nonzeros at 7 positions ([0, 1] and [4, 1] shared); [0, 1] cancels and is dropped.
    assert expected[0].shape[0] == 6
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == tuple(want.shape)
        assert got.dtype == want.dtype
        assert_values_equal(want.numpy(),
                            reassemble(got) if dtensor.is_dtensor(got) else got.numpy())


@pytest.mark.parametrize("values_spec", ["[x]", "[*]"])
def test_sparse_tensor_arguments_of_a_function(values_spec, mesh_2x2):
    """A tf.function taking a SparseTensor (host components, or DTensor values) beside a
    sharded DTensor: its ops run under rules, as on one device."""
    b = random_array((4, 3), seed=12)
    values = random_array((len(_INDICES),), seed=13)

    @tf.function
    def fn(sp, x):
        product = tf.sparse.sparse_dense_matmul(sp, x)
        return product + tf.reduce_sum(tf.sparse.reduce_sum(sp, axis=0)), (sp * 2.0).values

    expected = fn(tf.SparseTensor(_INDICES, values, _SHAPE), tf.constant(b))
    x = to_dtensor(b, layout_of("[*,y]", mesh_2x2))
    for sp in (tf.SparseTensor(_INDICES, values, _SHAPE),
               tf.SparseTensor(_INDICES, to_dtensor(values, layout_of(values_spec, mesh_2x2)),
                               _SHAPE)):
        product, doubled = run_without_fallback(fn, sp, x)
        assert_dtensor_equal(expected[0], layout_of("[*,y]", mesh_2x2), product)
        assert_values_equal(expected[1].numpy(), reassemble(doubled) if dtensor.is_dtensor(
            doubled) else doubled.numpy())


# ---------------------------------------------------------------------------------------
# Sparse embedding lookups on sharded tables (coverage: these already ran under rules)
# ---------------------------------------------------------------------------------------

_VOCAB, _DIM = 10, 4
_IDS = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1], [2, 2]],
                       np.array([1, 7, 3, 9, 1, 0], np.int64), [4, 3])
_WEIGHTS = tf.SparseTensor(_IDS.indices, random_array((6,), low=0.1, high=1.0, seed=8),
                           _IDS.dense_shape)


def _table_layouts():
    cases = [("[x,*]", MESH_1D), ("[*,x]", MESH_1D), ("[x,y]", MESH_2X2), ("[*,y]", MESH_2X2),
             ("[x,*]", MESH_8)]
    return [pytest.param(layout_of(s, m), id=f"{s}@{m.short()}") for s, m in cases]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("safe", [False, True], ids=["lookup", "safe"])
@pytest.mark.parametrize("table_layout", _table_layouts())
def test_embedding_lookup_sparse_on_a_sharded_table(table_layout, safe, combiner, in_function):
    table = random_array((_VOCAB, _DIM), seed=9)
    lookup = tf.nn.safe_embedding_lookup_sparse if safe else tf.nn.embedding_lookup_sparse
    variable = dtensor.DVariable(to_dtensor(table, table_layout))

    def loss_and_grad(t):
        with tf.GradientTape() as tape:
            out = lookup(t, _IDS, _WEIGHTS, combiner=combiner)
            loss = tf.reduce_sum(out * out)
        return out, tf.convert_to_tensor(tape.gradient(loss, t))

    expected_out, expected_grad = loss_and_grad(tf.Variable(table))
    out, grad = _run(loss_and_grad, in_function, variable)
    assert tuple(out.shape) == tuple(expected_out.shape)
    assert_values_equal(expected_out.numpy(), reassemble(out))
    assert_values_equal(expected_grad.numpy(), reassemble(grad))
