"""Tests of tf_dtensor/checkpoint.py: DVariables in `tf.train.Checkpoint` and
`tf.train.CheckpointManager`.

A DVariable is saved under the ordinary key (one slice per distinct block, which the
checkpoint reader assembles into the global value), so every test also checks the
checkpoint file itself, and values are compared bit for bit. The slices themselves are
checked in test_checkpoint_named.py, other libraries' files in test_checkpoint_interop.py.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor as builtin

from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, case_id, cpus,
                             layout_of, layouts_for, reassemble, spec_params, to_dtensor)
from tf_dtensor import checkpoint
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"
SHAPE = (8, 8)

# `x=4` on the upper four CPUs: a mesh that shares no device with MESH_1D.
MESH_4 = dtensor.create_mesh([("x", 4)], devices=cpus(8)[4:])

DTYPES = [np.float32, np.float64, tf.bfloat16.as_numpy_dtype, np.float16, np.int32, np.int64]


def random_value(shape=SHAPE, dtype=np.float32, seed=0) -> np.ndarray:
    """Random values that use every bit pattern class of the dtype (signs, exponents,
    full-range integers), so a lossy conversion anywhere shows up."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(dtype)


def dvariable(value: np.ndarray, layout: Layout, **kwargs) -> dtensor.DVariable:
    return dtensor.DVariable(to_dtensor(value, layout), **kwargs)


def assert_exact(expected: np.ndarray, layout: Layout, variable) -> None:
    """The variable keeps `layout` and holds `expected` bit for bit."""
    assert variable.layout == layout
    assert_dtensor_equal(expected, layout, variable.read_value())
    actual = reassemble(variable.read_value())
    assert actual.dtype == expected.dtype
    assert actual.tobytes() == expected.tobytes(), f"not bit-exact in {layout.short()}"


def saved_value(path: str, key: str = KEY) -> np.ndarray:
    return tf.train.load_checkpoint(path).get_tensor(key)


def all_layouts(shape=SHAPE, meshes=(MESH_1D, MESH_2X2, MESH_8)) -> list:
    params = []
    for mesh in meshes:
        for layout in layouts_for(mesh, shape):
            params.append(pytest.param(layout, id=case_id([layout])))
    return params


# --- saving: the global value under the ordinary key --------------------------------------

@pytest.mark.parametrize("layout", all_layouts())
def test_save_writes_the_global_value(layout, tmp_path):
    x = random_value()
    v = dvariable(x, layout)
    path = tf.train.Checkpoint(v=v).save(str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assert shapes[KEY] == list(SHAPE)
    assert tf.train.load_checkpoint(path).get_variable_to_dtype_map()[KEY] == tf.float32
    saved = saved_value(path)
    assert saved.tobytes() == x.tobytes()
    # Saving leaves the variable as it was.
    assert_exact(x, layout, v)


def test_global_value_of_a_dtensor():
    x = random_value((4, 8, 2))
    t = to_dtensor(x, layout_of("[y,x,*]", MESH_2X2))
    value = checkpoint.global_value(t)
    assert not dtensor.is_dtensor(value)
    assert tf.DeviceSpec.from_string(value.device).device_type == "CPU"
    assert value.numpy().tobytes() == x.tobytes()


@pytest.mark.parametrize("specs", [[None, None], ["x", None]], ids=["[*,*]", "[x,*]"])
def test_global_value_of_a_partial_dtensor_is_the_reduced_value(specs):
    # Components are terms of a sum over y (a on y=0, b on y=1): component 0 alone is a.
    a, b = random_value((4, 6), seed=1), random_value((4, 6), seed=2)
    layout = Layout([s or dtensor.UNSHARDED for s in specs], MESH_2X2, partial={"y": "sum"})
    rows = 2 if specs[0] == "x" else 4
    terms = [(a if y == 0 else b)[x * rows % 4:x * rows % 4 + rows]
             for x in range(2) for y in range(2)]  # MESH_2X2's devices run y fastest
    t = dtensor.pack(terms, layout)
    assert dtensor.fetch_layout(t).partial == {"y": "sum"}
    np.testing.assert_allclose(checkpoint.global_value(t).numpy(), a + b, rtol=1e-6)


@pytest.mark.parametrize("layout", [Layout([], MESH_2X2), Layout([], MESH_8)],
                         ids=lambda l: l.short())
def test_scalar_round_trip(layout, tmp_path):
    v = dtensor.DVariable(to_dtensor(np.float32(3.25), layout))
    path = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))
    assert saved_value(path) == np.float32(3.25)
    w = dtensor.DVariable(to_dtensor(np.float32(0), layout))
    tf.train.Checkpoint(v=w).read(path).assert_consumed()
    assert_exact(np.array(3.25, np.float32), layout, w)


