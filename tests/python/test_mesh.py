"""Tests of tf_dtensor/mesh.py (and `create_mesh`): construction, errors, value semantics,
text forms and parity with TF's built-in DTensor Mesh."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
import dtensor_testing
from dtensor_testing import cpus
from tf_dtensor import config, dtensor
from tf_dtensor.dtensor import Mesh

tf_dtensor_builtin = tf.experimental.dtensor


def _full(device: str) -> str:
    return f"/job:localhost/replica:0/task:0/device:{device}"


def test_create_mesh_2d(mesh_2x2):
    assert mesh_2x2.dim_names == ["x", "y"]
    assert mesh_2x2.shape() == [2, 2]
    assert mesh_2x2.size == 4
    assert mesh_2x2.dim_size("x") == 2 and mesh_2x2.dim_size("y") == 2
    assert mesh_2x2.contains_dim("y") and not mesh_2x2.contains_dim("z")
    assert mesh_2x2.device_type() == "CPU"
    assert mesh_2x2.num_local_devices() == 4
    assert mesh_2x2.local_devices() == [_full(d) for d in cpus(4)]
    assert mesh_2x2.local_device_ids() == [0, 1, 2, 3]
    np.testing.assert_array_equal(mesh_2x2.global_device_ids(), [[0, 1], [2, 3]])
    assert not mesh_2x2.is_remote()
    assert not mesh_2x2.use_xla_spmd()
    assert mesh_2x2.name == ""


def test_coords_first_dim_outermost(mesh_2x2):
    assert [mesh_2x2.coords(i).numpy().tolist() for i in range(4)] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert mesh_2x2.coords(0).dtype == tf.int32


def test_create_mesh_accepts_a_dict():
    mesh = dtensor.create_mesh({"a": 2, "b": 3}, devices=cpus(6))
    assert mesh.dim_names == ["a", "b"] and mesh.shape() == [2, 3]


def test_create_mesh_defaults_to_all_cpus_on_x():
    mesh = dtensor.create_mesh()
    assert mesh.dim_names == ["x"]
    assert mesh.shape() == [8]
    assert mesh.device_type() == "CPU"
    assert mesh.local_devices() == [_full(d) for d in cpus(8)]


def test_create_mesh_with_device_type():
    mesh = dtensor.create_mesh([("batch", 8)], device_type="CPU", mesh_name="m")
    assert mesh.name == "m"
    assert mesh.local_devices() == [_full(d) for d in cpus(8)]


def test_create_mesh_records_use_xla_spmd():
    assert dtensor.create_mesh([("x", 2)], devices=cpus(2), use_xla_spmd=True).use_xla_spmd()


def test_mesh_constructor_matches_create_mesh(mesh_2x2):
    mesh = Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3], cpus(4))
    assert mesh == mesh_2x2


def test_create_distributed_mesh_with_one_client(mesh_2x2):
    mesh = dtensor.create_distributed_mesh([("x", 2), ("y", 2)], local_devices=cpus(4))
    assert mesh == mesh_2x2


def test_create_distributed_mesh_of_several_clients_defaults_to_cpus(monkeypatch):
    # It took the preferred device type (GPU where there is one) where TensorFlow's
    # DTensor, and create_mesh, default to CPU. Two clients, as this process's variables
    # say; building the mesh joins nothing.
    monkeypatch.setenv("DTENSOR_JOBS", "localhost:10001,localhost:10002")
    monkeypatch.setenv("DTENSOR_CLIENT_ID", "1")
    monkeypatch.setattr(config, "preferred_device_type", lambda: "GPU")
    mesh = dtensor.create_distributed_mesh([("x", 16)])
    assert mesh.device_type() == "CPU"
    assert mesh.local_devices() == [f"/job:worker/replica:0/task:1/device:CPU:{i}"
                                    for i in range(8)]
    assert mesh.local_device_ids() == list(range(8, 16))


def test_duplicate_dim_names_are_rejected():
    # TF's built-in DTensor accepts this mesh; a layout on it would be ambiguous.
    with pytest.raises(tf_dtensor.MeshError, match=r"`x` appears twice"):
        dtensor.create_mesh([("x", 2), ("x", 2)], devices=cpus(4))
    assert issubclass(tf_dtensor.MeshError, ValueError)


def test_duplicate_dim_names_rejected_by_constructor():
    with pytest.raises(tf_dtensor.MeshError, match=r"`y` appears twice"):
        Mesh(["y", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3], cpus(4))


@pytest.mark.parametrize("name", ["unsharded", "match"])
def test_reserved_dim_names_are_rejected(name):
    with pytest.raises(tf_dtensor.MeshError, match=rf"`{name}` is reserved"):
        dtensor.create_mesh([(name, 2)], devices=cpus(2))


def test_empty_dim_name_is_rejected():
    with pytest.raises(tf_dtensor.MeshError, match="non-empty"):
        dtensor.create_mesh([("", 2)], devices=cpus(2))


def test_device_count_must_match_mesh_shape():
    with pytest.raises(tf_dtensor.MeshError, match=r"hold 3 devices but 2 devices were given"):
        dtensor.create_mesh([("x", 3)], devices=cpus(2))


def test_device_ids_must_match_local_devices():
    with pytest.raises(tf_dtensor.MeshError, match=r"4 local device ids but 2 local devices"):
        Mesh(["x"], np.arange(4), [0, 1, 2, 3], cpus(2))


def test_device_id_shape_must_match_dim_names():
    with pytest.raises(tf_dtensor.MeshError, match=r"shape \[4\] but 2 dimension names"):
        Mesh(["x", "y"], np.arange(4), [0, 1, 2, 3], cpus(4))


def test_repeated_device_is_rejected():
    with pytest.raises(tf_dtensor.MeshError, match=r"CPU:0` appears twice"):
        dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:0"])


def test_repeated_device_id_is_rejected():
    with pytest.raises(tf_dtensor.MeshError, match="duplicates"):
        Mesh(["x"], np.array([0, 0]), [0, 1], cpus(2))


def test_mixed_device_types_are_rejected():
    with pytest.raises(tf_dtensor.MeshError, match="CPU and GPU"):
        dtensor.create_mesh([("x", 2)], devices=["CPU:0", "GPU:0"])


@pytest.mark.parametrize("devices", [[0, 1], ["0", "1"], ["CPU", "CPU:1"], ["CPU:a", "CPU:1"]],
                         ids=["ints", "digits", "no-index", "bad-index"])
def test_a_device_without_type_and_index_is_named_in_the_error(devices):
    # Regression: devices=[0, 1] read as devices of types "0" and "1" and was refused as a
    # mesh that mixes device types.
    with pytest.raises(tf_dtensor.MeshError,
                       match=rf"Device `{devices[0]}` of the mesh is not a device name.*CPU:0"):
        dtensor.create_mesh([("x", 2)], devices=devices)


def test_zero_sized_dim_is_rejected():
    with pytest.raises(tf_dtensor.MeshError, match="size 0"):
        dtensor.create_mesh([("x", 0)], devices=[])


def test_dim_size_of_unknown_dim():
    mesh = dtensor.create_mesh([("x", 2)], devices=cpus(2))
    with pytest.raises(ValueError, match="`z`"):
        mesh.dim_size("z")


def test_equality_and_hash(mesh_2x2):
    same = dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(4))
    assert same == mesh_2x2 and hash(same) == hash(mesh_2x2)
    assert mesh_2x2 != dtensor.create_mesh([("x", 2), ("z", 2)], devices=cpus(4))
    assert mesh_2x2 != dtensor.create_mesh([("x", 4)], devices=cpus(4))
    assert mesh_2x2 != dtensor.create_mesh([("x", 2), ("y", 2)], devices=cpus(8)[4:])
    assert mesh_2x2 != "mesh(x=2,y=2)"
    assert len({mesh_2x2, same}) == 1


def test_mesh_is_immutable(mesh_2x2):
    with pytest.raises(AttributeError):
        mesh_2x2.size = 8
    with pytest.raises(AttributeError):
        mesh_2x2.dim_names = ["a", "b"]
    with pytest.raises(AttributeError):
        mesh_2x2.anything = 1
    names = mesh_2x2.dim_names
    names.append("z")
    assert mesh_2x2.dim_names == ["x", "y"]


def test_repr_and_str_match_the_overview_guide():
    mesh = dtensor.create_mesh([("x", 6)], devices=cpus(6))
    text = ("<Mesh object with dims=[('x', 6)], device_type=\"CPU\", num_local_devices=6), "
            "size=6>")
    assert repr(mesh) == text
    assert str(mesh) == text
    mesh_2d = dtensor.create_mesh([("x", 3), ("y", 2)], devices=cpus(6))
    assert str(mesh_2d) == ("<Mesh object with dims=[('x', 3), ('y', 2)], device_type=\"CPU\", "
                            "num_local_devices=6), size=6>")


def test_short_form(mesh_2x2, mesh_1d):
    assert mesh_2x2.short() == "mesh(x=2,y=2)"
    assert mesh_1d.short() == "mesh(x=2)"


def test_to_string_from_string_round_trip(mesh_2x2):
    text = mesh_2x2.to_string()
    assert text == ("|x=2,y=2|0,1,2,3|0,1,2,3|" + ",".join(_full(d) for d in cpus(4)))
    assert Mesh.from_string(text) == mesh_2x2
    named = dtensor.create_mesh([("x", 2)], devices=cpus(2), mesh_name="named")
    assert named.to_string().startswith("named|x=2|")
    assert Mesh.from_string(named.to_string()) == named


def test_from_string_garbage():
    with pytest.raises(tf_dtensor.MeshError, match="Cannot parse mesh 'garbage'"):
        Mesh.from_string("garbage")


@pytest.mark.parametrize("dims,name", [([("x", 2), ("y", 2)], ""), ([("x", 8)], "m8"),
                                       ([("b", 2), ("x", 1), ("y", 2)], "")])
def test_to_string_parity_with_tf(dims, name):
    size = int(np.prod([s for _, s in dims]))
    ours = dtensor.create_mesh(dims, devices=cpus(size), mesh_name=name)
    theirs = tf_dtensor_builtin.create_mesh(dims, devices=cpus(size), mesh_name=name)
    assert ours.to_string() == theirs.to_string()
    assert Mesh.from_string(theirs.to_string()) == ours
    assert tf_dtensor_builtin.Mesh.from_string(ours.to_string()) == theirs
    assert ours.dim_names == theirs.dim_names
    assert ours.shape() == theirs.shape()
    assert ours.local_devices() == theirs.local_devices()
    np.testing.assert_array_equal(ours.global_device_ids(), theirs.global_device_ids())


def test_local_device_locations_match_tf(mesh_2x2):
    tf_mesh = tf_dtensor_builtin.Mesh.from_string(mesh_2x2.to_string())
    assert mesh_2x2.local_device_locations() == tf_mesh.local_device_locations() == [
        {"x": 0, "y": 0}, {"x": 0, "y": 1}, {"x": 1, "y": 0}, {"x": 1, "y": 1}]
    assert mesh_2x2.unravel_index() == tf_mesh.unravel_index()


def test_local_device_locations_follow_the_device_ids():
    # Ids laid out column-major: device id 1 sits at x=1, y=0.
    mesh = Mesh(["x", "y"], np.array([[0, 2], [1, 3]]), [0, 1, 2, 3], cpus(4))
    assert mesh.local_device_locations() == [
        {"x": 0, "y": 0}, {"x": 1, "y": 0}, {"x": 0, "y": 1}, {"x": 1, "y": 1}]


# --- Single-device meshes, protos and the rest of TF's Mesh API (issue 8) -----------------

import pickle  # noqa: E402

from tensorflow.dtensor.proto import layout_pb2  # noqa: E402

from tf_dtensor import MeshError  # noqa: E402

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


def test_single_device_mesh_values_match_tf():
    mesh = Mesh.from_device(CPU0)
    theirs = tf_dtensor_builtin.Mesh.from_device(CPU0)
    assert mesh.is_single_device() and theirs.is_single_device()
    assert mesh.single_device == theirs.single_device == CPU0
    assert mesh.to_string() == theirs.to_string() == CPU0
    assert repr(mesh) == repr(theirs) == f"Mesh.from_string({CPU0})"
    assert mesh.as_proto() == theirs.as_proto()
    # TF reports a single-device mesh with size 0 and no device ids or local devices.
    assert mesh.size == theirs.size == 0
    assert mesh.shape() == theirs.shape() == []
    assert mesh.dim_names == theirs.dim_names == []
    assert mesh.local_devices() == theirs.local_devices() == []
    assert mesh.local_device_ids() == theirs.local_device_ids() == []
    assert mesh.num_local_devices() == theirs.num_local_devices() == 0
    assert mesh.global_devices() == theirs.global_devices() == []
    assert mesh.device_type() == theirs.device_type() == "CPU"
    assert mesh.is_remote() is theirs.is_remote() is False
    assert mesh.unravel_index() == theirs.unravel_index() == {0: {}}
    assert mesh.local_device_locations() == theirs.local_device_locations() == []
    assert "x" not in mesh and not mesh.contains_dim("x")


def test_single_device_mesh_where_tf_is_wrong():
    mesh = Mesh.from_device(CPU0)
    # TF: strides [1] for a mesh with no dimensions; one stride per dimension is [].
    assert mesh.strides == []
    # TF: ValueError from numpy's reshape; ours says where the device is.
    with pytest.raises(MeshError, match="no global device ids"):
        mesh.global_device_ids()
    # TF: segmentation fault.
    with pytest.raises(MeshError, match="no global device ids"):
        mesh.min_global_device_id()
    # TF: its host mesh is the unusable "empty_mesh"; a CPU device is its own host.
    assert mesh.host_mesh() == mesh
    assert Mesh.from_device("GPU:1").host_mesh() == Mesh.from_device("CPU:1")
    # TF: offset 0 is out of range of its size-0 mesh; the one device sits at [].
    assert mesh.device_location(0) == []


def test_single_device_mesh_value_semantics():
    mesh = Mesh.from_device(CPU0)
    assert mesh == Mesh.from_device("CPU:0") == Mesh.from_device("/device:CPU:0")
    assert hash(mesh) == hash(Mesh.from_device("CPU:0"))
    assert mesh != Mesh.from_device("CPU:1")
    assert mesh != dtensor.create_mesh([("x", 1)], devices=cpus(1))
    assert Mesh.from_string(CPU0) == mesh
    assert Mesh.from_proto(mesh.as_proto()) == mesh
    assert pickle.loads(pickle.dumps(mesh)) == mesh
    assert mesh.short() == "mesh(CPU:0)"


@pytest.mark.parametrize("device,message", [
    ("", "empty one"), ("garbage", "Cannot make a single-device mesh from `garbage`"),
    ("/job:localhost/replica:x/task:0/device:CPU:0", "Cannot make a single-device mesh")])
def test_from_device_errors(device, message):
    # TF accepts "garbage" as a device name; a mesh on no real device is refused here.
    with pytest.raises(MeshError, match=message):
        Mesh.from_device(device)


def test_from_string_names_both_forms_on_garbage():
    with pytest.raises(MeshError, match="or a device name"):
        Mesh.from_string("garbage")


@pytest.mark.parametrize("shape", [(6,), (2, 3), (2, 1, 2)], ids=str)
def test_grid_values_match_tf(shape):
    n = int(np.prod(shape))
    names = ["x", "y", "z"][:len(shape)]
    mesh = dtensor.create_mesh(list(zip(names, shape)), devices=cpus(n))
    theirs = tf_dtensor_builtin.create_mesh(list(zip(names, shape)), devices=cpus(n))
    assert mesh.strides == theirs.strides
    assert [mesh.device_location(i) for i in range(n)] == [
        theirs.device_location(i) for i in range(n)]
    assert mesh.min_global_device_id() == theirs.min_global_device_id() == 0
    assert mesh["x"] == theirs["x"] == ("x", shape[0])
    assert mesh["x"].name == "x" and mesh["x"].size == shape[0]
    assert ("y" in mesh) == ("y" in theirs)
    assert not mesh.is_single_device() and mesh.single_device == theirs.single_device == ""
    assert mesh.host_mesh() == mesh
    assert mesh.host_mesh().to_string() == theirs.host_mesh().to_string()
    assert mesh.global_device_ids().dtype == theirs.global_device_ids().dtype


def test_strides_and_device_location_values():
    mesh = dtensor.create_mesh([("x", 2), ("y", 3)], devices=cpus(6))
    assert mesh.strides == [3, 1]
    assert mesh.device_location(4) == [1, 1]
    for offset in (-1, 6):
        with pytest.raises(MeshError, match=f"offset {offset} is out of range"):
            mesh.device_location(offset)


def test_min_global_device_id_of_a_shifted_mesh():
    mesh = Mesh(["x"], np.arange(2) + 4, [4, 5], cpus(2))
    assert mesh.min_global_device_id() == 4


def test_getitem_and_dim_size_of_unknown_dim(mesh_2x2):
    for lookup in (lambda: mesh_2x2["z"], lambda: mesh_2x2.dim_size("z")):
        with pytest.raises(MeshError, match="`z` does not exist in mesh\\(x=2,y=2\\)"):
            lookup()


def test_host_mesh_of_an_accelerator_mesh():
    gpus = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(2)]
    mesh = Mesh(["x"], np.arange(2), [0, 1], gpus, global_devices=gpus)
    host = mesh.host_mesh()
    assert host.device_type() == "CPU"
    assert host.local_devices() == [_full(d) for d in cpus(2)]
    assert host.global_devices() == [_full(d) for d in cpus(2)]
    assert host.global_device_ids().tolist() == [0, 1]


@pytest.mark.parametrize("kind", ["1d", "2d", "named", "remote", "single_device"])
def test_proto_passes_between_the_libraries(kind):
    cpu = [_full(d) for d in cpus(4)]
    make = {
        "1d": lambda lib: lib.Mesh(["x"], np.arange(2), [0, 1], cpu[:2]),
        "2d": lambda lib: lib.Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3], cpu),
        "named": lambda lib: lib.Mesh(["x"], np.arange(2), [0, 1], cpu[:2], mesh_name="m"),
        "remote": lambda lib: lib.Mesh(
            ["x"], np.arange(2), [], [],
            global_devices=["/job:w/replica:0/task:0/device:CPU:0",
                            "/job:w/replica:0/task:0/device:CPU:1"]),
        "single_device": lambda lib: lib.Mesh.from_device(CPU0),
    }[kind]
    mesh, theirs = make(dtensor), make(tf_dtensor_builtin)
    proto = mesh.as_proto()
    assert isinstance(proto, layout_pb2.MeshProto)
    assert proto == theirs.as_proto()
    assert mesh.to_string() == theirs.to_string()
    assert Mesh.from_proto(theirs.as_proto()) == mesh
    assert tf_dtensor_builtin.Mesh.from_proto(proto) == theirs


def test_from_proto_errors():
    with pytest.raises(MeshError, match="MeshProto is empty"):
        Mesh.from_proto(layout_pb2.MeshProto())
    proto = dtensor.create_mesh([("x", 2)], devices=cpus(2)).as_proto()
    proto.global_device_ids.append(7)
    with pytest.raises(MeshError, match="3 global device ids"):
        Mesh.from_proto(proto)
    with pytest.raises(TypeError, match="MeshProto"):
        Mesh.from_proto(b"\x00")


def test_pickle_round_trip(mesh_2x2):
    assert pickle.loads(pickle.dumps(mesh_2x2)) == mesh_2x2


def test_public_names_cover_tf():
    public = lambda cls: {n for n in dir(cls) if not n.startswith("_")}  # noqa: E731
    assert public(tf_dtensor_builtin.Mesh) - public(Mesh) == set()
    assert {"__getitem__", "__contains__", "__reduce__"} <= set(dir(Mesh))


# --- malformed input is refused at construction, naming the bad value (issue 9) ---

def test_mesh_over_a_device_the_host_lacks_is_refused_at_first_use():
    # Built freely (programs build meshes before splitting the host into logical devices);
    # refused, naming the device and the fix, when first used.
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:99"])
    message = r"`\S*CPU:99` of mesh\(x=2\) does not exist: this host has 8 logical CPU"
    with pytest.raises(MeshError, match=message):
        dtensor.copy_to_mesh(tf.ones([2]), dtensor.Layout.replicated(mesh, 1))
    with pytest.raises(MeshError, match=message):
        dtensor.call_with_layout(tf.ones, dtensor.Layout.replicated(mesh, 1), shape=[2])
    with pytest.raises(MeshError, match=message):
        with dtensor.default_mesh(mesh):
            pass


def test_mesh_built_before_the_host_is_split_works_after(tmp_path):
    # TensorFlow's tests and notebooks build meshes first, then configure logical devices.
    script = """
