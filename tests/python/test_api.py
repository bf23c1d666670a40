"""Tests of tf_dtensor/api.py and tf_dtensor/config.py: pack/unpack, relayout, copy_to_mesh,
call_with_layout, default meshes, the accelerator-system calls and parity with
`tf.experimental.dtensor`."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import tensorflow as tf

import dtensor_testing
import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, layout_of,
                             layout_params, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

builtin = tf.experimental.dtensor


def _device(index: int) -> str:
    return f"/job:localhost/replica:0/task:0/device:CPU:{index}"


# --- pack / unpack -----------------------------------------------------------------------

def test_pack_unpack_round_trip_in_mesh_order(mesh_2x2):
    # [x,*] on x=2,y=2: devices 0,1 (x=0) hold rows 0:2, devices 2,3 (x=1) rows 2:4.
    layout = Layout(["x", UNSHARDED], mesh_2x2)
    top = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    bottom = top + 10
    packed = dtensor.pack([top, top, bottom, bottom], layout)
    assert dtensor.fetch_layout(packed) == layout
    assert packed.shape == (4, 3)
    assert packed.dtype == tf.int32
    components = dtensor.unpack(packed)
    assert [c.device for c in components] == [_device(i) for i in range(4)]
    for component, expected in zip(components, [top, top, bottom, bottom]):
        np.testing.assert_array_equal(component.numpy(), expected)
    assert_dtensor_equal(np.concatenate([top, bottom]), layout, packed)


def test_pack_fully_sharded_places_blocks_by_mesh_coords(mesh_2x2):
    layout = Layout(["x", "y"], mesh_2x2)
    blocks = [np.full((2, 2), i, np.float32) for i in range(4)]
    packed = dtensor.pack(blocks, layout)
    expected = np.block([[blocks[0], blocks[1]], [blocks[2], blocks[3]]])
    assert_dtensor_equal(expected, layout, packed)


def test_pack_replicated_overview(mesh_2x2):
    layout = Layout.replicated(mesh_2x2, 1)
    packed = dtensor.pack([[0, 1]] * 4, layout)
    assert_dtensor_equal(np.array([0, 1], np.int32), layout, packed)
    np.testing.assert_array_equal(packed.numpy(), [0, 1])


def test_pack_wrong_component_count(mesh_2x2):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"3 components .* 4 local devices"):
        dtensor.pack([tf.zeros([2, 2])] * 3, Layout(["x", UNSHARDED], mesh_2x2))


def test_pack_no_components(mesh_2x2):
    with pytest.raises(tf_dtensor.LayoutError, match="got none"):
        dtensor.pack([], Layout(["x", UNSHARDED], mesh_2x2))


def test_pack_mismatched_shapes(mesh_2x2):
    components = [tf.zeros([2, 2])] * 3 + [tf.zeros([3, 2])]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"component 3 has shape \[3, 2\].*block of shape \[2, 2\]"):
        dtensor.pack(components, Layout(["x", UNSHARDED], mesh_2x2))


def test_pack_mismatched_dtypes_names_the_dtypes(mesh_2x2):
    components = [tf.zeros([2, 2], tf.int32)] * 3 + [tf.zeros([2, 2], tf.float32)]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        dtensor.pack(components, Layout(["x", UNSHARDED], mesh_2x2))
    message = str(error.value)
    assert "component 3" in message
    assert "float32" in message and "int32" in message, message


def test_pack_rank_mismatch(mesh_2x2):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"rank 1 \(shape \[4\]\) but layout \[x,\*\] @ mesh\(x=2,y=2\) has "
                             r"rank 2"):
        dtensor.pack([tf.zeros([4])] * 4, Layout(["x", UNSHARDED], mesh_2x2))


def test_pack_rejects_dtensor_components(mesh_2x2):
    component = to_dtensor(np.zeros((2, 2), np.float32), Layout.replicated(mesh_2x2, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="already a DTensor"):
        dtensor.pack([component] * 4, Layout(["x", UNSHARDED], mesh_2x2))


@pytest.mark.parametrize("one", [np.zeros((2, 2), np.float32), tf.zeros([2, 2])],
                         ids=["numpy", "tensor"])
def test_pack_of_one_tensor_instead_of_a_list(one, mesh_2x2):
    """Iterated, the tensor's 2 rows were taken as 2 components ("pack got 2 components").
    A PackError is an UnimplementedError, what TensorFlow's DTensor raises here."""
    with pytest.raises(tf_dtensor.PackError,
                       match=r"pack takes a list of tensors, one per local device of "
                             r"mesh\(x=2,y=2\); got one tensor of shape \[2, 2\]"):
        dtensor.pack(one, Layout(["x", UNSHARDED], mesh_2x2))
    assert issubclass(tf_dtensor.PackError, tf.errors.UnimplementedError)


