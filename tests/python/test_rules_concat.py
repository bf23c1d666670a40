"""Numerical checks of cc/rules/concat_rules.cc: ConcatV2, Concat, Pack, Unpack, Split and
SplitV.

    concat([x,*], [x,*], axis=1) -> [x,*]          concat([x,*], [*,y], axis=0) -> [*,y]
    stack([x,*], [x,*], axis=0) -> [*,x,*]          unstack([x,y], axis=1) -> [x], [x], ...
    split([x,y], 2, axis=1) -> [x,*], [x,*]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, check_op, layout_of, layout_params,
                             random_array, spec_params)

SHAPE = (4, 8)


def _pair():
    return [random_array(SHAPE, seed=1), random_array(SHAPE, seed=2)]


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, SHAPE, meshes=[MESH_2X2]))
def test_concat_two(layouts, axis):
    check_op(lambda a, b: tf.concat([a, b], axis=axis), "ConcatV2", _pair(), layouts,
             host_inputs=[([], [axis])])


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, SHAPE, meshes=[MESH_1D]))
def test_concat_two_1d(layouts, axis):
    check_op(lambda a, b: tf.concat([a, b], axis=axis), "ConcatV2", _pair(), layouts,
             host_inputs=[([], [axis])])


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,*]", "[*,y]", "[y,x]"),
                                                ("[*,y]", "[*,y]", "[*,y]")))
def test_concat_three_of_different_sizes(layouts):
    arrays = [random_array((4, n), seed=n) for n in (8, 4, 2)]
    check_op(lambda a, b, c: tf.concat([a, b, c], axis=-1), "ConcatV2", arrays, layouts,
             host_inputs=[([], [-1])])


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]", "[x,y]"), ("[y,*]", "[*,x]")))
def test_concat_v1(layouts):
    check_op(lambda a, b: tf.raw_ops.Concat(concat_dim=0, values=[a, b]), "Concat", _pair(),
             layouts, host_inputs=[([], [0])], host_first=True)


def test_concat_of_integer_shapes(mesh_2x2):
    # Gradient code concatenates shape vectors; they stay replicated.
    arrays = [np.array([4, 8], np.int32), np.array([2], np.int32)]
    check_op(lambda a, b: tf.concat([a, b], axis=0), "ConcatV2", arrays,
             [layout_of("[*]", mesh_2x2)] * 2, host_inputs=[([], [0])])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, SHAPE, meshes=[MESH_2X2],
                                                  select=lambda c: c[0] == c[1] or
                                                  c[1].sharding_specs == ["unsharded"] * 2))
def test_stack(layouts, axis):
    check_op(lambda a, b: tf.stack([a, b], axis=axis), "Pack", _pair(), layouts,
             attrs={"axis": axis})


@pytest.mark.parametrize("layouts", layout_params((8,), (8,), (8,), meshes=[MESH_1D]))
def test_stack_vectors(layouts):
    arrays = [random_array((8,), seed=s) for s in range(3)]
    check_op(lambda a, b, c: tf.stack([a, b, c], axis=1), "Pack", arrays, layouts,
             attrs={"axis": 1})


@pytest.mark.parametrize("index", [0, 3])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_unstack(layouts, axis, index):
    num = SHAPE[axis]
    check_op(lambda x: tf.unstack(x, axis=axis)[index], "Unpack", [random_array(SHAPE)], layouts,
             attrs={"axis": axis, "num": num}, output=index)


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_split(layouts, axis, index):
    check_op(lambda x: tf.split(x, 2, axis=axis)[index], "Split", [random_array(SHAPE)],
             layouts, host_inputs=[([], [axis])], attrs={"num_split": 2}, host_first=True,
             output=index)


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("layouts", layout_params(SHAPE, meshes=[MESH_2X2]))
def test_split_sizes(layouts, axis, index):
    sizes = [2, 5, 1]
    check_op(lambda x: tf.split(x, sizes, axis=axis)[index], "SplitV", [random_array(SHAPE)],
             layouts, host_inputs=[([3], sizes), ([], [axis])], attrs={"num_split": 3},
             output=index)