# --- bit-exact round trips -------------------------------------------------------------------

ROUND_TRIP_LAYOUTS = (spec_params(MESH_1D, ("[x,*]",)) +
                      spec_params(MESH_2X2, ("[*,*]",), ("[x,y]",), ("[y,*]",)) +
                      spec_params(MESH_8, ("[*,x]",)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layouts", ROUND_TRIP_LAYOUTS)
def test_round_trip_is_bit_exact(layouts, dtype, tmp_path):
    (layout,) = layouts
    x = random_value(dtype=dtype, seed=1)
    v = dvariable(x, layout)
    path = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))
    assert saved_value(path).tobytes() == x.tobytes()
    # Overwrite the variable, then restore it.
    v.assign(to_dtensor(np.zeros_like(x), layout))
    tf.train.Checkpoint(v=v).read(path).assert_consumed()
    assert_exact(x, layout, v)


# --- restoring into another layout or mesh ------------------------------------------------

MOVES = [
    # (saved from, restored into)
    ("[x,*]", MESH_4, "[*,x]", MESH_1D),
    ("[x,*]", MESH_4, "[*,*]", MESH_2X2),
    ("[x,*]", MESH_4, "[x,y]", MESH_2X2),
    ("[x,*]", MESH_4, "[*,x]", MESH_8),
    ("[x,y]", MESH_2X2, "[y,x]", MESH_2X2),
    ("[x,y]", MESH_2X2, "[x,*]", MESH_8),
    ("[*,*]", MESH_2X2, "[x,y]", MESH_2X2),
    ("[*,x]", MESH_8, "[x,*]", MESH_4),
    ("[*,x]", MESH_8, "[*,*]", MESH_1D),
    ("[x,*]", MESH_1D, "[*,y]", MESH_2X2),
]


def move_id(move) -> str:
    src, src_mesh, dst, dst_mesh = move
    return f"{src}@{src_mesh.short()}->{dst}@{dst_mesh.short()}"


@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("move", MOVES, ids=move_id)
def test_restore_into_another_layout_or_mesh(move, dtype, tmp_path):
    src, src_mesh, dst, dst_mesh = move
    x = random_value(dtype=dtype, seed=2)
    path = tf.train.Checkpoint(v=dvariable(x, layout_of(src, src_mesh))).write(
        str(tmp_path / "ckpt"))
    target = layout_of(dst, dst_mesh)
    w = dvariable(np.zeros_like(x), target)
    tf.train.Checkpoint(v=w).read(path).assert_consumed()
    assert_exact(x, target, w)


def test_restore_a_rank_3_variable_into_another_mesh(tmp_path):
    x = random_value((4, 2, 8), seed=3)
    path = tf.train.Checkpoint(v=dvariable(x, layout_of("[x,*,y]", MESH_2X2))).write(
        str(tmp_path / "ckpt"))
    target = layout_of("[*,*,x]", MESH_8)
    w = dvariable(np.zeros_like(x), target)
    tf.train.Checkpoint(v=w).read(path).assert_consumed()
    assert_exact(x, target, w)