def test_unpack_regular_tensor():
    with pytest.raises(tf_dtensor.LayoutError, match="expects a DTensor"):
        dtensor.unpack(tf.zeros([2]))


def test_unpack_more_components_than_it_made_room_for(monkeypatch, mesh_8):
    # unpack first asks for at most `_unpack_capacity` components without reading the
    # layout; a DTensor with more takes the layout's count, and the room grows to it.
    from tf_dtensor import _packing
    monkeypatch.setattr(_packing, "_unpack_capacity", 2)
    blocks = [np.full([1, 3], i, np.float32) for i in range(8)]
    components = dtensor.unpack(dtensor.pack(blocks, Layout(["x", UNSHARDED], mesh_8)))
    assert [c.device for c in components] == [_device(i) for i in range(8)]
    for component, block in zip(components, blocks):
        np.testing.assert_array_equal(component.numpy(), block)
    assert _packing._unpack_capacity == 8
    # Fewer components than the room: exactly the ones there are.
    one = dtensor.copy_to_mesh(tf.ones([2]), Layout.replicated(MESH_2X2, 1))
    assert len(dtensor.unpack(one)) == 4


# --- numpy / repr ------------------------------------------------------------------------

def test_numpy_of_replicated(mesh_2x2):
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(to_dtensor(x, Layout.replicated(mesh_2x2, 2)).numpy(), x)


@pytest.mark.parametrize("spec", ["[x,y]", "[x,*]", "[*,y]"])
def test_numpy_of_sharded_raises(spec, mesh_2x2):
    t = to_dtensor(np.zeros((8, 4), np.float32), layout_of(spec, mesh_2x2))
    with pytest.raises(tf.errors.UnimplementedError, match=r"(?s)sharded.*unpack"):
        t.numpy()


@pytest.mark.parametrize("spec", ["[x,y]", "[*,*]"])
def test_repr_and_str_show_the_layout(spec, mesh_2x2):
    layout = layout_of(spec, mesh_2x2)
    t = to_dtensor(np.arange(32, dtype=np.int32).reshape(8, 4), layout)
    for text in (repr(t), str(t)):
        assert f'layout="{layout.to_string()}"' in text
        assert 'layout="sharding_specs:' in text


def test_repr_of_sharded_names_each_component(mesh_1d):
    t = dtensor.pack([np.array([1, 2], np.int32), np.array([3, 4], np.int32)],
                     Layout(["x"], mesh_1d))
    assert '{"CPU:0": [1 2], "CPU:1": [3 4]}' in repr(t)


def test_repr_prints_floats_as_tensorflow_does(mesh_1d):
    # TF prints 10.0 as `10` and 0.5 as `0.5`, never `1e+01`.
    t = dtensor.pack([np.array([10.0, 0.5], np.float32), np.array([20.0, 1234567.0], np.float32)],
                     Layout(["x"], mesh_1d))
    assert '{"CPU:0": [10 0.5], "CPU:1": [20 1234567]}' in repr(t), repr(t)


# --- fetch_layout / check_layout / is_dtensor ---------------------------------------------

def test_fetch_layout_of_regular_tensor():
    with pytest.raises(tf_dtensor.LayoutError, match="expects a DTensor"):
        dtensor.fetch_layout(tf.zeros([2]))


def test_check_layout(mesh_2x2):
    t = to_dtensor(np.zeros((8, 4)), layout_of("[x,y]", mesh_2x2))
    dtensor.check_layout(t, layout_of("[x,y]", mesh_2x2))
    with pytest.raises(ValueError, match=r"\[x,y\] @ mesh\(x=2,y=2\).*\[x,\*\] @ mesh"):
        dtensor.check_layout(t, layout_of("[x,*]", mesh_2x2))


