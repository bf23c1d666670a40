"""The policy for ops with no sharding rule (tf_dtensor/_device.py, `set_strict_mode`):
by default they run replicated and warn once per op name; in strict mode they raise.

Each test uses its own op (CTCGreedyDecoder, TridiagonalSolve, NthElement, ...): the warning
is given once per op name per process. The ops are ones with no rule; adding a rule for one
means moving its test to another.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (assert_dtensor_equal, collective_lowering, layout_of, reassemble,
                             to_dtensor)
from tf_dtensor import dtensor

_X = np.arange(32, dtype=np.float32).reshape(4, 8)


def _unsupported_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, tf_dtensor.UnsupportedOpWarning)]


# CTCGreedyDecoder has no rule by design: its outputs are sparse indices and values whose
# count depends on the data (cc/rules/data_dependent_rules.cc says why such ops gather).
_LOGITS = np.random.default_rng(0).normal(size=(6, 4, 5)).astype(np.float32)  # [t, batch, c]


def test_op_without_rule_runs_replicated_and_warns_once(mesh_2x2):
    t = to_dtensor(_LOGITS, layout_of("[*,x,*]", mesh_2x2))

    def decode(lengths):
        return tf.raw_ops.CTCGreedyDecoder(inputs=t, sequence_length=lengths)

    def expected(lengths):
        return tf.raw_ops.CTCGreedyDecoder(inputs=_LOGITS, sequence_length=lengths)

    lengths = np.array([6, 5, 3, 6], np.int32)
    with pytest.warns(tf_dtensor.UnsupportedOpWarning,
                      match=r"(?s)'CTCGreedyDecoder'.*\[\*,x,\*\] @ mesh\(x=2,y=2\)"):
        out = decode(lengths)
    for want, got in zip(expected(lengths), out):
        assert_dtensor_equal(want, layout_of("[" + ",".join(["*"] * want.shape.rank) + "]",
                                             mesh_2x2), got)
    shorter = np.array([2, 2, 1, 4], np.int32)
    again, caught = _unsupported_warnings(lambda: decode(shorter))
    assert caught == []
    assert_dtensor_equal(expected(shorter)[1], layout_of("[*]", mesh_2x2), again[1])


# Tridiagonal and banded solves: [3, 8] diagonals (or [4, 8] bands) against an [8, 4] rhs.
_DIAGONALS = np.stack([np.ones(8), np.full(8, 4.0), np.ones(8)]).astype(np.float32)
_BANDS = np.concatenate([np.ones((3, 8)), np.full((1, 8), 4.0)]).astype(np.float32)
_RHS = _X.T.copy()


def test_two_input_op_without_rule_runs_replicated(mesh_2x2):
    a = to_dtensor(_DIAGONALS, layout_of("[*,y]", mesh_2x2))
    b = to_dtensor(_RHS, layout_of("[*,x]", mesh_2x2))
    with pytest.warns(tf_dtensor.UnsupportedOpWarning, match="'TridiagonalSolve'"):
        out = tf.raw_ops.TridiagonalSolve(diagonals=a, rhs=b)
    assert_dtensor_equal(tf.raw_ops.TridiagonalSolve(diagonals=_DIAGONALS, rhs=_RHS),
                         layout_of("[*,*]", mesh_2x2), out)


def test_strict_mode_raises_naming_op_and_layouts(mesh_2x2, strict_mode):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    with pytest.raises(tf.errors.UnimplementedError,
                       match=(r"(?s)'NthElement' has no tf_dtensor rule"
                              r".*\[x,\*\] @ mesh\(x=2,y=2\)")):
        tf.raw_ops.NthElement(input=t, n=2)


def test_strict_mode_two_inputs(mesh_2x2, strict_mode):
    a = to_dtensor(_BANDS, layout_of("[x,y]", mesh_2x2))
    b = to_dtensor(_RHS, layout_of("[y,*]", mesh_2x2))
    with pytest.raises(tf.errors.UnimplementedError) as error:
        tf.linalg.banded_triangular_solve(a, b)
    message = str(error.value)
    assert "'BandedTriangularSolve'" in message
    assert "[x,y] @ mesh(x=2,y=2)" in message and "[y,*] @ mesh(x=2,y=2)" in message


def test_strict_mode_does_not_affect_ops_with_rules(mesh_2x2, strict_mode):
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    assert_dtensor_equal(_X * 2, layout_of("[x,y]", mesh_2x2), t + t)


def test_strict_mode_can_be_turned_off_again(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    dtensor.set_strict_mode(True)
    try:
        with pytest.raises(tf.errors.UnimplementedError, match="'Diag'"):
            tf.linalg.tensor_diag(t)
    finally:
        dtensor.set_strict_mode(False)
    out, caught = _unsupported_warnings(lambda: tf.linalg.tensor_diag(t))
    assert len(caught) == 1
    assert_dtensor_equal(tf.linalg.tensor_diag(_X), layout_of("[*,*,*,*]", mesh_2x2), out)


def test_explain_of_op_without_rule(mesh_2x2):
    with pytest.raises(tf_dtensor.UnsupportedOpError,
                       match="'NthElement' has no tf_dtensor rule"):
        tf_dtensor.debug.explain("NthElement", [layout_of("[x,*]", mesh_2x2), None], [[4, 8], []])


# FractionalMaxPool draws its pooling sequences from seed attributes although TF registers
# it as stateless. Without a rule, each device ran it under the ops and copies lowerings
# (the shared buffers of the default one compute a replicated result once) and the
# "replicated" result's replicas held different poolings. A seeded op without a rule now
# runs once, as a stateful one does, and every device gets that result.
@pytest.mark.parametrize("lowering", ["", "ops", "copies"], ids=["default", "ops", "copies"])
def test_seeded_op_without_rule_runs_once_so_replicas_agree(lowering, mesh_2x2):
    x = np.random.default_rng(1).normal(size=(4, 7, 7, 2)).astype(np.float32)

    def pool(t):
        return tf.nn.fractional_max_pool(t, [1.0, 1.6, 1.6, 1.0])

    with collective_lowering(lowering), warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_dtensor.UnsupportedOpWarning)
        for run in (pool, tf.function(pool)):
            out, rows, cols = run(to_dtensor(x, layout_of("[x,*,*,*]", mesh_2x2)))
            assert dtensor.fetch_layout(out) == layout_of("[*,*,*,*]", mesh_2x2)
            pooled = reassemble(out)   # fails where two devices' replicas differ
            # The sequences' components, as every device holds them (TF's shape inference
            # gives them one element too few inside a function).
            rows, cols = ([s.numpy() for s in dtensor.unpack(seq)] for seq in (rows, cols))
            for seq in (rows, cols):
                assert all(np.array_equal(s, seq[0]) for s in seq)
            rows, cols = rows[0], cols[0]
            expected = np.array([[x[:, r0:r1, c0:c1].max(axis=(1, 2))
                                  for c0, c1 in zip(cols[:-1], cols[1:])]
                                 for r0, r1 in zip(rows[:-1], rows[1:])]).transpose(2, 0, 1, 3)
            np.testing.assert_array_equal(pooled, expected)
