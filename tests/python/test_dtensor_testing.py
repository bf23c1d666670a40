"""The test helpers themselves (dtensor_testing.py): a checker that cannot fail is a defect."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, case_id, layout_of,
                             layouts_for, reassemble, run_without_fallback, spec_id, to_dtensor)
from tf_dtensor import _device as dtensor_device
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

_X = np.arange(8, dtype=np.float32).reshape(4, 2)


def test_layouts_for_enumerates_the_small_set():
    assert [spec_id(l) for l in layouts_for(MESH_1D, (4, 8))] == ["[*,*]", "[*,x]", "[x,*]"]
    assert sorted(spec_id(l) for l in layouts_for(MESH_2X2, (4, 8))) == sorted(
        ["[*,*]", "[*,x]", "[*,y]", "[x,*]", "[y,*]", "[x,y]", "[y,x]"])
    # Axes of size 1 cannot be sharded 2 ways.
    assert [spec_id(l) for l in layouts_for(MESH_1D, (4, 1))] == ["[*,*]", "[x,*]"]


def test_case_ids():
    a, b = layout_of("[x,*]", MESH_2X2), layout_of("[*,y]", MESH_2X2)
    assert case_id([a, b]) == "[x,*]-[*,y]"
    assert case_id([layout_of("[x]", MESH_1D)]) == "[x]@mesh(x=2)"


def test_reassemble_uses_mesh_coordinates():
    layout = Layout(["x", "y"], MESH_2X2)
    blocks = [np.full((2, 1), i, np.float32) for i in range(4)]
    np.testing.assert_array_equal(reassemble(dtensor.pack(blocks, layout)),
                                  [[0, 1], [0, 1], [2, 3], [2, 3]])


def test_detects_a_wrong_value():
    t = to_dtensor(_X, layout_of("[x,*]", MESH_2X2))
    with pytest.raises(AssertionError):
        assert_dtensor_equal(_X + 1, layout_of("[x,*]", MESH_2X2), t)


def test_detects_swapped_blocks():
    layout = Layout(["x", UNSHARDED], MESH_1D)
    t = dtensor.pack([_X[2:], _X[:2]], layout)
    with pytest.raises(AssertionError):
        assert_dtensor_equal(_X, layout, t)


def test_detects_disagreeing_replicas():
    layout = Layout(["x", UNSHARDED], MESH_2X2)
    t = dtensor.pack([_X[:2], _X[:2] + 1, _X[2:], _X[2:]], layout)
    with pytest.raises(AssertionError, match="replicas"):
        assert_dtensor_equal(_X, layout, t)


def test_detects_a_wrong_layout():
    t = to_dtensor(_X, layout_of("[x,*]", MESH_2X2))
    with pytest.raises(AssertionError, match="layout"):
        assert_dtensor_equal(_X, layout_of("[y,*]", MESH_2X2), t)


def test_detects_a_wrong_dtype_and_shape():
    t = to_dtensor(_X, layout_of("[x,*]", MESH_2X2))
    with pytest.raises(AssertionError, match="dtype"):
        assert_dtensor_equal(_X.astype(np.float64), layout_of("[x,*]", MESH_2X2), t)
    with pytest.raises(AssertionError, match="shape"):
        assert_dtensor_equal(_X.reshape(2, 4), layout_of("[x,*]", MESH_2X2), t)


def test_integers_compare_exactly():
    x = np.array([[2**30, 1], [3, 4]], np.int32)
    t = to_dtensor(x, layout_of("[x,*]", MESH_2X2))
    with pytest.raises(AssertionError):
        assert_dtensor_equal(x + np.array([[1, 0], [0, 0]], np.int32), layout_of("[x,*]", MESH_2X2),
                             t)


def test_flags_a_missing_rule_on_replicated_inputs():
    # Roll has no rule; on replicated inputs the fallback gathers nothing and never warns.
    t = to_dtensor(_X, layout_of("[*,*]", MESH_2X2))
    with pytest.raises(pytest.fail.Exception, match="ran without a rule"):
        run_without_fallback(lambda x: tf.roll(x, 1, axis=0), t)


def test_strict_mode_is_restored_after_a_check():
    before = dtensor_device.get().strict
    run_without_fallback(lambda x: x + 1, to_dtensor(_X, layout_of("[x,*]", MESH_2X2)))
    assert dtensor_device.get().strict == before