@pytest.mark.parametrize("layout", [None, "[x,y]", MESH_2X2], ids=["none", "string", "mesh"])
def test_check_layout_of_a_non_layout_is_a_type_error(layout, mesh_2x2):
    """`check_layout(t, None)` raised AttributeError ('NoneType' has no attribute 'short');
    TensorFlow's DTensor raises TypeError."""
    t = to_dtensor(np.zeros((8, 4)), layout_of("[x,y]", mesh_2x2))
    with pytest.raises(TypeError, match=r"`check_layout` takes a `Layout` as `layout`"):
        dtensor.check_layout(t, layout)


def test_is_dtensor(mesh_2x2):
    t = to_dtensor(np.zeros((8, 4)), layout_of("[x,y]", mesh_2x2))
    assert dtensor.is_dtensor(t)
    assert dtensor.is_dtensor(dtensor.DVariable(t))
    assert not dtensor.is_dtensor(tf.zeros([2]))
    assert not dtensor.is_dtensor(tf.Variable(1.0))
    assert not dtensor.is_dtensor(np.zeros(2))
    assert not dtensor.is_dtensor([1, 2])


# --- relayout ------------------------------------------------------------------------------

_X = np.arange(32, dtype=np.float32).reshape(4, 8)


@pytest.mark.parametrize("layouts", layout_params((4, 8), (4, 8), meshes=[MESH_2X2]))
def test_relayout(layouts):
    source, target = layouts
    t = to_dtensor(_X, source)
    assert_dtensor_equal(_X, source, t)
    assert_dtensor_equal(_X, target, dtensor.relayout(t, target))


@pytest.mark.parametrize("layouts", layout_params((4, 8), (4, 8), meshes=[MESH_1D]))
def test_relayout_1d(layouts):
    source, target = layouts
    assert_dtensor_equal(_X, target, dtensor.relayout(to_dtensor(_X, source), target))


def test_relayout_int_and_bool(mesh_2x2):
    for x in (_X.astype(np.int32), _X.astype(np.int64), _X > 10):
        t = to_dtensor(x, layout_of("[x,y]", mesh_2x2))
        assert_dtensor_equal(x, layout_of("[y,x]", mesh_2x2),
                             dtensor.relayout(t, layout_of("[y,x]", mesh_2x2)))


def test_relayout_across_overlapping_meshes_moves_the_value(mesh_2x2, mesh_1d):
    # The meshes share CPU:0 and CPU:1; the value crosses whole and is sliced on mesh_1d.
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    moved = dtensor.relayout(t, Layout(["x", UNSHARDED], mesh_1d))
    assert_dtensor_equal(_X, Layout(["x", UNSHARDED], mesh_1d), moved)


def test_relayout_rank_mismatch(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rank 1 .* rank 2"):
        dtensor.relayout(t, Layout(["x"], mesh_2x2))


@pytest.mark.parametrize("to_layout", [dtensor.relayout, dtensor.copy_to_mesh],
                         ids=["relayout", "copy_to_mesh"])
def test_uneven_shape_is_split_like_torch_chunk(to_layout, mesh_8):
    # 6 rows over 8 devices: one row each on the first six, none on the last two.
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    layout = Layout(["x", UNSHARDED], mesh_8)
    t = to_layout(tf.constant(x), layout)
    assert_dtensor_equal(x, layout, t)
    assert [c.shape[0] for c in dtensor.unpack(t)] == [1, 1, 1, 1, 1, 1, 0, 0]


def test_relayout_to_match_of_another_rank_shows_the_layout_as_written(mesh_2x2):
    """MATCH was filled in from the input first, and the error showed [x,*,y], a target the
    caller never wrote. TensorFlow's DTensor raises a ValueError too."""
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    target = Layout([dtensor.MATCH, dtensor.MATCH, "y"], mesh_2x2)
    with pytest.raises(tf_dtensor.RelayoutError,
                       match=r"relayout to \[match,match,y\] @ mesh\(x=2,y=2\): the layout has "
                             r"rank 3 but the input \(\[x,\*\] @ mesh\(x=2,y=2\)\) has rank 2"):
        dtensor.relayout(t, target)
    assert issubclass(tf_dtensor.RelayoutError, ValueError)


def test_relayout_like_of_a_regular_template_names_relayout_like(mesh_2x2):
    """The message named `fetch_layout`, which the caller never called."""
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"relayout_like: `layout_tensor` must be a DTensor.*got a regular "
                             r"EagerTensor.*call `relayout\(tensor, layout\)`"):
        dtensor.relayout_like(t, tf.zeros(_X.shape))


