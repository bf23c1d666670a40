"""Tests of tf_dtensor/layout.py: construction, errors, value semantics, text forms and
parity with TF's built-in DTensor Layout."""

from __future__ import annotations

import pickle
import re

import numpy as np

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


def test_local_shape_uneven(mesh_2x2):
    # Uneven axes are valid: the first block is the largest (torch.chunk geometry) ...
    assert Layout(["x", "y"], mesh_2x2).local_shape([5, 4]) == [3, 2]
    # ... but TF's method promises one local shape for every device, so it still raises.
    with pytest.raises(tf_dtensor.LayoutError, match=r"size 5\).*not divisible by 2"):
        Layout(["x", "y"], mesh_2x2).local_shape_from_global_shape([5, 4])


def test_replicated_batch_and_inner_sharded(mesh_2x2):
    assert Layout.replicated(mesh_2x2, 3).sharding_specs == [UNSHARDED] * 3
    assert Layout.replicated(mesh_2x2, 0).sharding_specs == []
    assert Layout.batch_sharded(mesh_2x2, "x", 3).sharding_specs == ["x", UNSHARDED, UNSHARDED]
    assert Layout.batch_sharded(mesh_2x2, "y", 3, axis=1).sharding_specs == [
        UNSHARDED, "y", UNSHARDED]
    assert Layout.inner_sharded(mesh_2x2, "y", 3).sharding_specs == [UNSHARDED, UNSHARDED, "y"]


def test_unknown_mesh_dim(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"`z`, which mesh\(x=2,y=2\) does not have .*\. Use one of `x`, `y`"):
        Layout(["z", UNSHARDED], mesh_2x2)
    assert issubclass(tf_dtensor.LayoutError, ValueError)


def test_mesh_dim_used_twice(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"(?s)same mesh dimension `x`.*Use `unsharded` for one of them"):
        Layout(["x", "x"], mesh_2x2)


def test_match_makes_a_relayout_target_only(mesh_2x2):
    # As in TensorFlow, MATCH ("keep the input's sharding of this axis") builds a layout that
    # `relayout` accepts (test_api.py); nothing else takes it.
    target = Layout([dtensor.MATCH, "x"], mesh_2x2)
    assert target.has_match and target.sharding_specs == ["match", "x"]
    assert target != Layout([UNSHARDED, "x"], mesh_2x2)
    assert not Layout([UNSHARDED, "x"], mesh_2x2).has_match
    with pytest.raises(tf_dtensor.LayoutError, match="MATCH"):
        dtensor.pack([tf.ones([2, 2])] * 4, target)


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


# --- Layout types, protos and shard geometry (issue 8): values as in TF's DTensor ---------

from tensorflow.dtensor.proto import layout_pb2  # noqa: E402
from tensorflow.dtensor.python import layout as tf_layout  # noqa: E402

from tf_dtensor.dtensor import LayoutType, Mesh  # noqa: E402
from tf_dtensor import LayoutError  # noqa: E402

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"

GEOMETRY_SPECS = [["x"], [UNSHARDED, "x"], ["x", "y"], ["y", UNSHARDED, "x"], [UNSHARDED] * 2, []]


def _mesh_for(specs, mesh_1d, mesh_2x2):
    return mesh_2x2 if "y" in specs or len(specs) != 1 else mesh_1d


def _tf_twin(layout):
    return builtin.Layout.from_string(layout.to_string())


def test_layout_type_matches_tf():
    assert {k: int(v) for k, v in LayoutType.__members__.items()} == {
        k: int(v) for k, v in tf_layout.LayoutType.__members__.items()}
    assert [int(LayoutType.STATIC), int(LayoutType.SINGLE_DEVICE), int(LayoutType.PARTED)] == [
        1, 2, 3]
    assert repr(LayoutType.PARTED) == "<LayoutType.PARTED: 3>"
    assert str(LayoutType.STATIC) == "LayoutType.STATIC"
    assert dtensor.LayoutType is LayoutType


