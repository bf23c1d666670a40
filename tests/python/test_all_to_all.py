"""All-to-all on meshes of virtual CPUs (cc/spmd/shared_buffer_lowering.cc): a relayout that
moves a mesh dimension between tensor axes exchanges sub-blocks directly,

    [x,*] -> [*,x]: source block c split by the target's column pieces; target block k
    concatenates piece k of every source block along the rows,

checked against one plain device for even and uneven axes, 1-D and 2-D meshes (other
mesh dimensions sharding other axes, replicating, or pending), eagerly, in tf.function
and through gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, cpus, layout_of,
                             random_array, to_dtensor)
from tf_dtensor.dtensor import Layout, create_mesh

MESH_2X4 = create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
MESH_3 = create_mesh([("x", 3)], devices=cpus(3))

RELAYOUTS = [
    # 1-D meshes, both directions, even and uneven (empty pieces on 8 devices for 5 rows).
    (MESH_1D, "x,*", "*,x", (4, 6)),
    (MESH_8, "x,*", "*,x", (16, 8)),
    (MESH_8, "*,x", "x,*", (8, 24)),
    (MESH_8, "x,*", "*,x", (5, 7)),
    (MESH_8, "*,x", "x,*", (9, 3)),
    (MESH_3, "x,*", "*,x", (7, 5)),
    (MESH_3, "*,x", "x,*", (4, 8)),
    # 2-D meshes: the other dimension shards another axis, or replicates.
    (MESH_2X2, "x,*", "*,x", (4, 6)),
    (MESH_2X4, "y,*", "*,y", (8, 4)),
    (MESH_2X4, "*,y", "y,*", (6, 7)),
    (MESH_2X4, "x,*,y", "*,x,y", (4, 6, 8)),
    (MESH_2X4, "*,y,x", "y,*,x", (5, 3, 4)),
    (MESH_2X4, "x,*,*", "*,*,x", (8, 2, 3)),
    # Rows of at least 256 bytes: one ParallelDynamicStitch per group (uneven source
    # pieces too when they are cut before the target axis).
    (MESH_8, "x,*", "*,x", (16, 512)),
    (MESH_8, "x,*", "*,x", (13, 512)),
    (MESH_3, "x,*", "*,x", (7, 192)),
    (MESH_8, "*,*,x", "*,x,*", (2, 8, 512)),
    (MESH_2X4, "x,*,y", "*,x,y", (4, 8, 512)),
    (MESH_2X4, "y,x,*", "*,x,y", (8, 4, 256)),
    (MESH_2X4, "*,y,x", "*,x,y", (3, 8, 256)),
]


def _id(case) -> str:
    mesh, source, target, shape = case
    return f"{mesh.short()}[{source}]-[{target}]-{'x'.join(map(str, shape))}"


def _relayout(target: Layout, traced: bool):
    fn = lambda t: tf_dtensor.relayout(t, target)  # noqa: E731
    return tf.function(fn) if traced else fn


@pytest.mark.parametrize("case", RELAYOUTS, ids=[_id(c) for c in RELAYOUTS])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_to_all_matches_one_device(case, traced):
    mesh, source, target, shape = case
    value = random_array(shape, seed=7)
    target_layout = layout_of(target, mesh)
    actual = _relayout(target_layout, traced)(to_dtensor(value, layout_of(source, mesh)))
    assert_dtensor_equal(value, target_layout, actual)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("shape", [(5, 7), (16, 2048)], ids=str)
def test_all_to_all_of_other_dtypes(dtype, shape):
    value = (np.arange(np.prod(shape)).reshape(shape) % 3 == 0).astype(dtype)
    target = layout_of("*,x", MESH_8)
    assert_dtensor_equal(value, target,
                         tf_dtensor.relayout(to_dtensor(value, layout_of("x,*", MESH_8)), target))


@pytest.mark.parametrize("shape", [(4, 6), (3, 5), (4, 256)], ids=str)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_to_all_keeps_pending_reductions(shape, traced):
    # [x,*] +partial(y:sum) -> [*,x] +partial(y:sum): each y's term moves on its own.
    value = random_array(shape, seed=8)
    source = Layout(["x", "unsharded"], MESH_2X2, partial={"y": "sum"})
    target = Layout(["unsharded", "x"], MESH_2X2, partial={"y": "sum"})
    actual = _relayout(target, traced)(to_dtensor(value, source))
    assert_dtensor_equal(value, target, actual)
    terms = [c.numpy() for c in tf_dtensor.unpack(actual)]
    # Device (x, y=0) holds the whole block and (x, y=1) zeros, as in the source.
    for device, term in enumerate(terms):
        y = device % 2
        assert np.count_nonzero(term) == (0 if y else term.size)


@pytest.mark.parametrize("case", [RELAYOUTS[3], RELAYOUTS[10], RELAYOUTS[14], RELAYOUTS[17]],
                         ids=[_id(RELAYOUTS[i]) for i in (3, 10, 14, 17)])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_gradient_through_all_to_all(case, traced):
    # d/dt sum(relayout(t) * w) = w, relaid out back (another all-to-all).
    mesh, source, target, shape = case
    value, weight = random_array(shape, seed=9), random_array(shape, seed=10)
    source_layout, target_layout = layout_of(source, mesh), layout_of(target, mesh)
    w = to_dtensor(weight, target_layout)

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = tf.reduce_sum(tf_dtensor.relayout(t, target_layout) * w)
        return tape.gradient(loss, t)

    run = tf.function(grad) if traced else grad
    assert_dtensor_equal(weight, source_layout, run(to_dtensor(value, source_layout)))
