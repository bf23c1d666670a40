"""Numerical checks of cc/rules/matmul_rules.cc: MatMul (with transposes), BatchMatMulV2 and
SparseTensorDenseMatMul (a SparseTensor times a DTensor).

    [x,*] @ [*,*] -> [x,*]
    [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]
    [y,x] @ [x,*] -> partial(x) -> all-reduce -> [y,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (LOWERINGS, MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, case_id, check_op, collective_lowering,
                             is_replicated, layout_of, layout_params, layouts_for, random_array,
                             reassemble, run_without_fallback, spec_params, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout


@pytest.mark.parametrize("layouts", layout_params((4, 8), (8, 4)))
def test_matmul(layouts):
    check_op(tf.matmul, "MatMul", [random_array((4, 8)), random_array((8, 4), seed=1)], layouts)


def test_matmul_int32(mesh_2x2):
    a = random_array((4, 8), np.int32, -3, 3)
    b = random_array((8, 4), np.int32, -3, 3, seed=1)
    check_op(tf.matmul, "MatMul", [a, b], [layout_of("[y,x]", mesh_2x2),
                                          layout_of("[x,*]", mesh_2x2)])


# A representative subset for the transposed forms: each of m, k, n sharded on either side.
@pytest.mark.parametrize("transpose_a,transpose_b", [(True, False), (False, True), (True, True)],
                         ids=["ta", "tb", "ta-tb"])
@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2, ("[x,y]", "[x,y]"), ("[y,x]", "[x,y]"), ("[x,*]", "[x,*]"), ("[*,x]", "[*,x]"),
    ("[x,*]", "[*,*]"), ("[*,*]", "[*,y]")))
def test_matmul_transposed(layouts, transpose_a, transpose_b):
    def fn(a, b):
        return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)

    arrays = [random_array((8, 8)), random_array((8, 8), seed=1)]
    check_op(fn, "MatMul", arrays, layouts,
             attrs={"transpose_a": transpose_a, "transpose_b": transpose_b})


# Every layout of `a` against a replicated `b`, plus sharded pairs.
@pytest.mark.parametrize("layouts", layout_params(
    (2, 4, 8), (2, 8, 4), meshes=[MESH_2X2], select=lambda c: is_replicated(c[1])) + spec_params(
        MESH_2X2, ("[x,*,y]", "[x,y,*]"), ("[x,y,*]", "[x,*,y]"), ("[y,x,*]", "[*,x,*]"),
        ("[*,*,x]", "[y,x,*]"), ("[x,*,*]", "[y,*,*]")))
def test_batch_matmul(layouts):
    check_op(tf.matmul, "BatchMatMulV2",
             [random_array((2, 4, 8)), random_array((2, 8, 4), seed=1)], layouts)


@pytest.mark.parametrize("layouts", layout_params(
    (2, 4, 8), (8, 4), meshes=[MESH_2X2],
    select=lambda c: is_replicated(c[0]) or is_replicated(c[1])) + spec_params(
        MESH_2X2, ("[x,*,y]", "[y,*]"), ("[*,x,y]", "[y,x]"), ("[y,*,x]", "[x,*]")))
def test_batch_matmul_broadcast(layouts):
    check_op(tf.matmul, "BatchMatMulV2",
             [random_array((2, 4, 8)), random_array((8, 4), seed=1)], layouts)


def test_batch_matmul_adjoint(mesh_2x2):
    def fn(a, b):
        return tf.linalg.matmul(a, b, adjoint_a=True, adjoint_b=True)

    check_op(fn, "BatchMatMulV2", [random_array((2, 8, 4)), random_array((2, 4, 8), seed=1)],
             [layout_of("[x,y,*]", mesh_2x2), layout_of("[*,*,y]", mesh_2x2)],
             attrs={"adj_x": True, "adj_y": True})


# The overview guide's cases, with the collectives the planner reports.
@pytest.mark.parametrize("specs,expected", [
    pytest.param(("[*,x]", "[x,*]"), "[*,*]", id="[*,x]-[x,*]"),
    pytest.param(("[y,x]", "[x,*]"), "[y,*]", id="[y,x]-[x,*]"),
])
def test_matmul_contracted_axis_all_reduces(specs, expected, mesh_2x2):
    layouts = [layout_of(s, mesh_2x2) for s in specs]
    plan = tf_dtensor.debug.explain("MatMul", layouts, [[4, 8], [8, 4]])
    assert plan["outputs"] == [layout_of(expected, mesh_2x2)]
    assert any("all-reduce(sum)" in c and "x" in c for c in plan["collectives"]), (
        plan["collectives"])
    a, b = random_array((4, 8)), random_array((8, 4), seed=1)
    c = tf.matmul(to_dtensor(a, layouts[0]), to_dtensor(b, layouts[1]))
    assert_dtensor_equal(a @ b, layout_of(expected, mesh_2x2), c)


# Golden plans from the header of matmul_rules.cc.
@pytest.mark.parametrize("specs,expected,all_reduce", [
    pytest.param(("[x,*]", "[*,*]"), "[x,*]", False, id="[x,*]-[*,*]"),
    pytest.param(("[*,*]", "[*,y]"), "[*,y]", False, id="[*,*]-[*,y]"),
    pytest.param(("[x,*]", "[*,y]"), "[x,y]", False, id="[x,*]-[*,y]"),
    pytest.param(("[*,x]", "[*,*]"), "[*,*]", True, id="[*,x]-[*,*]"),
    pytest.param(("[*,*]", "[y,*]"), "[*,*]", True, id="[*,*]-[y,*]"),
])
def test_matmul_plan(specs, expected, all_reduce, mesh_2x2):
    layouts = [layout_of(s, mesh_2x2) for s in specs]
    plan = tf_dtensor.debug.explain("MatMul", layouts, [[4, 8], [8, 4]])
    assert plan["outputs"] == [layout_of(expected, mesh_2x2)]
    assert any("all-reduce(sum)" in c for c in plan["collectives"]) == all_reduce, (
        plan["collectives"])


def test_matmul_rejects_vectors(mesh_2x2):
    with pytest.raises(ValueError, match="MatMul"):
        tf_dtensor.debug.explain("MatMul", [layout_of("[x]", mesh_2x2),
                                            layout_of("[*,*]", mesh_2x2)], [[8], [8, 4]])


def test_matmul_mismatched_shapes_report_global_shapes(mesh_2x2):
    """A contraction over axes of different sizes is refused before any shard runs, with
    the global shapes and layouts (the local kernel would name its block's shape: [2,6])."""
    a = dtensor.call_with_layout(tf.ones, layout_of("[x,*]", mesh_2x2), shape=(4, 6))
    b = dtensor.call_with_layout(tf.ones, layout_of("[*,*]", mesh_2x2), shape=(5, 3))
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        tf.matmul(a, b)
    message = str(caught.value)
    assert "'MatMul' cannot contract axis 1 of input 0 (global shape [4, 6], layout [x,*]" in (
        message)
    assert "axis 0 of input 1 (global shape [5, 3], layout [*,*]" in message
    assert "sizes 6 and 5" in message and "transpose" in message
    # The same shapes with transpose_b line up, and the product is right.
    c = tf.matmul(a, dtensor.call_with_layout(tf.ones, layout_of("[*,*]", mesh_2x2),
                                              shape=(5, 6)), transpose_b=True)
    assert_dtensor_equal(np.full((4, 5), 6.0, np.float32), layout_of("[x,*]", mesh_2x2), c)


def test_batch_matmul_broadcast_batch_is_not_a_mismatch(mesh_2x2):
    """Batch axes of size 1 broadcast (a pass-through factor), so they pass the check."""
    a, b = random_array((1, 4, 6)), random_array((3, 6, 2), seed=1)
    check_op(tf.matmul, "BatchMatMulV2", [a, b],
             [layout_of("[*,x,*]", mesh_2x2), layout_of("[*,*,y]", mesh_2x2)])


_MESH_4X2 = dtensor.create_mesh([("x", 4), ("y", 2)], devices=[f"CPU:{i}" for i in range(8)])


@pytest.mark.parametrize("layouts", spec_params(
    _MESH_4X2, ("[x,*]", "[*,y]"), ("[*,x]", "[x,*]"), ("[y,x]", "[x,*]"), ("[x,y]", "[y,*]")))
def test_matmul_on_a_4x2_mesh(layouts):
    check_op(tf.matmul, "MatMul", [random_array((8, 8)), random_array((8, 8), seed=1)], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_8, ("[x,*]", "[*,*]"),
                                                ("[*,x]", "[x,*]")))