@pytest.mark.parametrize("specs", GEOMETRY_SPECS, ids=str)
def test_geometry_matches_tf(specs, mesh_1d, mesh_2x2):
    layout = Layout(specs, _mesh_for(specs, mesh_1d, mesh_2x2))
    theirs = _tf_twin(layout)
    assert layout.type == LayoutType.STATIC and int(theirs.type) == 1
    assert layout.shape == theirs.shape
    assert layout.offset_to_shard() == theirs.offset_to_shard()
    assert [layout.offset_tuple_to_global_index(t) for t in layout.offset_to_shard()] == [
        theirs.offset_tuple_to_global_index(t) for t in theirs.offset_to_shard()]
    assert layout.is_batch_parallel() == theirs.is_batch_parallel()
    assert layout.is_single_device() is False
    shape = [4] * layout.rank
    assert layout.local_shape_from_global_shape(shape) == theirs.local_shape_from_global_shape(shape)
    assert layout.global_shape_from_local_shape(shape) == theirs.global_shape_from_local_shape(shape)
    assert layout.local_shape_from_global_shape([-1] * layout.rank) == (-1,) * layout.rank


def test_offset_to_shard_values(mesh_2x2):
    layout = Layout(["y", UNSHARDED, "x"], mesh_2x2)
    assert layout.offset_to_shard() == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
    assert [layout.offset_tuple_to_global_index(t) for t in layout.offset_to_shard()] == [
        0, 2, 1, 3]
    assert Layout(["x", "y"], mesh_2x2).local_shape_from_global_shape((8, 6)) == (4, 3)
    assert Layout(["x", "y"], mesh_2x2).global_shape_from_local_shape([4, 3]) == (8, 6)


@pytest.mark.parametrize("specs,expected", [
    (["x"], True), (["y"], True), (["x", "y"], False), ([UNSHARDED, "x"], False),
    ([UNSHARDED], False), ([], False), (["x", UNSHARDED, UNSHARDED], True)], ids=str)
def test_is_batch_parallel(specs, expected, mesh_2x2):
    assert Layout(specs, mesh_2x2).is_batch_parallel() is expected


def test_out_of_range_axes_and_offsets_raise(mesh_2x2):
    # TF's DTensor crashes (segfault) or returns meaningless numbers here; we name the input.
    layout = Layout(["x", UNSHARDED], mesh_2x2)
    for axis in (2, -1):
        with pytest.raises(LayoutError, match=f"Axis {axis} is out of range"):
            layout.num_shards(axis)
    with pytest.raises(LayoutError, match="has 1 entries but layout"):
        layout.offset_tuple_to_global_index((1,))
    with pytest.raises(LayoutError, match="axis 0 has 2 shard"):
        layout.offset_tuple_to_global_index((2, 0))
    with pytest.raises(LayoutError, match="axis 1 has 1 shard"):
        layout.offset_tuple_to_global_index((0, 1))
    with pytest.raises(LayoutError, match="rank 2 but"):
        layout.local_shape_from_global_shape([4])
    with pytest.raises(LayoutError, match="rank 2 but"):
        layout.global_shape_from_local_shape([4, 4, 4])
    with pytest.raises(LayoutError, match="not divisible"):
        layout.local_shape_from_global_shape([3, 4])


def test_parted_layout(mesh_2x2):
    static = Layout(["x", UNSHARDED], mesh_2x2)
    parted = static.to_parted()
    assert parted.type == LayoutType.PARTED
    assert parted.sharding_specs == ["x", UNSHARDED] and parted.mesh == mesh_2x2
    assert parted.to_string() == "parted:x,unsharded, mesh:" + mesh_2x2.to_string()
    assert parted.to_string() == _tf_twin(static).to_parted().to_string()
    assert repr(parted) == f"Layout.from_string({parted.to_string()})"
    assert parted.short() == "parted[x,*] @ mesh(x=2,y=2)"
    assert parted != static and hash(parted) != hash(static)
    assert parted.to_parted() == parted
    assert Layout.from_string(parted.to_string()) == parted
    assert Layout.from_proto(parted.as_proto()) == parted
    assert pickle.loads(pickle.dumps(parted)) == parted
    assert parted.offset_to_shard() == static.offset_to_shard()
    assert parted.local_shape_from_global_shape([4, 6]) == (2, 6)
    assert parted.is_batch_parallel() and not parted.is_fully_replicated()
    # As in TF, delete builds a static layout.
    assert parted.delete(1) == Layout(["x"], mesh_2x2)
    assert Layout([], mesh_2x2).to_parted().to_string() == "parted: mesh:" + mesh_2x2.to_string()


