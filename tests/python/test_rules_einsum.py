"""Numerical checks of cc/rules/einsum_rules.cc: each letter of the equation is a factor.

    "ij,jk->ik":     [x,*] [*,y] -> [x,y]                      (pass-through letters)
    "ij,jk->ik":     [*,x] [x,*] -> partial(x) -> all-reduce -> [*,*]   (contracted j)
    "ii->i":         [x,*] -> gather -> [*]                     (a diagonal)
    "...ij,...jk->...ik": broadcast axes aligned from the right; size-1 axes never shard
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import gen_linalg_ops

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, assert_values_equal,
                             check_op, is_replicated, layout_of, layout_params, layouts_for,
                             random_array, reassemble, run_without_fallback, spec_params,
                             to_dtensor)
import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout


def _einsum(equation):
    def fn(*operands):
        return tf.einsum(equation, *operands)
    return fn


def _check(equation, shapes, layouts, fn=None):
    arrays = [random_array(s, seed=i) for i, s in enumerate(shapes)]
    return check_op(fn or _einsum(equation), "Einsum", arrays, layouts,
                    attrs={"equation": equation})


def _one_replicated(combo):
    return any(is_replicated(l) for l in combo)


# (equation, shapes, mesh selection): every layout combination, or for rank-3+ pairs on
# the 2x2 mesh those where one operand is replicated (the rest come from SHARDED_PAIRS).
CASES = [
    ("ij,jk->ik", [(4, 8), (8, 4)], None),
    ("ij,kj->ik", [(4, 8), (4, 8)], None),
    ("bij,bjk->bik", [(2, 4, 8), (2, 8, 4)], _one_replicated),
    ("bqhd,bkhd->bhqk", [(2, 4, 2, 4), (2, 6, 2, 4)], _one_replicated),
    ("bhqk,bkhd->bqhd", [(2, 2, 4, 6), (2, 6, 2, 4)], _one_replicated),
    ("ij->ji", [(4, 8)], None),
    ("ijk->kij", [(2, 4, 8)], None),
    ("ij->i", [(4, 8)], None),
    ("ij->j", [(4, 8)], None),
    ("ij->", [(4, 8)], None),
    ("ijk->ik", [(2, 4, 8)], None),
    ("i,i->", [(8,), (8,)], None),
    ("i,j->ij", [(4,), (8,)], None),
    ("ij,ij->ij", [(4, 8), (4, 8)], None),
    ("ij,kj->ikj", [(4, 8), (2, 8)], None),
    ("ii->i", [(4, 4)], None),
    ("ii->", [(4, 4)], None),
    ("iij->ij", [(2, 2, 8)], None),
    ("...ij,...jk->...ik", [(2, 4, 8), (8, 4)], None),
    ("...ij,...jk->...ik", [(2, 1, 4, 8), (2, 8, 4)], _one_replicated),
    ("...i->...", [(2, 4, 8)], None),
    ("b...,b...->...", [(2, 4, 2), (2, 4, 2)], _one_replicated),
]


def _params():
    params = []
    for equation, shapes, select in CASES:
        for p in layout_params(*shapes, select=select):
            params.append(pytest.param(equation, shapes, p.values[0],
                                       id=f"{equation}-{p.id}"))
    return params


@pytest.mark.parametrize("equation,shapes,layouts", _params())
def test_einsum(equation, shapes, layouts):
    _check(equation, shapes, layouts)


# A letter repeated in the output writes a diagonal: tf.einsum refuses it, but its
# gradient of "ii->i" calls the op with "i->ii".
@pytest.mark.parametrize("equation,shapes,layouts", [
    pytest.param(equation, shapes, p.values[0], id=f"{equation}-{p.id}")
    for equation, shapes in [("i->ii", [(4,)]), ("ij->iij", [(2, 8)])]
    for p in layout_params(*shapes)])
def test_einsum_writing_a_diagonal(equation, shapes, layouts):
    _check(equation, shapes, layouts,
           fn=lambda *operands: gen_linalg_ops.einsum(list(operands), equation))


# Both operands sharded, for the equations whose full product is too large to enumerate.
SHARDED_PAIRS = [
    ("bij,bjk->bik", [(2, 4, 8), (2, 8, 4)],
     [("[x,*,y]", "[x,y,*]"), ("[x,y,*]", "[*,*,y]"), ("[*,x,y]", "[y,*,x]"),
      ("[y,*,x]", "[*,x,*]")]),
    ("bqhd,bkhd->bhqk", [(2, 4, 2, 4), (2, 6, 2, 4)],
     [("[x,*,y,*]", "[x,*,y,*]"), ("[x,*,*,y]", "[*,*,*,y]"), ("[*,x,*,y]", "[*,y,*,x]"),
      ("[x,y,*,*]", "[y,x,*,*]")]),
    ("bhqk,bkhd->bqhd", [(2, 2, 4, 6), (2, 6, 2, 4)],
     [("[x,y,*,*]", "[x,*,y,*]"), ("[x,*,*,y]", "[x,y,*,*]"), ("[*,*,x,y]", "[*,*,y,x]")]),
    ("...ij,...jk->...ik", [(2, 1, 4, 8), (2, 8, 4)],
     [("[x,*,*,y]", "[*,y,*]"), ("[*,*,x,*]", "[y,*,*]"), ("[y,*,*,x]", "[*,x,y]")]),
]


@pytest.mark.parametrize("equation,shapes,layouts", [
    pytest.param(equation, shapes, p.values[0], id=f"{equation}-{p.id}")
    for equation, shapes, cases in SHARDED_PAIRS for p in spec_params(MESH_2X2, *cases)])
def test_einsum_both_sharded(equation, shapes, layouts):
    _check(equation, shapes, layouts)


@pytest.mark.parametrize("equation,shapes,specs", [
    ("ij,jk->ik", [(4, 8), (8, 4)], ("[*,x]", "[x,y]")),
    ("bqhd,bkhd->bhqk", [(2, 4, 2, 4), (2, 6, 2, 4)], ("[x,*,*,y]", "[x,*,*,y]")),
    ("bhqk,bkhd->bqhd", [(2, 2, 4, 6), (2, 6, 2, 4)], ("[x,y,*,*]", "[x,*,y,*]")),
    ("ij->", [(4, 8)], ("[x,y]",)),
    ("i,i->", [(8,), (8,)], ("[x]", "[*]")),
    ("...ij,...jk->...ik", [(2, 4, 8), (8, 4)], ("[x,*,y]", "[y,*]")),
])
def test_einsum_in_tf_function(equation, shapes, specs):
    layouts = [layout_of(s, MESH_2X2) for s in specs]
    _check(equation, shapes, layouts, fn=tf.function(_einsum(equation)))


def test_int32_einsum():
    a = random_array((4, 8), np.int32, -3, 3)
    b = random_array((8, 4), np.int32, -3, 3, seed=1)
    check_op(_einsum("ij,jk->ik"), "Einsum", [a, b],
             [layout_of("[y,x]", MESH_2X2), layout_of("[x,*]", MESH_2X2)],
             attrs={"equation": "ij,jk->ik"})


def _uneven_params():
    params = []
    for mesh in (MESH_1D, MESH_2X2):
        for a in layouts_for(mesh, (5, 3), uneven=True):
            for b in (Layout.replicated(mesh, 2), *layouts_for(mesh, (3, 4), uneven=True)[1:3]):
                if not a.is_even((5, 3)):
                    params.append(pytest.param((a, b), id=f"{a.short()}-{b.short()}"))
    return params


@pytest.mark.parametrize("layouts", _uneven_params())
def test_einsum_on_uneven_shards(layouts):
    equation = "ij,jk->ik"
    result = _check(equation, [(5, 3), (3, 4)], layouts)
    expected = random_array((5, 3)) @ random_array((3, 4), seed=1)
    assert_values_equal(expected, reassemble(tf.function(_einsum(equation))(
        to_dtensor(random_array((5, 3)), layouts[0]),
        to_dtensor(random_array((3, 4), seed=1), layouts[1]))))
    assert tuple(result.shape) == (5, 4)


def test_uneven_attention_scores():
    q = random_array((3, 5, 2, 4))
    k = random_array((3, 7, 2, 4), seed=1)
    for specs in (("[x,y,*,*]", "[x,*,*,*]"), ("[*,*,x,y]", "[*,y,x,*]"),
                  ("[y,x,*,*]", "[*,*,*,x]")):
        _check("bqhd,bkhd->bhqk", [q.shape, k.shape],
               [layout_of(s, MESH_2X2) for s in specs])


GRADIENT_CASES = [
    ("bqhd,bkhd->bhqk", [(2, 4, 2, 4), (2, 6, 2, 4)], ("[x,*,y,*]", "[x,*,y,*]")),
    ("bhqk,bkhd->bqhd", [(2, 2, 4, 6), (2, 6, 2, 4)], ("[x,y,*,*]", "[x,*,y,*]")),
    ("ij,jk->ik", [(4, 8), (8, 4)], ("[*,x]", "[x,y]")),
    ("ij,jk->ik", [(4, 8), (8, 4)], ("[x,*]", "[*,y]")),
    ("bij,bjk->bik", [(2, 4, 8), (2, 8, 4)], ("[x,*,y]", "[*,y,*]")),
    ("i,j->ij", [(4,), (8,)], ("[x]", "[y]")),
    ("i,i->", [(8,), (8,)], ("[x]", "[x]")),
    ("ij->ji", [(4, 8)], ("[x,y]",)),
    # Diagonals: the gradient writes one ("i->ii").
    ("ii->i", [(4, 4)], ("[x,y]",)),
    ("iij->ij", [(2, 2, 8)], ("[x,*,y]",)),
    ("ijk->ik", [(2, 4, 8)], ("[*,x,y]",)),
    ("...ij,...jk->...ik", [(2, 4, 8), (8, 4)], ("[x,*,y]", "[y,*]")),
]


@pytest.mark.parametrize("equation,shapes,specs", GRADIENT_CASES,
                         ids=[f"{c[0]}-{'-'.join(c[2])}" for c in GRADIENT_CASES])
def test_einsum_gradient(equation, shapes, specs):
    # float64: the sharded sums add in another order than the one-device ones.
    arrays = [random_array(s, np.float64, seed=i) for i, s in enumerate(shapes)]

    def grads(*operands):
        with tf.GradientTape() as tape:
            tape.watch(list(operands))
            loss = tf.reduce_sum(tf.sin(tf.einsum(equation, *operands)))
        return [loss] + tape.gradient(loss, list(operands))

    expected = [g.numpy() for g in grads(*[tf.constant(a) for a in arrays])]
    inputs = [to_dtensor(a, layout_of(s, MESH_2X2)) for a, s in zip(arrays, specs)]
    for run in (grads, tf.function(grads)):
        got = run_without_fallback(run, *inputs)
        for e, g in zip(expected, got):
            assert tuple(g.shape) == e.shape
            assert_values_equal(e, reassemble(g))


def test_partial_input_passes_through():
    # einsum is linear in each operand: a pending sum passes to the output unreduced.
    a = random_array((4, 6), seed=1)
    b = random_array((6, 3), seed=2)
    p = to_dtensor(a, Layout([UNSHARDED, UNSHARDED], MESH_2X2, partial={"y": "sum"}))
    w = to_dtensor(b, Layout.replicated(MESH_2X2, 2))
    result = tf.einsum("ij,jk->ik", p, w)
    assert dtensor.fetch_layout(result).partial == {"y": "sum"}
    assert_values_equal(a @ b, reassemble(result))
    assert_values_equal(a @ b, reassemble(tf.function(_einsum("ij,jk->ik"))(p, w)))


def test_function_keeps_contraction_partial_until_a_nonlinear_use():
    x = random_array((4, 6), seed=3)
    w = random_array((6, 3), seed=4)
    xs = to_dtensor(x, layout_of("[*,x]", MESH_2X2))
    ws = to_dtensor(w, layout_of("[x,*]", MESH_2X2))

    @tf.function
    def f(x, w):
        h = tf.einsum("ij,jk->ik", x, w)
        return tf.nn.relu(tf.einsum("ik,k->i", h, tf.ones([3])))

    expected = np.maximum((x @ w).sum(1), 0)
    assert_dtensor_equal(expected, Layout.replicated(MESH_2X2, 1), run_without_fallback(f, xs, ws))


def test_explain_einsum_contracted_axis_is_partial():
    layouts = [layout_of("[*,x]", MESH_2X2), layout_of("[x,y]", MESH_2X2)]
    plan = tf_dtensor.debug.explain("Einsum", layouts, [[4, 8], [8, 4]],
                                    attrs={"equation": "ij,jk->ik"})
    assert plan["outputs"] == [layout_of("[*,y]", MESH_2X2)]
    assert "all-reduce(sum) of output 0 over x" in plan["collectives"]


@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk", [[4, 8], [8, 4]], "exactly one"),
    ("ij,jk->ik", [[4, 8]], "2 operands"),
    ("ijk->ik", [[4, 8]], "rank is 2"),
    ("ij->iz", [[4, 8]], "letter 'z'"),
    ("i$->i", [[4, 8]], "invalid character"),
    ("...ij->ij", [[2, 4, 8]], "no \"...\" in its output"),
])
def test_explain_rejects_bad_equations(equation, shapes, message):
    with pytest.raises(ValueError, match="Einsum") as error:
        tf_dtensor.debug.explain("Einsum", [Layout.replicated(MESH_2X2, len(s)) for s in shapes],
                                 shapes, attrs={"equation": equation})
    assert message in str(error.value)