def test_matmul_on_8_devices(layouts):
    check_op(tf.matmul, "MatMul", [random_array((8, 8)), random_array((8, 8), seed=1)], layouts)


# ---------------------------------------------------------------------------------------
# SparseTensorDenseMatMul: a SparseTensor times a DTensor (tf.sparse.sparse_dense_matmul)
#   sp @ [*,x] -> [*,x]                    (b's columns stay sharded, no collective)
#   sp @ [x,*] -> gather k -> [*,*]        (a's column indices are global)
#   sp([x,*] [x]) @ [*,y] -> partial(x) -> all-reduce -> [*,y]   (nonzeros split)
# ---------------------------------------------------------------------------------------

# a is 5x6 with 6 nonzeros; with adjoint_a it is stored as its 6x5 transpose.
_SPARSE_INDICES = np.array([[0, 1], [1, 3], [2, 0], [2, 5], [4, 4], [4, 2]], np.int64)
_SPARSE_VALUES = random_array((6,), seed=7)


def _sparse(adjoint_a: bool = False) -> tf.SparseTensor:
    indices = _SPARSE_INDICES[:, ::-1].copy() if adjoint_a else _SPARSE_INDICES
    return tf.sparse.reorder(tf.SparseTensor(indices, _SPARSE_VALUES, (6, 5) if adjoint_a
                                             else (5, 6)))