def test_single_device_layout():
    layout = Layout.from_device(CPU0)
    mesh = Mesh.from_device(CPU0)
    assert layout == Layout.from_single_device_mesh(mesh) == Layout.from_device("CPU:0")
    assert hash(layout) == hash(Layout.from_single_device_mesh(mesh))
    assert layout != Layout.from_device("CPU:1")
    assert layout.type == LayoutType.SINGLE_DEVICE and layout.is_single_device()
    assert layout.mesh == mesh and layout.rank == 0 and layout.sharding_specs == []
    assert layout.shape == []
    assert not layout.is_fully_replicated() and not layout.is_batch_parallel()
    assert layout.to_string() == f"maximal:true, mesh:{CPU0}"
    assert repr(layout) == f"Layout.from_string(maximal:true, mesh:{CPU0})"
    assert layout.short() == "[] @ mesh(CPU:0)"
    assert Layout.from_string(layout.to_string()) == layout
    assert pickle.loads(pickle.dumps(layout)) == layout
    # One device holds the whole tensor, whatever its rank (TF answers () here).
    assert layout.local_shape_from_global_shape([3, 5]) == (3, 5)
    assert layout.global_shape_from_local_shape([3, 5]) == (3, 5)
    # TF's offset_to_shard raises IndexError (its single-device mesh has size 0).
    assert layout.offset_to_shard() == [()]
    assert layout.offset_tuple_to_global_index(()) == 0


def test_single_device_layout_errors(mesh_2x2):
    mesh = Mesh.from_device(CPU0)
    with pytest.raises(LayoutError, match="needs a single-device mesh"):
        Layout.from_single_device_mesh(mesh_2x2)
    for specs in ([], [UNSHARDED]):
        with pytest.raises(LayoutError, match="from_single_device_mesh"):
            Layout(specs, mesh)
    with pytest.raises(LayoutError, match="from_single_device_mesh"):
        Layout.replicated(mesh, 2)
    with pytest.raises(LayoutError, match="no sharding specs to part"):
        Layout.from_device(CPU0).to_parted()
    with pytest.raises(LayoutError, match="single-device layout has no sharding specs"):
        Layout.from_string(f"maximal:true,x mesh:{CPU0}")


@pytest.mark.parametrize("kind", ["static", "parted", "rank0", "single_device"])
def test_proto_passes_between_the_libraries(kind, mesh_2x2):
    layout = {"static": Layout(["y", UNSHARDED, "x"], mesh_2x2),
              "parted": Layout(["x", "y"], mesh_2x2).to_parted(),
              "rank0": Layout([], mesh_2x2),
              "single_device": Layout.from_device(CPU0)}[kind]
    theirs = _tf_twin(layout)
    proto = layout.as_proto()
    assert isinstance(proto, layout_pb2.LayoutProto)
    assert proto == theirs.as_proto()
    assert proto.SerializeToString(deterministic=True) == theirs.as_proto().SerializeToString(
        deterministic=True)
    assert Layout.from_proto(theirs.as_proto()) == layout
    assert builtin.Layout.from_proto(proto).to_string() == layout.to_string()
    assert int(builtin.Layout.from_proto(proto).type) == int(layout.type)


def test_from_proto_errors(mesh_2x2):
    proto = Layout(["x"], mesh_2x2).as_proto()
    proto.type = layout_pb2.LayoutProto.UNKNOWN
    with pytest.raises(LayoutError, match="UNKNOWN or unset"):
        Layout.from_proto(proto)
    with pytest.raises(LayoutError, match="no `mesh_config`"):
        Layout.from_proto(layout_pb2.LayoutProto())
    proto = Layout(["x"], mesh_2x2).as_proto()
    proto.sharding_specs[0].sharding_spec = "z"
    with pytest.raises(LayoutError, match="`z`"):
        Layout.from_proto(proto)
    with pytest.raises(TypeError, match="LayoutProto"):
        Layout.from_proto("sharding_specs:x")


def test_constructor_takes_only_a_mesh():
    with pytest.raises(LayoutError, match="`mesh` must be a Mesh"):
        Layout(["x"], "mesh")


