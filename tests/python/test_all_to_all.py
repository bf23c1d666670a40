"""All-to-all on meshes of virtual CPUs (cc/spmd/shared_buffer_lowering.cc): a relayout that
moves a mesh dimension between tensor axes exchanges sub-blocks directly,

    [x,*] -> [*,x]: source block c split by the target's column pieces; target block k
    concatenates piece k of every source block along the rows,

checked against one plain device for even and uneven axes, 1-D and 2-D meshes (other
mesh dimensions sharding other axes, replicating, or pending), eagerly, in tf.function
and through gradients, under the shared-buffer lowering (virtual CPUs) and under the
copies lowering (GPUs) in both its forms: "split" (SplitV at sources, ConcatV2 at targets)
and "transpose" (one Transpose and views at a source, one DynamicStitch and a Transpose at
a target, where pieces are even).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, cpus, layout_of,
                             random_array, to_dtensor)
from tf_dtensor import config
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


@pytest.fixture(params=["shared", "copies-transpose", "copies-split"])
def form(request, monkeypatch):
    """Each lowering and all-to-all form in turn (TF_DTENSOR_COPIES_PIECES)."""
    lowering, _, cut = request.param.partition("-")
    if cut:
        monkeypatch.setenv("TF_DTENSOR_COPIES_PIECES", cut)
    config.set_collective_lowering(lowering)
    try:
        yield request.param
    finally:
        config.set_collective_lowering("")


def _id(case) -> str:
    mesh, source, target, shape = case
    return f"{mesh.short()}[{source}]-[{target}]-{'x'.join(map(str, shape))}"


def _relayout(target: Layout, traced: bool):
    fn = lambda t: tf_dtensor.relayout(t, target)  # noqa: E731
    return tf.function(fn) if traced else fn


@pytest.mark.parametrize("case", RELAYOUTS, ids=[_id(c) for c in RELAYOUTS])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_to_all_matches_one_device(form, case, traced):
    mesh, source, target, shape = case
    value = random_array(shape, seed=7)
    target_layout = layout_of(target, mesh)
    actual = _relayout(target_layout, traced)(to_dtensor(value, layout_of(source, mesh)))
    assert_dtensor_equal(value, target_layout, actual)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float64, np.int8, np.complex64],
                         ids=lambda d: d.__name__)
@pytest.mark.parametrize("shape", [(5, 7), (16, 2048)], ids=str)
@pytest.mark.parametrize("direction", [("x,*", "*,x"), ("*,x", "x,*")], ids=["rows", "columns"])
def test_all_to_all_of_other_dtypes(form, dtype, shape, direction):
    value = (np.arange(np.prod(shape)).reshape(shape) % 3 == 0).astype(dtype)
    source, target = layout_of(direction[0], MESH_8), layout_of(direction[1], MESH_8)
    assert_dtensor_equal(value, target, tf_dtensor.relayout(to_dtensor(value, source), target))


@pytest.mark.parametrize("shape", [(4, 6), (3, 5), (4, 256)], ids=str)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_all_to_all_keeps_pending_reductions(form, shape, traced):
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
def test_gradient_through_all_to_all(form, case, traced):
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


def _spmd_ops(name):
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    names = [n for n in context.context().list_function_names() if "tfd_spmd" in n and name in n]
    assert names, "no SPMD function found"
    fdef = context.context().get_function_def(max(names, key=lambda n: int(n.rsplit("_", 1)[1])))
    ops = {}
    for node in fdef.node_def:
        ops[node.op] = ops.get(node.op, 0) + 1
    return ops


@pytest.mark.parametrize("cut, source, target, expected", [
    # [x,*] -> [*,x]: a Transpose at every source (its rows come before the target axis),
    # and at every target one DynamicStitch (its pieces are contiguous rows: no Transpose).
    # The sources' views go to the stitch as they are: two Reshapes a device (the fold and
    # the block), none per piece (there were 144).
    ("transpose", "x,*", "*,x", {"Transpose": 8, "DynamicStitch": 8, "SplitV": 0,
                                 "ConcatV2": 0, "Reshape": 16}),
    # [*,x] -> [x,*]: the cut needs no Transpose; the join moves the pieces into place
    # (one more Reshape a target, to the cube the Transpose takes).
    ("transpose", "*,x", "x,*", {"Transpose": 8, "DynamicStitch": 8, "SplitV": 0,
                                 "ConcatV2": 0, "Reshape": 24}),
    ("split", "x,*", "*,x", {"Transpose": 0, "DynamicStitch": 0, "SplitV": 8, "ConcatV2": 8}),
], ids=["transpose-rows", "transpose-columns", "split"])
def test_copies_all_to_all_form_shows_in_the_graph(monkeypatch, cut, source, target, expected):
    monkeypatch.setenv("TF_DTENSOR_COPIES_PIECES", cut)
    config.set_collective_lowering("copies")
    try:
        value = random_array((16, 64), seed=11)
        target_layout = layout_of(target, MESH_8)

        @tf.function
        def exchange_for_the_form_test(t):
            return tf_dtensor.relayout(t, target_layout)

        assert_dtensor_equal(value, target_layout,
                             exchange_for_the_form_test(to_dtensor(value, layout_of(source, MESH_8))))
        ops = _spmd_ops("exchange_for_the_form_test")
        assert {op: ops.get(op, 0) for op in expected} == expected
    finally:
        config.set_collective_lowering("")


@pytest.mark.parametrize("shape, dtype, expected", [
    # 60 columns over 8 are uneven: the sources split; the targets' rows are even: stitched.
    ((16, 60), np.float32, {"SplitV": 8, "Transpose": 0, "DynamicStitch": 8, "ConcatV2": 0}),
    # A source's pieces of 2x1 float32 (8 bytes) would not be aligned views: split.
    ((16, 8), np.float32, {"SplitV": 8, "Transpose": 0, "DynamicStitch": 8, "ConcatV2": 0}),
    # bool has no GPU DynamicStitch: the targets concatenate.
    ((16, 512), np.bool_, {"SplitV": 0, "Transpose": 8, "DynamicStitch": 0, "ConcatV2": 8}),
    # int32 keeps the split form at both ends: a GPU's int32 lives in host memory, and the
    # folded forms of it were wrong on an H200 (block_pieces.cc, Foldable).
    ((16, 512), np.int32, {"SplitV": 8, "Transpose": 0, "DynamicStitch": 0, "ConcatV2": 8}),
], ids=["uneven-columns", "unaligned", "bool", "int32"])
def test_copies_all_to_all_falls_back_to_split_where_the_form_does_not_apply(
        monkeypatch, shape, dtype, expected):
    monkeypatch.setenv("TF_DTENSOR_COPIES_PIECES", "transpose")
    config.set_collective_lowering("copies")
    try:
        value = (random_array(shape, seed=12) * 10).astype(dtype)
        target_layout = layout_of("*,x", MESH_8)

        @tf.function
        def fallback_for_the_form_test(t):
            return tf_dtensor.relayout(t, target_layout)

        assert_dtensor_equal(value, target_layout,
                             fallback_for_the_form_test(to_dtensor(value, layout_of("x,*", MESH_8))))
        ops = _spmd_ops("fallback_for_the_form_test")
        assert {op: ops.get(op, 0) for op in expected} == expected
    finally:
        config.set_collective_lowering("")