def test_copy_to_mesh_of_a_non_layout_names_copy_to_mesh(mesh_2x2):
    """The message named `relayout`, which the caller never called, for both kinds of
    input; MATCH on a regular tensor names copy_to_mesh too."""
    for value in (tf.constant(_X), to_dtensor(_X, layout_of("[x,y]", mesh_2x2))):
        with pytest.raises(TypeError, match=r"`copy_to_mesh` takes a `Layout` as `layout`; "
                                            r"got 'x' \(str\)"):
            dtensor.copy_to_mesh(value, "x")
    with pytest.raises(tf_dtensor.LayoutError, match=r"^copy_to_mesh to \[match,unsharded\]"):
        dtensor.copy_to_mesh(tf.constant(_X), Layout([dtensor.MATCH, UNSHARDED], mesh_2x2))


def test_relayout_like(mesh_2x2):
    t = to_dtensor(_X, layout_of("[*,*]", mesh_2x2))
    like = to_dtensor(np.zeros((4, 8)), layout_of("[y,x]", mesh_2x2))
    assert_dtensor_equal(_X, layout_of("[y,x]", mesh_2x2), dtensor.relayout_like(t, like))


def test_mesh_device_order_is_respected():
    # The first mesh position is CPU:1: it holds rows 0:2.
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:1", "CPU:0"])
    layout = Layout(["x", UNSHARDED], mesh)
    t = to_dtensor(_X, layout)
    components = dtensor.unpack(t)
    assert [c.device for c in components] == [_device(1), _device(0)]
    np.testing.assert_array_equal(components[0].numpy(), _X[:2])
    assert_dtensor_equal(_X.sum(axis=0), Layout.replicated(mesh, 1), tf.reduce_sum(t, axis=0))


def test_mesh_on_the_upper_devices():
    mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4, 8)])
    t = to_dtensor(_X, layout_of("[y,x]", mesh))
    assert [c.device for c in dtensor.unpack(t)] == [_device(i) for i in range(4, 8)]
    assert_dtensor_equal(_X @ _X.T, layout_of("[y,*]", mesh), tf.matmul(t, to_dtensor(
        _X.T, layout_of("[x,*]", mesh))))


# --- copy_to_mesh / call_with_layout -------------------------------------------------------

@pytest.mark.parametrize("layouts", layout_params((4, 8), meshes=[MESH_2X2]))
def test_copy_to_mesh(layouts):
    (layout,) = layouts
    assert_dtensor_equal(_X, layout, dtensor.copy_to_mesh(tf.constant(_X), layout))


def test_copy_to_mesh_from_numpy_and_lists(mesh_2x2):
    assert_dtensor_equal(_X, layout_of("[x,y]", mesh_2x2),
                         dtensor.copy_to_mesh(_X, layout_of("[x,y]", mesh_2x2)))
    assert_dtensor_equal(np.array([1, 2], np.int32), layout_of("[x]", mesh_2x2),
                         dtensor.copy_to_mesh([1, 2], layout_of("[x]", mesh_2x2)))


def test_copy_to_mesh_of_a_dtensor_relayouts(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,*]", mesh_2x2))
    assert_dtensor_equal(_X, layout_of("[*,y]", mesh_2x2),
                         dtensor.copy_to_mesh(t, layout_of("[*,y]", mesh_2x2)))


def test_call_with_layout_relayouts_a_computed_result(mesh_2x2):
    layout = layout_of("[y,x]", mesh_2x2)
    out = dtensor.call_with_layout(lambda: tf.ones([4, 8]) * 3.0 + 1.0, layout)
    assert_dtensor_equal(np.full((4, 8), 4.0, np.float32), layout, out)


def test_call_with_layout_without_layout_is_a_plain_call():
    out = dtensor.call_with_layout(tf.ones, None, shape=(2, 2))
    assert not dtensor.is_dtensor(out)
    np.testing.assert_array_equal(out.numpy(), np.ones((2, 2)))


# --- default meshes --------------------------------------------------------------------------

