"""In-place updates and reads of part of a sharded DVariable (cc/rules/resource_rules.cc,
ThroughValueRule): `v[...].assign(x)` (ResourceStridedSliceAssign), `v.scatter_nd_*`
(ResourceScatterNd*) and `v.gather_nd` (ResourceGatherNd), each against the same program on
a plain tf.Variable, eagerly and inside a tf.function. These were refused on a sharded
DVariable (TF's DTensor refuses them too)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (LOWERINGS, MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, collective_lowering, layout_of,
                             random_array, reassemble, run_without_fallback, to_dtensor)
from tf_dtensor import dtensor

_V = random_array((6, 4), seed=3)
_ROWS = np.array([[1], [4], [1]], np.int32)          # a duplicate: adds add up
_CELLS = np.array([[0, 3], [5, 0], [2, 2]], np.int64)
_UPDATES = {"rows": random_array((3, 4), seed=4), "cells": random_array((3,), seed=5)}


def _slice_assigns(v, value):
    v[1:4].assign(value[:3])                      # rows across blocks
    v[:, 2].assign(value[:, 0])                   # a column (shrink axis)
    v[::2, 1:3].assign(value[:3, :2] * 2.0)       # strided rows, cut columns
    v[-1].assign(tf.ones([4]))                    # negative index, a broadcast value


def _scatters(v, updates):
    v.scatter_nd_update(_CELLS, updates["cells"])
    v.scatter_nd_add(_ROWS, updates["rows"])
    v.scatter_nd_sub(_CELLS, updates["cells"] * 3.0)
    v.scatter_nd_max(_ROWS, updates["rows"])
    v.scatter_nd_min(_CELLS, updates["cells"])


def _run(program, variable_layout, in_function, lowering=""):
    """The variable after `program` on a DVariable of `variable_layout`, and on tf.Variable."""
    plain = tf.Variable(_V)
    program(plain, *_arguments(program, None))
    with collective_lowering(lowering):
        v = dtensor.DVariable(to_dtensor(_V, variable_layout))
        args = _arguments(program, variable_layout.mesh)
        if in_function:
            run_without_fallback(tf.function(lambda: program(v, *args)))
        else:
            run_without_fallback(lambda: program(v, *args))
        return plain.numpy(), v


def _arguments(program, mesh):
    replicated = lambda a: a if mesh is None else to_dtensor(a, dtensor.Layout.replicated(
        mesh, a.ndim))
    if program is _slice_assigns:
        return (replicated(random_array((6, 4), seed=6)),)
    return ({k: replicated(a) for k, a in _UPDATES.items()},)


_LAYOUTS = [("[x,*]", MESH_2X2), ("[*,y]", MESH_2X2), ("[x,y]", MESH_2X2), ("[y,x]", MESH_2X2),
            ("[x,*]", MESH_1D), ("[x,*]", MESH_8), ("[*,x]", MESH_8)]  # 6 rows over 8: uneven


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("program", [_slice_assigns, _scatters], ids=["slices", "scatters"])
@pytest.mark.parametrize("spec,mesh", _LAYOUTS, ids=[f"{s}-{m.size}" for s, m in _LAYOUTS])
def test_updates_of_part_of_a_sharded_variable(spec, mesh, program, in_function):
    layout = layout_of(spec, mesh)
    expected, v = _run(program, layout, in_function)
    # The variable keeps its layout and holds what the plain variable holds.
    assert dtensor.fetch_layout(v) == layout
    assert_dtensor_equal(expected, layout, v.read_value())


@pytest.mark.parametrize("lowering", [l for l in LOWERINGS if l])
@pytest.mark.parametrize("program", [_slice_assigns, _scatters], ids=["slices", "scatters"])
def test_updates_under_each_lowering(program, lowering):
    layout = layout_of("[x,y]", MESH_2X2)
    expected, v = _run(program, layout, in_function=True, lowering=lowering)
    with collective_lowering(lowering):
        assert_dtensor_equal(expected, layout, v.read_value())


def test_a_slice_along_a_whole_axis_stays_on_each_block(mesh_2x2):
    # Columns cut on a row-sharded variable: every device updates its own rows, with no
    # collective; rows cut: the value is gathered along x and written back.
    v = dtensor.DVariable(to_dtensor(_V, layout_of("[x,*]", mesh_2x2)))
    value = to_dtensor(np.full((6, 2), 7.0, np.float32), layout_of("[x,*]", mesh_2x2))
    with tf_dtensor.debug.collectives() as ledger:
        v[:, 1:3].assign(value)
    assert ledger.count() == 0, ledger
    with tf_dtensor.debug.collectives() as ledger:
        v[2:5].assign(tf.zeros([3, 4]))
    assert ledger.count() > 0
    expected = _V.copy()
    expected[:, 1:3] = 7.0
    expected[2:5] = 0.0
    assert_dtensor_equal(expected, layout_of("[x,*]", mesh_2x2), v.read_value())


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("spec", ["[x,*]", "[*,y]", "[x,y]"])
def test_gather_nd_of_a_sharded_variable_and_its_gradient(spec, in_function, mesh_2x2):
    def program(v):
        with tf.GradientTape() as tape:
            picked = v.gather_nd(_CELLS) + tf.reduce_sum(tf.gather_nd(v, _ROWS), axis=1)
            loss = tf.reduce_sum(picked * picked)
        return picked, tf.convert_to_tensor(tape.gradient(loss, v))

    run = tf.function(program) if in_function else program
    want = run(tf.Variable(_V))
    got = run_without_fallback(run, dtensor.DVariable(to_dtensor(_V, layout_of(spec, mesh_2x2))))
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_values_equal(w.numpy(), reassemble(g))


def test_a_bad_slice_is_refused_as_on_one_device(mesh_2x2):
    v = dtensor.DVariable(to_dtensor(_V, layout_of("[x,*]", mesh_2x2)))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.Variable(_V)[1:3].assign(tf.ones([5, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        v[1:3].assign(tf.ones([5, 4]))
    assert_dtensor_equal(_V, layout_of("[x,*]", mesh_2x2), v.read_value())
