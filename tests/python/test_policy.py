"""The policy for ops with no sharding rule (tf_dtensor/_device.py, `set_strict_mode`):
by default they run replicated and warn once per op name; in strict mode they raise.

Each test uses its own op (Cumsum, ConcatV2, Cumprod, ...): the warning is given once per op
name per process.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import assert_dtensor_equal, layout_of, to_dtensor
from tf_dtensor import dtensor

_X = np.arange(32, dtype=np.float32).reshape(4, 8)


def _unsupported_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, tf_dtensor.UnsupportedOpWarning)]


def test_op_without_rule_runs_replicated_and_warns_once(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    with pytest.warns(tf_dtensor.UnsupportedOpWarning,
                      match=r"(?s)'Cumsum'.*\[x,\*\] @ mesh\(x=2,y=2\)"):
        out = tf.math.cumsum(t, axis=1)
    assert_dtensor_equal(np.cumsum(_X, axis=1), layout_of("[*,*]", mesh_2x2), out)
    again, caught = _unsupported_warnings(lambda: tf.math.cumsum(t, axis=0))
    assert caught == []
    assert_dtensor_equal(np.cumsum(_X, axis=0), layout_of("[*,*]", mesh_2x2), again)


def test_concat_without_rule_runs_replicated(mesh_2x2):
    a = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    b = to_dtensor(-_X, layout_of("[*,x]", mesh_2x2))
    with pytest.warns(tf_dtensor.UnsupportedOpWarning, match="'ConcatV2'"):
        out = tf.concat([a, b], axis=0)
    assert_dtensor_equal(np.concatenate([_X, -_X]), layout_of("[*,*]", mesh_2x2), out)


def test_strict_mode_raises_naming_op_and_layouts(mesh_2x2, strict_mode):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    with pytest.raises(tf.errors.UnimplementedError,
                       match=r"(?s)'Cumprod' has no tf_dtensor rule.*\[x,\*\] @ mesh\(x=2,y=2\)"):
        tf.math.cumprod(t, axis=1)


def test_strict_mode_concat(mesh_2x2, strict_mode):
    a = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    b = to_dtensor(_X, layout_of("[y,*]", mesh_2x2))
    with pytest.raises(tf.errors.UnimplementedError) as error:
        tf.concat([a, b], axis=1)
    message = str(error.value)
    assert "'ConcatV2'" in message
    assert "[x,y] @ mesh(x=2,y=2)" in message and "[y,*] @ mesh(x=2,y=2)" in message


def test_strict_mode_does_not_affect_ops_with_rules(mesh_2x2, strict_mode):
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    assert_dtensor_equal(_X * 2, layout_of("[x,y]", mesh_2x2), t + t)


def test_strict_mode_can_be_turned_off_again(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    dtensor.set_strict_mode(True)
    try:
        with pytest.raises(tf.errors.UnimplementedError, match="'Reverse"):
            tf.reverse(t, axis=[1])
    finally:
        dtensor.set_strict_mode(False)
    out, caught = _unsupported_warnings(lambda: tf.reverse(t, axis=[1]))
    assert len(caught) == 1
    assert_dtensor_equal(_X[:, ::-1], layout_of("[*,*]", mesh_2x2), out)


def test_explain_of_op_without_rule(mesh_2x2):
    with pytest.raises(tf_dtensor.UnsupportedOpError, match="'Cumsum' has no tf_dtensor rule"):
        tf_dtensor.debug.explain("Cumsum", [layout_of("[x,*]", mesh_2x2), None], [[4, 8], []])