# --- compatibility with plain variables ---------------------------------------------------

@pytest.mark.parametrize("layout", all_layouts(meshes=(MESH_2X2, MESH_8)))
def test_plain_variable_reads_a_dvariable_checkpoint(layout, tmp_path):
    x = random_value(dtype=np.float64, seed=4)
    path = tf.train.Checkpoint(v=dvariable(x, layout)).write(str(tmp_path / "ckpt"))
    plain = tf.Variable(tf.zeros(SHAPE, tf.float64))
    tf.train.Checkpoint(v=plain).read(path).assert_consumed()
    assert plain.numpy().tobytes() == x.tobytes()


@pytest.mark.parametrize("layout", all_layouts(meshes=(MESH_1D, MESH_2X2)))
def test_dvariable_reads_a_plain_variable_checkpoint(layout, tmp_path):
    x = random_value(dtype=np.int32, seed=5)
    path = tf.train.Checkpoint(v=tf.Variable(x)).write(str(tmp_path / "ckpt"))
    w = dvariable(np.zeros_like(x), layout)
    tf.train.Checkpoint(v=w).read(path).assert_consumed()
    assert_exact(x, layout, w)


# --- deferred restoration (restore-on-create) ---------------------------------------------

@pytest.mark.parametrize("layouts", spec_params(MESH_8, ("[x,*]",)) +
                         spec_params(MESH_2X2, ("[x,y]",), ("[*,*]",)))
def test_variable_created_after_restore_is_restored(layouts, tmp_path):
    (layout,) = layouts
    x = random_value(seed=6)
    path = tf.train.Checkpoint(v=dvariable(x, layout_of("[*,x]", MESH_1D))).write(
        str(tmp_path / "ckpt"))
    ckpt = tf.train.Checkpoint()
    status = ckpt.read(path)
    ckpt.v = dvariable(np.zeros_like(x), layout)  # Tracking it restores it.
    status.assert_consumed()
    assert_exact(x, layout, ckpt.v)


class Dense(tf.Module):
    """A tiny model whose weights are DVariables, tracked as attributes."""

    def __init__(self, kernel_layout: Layout, bias_layout: Layout, seed: int = 0):
        super().__init__()
        self.kernel = dvariable(random_value(SHAPE, seed=seed), kernel_layout, name="kernel")
        self.bias = dvariable(random_value((8,), seed=seed + 1), bias_layout, name="bias")
        self.extras = [dvariable(random_value((8, 2), np.int64, seed=seed + 2),
                                 Layout.replicated(kernel_layout.mesh, 2))]

    def __call__(self, x):
        return tf.matmul(x, self.kernel) + self.bias


