"""Tests of tf_dtensor/variable.py: DVariable creation, reads and assignments."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import MESH_1D, MESH_2X2, assert_dtensor_equal, layout_of, \
    run_without_fallback, spec_params, to_dtensor
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

_X = np.arange(32, dtype=np.float32).reshape(8, 4)

LAYOUTS = spec_params(MESH_2X2, ("[*,*]",), ("[x,*]",), ("[x,y]",), ("[*,y]",)) + spec_params(
    MESH_1D, ("[x,*]",))


@pytest.mark.parametrize("layouts", LAYOUTS)
def test_dvariable_keeps_the_layout_and_value(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_X, layout))
    assert dtensor.fetch_layout(v) == layout
    assert v.layout == layout
    assert dtensor.is_dtensor(v)
    assert v.shape == (8, 4) and v.dtype == tf.float32
    assert_dtensor_equal(_X, layout, v.read_value())
    assert_dtensor_equal(_X, layout, tf.convert_to_tensor(v))


@pytest.mark.parametrize("layouts", LAYOUTS)
def test_dvariable_plus_dtensor(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_X, layout))
    assert_dtensor_equal(_X + 1, layout, v + to_dtensor(np.ones_like(_X), layout))


@pytest.mark.parametrize("layouts", LAYOUTS)
def test_assign_assign_add_assign_sub(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(np.zeros_like(_X), layout))
    v.assign(to_dtensor(_X, layout))
    assert_dtensor_equal(_X, layout, v.read_value())
    v.assign_add(to_dtensor(np.full_like(_X, 2.0), layout))
    assert_dtensor_equal(_X + 2, layout, v.read_value())
    v.assign_sub(to_dtensor(np.full_like(_X, 5.0), layout))
    assert_dtensor_equal(_X - 3, layout, v.read_value())


def test_overview_dvariable(mesh_2x2):
    layout = Layout.replicated(mesh_2x2, 2)
    initial = dtensor.call_with_layout(tf.function(tf.random.stateless_normal), layout,
                                       shape=tf.TensorShape([64, 32]), seed=[1, 1],
                                       dtype=tf.float32)
    v = dtensor.DVariable(initial_value=initial)
    assert dtensor.fetch_layout(v) == layout
    expected = tf.random.stateless_normal([64, 32], seed=[1, 1]).numpy()
    ones = dtensor.call_with_layout(tf.ones, layout, shape=(64, 32))
    assert_dtensor_equal(expected + 1, layout, v + ones)
    v.assign(ones)
    assert_dtensor_equal(np.ones((64, 32), np.float32), layout, v.read_value())


@pytest.mark.parametrize("value_spec", ["[*,*]", "[y,*]", "[x,y]", "[*,x]"])
@pytest.mark.parametrize("variable_spec", ["[x,*]", "[*,*]"])
@pytest.mark.parametrize("in_function", [False, True])
def test_assign_another_layout_relays_it_out(value_spec, variable_spec, in_function, mesh_2x2):
    # As TF's DTensor does, a value of another layout is relaid out into the variable's,
    # eagerly as inside a tf.function; the variable keeps its layout. Eagerly this used to
    # be refused ("a DVariable's layout is fixed"), so `v.assign_sub(lr * g)` with a
    # gradient of another layout failed outside a function and ran inside one.
    layout = layout_of(variable_spec, mesh_2x2)
    v = dtensor.DVariable(to_dtensor(np.zeros_like(_X), layout))
    # (update, value, the variable's value after it)
    steps = [(v.assign, _X, _X), (v.assign_add, 2 * _X + 1, 3 * _X + 1),
             (v.assign_sub, _X - 4, 2 * _X + 5)]
    for method, value, expected in steps:
        update = tf.function(method) if in_function else method
        update(to_dtensor(value, layout_of(value_spec, mesh_2x2)))
        assert dtensor.fetch_layout(v) == layout
        assert_dtensor_equal(expected, layout, v.read_value())


def test_assign_another_mesh_is_rejected(mesh_2x2, mesh_1d):
    v = dtensor.DVariable(to_dtensor(_X, Layout.replicated(mesh_2x2, 2)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="different meshes"):
        v.assign(to_dtensor(-_X, Layout.replicated(mesh_1d, 2)))
    assert_dtensor_equal(_X, Layout.replicated(mesh_2x2, 2), v.read_value())


def test_regular_tensor_without_layout_is_rejected():
    with pytest.raises(tf_dtensor.LayoutError, match="`layout=`"):
        dtensor.DVariable(tf.ones([2]))


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[*,*]",), ("[x,y]",)))
def test_regular_tensor_with_layout(layouts):
    (layout,) = layouts
    v = dtensor.DVariable(tf.constant(_X), layout=layout)
    assert dtensor.fetch_layout(v) == layout
    assert_dtensor_equal(_X, layout, v.read_value())


def test_callable_initial_value_with_layout(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    v = dtensor.DVariable(lambda: tf.ones([8, 4]), layout=layout)
    assert_dtensor_equal(np.ones((8, 4), np.float32), layout, v.read_value())


def test_conflicting_layout_is_rejected(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError, match=r"`layout=\[y,\*\] @ mesh\(x=2,y=2\)`"):
        dtensor.DVariable(to_dtensor(_X, layout_of("[x,*]", mesh_2x2)),
                          layout=layout_of("[y,*]", mesh_2x2))


# DisableCopyOnRead (ResourceVariable.read_value_no_copy, used by TF's checkpoint saving
# and embedding lookups) runs on every component handle and changes no layout.
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("layouts", LAYOUTS)
def test_read_value_no_copy(layouts, in_function):
    (layout,) = layouts
    v = dtensor.DVariable(to_dtensor(_X, layout))
    read = tf.function(v.read_value_no_copy) if in_function else v.read_value_no_copy
    assert_dtensor_equal(_X, layout, run_without_fallback(read))
    v.assign_add(to_dtensor(np.ones_like(_X), layout))
    assert_dtensor_equal(_X + 1, layout, run_without_fallback(read))