def _columns_kept(b_layout: Layout, adjoint_b: bool) -> Layout:
    """The output layout: new rows, b's column sharding."""
    return Layout([UNSHARDED, b_layout.sharding_specs[0 if adjoint_b else 1]], b_layout.mesh)


_ADJOINTS = [pytest.param(False, False, id="plain"), pytest.param(True, False, id="adj_a"),
             pytest.param(False, True, id="adj_b"), pytest.param(True, True, id="adj_a-adj_b")]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("adjoint_a,adjoint_b", _ADJOINTS)
@pytest.mark.parametrize("b_layout", [pytest.param(l, id=case_id([l])) for mesh in (
    MESH_1D, MESH_2X2) for l in layouts_for(mesh, (6, 4))])
def test_sparse_dense_matmul_keeps_columns_sharded(b_layout, adjoint_a, adjoint_b, in_function):
    """Ran without a rule before (strict mode: "'SparseTensorDenseMatMul' has no tf_dtensor
    rule"; otherwise b was gathered and the product replicated)."""
    sp = _sparse(adjoint_a)
    b = random_array((4, 6) if adjoint_b else (6, 4), seed=8)
    b_layout = Layout(b_layout.sharding_specs[::-1] if adjoint_b else b_layout.sharding_specs,
                      b_layout.mesh)

    def fn(x):
        return tf.sparse.sparse_dense_matmul(sp, x, adjoint_a=adjoint_a, adjoint_b=adjoint_b)

    expected = fn(tf.constant(b))
    expected_layout = _columns_kept(b_layout, adjoint_b)
    plan = tf_dtensor.debug.explain(
        "SparseTensorDenseMatMul", [None, None, None, b_layout], [[6, 2], [6], [2], list(b.shape)],
        int_values={2: list(sp.dense_shape.numpy())},
        attrs={"adjoint_a": adjoint_a, "adjoint_b": adjoint_b})
    assert plan["outputs"] == [expected_layout]
    k_sharded = b_layout.sharding_specs[1 if adjoint_b else 0] != UNSHARDED
    assert bool(plan["collectives"]) == k_sharded, plan["collectives"]
    actual = run_without_fallback(tf.function(fn) if in_function else fn, to_dtensor(b, b_layout))
    assert_dtensor_equal(expected, expected_layout, actual)


def test_sparse_dense_matmul_uneven_columns(mesh_2x2):
    b = random_array((6, 5), seed=9)
    layout = layout_of("[*,y]", mesh_2x2)
    actual = run_without_fallback(tf.sparse.sparse_dense_matmul, _sparse(), to_dtensor(b, layout))
    assert_dtensor_equal(tf.sparse.sparse_dense_matmul(_sparse(), b), layout, actual)


@pytest.mark.parametrize("nonzeros", [6, 5, 1], ids=["even", "uneven", "one"])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_sparse_dense_matmul_sharded_nonzeros_are_partial_sums(nonzeros, in_function, mesh_2x2):
    """a's components packed sharded over their nonzeros (x): each device multiplies its own
    and the products are summed; b's columns keep y. One nonzero leaves a device none."""
    indices, values = _SPARSE_INDICES[:nonzeros], _SPARSE_VALUES[:nonzeros]
    b = random_array((6, 4), seed=10)

    def fn(i, v, x):
        return tf.raw_ops.SparseTensorDenseMatMul(a_indices=i, a_values=v, a_shape=[5, 6], b=x)

    expected = fn(tf.constant(indices), tf.constant(values), tf.constant(b))
    layouts = [layout_of("[x,*]", mesh_2x2), layout_of("[x]", mesh_2x2),
               layout_of("[*,y]", mesh_2x2)]
    plan = tf_dtensor.debug.explain("SparseTensorDenseMatMul", layouts[:2] + [None, layouts[2]],
                                    [[nonzeros, 2], [nonzeros], [2], [6, 4]],
                                    int_values={2: [5, 6]})
    assert plan["inputs"][:2] == layouts[:2], plan
    assert any("all-reduce(sum)" in c and "over x" in c for c in plan["collectives"]), plan
    inputs = [to_dtensor(a, l) for a, l in zip((indices, values, b), layouts)]
    for lowering in LOWERINGS:
        with collective_lowering(lowering):
            run = tf.function(fn) if in_function else fn
            actual = run_without_fallback(run, *inputs)
            if in_function:   # the sum may stay pending inside the function; returned, made
                actual = dtensor.relayout(actual, layout_of("[*,y]", mesh_2x2))
            assert_dtensor_equal(expected, layout_of("[*,y]", mesh_2x2), actual)


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,*]", "[*,y]"), ("[x,y]", "[*,*]"),
                                                ("[*,y]", "[x,*]")))