def test_default_mesh_runs_ops_on_the_mesh(mesh_2x2, mesh_1d):
    assert dtensor.get_default_mesh() is None
    with dtensor.default_mesh(mesh_2x2):
        assert dtensor.get_default_mesh() == mesh_2x2
        out = tf.ones([2, 2]) + 1.0
        assert_dtensor_equal(np.full((2, 2), 2.0, np.float32), Layout.replicated(mesh_2x2, 2), out)
        with dtensor.run_on(mesh_1d):
            assert dtensor.get_default_mesh() == mesh_1d
            inner = tf.zeros([3]) - 1.0
            assert_dtensor_equal(np.full(3, -1.0, np.float32), Layout.replicated(mesh_1d, 1), inner)
        assert dtensor.get_default_mesh() == mesh_2x2
    assert dtensor.get_default_mesh() is None
    assert not dtensor.is_dtensor(tf.ones([2]))


def test_default_mesh_is_restored_after_an_error(mesh_2x2):
    with pytest.raises(RuntimeError):
        with dtensor.default_mesh(mesh_2x2):
            raise RuntimeError("boom")
    assert dtensor.get_default_mesh() is None


def test_regular_tensor_operand_is_replicated(mesh_2x2):
    t = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    out = t + tf.ones([4, 8])
    assert_dtensor_equal(_X + 1, layout_of("[x,y]", mesh_2x2), out)


def test_ops_on_two_meshes_are_rejected(mesh_2x2, mesh_1d):
    a = to_dtensor(_X, layout_of("[x,y]", mesh_2x2))
    b = to_dtensor(_X, Layout.replicated(mesh_1d, 2))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"'AddV2' got inputs on different meshes: mesh\(x=2,y=2\) and "
                             r"mesh\(x=2\)"):
        tf.add(a, b)


# --- devices and clients -----------------------------------------------------------------

def test_device_name():
    assert dtensor.device_name() == "/job:localhost/replica:0/task:0/device:TFDTENSOR:0"


def test_clients_and_devices():
    assert dtensor.client_id() == 0
    assert dtensor.num_clients() == 1
    assert dtensor.preferred_device_type() == "CPU"
    assert dtensor.num_local_devices("CPU") == 8
    assert dtensor.num_global_devices("CPU") == 8
    devices = dtensor.local_devices("CPU")
    assert [(d.device_type, d.device_index) for d in devices] == [("CPU", i) for i in range(8)]
    assert dtensor.local_devices("cpu") == devices
    assert dtensor.num_local_devices("GPU") == 0


@pytest.mark.parametrize("mesh", [MESH_1D, MESH_2X2, MESH_8], ids=lambda m: m.short())
def test_barrier(mesh):
    assert dtensor.barrier(mesh) is None


def test_barrier_of_a_non_mesh_is_a_type_error_naming_barrier():
    # It was an AttributeError ('str' object has no attribute 'dim_names').
    with pytest.raises(TypeError, match=r"barrier takes a `Mesh` as `mesh`; got 'x'"):
        dtensor.barrier("x")


def test_call_with_layout_of_a_non_layout_is_a_type_error_naming_it():
    # It was an AttributeError ('str' object has no attribute 'mesh').
    with pytest.raises(TypeError, match=r"`call_with_layout` takes a `Layout` as `layout`"):
        dtensor.call_with_layout(tf.ones, "x", shape=[2])


def test_accelerator_system():
    assert dtensor.initialize_accelerator_system("CPU") == "CPU"
    dtensor.shutdown_accelerator_system()
    with pytest.raises(ValueError, match="not initialized"):
        dtensor.shutdown_accelerator_system()


# --- parity with tf.experimental.dtensor ---------------------------------------------------

_FUNCTIONS = [n for n in dtensor.__all__
              if inspect.isfunction(getattr(dtensor, n)) and hasattr(builtin, n)]


def test_public_names_exist_in_tf():
    ours_only = sorted(n for n in dtensor.__all__ if not hasattr(builtin, n))
    assert ours_only == ["set_strict_mode"]


# Options of ours beyond TensorFlow's, keyword-only with a default that keeps TensorFlow's
# behaviour: code written for TensorFlow's signature runs unchanged.
_EXTRA_KEYWORDS = {"pack": ["run_check"]}


