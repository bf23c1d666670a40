"""Tests of tf_dtensor/layout.py: construction, errors, value semantics, text forms and
parity with TF's built-in DTensor Layout."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import cpus, layout_of, layouts_for
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

builtin = tf.experimental.dtensor


def test_sharding_specs_and_rank(mesh_2x2):
    layout = Layout(["y", UNSHARDED, "x"], mesh_2x2)
    assert layout.sharding_specs == ["y", "unsharded", "x"]
    assert layout.rank == 3
    assert layout.mesh == mesh_2x2
    assert [layout.num_shards(i) for i in range(3)] == [2, 1, 2]
    assert not layout.is_fully_replicated()
    assert Layout.replicated(mesh_2x2, 2).is_fully_replicated()


def test_local_shape(mesh_2x2):
    assert Layout(["x", "y"], mesh_2x2).local_shape([8, 4]) == [4, 2]
    assert Layout([UNSHARDED, "y"], mesh_2x2).local_shape([8, 4]) == [8, 2]


def test_local_shape_indivisible(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError, match=r"size 5\).*not divisible by 2"):
        Layout(["x", "y"], mesh_2x2).local_shape([5, 4])


def test_replicated_batch_and_inner_sharded(mesh_2x2):
    assert Layout.replicated(mesh_2x2, 3).sharding_specs == [UNSHARDED] * 3
    assert Layout.replicated(mesh_2x2, 0).sharding_specs == []
    assert Layout.batch_sharded(mesh_2x2, "x", 3).sharding_specs == ["x", UNSHARDED, UNSHARDED]
    assert Layout.batch_sharded(mesh_2x2, "y", 3, axis=1).sharding_specs == [
        UNSHARDED, "y", UNSHARDED]
    assert Layout.inner_sharded(mesh_2x2, "y", 3).sharding_specs == [UNSHARDED, UNSHARDED, "y"]


def test_unknown_mesh_dim(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"`z`, which mesh\(x=2,y=2\) does not have\. Use one of `x`, `y`"):
        Layout(["z", UNSHARDED], mesh_2x2)
    assert issubclass(tf_dtensor.LayoutError, ValueError)


def test_mesh_dim_used_twice(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"(?s)same mesh dimension `x`.*Use `unsharded` for one of them"):
        Layout(["x", "x"], mesh_2x2)


def test_match_is_not_a_user_layout_spec(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError, match="`match`"):
        Layout([dtensor.MATCH, "x"], mesh_2x2)


_DEVICES = ",".join(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2))


@pytest.mark.parametrize("text,message", [
    pytest.param("garbage", "Cannot parse layout 'garbage'", id="garbage"),
    pytest.param("", "Cannot parse layout", id="empty"),
    pytest.param("sharding_specs:x, mesh:nonsense", "Cannot parse mesh 'nonsense'", id="bad-mesh"),
    pytest.param(f"sharding_specs:z, mesh:|x=2|0,1|0,1|{_DEVICES}", "`z`", id="unknown-dim"),
])
def test_from_string_garbage(text, message):
    with pytest.raises(tf_dtensor.LayoutError, match=re.escape(message)):
        Layout.from_string(text)


def test_equality_and_hash(mesh_2x2, mesh_1d):
    a = Layout(["x", UNSHARDED], mesh_2x2)
    b = Layout(["x", UNSHARDED], dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4)))
    assert a == b and hash(a) == hash(b)
    assert a != Layout(["y", UNSHARDED], mesh_2x2)
    assert a != Layout(["x", UNSHARDED], mesh_1d)
    assert a != Layout(["x", UNSHARDED, UNSHARDED], mesh_2x2)
    assert a != "[x,*]"
    assert len({a, b, Layout(["y", UNSHARDED], mesh_2x2)}) == 2


def test_layout_is_immutable(mesh_2x2):
    layout = Layout(["x", UNSHARDED], mesh_2x2)
    with pytest.raises(AttributeError):
        layout.sharding_specs = ["y", UNSHARDED]
    with pytest.raises(AttributeError):
        layout.mesh = mesh_2x2
    with pytest.raises(AttributeError):
        layout.anything = 1
    specs = layout.sharding_specs
    specs[0] = "y"
    assert layout.sharding_specs == ["x", UNSHARDED]


def test_repr_and_str_match_the_overview_guide():
    mesh = dtensor.create_mesh([("x", 6)], devices=cpus(6))
    text = ("Layout(sharding_specs=['unsharded'], mesh=<Mesh object with dims=[('x', 6)], "
            "device_type=\"CPU\", num_local_devices=6), size=6>)")
    layout = Layout([UNSHARDED], mesh)
    assert repr(layout) == text
    assert str(layout) == text


@pytest.mark.parametrize("specs,short", [
    ([UNSHARDED, "x"], "[*,x] @ mesh(x=2,y=2)"),
    (["y", "x"], "[y,x] @ mesh(x=2,y=2)"),
    ([], "[] @ mesh(x=2,y=2)"),
    (["x", UNSHARDED, "y"], "[x,*,y] @ mesh(x=2,y=2)"),
])
def test_short_form(specs, short, mesh_2x2):
    assert Layout(specs, mesh_2x2).short() == short
    assert layout_of(short.split(" @ ")[0], mesh_2x2) == Layout(specs, mesh_2x2)


def test_to_string(mesh_1d):
    assert Layout(["x", UNSHARDED], mesh_1d).to_string() == (
        "sharding_specs:x,unsharded, mesh:" + mesh_1d.to_string())


@pytest.mark.parametrize("shape", [(4, 8), (2, 4, 4), (8,), ()])
def test_to_string_from_string_round_trip(shape, mesh_2x2):
    for layout in layouts_for(mesh_2x2, shape):
        assert Layout.from_string(layout.to_string()) == layout


@pytest.mark.parametrize("specs", [["x", UNSHARDED], [UNSHARDED, "y"], ["y", "x"], [],
                                   [UNSHARDED, UNSHARDED, "x"]])
def test_string_parity_with_tf(specs, mesh_2x2):
    tf_mesh = builtin.Mesh.from_string(mesh_2x2.to_string())
    ours = Layout(specs, mesh_2x2)
    theirs = builtin.Layout(specs, tf_mesh)
    assert ours.to_string() == theirs.to_string()
    assert Layout.from_string(theirs.to_string()) == ours
    assert builtin.Layout.from_string(ours.to_string()) == theirs
    assert ours.sharding_specs == theirs.sharding_specs
    assert ours.rank == theirs.rank


def test_constructor_parity_with_tf(mesh_2x2):
    tf_mesh = builtin.Mesh.from_string(mesh_2x2.to_string())
    pairs = [
        (Layout.replicated(mesh_2x2, 2), builtin.Layout.replicated(tf_mesh, 2)),
        (Layout.batch_sharded(mesh_2x2, "x", 3), builtin.Layout.batch_sharded(tf_mesh, "x", 3)),
        (Layout.batch_sharded(mesh_2x2, "y", 3, axis=1),
         builtin.Layout.batch_sharded(tf_mesh, "y", 3, axis=1)),
        (Layout.inner_sharded(mesh_2x2, "y", 2), builtin.Layout.inner_sharded(tf_mesh, "y", 2)),
    ]
    for ours, theirs in pairs:
        assert ours.sharding_specs == theirs.sharding_specs
        assert ours.to_string() == theirs.to_string()


def test_constants_match_tf():
    assert dtensor.UNSHARDED == builtin.UNSHARDED == "unsharded"
    assert dtensor.MATCH == builtin.MATCH == "match"


@pytest.mark.parametrize("dims", [[0], [1], [0, 2], 2], ids=str)
def test_delete_matches_tf(dims, mesh_2x2):
    tf_mesh = builtin.Mesh.from_string(mesh_2x2.to_string())
    specs = ["x", UNSHARDED, "y"]
    ours = Layout(specs, mesh_2x2).delete(dims)
    assert ours.to_string() == builtin.Layout(specs, tf_mesh).delete(dims).to_string()
    assert ours.mesh == mesh_2x2


def test_delete_gives_the_guide_bias_layout(mesh_1d):
    weight_layout = Layout.replicated(mesh_1d, 2)
    assert weight_layout.delete([0]) == Layout.replicated(mesh_1d, 1)