def test_dense_times_sparse_keeps_rows_sharded(layouts):
    """tf.sparse.sparse_dense_matmul(dense, sparse) runs the op with both adjoints on the
    dense operand's transpose: its rows stay sharded."""
    a_layout = layouts[0]
    a = random_array((4, 5), seed=11)
    expected = tf.sparse.sparse_dense_matmul(a, _sparse())
    actual = run_without_fallback(tf.sparse.sparse_dense_matmul, to_dtensor(a, a_layout),
                                  _sparse())
    assert_dtensor_equal(expected, Layout([a_layout.sharding_specs[0], UNSHARDED], MESH_2X2),
                         actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("adjoint_a", [False, True], ids=["plain", "adj_a"])
@pytest.mark.parametrize("b_spec", ["[*,y]", "[x,y]", "[y,*]"])
def test_sparse_dense_matmul_gradient(b_spec, adjoint_a, in_function, mesh_2x2):
    """The gradients of b (SparseTensorDenseMatMul with adjoint_a flipped) and of a's
    values (gathers of rows), as on one device."""
    sp = _sparse(adjoint_a)
    b = random_array((6, 4), seed=12)

    def grads(values, x):
        with tf.GradientTape() as tape:
            tape.watch([values, x])
            a = tf.SparseTensor(sp.indices, values, sp.dense_shape)
            y = tf.sparse.sparse_dense_matmul(a, x, adjoint_a=adjoint_a)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [values, x])

    expected = grads(sp.values, tf.constant(b))
    run = tf.function(grads) if in_function else grads
    b_layout = layout_of(b_spec, mesh_2x2)
    actual = run_without_fallback(run, sp.values, to_dtensor(b, b_layout))
    for want, got in zip(expected, actual):
        assert tuple(got.shape) == tuple(want.shape)
        assert_values_equal(want.numpy(), reassemble(got) if dtensor.is_dtensor(got)
                            else got.numpy())
    if not in_function:   # an eager gradient has its source's layout
        assert dtensor.fetch_layout(actual[1]) == b_layout


@pytest.mark.parametrize("spec", ["[x,*,*,*,*]", "[x,*,*,*,y]", "[*,*,*,*,*]"])
def test_extract_volume_patches_gradient(spec, mesh_2x2):
    """The gradient of ExtractVolumePatches is a SparseTensorDenseMatMul, which had no rule
    (strict mode refused the gradient)."""
    x = random_array((2, 3, 4, 4, 2), seed=13)

    def grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            patches = tf.extract_volume_patches(v, [1, 2, 2, 2, 1], [1, 1, 2, 1, 1], "VALID")
            loss = tf.reduce_sum(tf.sin(patches))
        return tape.gradient(loss, v)

    layout = layout_of(spec, mesh_2x2)
    actual = run_without_fallback(grad, to_dtensor(x, layout))
    assert_dtensor_equal(grad(tf.constant(x)), layout, actual)


@pytest.mark.parametrize("operand", ["b", "values"])
def test_sparse_dense_matmul_of_a_pending_sum(operand, mesh_2x2):
    """Inside tf.function a contraction's sum stays pending; the product is linear in b
    and in a's values (one at a time), so the sum passes through it or is made first."""
    sp, p, q = _sparse(), random_array((6, 8), seed=14), random_array((8, 4), seed=15)
    v = random_array((6, 8), seed=16)

    def fn(p, q, v):
        if operand == "b":
            return tf.sparse.sparse_dense_matmul(sp, tf.matmul(p, q)) * 2.0
        values = tf.reduce_sum(v, axis=1)
        return tf.sparse.sparse_dense_matmul(tf.SparseTensor(sp.indices, values, sp.dense_shape),
                                             q[:6]) * 2.0

    expected = fn(tf.constant(p), tf.constant(q), tf.constant(v))
    actual = run_without_fallback(tf.function(fn), to_dtensor(p, layout_of("[y,x]", mesh_2x2)),
                                  to_dtensor(q, layout_of("[x,*]", mesh_2x2)),
                                  to_dtensor(v, layout_of("[*,x]", mesh_2x2)))
    assert_values_equal(expected.numpy(), reassemble(actual))