import tensorflow as tf
from tf_dtensor import dtensor
mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4)])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
t = dtensor.call_with_layout(tf.ones, dtensor.Layout(["x"], mesh), shape=[8])
print("components", [c.numpy().tolist() for c in dtensor.unpack(t)])
"""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(tf_dtensor.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # From another folder: `-c` puts the working directory first on sys.path, and the
    # checkout's tf_dtensor/ has no built module when the package is installed.
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env=env, check=False, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "components [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]" in result.stdout


@pytest.mark.parametrize("size", [2.5, "2", True], ids=["fraction", "string", "bool"])
def test_mesh_dimension_size_must_be_a_whole_number(size):
    """A TypeError, the class TensorFlow's DTensor raises for 2.5 and "2"."""
    with pytest.raises(TypeError, match=r"Mesh dimension `x` has size"):
        dtensor.create_mesh([("x", size)], devices=["CPU:0", "CPU:1"])


@pytest.mark.parametrize("name", [1, None], ids=["int", "none"])
def test_mesh_dimension_name_of_another_type_is_a_type_error(name):
    """TensorFlow's DTensor raises TypeError; tf_dtensor raised a MeshError (ValueError)."""
    with pytest.raises(TypeError, match=r"Mesh dimension 0 is named .*; mesh dimensions are named by strings"):
        dtensor.create_mesh([(name, 2)], devices=["CPU:0", "CPU:1"])


