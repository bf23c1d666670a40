"""A tensor axis sharded over several mesh dimensions: `Layout(["x+y", ...])`.

PyTorch's `[Shard(0), Shard(0)]` on a 2-D mesh. The axis is cut like nested torch.chunks
(over the major mesh dimension, then each piece over the next). Relayouts, pack/unpack,
variables and checkpoints hold such layouts; other ops see the axis over its major mesh
dimension (dispatch relayouts first). Every result is checked against one plain device.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_2X2, assert_dtensor_equal, cpus, random_array, reassemble,
                             to_dtensor)
import tf_dtensor
from tf_dtensor import config, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

U = UNSHARDED
MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
MESH_2X2X2 = dtensor.create_mesh([("x", 2), ("y", 2), ("z", 2)], devices=cpus(8))

# (mesh, specs): the multi-dimension layouts under test, in and out of mesh order.
MULTI = [
    (MESH_2X2, ["x+y", U]),
    (MESH_2X2, ["y+x", U]),
    (MESH_2X2, [U, "x+y"]),
    (MESH_2X4, ["x+y", U]),
    (MESH_2X4, ["y+x", U]),
    (MESH_2X2X2, ["x+z", "y"]),
    (MESH_2X2X2, ["z+y+x", U]),
]
MULTI_IDS = [f"{'-'.join(s)}@{'x'.join(str(m.dim_size(d)) for d in m.dim_names)}"
             for m, s in MULTI]
SHAPES = [(8, 4), (5, 3), (3, 2), (0, 2)]


def _nested_pieces(size, sizes):
    """Reference nested torch.chunk: offsets and sizes of each piece, major first."""
    pieces = [(0, size)]
    for k in sizes:
        nxt = []
        for offset, n in pieces:
            chunk = -(-n // k) if n else 0
            for i in range(k):
                begin = min(n, chunk * i)
                nxt.append((offset + begin, min(n, begin + chunk) - begin))
        pieces = nxt
    return pieces


@pytest.mark.parametrize("size", [8, 5, 3, 1, 0])
def test_geometry_is_nested_torch_chunk(size):
    layout = Layout(["x+y"], MESH_2X4)
    assert layout.num_shards(0) == 8
    expected = _nested_pieces(size, [2, 4])
    assert layout.shard_geometry([size], [5]) == ((expected[5][1],), (expected[5][0],))
    assert [(s[0], o[0]) for s, o in layout.device_blocks([size])] == [
        (n, o) for o, n in expected]
    assert sum(n for _, n in expected) == size


def test_strings_and_protos_round_trip():
    layout = Layout(["x+y", U], MESH_2X2)
    assert layout.sharding_specs == ["x+y", U]
    assert layout.short() == "[x+y,*] @ mesh(x=2,y=2)"
    assert Layout.from_string(layout.to_string()) == layout
    assert Layout.from_proto(layout.as_proto()) == layout
    assert layout != Layout(["y+x", U], MESH_2X2)
    assert hash(layout) != hash(Layout(["y+x", U], MESH_2X2))


@pytest.mark.parametrize("specs,message", [
    (["x+x"], "axis 0 twice"),
    (["x+y", "y"], "axes 0 and 1"),
    (["x+q"], "`q`"),
])
def test_invalid_multi_dim_specs_name_the_problem(specs, message):
    with pytest.raises(tf_dtensor.LayoutError, match=message):
        Layout(specs + [U] * (2 - len(specs)), MESH_2X2)


def test_partial_cannot_use_a_dim_that_shards():
    with pytest.raises(ValueError, match="partial over `y`"):
        Layout(["x+y", U], MESH_2X2, partial={"y": "sum"})


@pytest.mark.parametrize("mesh,specs", MULTI, ids=MULTI_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_relayout_to_and_from_every_layout(mesh, specs, shape):
    value = random_array(shape)
    multi = Layout(specs, mesh)
    start = to_dtensor(value, multi)
    assert_dtensor_equal(value, multi, start)
    targets = [Layout([U, U], mesh), Layout([mesh.dim_names[0], U], mesh),
               Layout([U, mesh.dim_names[-1]], mesh), Layout(specs[::-1], mesh)]
    for target in targets:
        moved = dtensor.relayout(start, target)
        assert_dtensor_equal(value, target, moved)
        assert_dtensor_equal(value, multi, dtensor.relayout(moved, multi))


@pytest.mark.parametrize("policy", ["", "ops"], ids=["shared", "collective-ops"])
@pytest.mark.parametrize("specs", [["x+y", U], ["y+x", U]], ids=["x+y", "y+x"])
@pytest.mark.parametrize("rows", [8, 5])
def test_both_collective_lowerings_gather_in_piece_order(policy, specs, rows):
    value = random_array((rows, 3))
    layout = Layout(specs, MESH_2X2)
    config.set_collective_lowering(policy)
    try:
        d = to_dtensor(value, layout)
        assert_dtensor_equal(value, layout, d)
        whole = dtensor.relayout(d, Layout([U, U], MESH_2X2))
        assert_dtensor_equal(value, Layout([U, U], MESH_2X2), whole)
        moved = dtensor.relayout(d, Layout([U, "x"], MESH_2X2))
        assert_dtensor_equal(value, Layout([U, "x"], MESH_2X2), moved)
    finally:
        config.set_collective_lowering("")


def test_pack_and_unpack_use_the_nested_blocks():
    layout = Layout(["y+x", U], MESH_2X2)
    value = np.arange(10, dtype=np.float32).reshape(5, 2)
    blocks = [value[o[0]:o[0] + s[0]] for s, o in layout.device_blocks([5, 2])]
    # Device (x, y) holds piece 2y + x: rows [0:2], [3:4], [2:3], [4:5].
    assert [b[:, 0].tolist() for b in blocks] == [[0, 2], [6], [4], [8]]
    packed = dtensor.pack([tf.constant(b) for b in blocks], layout)
    assert packed.shape == (5, 2)
    assert_dtensor_equal(value, layout, packed)
    assert [c.numpy().tolist() for c in dtensor.unpack(packed)] == [b.tolist() for b in blocks]


@pytest.mark.parametrize("mesh,specs", MULTI[:4], ids=MULTI_IDS[:4])
def test_ops_see_the_major_dimension_and_match_one_device(mesh, specs):
    a = random_array((5, 4) if specs[0] != U else (4, 5))
    b = random_array((a.shape[1], 3))
    multi = Layout(specs, mesh)
    da = to_dtensor(a, multi)
    major = Layout([s.split("+")[0] if s != U else U for s in specs], mesh)

    def program(x, w):
        y = tf.matmul(tf.nn.relu(x * 2.0 + 1.0), w)
        return y, tf.reduce_mean(x, axis=0)

    expected = program(tf.constant(a), tf.constant(b))
    eager = program(da, to_dtensor(b, Layout([U, U], mesh)))
    traced = tf.function(program)(da, to_dtensor(b, Layout([U, U], mesh)))
    for got in (eager, traced):
        for e, g in zip(expected, got):
            np.testing.assert_allclose(reassemble(g), e.numpy(), rtol=1e-5, atol=1e-5)
    # Elementwise ops keep the major dimension's sharding (the input was relaid out to it).
    assert dtensor.fetch_layout(dtensor.relayout(da, major) + 1.0) == major
    assert dtensor.fetch_layout(da + 1.0) == major


@pytest.mark.parametrize("specs", [["x+y", U], ["y+x", U]], ids=["x+y", "y+x"])
def test_gradients_flow_through_a_multi_dim_relayout(specs):
    value = random_array((5, 3))
    layout = Layout(specs, MESH_2X2)
    replicated = to_dtensor(value, Layout([U, U], MESH_2X2))

    def loss_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            sharded = dtensor.relayout(x, layout)
            loss = tf.reduce_sum(tf.sin(sharded) * sharded)
        return loss, tape.gradient(loss, x), sharded

    expected = np.cos(value) * value + np.sin(value)
    for fn in (loss_and_grad, tf.function(loss_and_grad)):
        loss, grad, sharded = fn(replicated)
        np.testing.assert_allclose(reassemble(grad), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(reassemble(loss), np.sum(np.sin(value) * value), rtol=1e-5)
        # A tf.function returns the multi-dimension layout as it is.
        assert_dtensor_equal(value, layout, sharded)


def test_a_dvariable_keeps_a_multi_dim_layout():
    value = random_array((5, 3))
    layout = Layout(["x+y", U], MESH_2X2)
    v = dtensor.DVariable(to_dtensor(value, layout))
    assert v.layout == layout
    v.assign_add(to_dtensor(value, layout))
    assert_dtensor_equal(2 * value, layout, v.read_value())

    @tf.function
    def step():
        v.assign(v * 3.0)
        return v.read_value()

    assert_dtensor_equal(6 * value, layout, step())
    # An op that would use the variable in place reads it instead, or says why not.
    assert_dtensor_equal(7 * value, Layout(["x", U], MESH_2X2), v + value)


def test_checkpoint_round_trip_of_a_multi_dim_variable(tmp_path):
    value = random_array((5, 3))
    layout = Layout(["y+x", U], MESH_2X2)
    v = dtensor.DVariable(to_dtensor(value, layout))
    checkpoint = dtensor.DTensorCheckpoint(mesh=MESH_2X2, v=v)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    v.assign(to_dtensor(np.zeros_like(value), layout))
    checkpoint.restore(path)
    assert_dtensor_equal(value, layout, v.read_value())
    # Restored into a differently laid-out variable.
    w = dtensor.DVariable(to_dtensor(np.zeros_like(value), Layout([U, "x"], MESH_2X2)))
    dtensor.DTensorCheckpoint(mesh=MESH_2X2, v=w).restore(path)
    assert_dtensor_equal(value, Layout([U, "x"], MESH_2X2), w.read_value())