def test_module_attributes_are_saved_under_their_paths(tmp_path):
    model = Dense(layout_of("[*,x]", MESH_2X2), layout_of("[x]", MESH_2X2))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assert shapes["model/kernel/.ATTRIBUTES/VARIABLE_VALUE"] == [8, 8]
    assert shapes["model/bias/.ATTRIBUTES/VARIABLE_VALUE"] == [8]
    assert shapes["model/extras/0/.ATTRIBUTES/VARIABLE_VALUE"] == [8, 2]
    assert saved_value(path, "model/kernel/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == \
        random_value(SHAPE, seed=0).tobytes()


@pytest.mark.parametrize("mesh", [MESH_1D, MESH_2X2, MESH_8], ids=lambda m: m.short())
def test_module_restores_into_another_mesh(mesh, tmp_path):
    source = Dense(layout_of("[x,y]", MESH_2X2), layout_of("[y]", MESH_2X2), seed=10)
    path = tf.train.Checkpoint(model=source).write(str(tmp_path / "ckpt"))
    target = Dense(layout_of("[*,x]", mesh), Layout.replicated(mesh, 1), seed=20)
    tf.train.Checkpoint(model=target).read(path).assert_consumed()
    assert_exact(random_value(SHAPE, seed=10), layout_of("[*,x]", mesh), target.kernel)
    assert_exact(random_value((8,), seed=11), Layout.replicated(mesh, 1), target.bias)
    assert_exact(random_value((8, 2), np.int64, seed=12), Layout.replicated(mesh, 2),
                 target.extras[0])
    # The restored model computes what the saved one does.
    inputs = to_dtensor(np.ones((2, 8), np.float32), Layout.replicated(mesh, 2))
    expected = np.ones((2, 8), np.float32) @ random_value(SHAPE, seed=10) + \
        random_value((8,), seed=11)
    np.testing.assert_allclose(reassemble(target(inputs)), expected, rtol=1e-5, atol=1e-5)


def test_module_attribute_set_after_restore_is_restored(tmp_path):
    source = Dense(layout_of("[x,*]", MESH_8), layout_of("[x]", MESH_8), seed=30)
    path = tf.train.Checkpoint(model=source).write(str(tmp_path / "ckpt"))
    model = tf.Module()
    status = tf.train.Checkpoint(model=model).read(path)
    model.kernel = dvariable(np.zeros(SHAPE, np.float32), layout_of("[*,y]", MESH_2X2))
    model.bias = dvariable(np.zeros(8, np.float32), layout_of("[x]", MESH_1D))
    model.extras = [dvariable(np.zeros((8, 2), np.int64), layout_of("[x,*]", MESH_2X2))]
    status.assert_consumed()
    assert_exact(random_value(SHAPE, seed=30), layout_of("[*,y]", MESH_2X2), model.kernel)
    assert_exact(random_value((8,), seed=31), layout_of("[x]", MESH_1D), model.bias)
    assert_exact(random_value((8, 2), np.int64, seed=32), layout_of("[x,*]", MESH_2X2),
                 model.extras[0])


# --- CheckpointManager ----------------------------------------------------------------------

def test_checkpoint_manager_keeps_max_to_keep(tmp_path):
    layout = layout_of("[x,y]", MESH_2X2)
    v = dvariable(np.zeros(SHAPE, np.float32), layout)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(tmp_path), max_to_keep=2)
    values = [random_value(seed=40 + step) for step in range(4)]
    paths = []
    for value in values:
        v.assign(to_dtensor(value, layout))
        paths.append(manager.save())
    assert manager.checkpoints == paths[2:]
    assert manager.latest_checkpoint == paths[3]
    for path in paths[:2]:
        assert not os.path.exists(path + ".index"), f"{path} should have been deleted"
    for path, value in zip(paths[2:], values[2:]):
        assert saved_value(path).tobytes() == value.tobytes()
    # A new manager over the directory finds the kept checkpoints; restore the latest into
    # another layout.
    target = layout_of("[*,x]", MESH_8)
    w = dvariable(np.zeros(SHAPE, np.float32), target)
    restorer = tf.train.CheckpointManager(tf.train.Checkpoint(v=w), str(tmp_path), max_to_keep=2)
    assert restorer.checkpoints == paths[2:]
    restorer.restore_or_initialize()
    assert_exact(values[3], target, w)
    tf.train.Checkpoint(v=w).restore(paths[2]).assert_consumed()
    assert_exact(values[2], target, w)


# --- wrong input ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(8, 4), (64,), (8, 8, 1)], ids=str)
def test_restoring_another_global_shape_names_both_shapes(shape, tmp_path):
    # A replicated variable reads the full value: tf_dtensor names the variable and both
    # shapes. The class is TensorFlow's DTensor's (InvalidArgumentError).
    x = random_value(seed=50)
    path = tf.train.Checkpoint(v=dvariable(x, layout_of("[x,*]", MESH_2X2))).write(
        str(tmp_path / "ckpt"))
    layout = Layout.replicated(MESH_1D, len(shape))
    w = dtensor.DVariable(to_dtensor(np.ones(shape, np.float32), layout), name="dense/kernel")
    shape_text = str(list(shape)).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(tf.errors.InvalidArgumentError, match=(
            rf"(?s)DVariable `dense/kernel:0`.*holds a value of shape \[8, 8\].*global shape is "
            rf"{shape_text}.*Create the variable with shape \[8, 8\]")):
        tf.train.Checkpoint(v=w).read(path)
    # The variable is left as it was.
    assert_exact(np.ones(shape, np.float32), layout, w)