@pytest.mark.parametrize("mesh_dims, entry", [
    ("x", "got the string 'x'. Did you mean \\[\\('x', -1\\)\\]"),
    (["x", "y"], "entry 0 is 'x'"),
    ([("x", 2, 1)], "entry 0 is \\('x', 2, 1\\)"),
    (3, "got 3 \\(int\\)"),
], ids=["string", "list_of_names", "triple", "int"])
def test_create_mesh_dims_that_are_not_pairs_name_mesh_dims(mesh_dims, entry):
    """These failed inside tuple unpacking ("string index out of range", "not enough values to
    unpack") or, for a triple, were accepted; TensorFlow's DTensor fails with an IndexError."""
    with pytest.raises(TypeError, match=r"create_mesh: `mesh_dims` must be a list of \(name, size\) pairs.*" + entry):
        dtensor.create_mesh(mesh_dims, devices=["CPU:0", "CPU:1"])


def test_create_mesh_devices_as_one_string_is_refused():
    """Read letter by letter, "CPU:0" was five devices ("hold 1 devices but 5 were given")."""
    with pytest.raises(MeshError, match=r"`devices` must be a list of devices; got the single device 'CPU:0'. Did you mean \['CPU:0'\]"):
        dtensor.create_mesh([("x", 1)], devices="CPU:0")
    with pytest.raises(MeshError, match=r"`local_devices` must be a list"):
        dtensor.Mesh(["x"], np.arange(1), [0], "CPU:0")