@pytest.mark.parametrize("name", _FUNCTIONS)
def test_signature_parity(name):
    signature = inspect.signature(getattr(dtensor, name))
    ours = list(signature.parameters)
    theirs = list(inspect.signature(getattr(builtin, name)).parameters)
    extras = _EXTRA_KEYWORDS.get(name, [])
    assert ours == theirs + extras
    for extra in extras:
        parameter = signature.parameters[extra]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default is not inspect.Parameter.empty


@pytest.mark.parametrize("name", ["Mesh", "Layout", "DVariable"])
def test_class_constructor_parity(name):
    # TF's parameters, in TF's order; ours may add keyword-only ones after them
    # (Layout's `partial`).
    ours = inspect.signature(getattr(dtensor, name).__init__).parameters
    theirs = list(inspect.signature(getattr(builtin, name).__init__).parameters)
    assert list(ours)[:len(theirs)] == theirs
    assert all(p.kind == p.KEYWORD_ONLY for p in list(ours.values())[len(theirs):])


def _public_methods(cls):
    return sorted(n for n, member in vars(cls).items()
                  if not n.startswith("_") and callable(getattr(cls, n)))


@pytest.mark.parametrize("cls,method", [(cls, method) for cls in ["Mesh", "Layout", "DVariable"]
                                        for method in _public_methods(getattr(builtin, cls))])
def test_method_parity(cls, method):
    # Every public method of TF's classes exists on ours with TF's parameter names in TF's
    # order, so keyword calls written for TF run unchanged (`mesh.coords(device_idx=3)` was
    # a TypeError: ours named it `device_id`).
    theirs = inspect.signature(getattr(getattr(builtin, cls), method)).parameters
    ours = inspect.signature(getattr(getattr(dtensor, cls), method)).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    assert all(p.kind == p.KEYWORD_ONLY or p.default is not p.empty
               for p in list(ours.values())[len(theirs):])


def test_mesh_coords_by_keyword(mesh_2x2):
    np.testing.assert_array_equal(mesh_2x2.coords(device_idx=2).numpy(), [1, 0])


def test_tf_parses_the_layout_of_a_dtensor(mesh_2x2):
    t = to_dtensor(_X, layout_of("[y,x]", mesh_2x2))
    theirs = builtin.Layout.from_string(dtensor.fetch_layout(t).to_string())
    assert theirs.sharding_specs == ["y", "x"]
    assert theirs.mesh.to_string() == mesh_2x2.to_string()


def test_call_with_layout_keeps_shape_arguments_whole(mesh_1d):
    # Regression: the shape argument [2] of tf.ones was itself given layout [x].
    layout = dtensor.Layout(["x"], mesh_1d)
    ones = dtensor.call_with_layout(tf.ones, layout, shape=[2])
    assert dtensor.fetch_layout(ones) == layout
    np.testing.assert_array_equal(np.concatenate([c.numpy() for c in dtensor.unpack(ones)]),
                                  np.ones([2], np.float32))


def test_call_with_layout_random_rank_1(mesh_1d):
    # Regression: the random key [1] and counter [2] must not take the requested layout.
    layout = dtensor.Layout(["x"], mesh_1d)
    value = dtensor.call_with_layout(tf.random.stateless_normal, layout, shape=[8], seed=[1, 2])
    expected = tf.random.stateless_normal([8], seed=[1, 2]).numpy()
    np.testing.assert_allclose(np.concatenate([c.numpy() for c in dtensor.unpack(value)]),
                               expected)


def test_barrier_on_2d_mesh(mesh_2x2):
    dtensor.barrier(mesh_2x2)


# --- TensorFlow's `api._dtensor_device()` and `layout=` on TensorFlow's ops (issue 25) ---

def test_tf_ops_take_a_tf_dtensor_layout(mesh_2x2):
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh_2x2)
    ones = tf.ones([4, 2], layout=layout)
    assert dtensor.fetch_layout(ones) == layout
    np.testing.assert_array_equal(dtensor.unpack(ones)[0].numpy(), np.ones([2, 2]))
    filled = tf.fill([4, 2], 7, layout=layout)
    assert dtensor.fetch_layout(filled) == layout and filled.dtype == tf.int32
    like = tf.zeros_like(ones, layout=dtensor.Layout.replicated(mesh_2x2, 2))
    assert dtensor.fetch_layout(like) == dtensor.Layout.replicated(mesh_2x2, 2)
    # TensorFlow's own layouts still go to TensorFlow's DTensor.
    from tensorflow.experimental import dtensor as builtin
    builtin_mesh = builtin.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    assert builtin.fetch_layout(tf.ones([2], layout=builtin.Layout(["x"], builtin_mesh))) \
        == builtin.Layout(["x"], builtin_mesh)