def test_restoring_another_global_shape_into_shards_names_the_key_and_shapes(tmp_path):
    # A sharded variable reads slices: RestoreV2 compares the shapes, as in TF's DTensor.
    x = random_value(seed=51)
    path = tf.train.Checkpoint(v=dvariable(x, layout_of("[x,*]", MESH_2X2))).write(
        str(tmp_path / "ckpt"))
    layout = layout_of("[x,y]", MESH_2X2)
    w = dvariable(np.ones((8, 4), np.float32), layout)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"v/\.ATTRIBUTES/VARIABLE_VALUE.*\[8,4\].*\[8,8\]"):
        tf.train.Checkpoint(v=w).read(path)
    assert_exact(np.ones((8, 4), np.float32), layout, w)


def test_restoring_another_dtype_names_the_key_and_dtypes(tmp_path):
    path = tf.train.Checkpoint(v=dvariable(random_value(), layout_of("[x,*]", MESH_1D))).write(
        str(tmp_path / "ckpt"))
    w = dvariable(np.zeros(SHAPE, np.float64), layout_of("[x,*]", MESH_1D))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"v/\.ATTRIBUTES/VARIABLE_VALUE.*double.*float"):
        tf.train.Checkpoint(v=w).read(path)


def test_restoring_a_missing_variable_is_reported(tmp_path):
    path = tf.train.Checkpoint(v=dvariable(random_value(), layout_of("[x,*]", MESH_1D))).write(
        str(tmp_path / "ckpt"))
    w = dvariable(np.zeros(SHAPE, np.float32), layout_of("[x,*]", MESH_1D))
    status = tf.train.Checkpoint(other=w).read(path)
    with pytest.raises(AssertionError, match="not bound to checkpointed values"):
        status.assert_consumed()
    status.expect_partial()
    assert_exact(np.zeros(SHAPE, np.float32), layout_of("[x,*]", MESH_1D), w)


# --- saving and restoring inside functions --------------------------------------------------

def test_async_checkpoint_saves_the_value_at_each_save(tmp_path):
    layout = layout_of("[x,y]", MESH_2X2)
    v = dvariable(random_value(seed=60), layout)
    ckpt = tf.train.Checkpoint(v=v)
    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    first = ckpt.save(str(tmp_path / "ckpt"), options=options)
    # The second save copies to the host inside TensorFlow's traced copy function.
    v.assign(to_dtensor(random_value(seed=61), layout))
    second = ckpt.save(str(tmp_path / "ckpt"), options=options)
    ckpt.sync()
    assert saved_value(first).tobytes() == random_value(seed=60).tobytes()
    assert saved_value(second).tobytes() == random_value(seed=61).tobytes()


def test_write_inside_a_function_reads_the_value_when_it_runs(tmp_path):
    layout = layout_of("[*,x]", MESH_8)
    v = dvariable(np.zeros(SHAPE, np.float32), layout)
    ckpt = tf.train.Checkpoint(v=v)
    prefix = str(tmp_path / "ckpt")

    @tf.function
    def write():
        return ckpt.write(prefix)

    for seed in (70, 71):
        v.assign(to_dtensor(random_value(seed=seed), layout))
        write()
        assert saved_value(prefix).tobytes() == random_value(seed=seed).tobytes()