def test_create_mesh_device_names_that_do_not_parse_are_named():
    """`["foo", "bar"]` was a mesh that "mixes device types FOO and BAR"."""
    with pytest.raises(MeshError, match=r"Device `foo` of the mesh is not a device name: expected a type and an index, such as `CPU:0`"):
        dtensor.create_mesh([("x", 2)], devices=["foo", "bar"])
    with pytest.raises(MeshError, match=r"Device `bar` of the mesh is not a device name"):
        dtensor.Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "bar"])


def test_create_mesh_device_type_that_the_devices_do_not_have_is_refused():
    """It was ignored: a mesh of CPUs came back for `device_type="GPU"` (TF raises ValueError)."""
    with pytest.raises(MeshError, match=r"`device_type='GPU'` conflicts with the devices given \('CPU:0' is a CPU device"):
        dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"], device_type="GPU")
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"], device_type="cpu")
    assert mesh.device_type() == "CPU"


def test_integral_float_size_is_accepted():
    assert dtensor.create_mesh([("x", 2.0)], devices=["CPU:0", "CPU:1"]).shape() == [2]


@pytest.mark.parametrize("ids", [np.array(["a", "b"]), np.array([0.0, 1.0])], ids=["strings", "floats"])
def test_mesh_ids_must_be_integers(ids):
    """A TypeError, the class TensorFlow's DTensor raises for such ids."""
    with pytest.raises(TypeError, match="must hold integers"):
        dtensor.Mesh(["x"], ids, [0, 1], ["CPU:0", "CPU:1"])