def test_device_view_scopes_and_stats(mesh_2x2):
    from tf_dtensor import api
    device = api._dtensor_device()
    layout = dtensor.Layout([dtensor.UNSHARDED, "y"], mesh_2x2)
    with device._default_layout(layout):
        zeros = tf.zeros([2, 4])
    assert dtensor.fetch_layout(zeros) == layout
    with device._experimental_default_mesh(mesh_2x2):
        assert not dtensor.is_dtensor(tf.ones([2]))  # not placed on the device: stays put
        with tf.device(dtensor.device_name()):
            assert dtensor.fetch_layout(tf.ones([2])) == dtensor.Layout.replicated(mesh_2x2, 1)
    api.reset_dtensor_device(is_async=False)
    assert device._get_stats()["function_manager.hit"] == 0 and not device.is_async

    @tf.function
    def double(t):
        return t * 2

    double(zeros)
    double(zeros)
    stats = device._get_stats()
    assert stats["function_manager.miss"] == 1 and stats["function_manager.hit"] == 1
    with pytest.raises(TypeError, match="is_async"):
        api.reset_dtensor_device(is_async="yes")
    api.reset_dtensor_device(is_async=True)

    # While tracing, the scope's ops carry the layout (TensorFlow's `_layout` attribute) and
    # the expansion makes their outputs in it: a constant, a creation op, a computed value.
    @tf.function
    def traced(anchor):
        with device._default_layout(layout):
            const = tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4))
            zeros = tf.zeros([2, 4])
            summed = anchor + 1.0
        return const, zeros, summed

    anchor = dtensor.copy_to_mesh(tf.zeros([2, 4]), Layout.replicated(layout.mesh, 2))
    for got, want in zip(traced(anchor), [np.arange(8).reshape(2, 4), np.zeros([2, 4]),
                                          np.ones([2, 4])]):
        assert dtensor.fetch_layout(got) == layout
        np.testing.assert_array_equal(dtensor_testing.reassemble(got), want)


# --- MATCH in relayout targets (issue 25) ---

def test_relayout_with_match_keeps_the_input_sharding_of_those_axes(mesh_2x2):
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = dtensor.copy_to_mesh(tf.constant(value), Layout(["x", "y"], mesh_2x2))
    first = Layout([dtensor.MATCH, UNSHARDED], mesh_2x2)
    assert first.sharding_specs == ["match", "unsharded"] and first.has_match
    assert first.short() == "[match,unsharded] @ mesh(x=2,y=2)"
    assert Layout.from_string(first.to_string().replace("match", "unsharded")) != first
    eager = dtensor.relayout(t, first)
    assert dtensor.fetch_layout(eager) == Layout(["x", UNSHARDED], mesh_2x2)
    traced = tf.function(lambda a: dtensor.relayout(a + 1, Layout([UNSHARDED, dtensor.MATCH],
                                                                     mesh_2x2)))(t)
    assert dtensor.fetch_layout(traced) == Layout([UNSHARDED, "y"], mesh_2x2)
    np.testing.assert_array_equal(dtensor_testing.reassemble(eager), value)
    np.testing.assert_array_equal(dtensor_testing.reassemble(traced), value + 1)


def test_match_is_refused_outside_relayout(mesh_2x2):
    match = Layout([dtensor.MATCH, UNSHARDED], mesh_2x2)
    with pytest.raises(tf_dtensor.LayoutError, match="MATCH"):
        dtensor.pack([tf.ones([4, 4])] * 4, match)
    with pytest.raises(tf_dtensor.LayoutError, match="MATCH"):
        dtensor.call_with_layout(tf.ones, match, shape=[4, 4])
    with pytest.raises(tf_dtensor.LayoutError, match="regular tensor has none"):
        dtensor.copy_to_mesh(tf.ones([4, 4]), match)