def test_restore_from_tensors_inside_a_function(tmp_path):
    # TensorFlow restores inside a function when a checkpoint spans several tasks; the
    # assignment then runs when the function runs.
    layout = layout_of("[x,y]", MESH_2X2)
    v = dvariable(np.zeros(SHAPE, np.float32), layout)

    @tf.function
    def restore(value):
        checkpoint.restore_from_tensors(v, {"VARIABLE_VALUE": value})

    for seed in (80, 81):
        restore(tf.constant(random_value(seed=seed)))
        assert_exact(random_value(seed=seed), layout, v)

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"shape \[4, 8\].*global shape is \[8, 8\]"):
        restore(tf.zeros([4, 8]))


# --- tf.experimental.dtensor compatibility -------------------------------------------------

def test_dtensor_checkpoint_signature_matches_tf():
    ours = list(inspect.signature(dtensor.DTensorCheckpoint.__init__).parameters)
    theirs = list(inspect.signature(builtin.DTensorCheckpoint.__init__).parameters)
    assert ours == theirs


def test_dtensor_checkpoint_round_trip(tmp_path):
    x = random_value(seed=90)
    v = dvariable(x, layout_of("[x,*]", MESH_2X2))
    path = dtensor.DTensorCheckpoint(MESH_2X2, v=v).save(str(tmp_path / "ckpt"))
    assert saved_value(path).tobytes() == x.tobytes()
    w = dvariable(np.zeros_like(x), layout_of("[*,x]", MESH_8))
    dtensor.DTensorCheckpoint(MESH_8, v=w).restore(path).assert_consumed()
    assert_exact(x, layout_of("[*,x]", MESH_8), w)


@pytest.mark.parametrize("layout", [Layout(["x", dtensor.UNSHARDED], MESH_4),
                                    Layout([dtensor.UNSHARDED, "y"], MESH_2X2)],
                         ids=lambda l: l.short())
def test_uneven_dvariable_round_trip(layout, tmp_path):
    # 5 rows over x=4 (blocks 2, 2, 1, 0) or 3 columns over y=2: saved whole, restored into
    # the variable's uneven blocks, and readable by a plain tf.Variable.
    value = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert not layout.is_even(value.shape)
    variable = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(value), layout))
    path = tf.train.Checkpoint(v=variable).save(str(tmp_path / "ckpt"))
    variable.assign(dtensor.copy_to_mesh(tf.zeros([5, 3]), layout))
    tf.train.Checkpoint(v=variable).restore(path)
    assert_dtensor_equal(value, layout, variable.read_value())
    plain = tf.Variable(tf.zeros([5, 3]))
    tf.train.Checkpoint(v=plain).restore(path)
    np.testing.assert_array_equal(plain.numpy(), value)
    np.testing.assert_array_equal(checkpoint.global_value(variable).numpy(), value)


@pytest.mark.parametrize("spec", ["[*]", "[x]"])
def test_a_dvariable_saved_by_another_trackable_is_written_once_and_whole(spec, tmp_path):
    # An object that hands TensorFlow's saver the DVariable itself (Keras' variable did, before
    # tf_dtensor.keras gave it the DVariable's saveable): TF's save function takes the
    # handle and the plain save counter's, and runs on the DTensor device; its SaveV2 (a
    # side effect without a rule) runs once on the host with the value whole. It used to be
    # placed on the host and refused (the handle cannot be copied there).
    from tensorflow.python.trackable import base as trackable

    class HandsOverTheVariable(trackable.Trackable):
        def __init__(self, variable):
            self.variable = variable

        def _serialize_to_tensors(self):
            return {"VARIABLE_VALUE": self.variable}

    v = dtensor.DVariable(dtensor.call_with_layout(tf.range, layout_of(spec, MESH_1D), 4.0))
    path = tf.train.Checkpoint(w=HandsOverTheVariable(v)).save(str(tmp_path / "ckpt"))
    saved = tf.train.load_checkpoint(path)
    np.testing.assert_array_equal(saved.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE"),
                                  [0.0, 1.0, 2.0, 3.0])
    assert saved.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE") == 1