def test_coords_of_an_id_past_the_mesh_wrap_around(mesh_2x2):
    # Regression: an unknown id once returned the coordinates of position 0. TensorFlow's
    # DTensor defines `coords(id)` as `(id // strides) % shape` (its own tests rely on ids
    # past the size wrapping around), so id 99 is id 3.
    assert mesh_2x2.coords(99).numpy().tolist() == mesh_2x2.coords(3).numpy().tolist()
    assert mesh_2x2.coords(3).numpy().tolist() == [1, 1]
    assert mesh_2x2.coords(6).numpy().tolist() == [1, 0]


@pytest.mark.parametrize("name,shown", [("a+b", "`+`"), ("a,b", "`,`"), ("a|b", "`|`"),
                                        ("a=b", "`=`"), ("mesh:", "`:`"), (" x", "whitespace")])
def test_dim_names_holding_a_separator_are_rejected(name, shown):
    # They were accepted, and layouts on them broke later: `[Shard(0), Replicate()]` on a
    # dimension named "a+b" raised a bare KeyError ('a'), "a,b" failed to parse back.
    with pytest.raises(tf_dtensor.MeshError,
                       match=rf"`{re.escape(name)}` contains {re.escape(shown)}, which the text "
                             rf"forms .* use as a separator"):
        dtensor.create_mesh([(name, 2), ("c", 2)], devices=cpus(4))
    from tf_dtensor.placements import init_device_mesh
    with pytest.raises(tf_dtensor.MeshError, match="separator"):
        init_device_mesh("cpu", (2, 2), mesh_dim_names=(name, "c"))