def test_pickle_round_trip(mesh_2x2):
    layout = Layout(["x", UNSHARDED], mesh_2x2)
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_public_names_cover_tf():
    public = lambda cls: {n for n in dir(cls) if not n.startswith("_")}  # noqa: E731
    assert public(builtin.Layout) - public(Layout) == set()


# --- malformed input is refused at construction, naming the bad value (issue 9) ---

def test_replicated_layout_needs_a_non_negative_rank(mesh_1d):
    with pytest.raises(tf_dtensor.LayoutError, match=r"Layout.replicated: `rank` must be a non-negative"):
        Layout.replicated(mesh_1d, -1)


@pytest.mark.parametrize("rank", [1.5, 2.0, None, "2"], ids=["fraction", "float", "none", "string"])
def test_replicated_layout_rank_of_another_type_is_a_type_error(rank, mesh_1d):
    """A rank that is not an int is a TypeError, the class TensorFlow's DTensor raises."""
    with pytest.raises(TypeError, match=r"Layout.replicated: `rank` must be a non-negative integer; got"):
        Layout.replicated(mesh_1d, rank)


def test_inner_sharded_of_rank_zero_names_inner_sharded(mesh_1d):
    """TF's DTensor crashes the process here; the message used to name batch_sharded's axis -1."""
    with pytest.raises(tf_dtensor.LayoutError, match=r"Layout.inner_sharded: a rank-0 layout has no inner axis"):
        Layout.inner_sharded(mesh_1d, "x", 0)


@pytest.mark.parametrize("axis", [2, -3], ids=["past_rank", "before_rank"])
def test_batch_sharded_axis_must_be_inside_the_rank(axis, mesh_1d):
    with pytest.raises(tf_dtensor.LayoutError, match=rf"`axis={axis}` is out of range for a rank-2 layout"):
        Layout.batch_sharded(mesh_1d, "x", 2, axis=axis)


def test_batch_sharded_negative_axis_counts_from_the_end(mesh_1d):
    assert Layout.batch_sharded(mesh_1d, "x", 2, axis=-1).sharding_specs == [UNSHARDED, "x"]


def test_sharding_specs_given_as_a_string_is_a_type_error(mesh_1d):
    with pytest.raises(TypeError, match=r"Did you mean \['x'\]"):
        Layout("x", mesh_1d)


@pytest.mark.parametrize("call,message", [
    (lambda m: Layout([0], m), r"`sharding_specs`.*entry 0 is 0 \(int\)"),
    (lambda m: Layout([None, "x"], m), r"`sharding_specs`.*entry 0 is None"),
    (lambda m: Layout.from_string(3), r"`layout_str` must be a str; got 3 \(int\)"),
    (lambda m: Layout(["x"], m).num_shards("a"), r"`idx` must be an int; got 'a'"),
    (lambda m: Layout(["x"], m).offset_tuple_to_global_index(["a"]), r"`offset_tuple`.*'a'"),
    (lambda m: Layout(["x"], m).shard_geometry(["a"], [0]), r"`global_shape`.*'a'"),
    (lambda m: dtensor.Mesh([1], np.arange(2), [0, 1], ["CPU:0", "CPU:1"]),
     r"`dim_names` must be a list of str; entry 0 is 1 \(int\)"),
    (lambda m: dtensor.Mesh(["x"], np.arange(2), [0, 1], [0, 1]), r"Devices are names.*0 \(int\)"),
    (lambda m: dtensor.Mesh.from_string(5), r"`mesh_str` must be a str"),
    (lambda m: m.dim_size(3), r"`dim_name` must be a str; got 3"),
    (lambda m: dtensor.pack([tf.zeros([1])] * 4, "x"), r"`pack` takes a `Layout`.*'x' \(str\)"),
    (lambda m: dtensor.relayout(tf.zeros([2]), "x"), r"`relayout` takes a `Layout`"),
], ids=["spec-int", "spec-none", "from-string", "num-shards", "offset-tuple", "geometry",
        "dim-names", "devices", "mesh-from-string", "dim-size", "pack", "relayout"])
def test_wrong_argument_types_get_plain_messages(call, message, mesh_2x2):
    # Never pybind11's "incompatible function arguments" signature dump.
    with pytest.raises(TypeError, match=message) as error:
        call(mesh_2x2)
    assert "incompatible function arguments" not in str(error.value)
