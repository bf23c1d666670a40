"""Numerical checks of cc/rules/matmul_rules.cc: MatMul (with transposes) and BatchMatMulV2.

    [x,*] @ [*,*] -> [x,*]
    [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]
    [y,x] @ [x,*] -> partial(x) -> all-reduce -> [y,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_2X2, MESH_8, assert_dtensor_equal, check_op, is_replicated,
                             layout_of, layout_params, random_array, spec_params, to_dtensor)
from tf_dtensor import dtensor


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