_MANY_DEVICES_PROGRAM = """
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 64)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED as U, Layout

rng = np.random.default_rng(0)
x0, y0 = rng.uniform(-1, 1, (24, 10)).astype(np.float32), rng.uniform(-1, 1, (24, 3)).astype(np.float32)
w0, v0 = rng.uniform(-1, 1, (10, 6)).astype(np.float32), rng.uniform(-1, 1, (6, 3)).astype(np.float32)

def put(value, layout):
    whole = dtensor.copy_to_mesh(tf.constant(value), Layout.replicated(layout.mesh, value.ndim))
    return dtensor.relayout(whole, layout)

def whole(t):
    mesh = dtensor.fetch_layout(t).mesh
    parts = dtensor.unpack(dtensor.relayout(t, Layout.replicated(mesh, t.shape.rank)))
    for part in parts[1:]:
        np.testing.assert_array_equal(part.numpy(), parts[0].numpy())
    return parts[0].numpy()

def train(w, v, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(tf.nn.relu(tf.matmul(x, w)), v) - y) ** 2)
    gw, gv = tape.gradient(loss, [w, v])
    w.assign_sub(0.1 * gw)
    v.assign_sub(0.1 * gv)
    return loss

pw, pv = tf.Variable(w0), tf.Variable(v0)
plain = tf.function(lambda x, y: train(pw, pv, x, y))
expected = [plain(x0, y0).numpy() for _ in range(2)]
# (mesh, batch spec, w spec, v spec): 24 rows over 64 devices leave blocks empty
for dims, batch, ws, vs in [([("b", 8), ("m", 8)], "b", [U, "m"], ["m", U]),
                            ([("b", 4), ("m", 4), ("z", 4)], "b+z", [U, "m"], ["m", U]),
                            ([("b", 64)], "b", [U, U], [U, U])]:
    mesh = dtensor.create_mesh(dims, devices=[f"CPU:{i}" for i in range(64)])
    w = dtensor.DVariable(put(w0, Layout(ws, mesh)))
    v = dtensor.DVariable(put(v0, Layout(vs, mesh)))
    step = tf.function(lambda x, y: train(w, v, x, y))
    x, y = put(x0, Layout([batch, U], mesh)), put(y0, Layout([batch, U], mesh))
    for want in expected:
        np.testing.assert_allclose(whole(step(x, y)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(whole(w.read_value()), pw.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(whole(v.read_value()), pv.numpy(), rtol=1e-5, atol=1e-6)
    assert dtensor.fetch_layout(w.read_value()) == Layout(ws, mesh)
# A sub-mesh of the last 8 devices, as 2x2x2, and back.
big = dtensor.create_mesh([("x", 8), ("y", 8)], devices=[f"CPU:{i}" for i in range(64)])
small = dtensor.create_mesh([("x", 2), ("y", 2), ("z", 2)], devices=[f"CPU:{i}" for i in range(56, 64)])
t = put(x0, Layout(["x+y", U], big))
moved = dtensor.relayout(t, Layout(["z", "x+y"], small))
np.testing.assert_array_equal(whole(moved), x0)
np.testing.assert_array_equal(whole(dtensor.relayout(moved, Layout(["y", "x"], big))), x0)
print("OK")
"""


def test_meshes_of_64_devices_train_and_move_as_one_device():
    # Beyond the 8 devices of the suite: 8x8, 4x4x4 (the batch over two mesh dimensions)
    # and 64x1 meshes train a two-layer step in a tf.function as one device does, and a
    # value moves to a 2x2x2 sub-mesh and back (a process of its own: 64 virtual CPUs).
    result = dtensor_testing.run_python(_MANY_DEVICES_PROGRAM)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK"), result.stdout[-2000:]
