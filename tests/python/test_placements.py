"""PyTorch-style placements (issue 11): conversions, the tensor functions and their messages.

Every placement combination on a 1-D mesh (4 devices) and a 2x2 mesh, for an even and an
uneven shape, is checked against one plain device (values, dtype, global shape, layout),
eagerly, inside `tf.function` and through gradients.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_2X2, assert_dtensor_equal, assert_values_equal, cpus,
                             random_array, run_python)
import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout
from tf_dtensor.placements import (Partial, Replicate, Shard, distribute_tensor,
                                   format_placements, from_local, full_tensor,
                                   init_device_mesh, placements_of, redistribute, to_local)

U = UNSHARDED
MESH_4 = dtensor.create_mesh([("x", 4)], devices=cpus(4))
SHAPES = [(4, 6), (5, 3)]   # even on both meshes; uneven on both (5 = 2+2+1+0 = 3+2)
CHOICES = [Shard(0), Shard(1), Replicate(), Partial("sum"), Partial("mean"), Partial("max"),
           Partial("min")]


def _combo_params():
    params = []
    for mesh in (MESH_4, MESH_2X2):
        for combo in itertools.product(CHOICES, repeat=len(mesh.dim_names)):
            for shape in SHAPES:
                ident = f"{format_placements(combo)}-{'x'.join(map(str, shape))}@{mesh.short()}"
                params.append(pytest.param(mesh, combo, shape, id=ident))
    return params


COMBOS = _combo_params()


def _check_value(expected: np.ndarray, layout: Layout, actual) -> None:
    """Layout, dtype, global shape and value of a DTensor, and its blocks' geometry."""
    assert_dtensor_equal(expected, layout, actual)
    blocks = to_local(actual)
    geometry = layout.device_blocks(expected.shape)
    assert [tuple(b.shape) for b in blocks] == [shape for shape, _ in geometry]
    if not layout.is_partial:
        for block, (shape, offset) in zip(blocks, geometry):
            region = tuple(slice(o, o + s) for o, s in zip(offset, shape))
            assert_values_equal(expected[region], block.numpy())


# ---------------------------------------------------------------------------------------
# Placement values and conversions
# ---------------------------------------------------------------------------------------

def test_placements_are_frozen_hashable_values_with_short_forms():
    assert {Shard(0), Shard(0), Replicate(), Replicate(), Partial(), Partial("sum")} == {
        Shard(0), Replicate(), Partial()}
    assert Shard(1) != Shard(0) and Partial("max") != Partial("sum")
    assert (repr(Shard(0)), repr(Replicate()), repr(Partial())) == (
        "Shard(dim=0)", "Replicate()", "Partial(reduce_op='sum')")
    assert (str(Shard(0)), str(Replicate()), str(Partial()), str(Partial("mean"))) == (
        "S(0)", "R", "P(sum)", "P(mean)")
    assert format_placements([Shard(0), Replicate()], MESH_2X2) == "[S(0), R] @ mesh(x=2,y=2)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Shard(0).dim = 1
    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(0).is_shard(1)
    assert Replicate().is_replicate() and Partial().is_partial() and not Shard(0).is_partial()
    with pytest.raises(TypeError, match="Shard"):
        Shard("0")


@pytest.mark.parametrize("mesh,combo,shape", [p for p in COMBOS if p.values[2] == SHAPES[0]])
def test_from_placements_and_placements_are_inverses(mesh, combo, shape):
    layout = Layout.from_placements(mesh, combo, len(shape))
    assert layout.placements == tuple(combo)
    assert Layout.from_placements(mesh, layout.placements, layout.rank) == layout
    partial = {n: p.reduce_op for n, p in zip(mesh.dim_names, combo) if isinstance(p, Partial)}
    assert layout.partial == partial


@pytest.mark.parametrize("specs,partial,placements", [
    ([U, U], {}, (Replicate(), Replicate())),
    (["x", U], {}, (Shard(0), Replicate())),
    ([U, "x"], {}, (Shard(1), Replicate())),
    (["y", "x"], {}, (Shard(1), Shard(0))),
    ([U, "y"], {"x": "sum"}, (Partial("sum"), Shard(1))),
    ([U, U], {"x": "max", "y": "mean"}, (Partial("max"), Partial("mean"))),
])
def test_layouts_to_placements(specs, partial, placements):
    layout = Layout(specs, MESH_2X2, partial=partial or None)
    assert layout.placements == placements
    assert Layout.from_placements(MESH_2X2, placements, len(specs)) == layout


def test_negative_shard_dims_normalise_against_the_rank():
    layout = Layout.from_placements(MESH_2X2, [Shard(-1), Shard(-2)], 2)
    assert layout == Layout(["y", "x"], MESH_2X2)
    assert layout.placements == (Shard(1), Shard(0))


def test_axis_sharded_over_two_mesh_dims():
    layout = Layout.from_placements(MESH_2X2, [Shard(0), Shard(0)], 2)
    assert layout.sharding_specs == ["x+y", U] and layout.num_shards(0) == 4
    assert layout.placements == (Shard(0), Shard(0))
    # Nested torch.chunk: 5 rows over x (3, 2), then each piece over y.
    assert [(s[0], o[0]) for s, o in layout.device_blocks([5, 3])] == [
        (2, 0), (1, 2), (1, 3), (1, 4)]
    with pytest.raises(tf_dtensor.LayoutError, match=r"minor mesh dimension first.*'x\+y'"):
        Layout(["y+x", U], MESH_2X2).placements


# Run with the package's __init__ skipped (it imports every facade): what the modules
# themselves load. The values and their conversion to layouts need nothing above `layout`.
_IMPORTS_OF_THE_VALUES = """
import importlib.util, sys, types
import numpy as np
import tensorflow  # tf_dtensor._core needs TensorFlow's libraries loaded first
spec = importlib.util.find_spec("tf_dtensor")
package = types.ModuleType("tf_dtensor")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["tf_dtensor"] = package
loaded = lambda: sorted(m for m in sys.modules if m.startswith("tf_dtensor."))
from tf_dtensor._placement_types import Replicate, Shard
print(loaded())
from tf_dtensor.layout import Layout
from tf_dtensor.mesh import Mesh
mesh = Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3],
            [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)])
layout = Layout.from_placements(mesh, [Shard(1), Replicate()], 2)
assert layout.placements == (Shard(1), Replicate()), layout.placements
print(loaded())
"""


def test_placement_values_and_conversions_load_no_runtime_module():
    result = run_python(_IMPORTS_OF_THE_VALUES)
    assert result.returncode == 0, result.stderr[-3000:]
    values, conversions = result.stdout.strip().splitlines()[-2:]
    assert values == "['tf_dtensor._placement_types']"
    assert conversions == str(sorted([
        "tf_dtensor._args", "tf_dtensor._core", "tf_dtensor._errors",
        "tf_dtensor._placement_types", "tf_dtensor.layout", "tf_dtensor.mesh"]))


def test_multi_dim_conversions_on_the_second_axis():
    layout = Layout.from_placements(MESH_2X2, [Shard(1), Shard(1)], 2)
    assert layout.sharding_specs == [U, "x+y"]
    assert layout.placements == (Shard(1), Shard(1))
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"\[\*,y\+x\] @ mesh\(x=2,y=2\) shards axis 1 over `y` then `x`, "
                             r"minor mesh dimension first.*Use the spec 'x\+y' instead"):
        Layout([U, "y+x"], MESH_2X2).placements


def test_parted_and_single_device_layouts_have_no_placements():
    with pytest.raises(tf_dtensor.LayoutError, match="parted layout"):
        Layout(["x", U], MESH_2X2).to_parted().placements
    with pytest.raises(tf_dtensor.LayoutError, match="single_device layout"):
        Layout.from_device("CPU:0").placements


# ---------------------------------------------------------------------------------------
# init_device_mesh
# ---------------------------------------------------------------------------------------

def test_init_device_mesh_names_and_devices():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    assert mesh == MESH_2X2
    assert init_device_mesh("CPU", (4,), ("x",)) == MESH_4
    unnamed = init_device_mesh("cpu", (2, 2))
    assert unnamed.dim_names == ["dim_0", "dim_1"] and unnamed.shape() == [2, 2]
    assert init_device_mesh("cpu", 2).short() == "mesh(dim_0=2)"


def test_init_device_mesh_errors():
    with pytest.raises(tf_dtensor.MeshError, match="needs 16 CPU devices but this client has 8"):
        init_device_mesh("cpu", (4, 4))
    with pytest.raises(tf_dtensor.MeshError, match="one name per dimension"):
        init_device_mesh("cpu", (2, 2), ("x",))
    with pytest.raises(tf_dtensor.MeshError):
        init_device_mesh("cpu", (2, 2), ("x", "x"))


# ---------------------------------------------------------------------------------------
# Every combination: distribute, read back, redistribute, from_local, gradients
# ---------------------------------------------------------------------------------------

def _loss(t):
    return tf.reduce_sum(tf.square(full_tensor(t)))


@pytest.mark.parametrize("mesh,combo,shape", COMBOS)
def test_every_placement_against_one_device(mesh, combo, shape):
    x = random_array(shape, seed=len(COMBOS))
    layout = Layout.from_placements(mesh, combo, len(shape))
    t = distribute_tensor(tf.constant(x), mesh, combo)
    _check_value(x, layout, t)
    assert placements_of(t) == tuple(combo)

    # full_tensor: a regular tensor with the whole value.
    whole = full_tensor(t)
    assert not dtensor.is_dtensor(whole) and whole.dtype == tf.float32
    assert_values_equal(x, whole.numpy())

    # An op on the distributed value agrees with one device; the mean counts every element.
    assert_values_equal(np.mean(x * 2.0 + 1.0, axis=0),
                        full_tensor(tf.reduce_mean(t * 2.0 + 1.0, axis=0)).numpy())

    # to_local / from_local round trip, with the global shape checked.
    back = from_local(to_local(t), mesh, combo, shape=shape)
    _check_value(x, layout, back)

    # redistribute to fully replicated, to the other combinations' first entries, and back.
    for target in ([Replicate()] * len(mesh.dim_names), [Shard(1)] + [Replicate()] * (
            len(mesh.dim_names) - 1)):
        moved = redistribute(t, target)
        _check_value(x, Layout.from_placements(mesh, target, 2), moved)
        _check_value(x, layout, redistribute(moved, combo))

    # Gradients through distribute_tensor and full_tensor (eager): d sum(x^2) = 2x, a
    # regular tensor like the input.
    xc = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xc)
        loss = _loss(distribute_tensor(xc, mesh, combo))
    grad = tape.gradient(loss, xc)
    assert not dtensor.is_dtensor(grad)
    assert_values_equal(2.0 * x, grad.numpy())
    assert_values_equal(np.sum(x * x), loss.numpy())


@pytest.mark.parametrize("mesh,combo,shape", COMBOS)
def test_every_placement_inside_tf_function(mesh, combo, shape):
    x = random_array(shape, seed=7)
    replicated = dtensor.copy_to_mesh(tf.constant(x), Layout.replicated(mesh, 2))
    layout = Layout.from_placements(mesh, combo, 2)

    @tf.function
    def step(r):
        with tf.GradientTape() as tape:
            tape.watch(r)
            t = redistribute(r, combo, mesh=mesh)
            scaled = t * 3.0
            whole = full_tensor(scaled, mesh=mesh)
            loss = tf.reduce_sum(tf.square(whole))
        return t, whole, tf.reduce_mean(t), tape.gradient(loss, r)

    t, whole, mean, grad = step(replicated)
    _check_value(x, layout, t)
    assert dtensor.fetch_layout(whole) == Layout.replicated(mesh, 2)
    assert_values_equal(3.0 * x, whole.numpy())
    assert_values_equal(np.float32(x.mean()), full_tensor(mean).numpy())
    assert_values_equal(18.0 * x, full_tensor(grad).numpy())

    # distribute_tensor of a regular tensor inside a function run on the mesh.
    @tf.function
    def distribute(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(tf.square(distribute_tensor(v, mesh, combo)))
        return distribute_tensor(v, mesh, combo), tape.gradient(loss, v)

    with dtensor.run_on(mesh):
        inside, grad = distribute(tf.constant(x))
    _check_value(x, layout, inside)
    assert_values_equal(2.0 * x, full_tensor(grad).numpy())


@pytest.mark.parametrize("mesh,combo,shape", [p for p in COMBOS if p.values[2] == (5, 3)])
def test_distribute_tensor_inside_tf_function_needs_no_run_on(mesh, combo, shape):
    # Called with a regular tensor and outside `run_on`, the function ran on a regular
    # device and failed on the relayout; it now runs on the mesh and gives what eager does.
    x = random_array(shape, seed=11)
    layout = Layout.from_placements(mesh, combo, 2)
    eager = distribute_tensor(tf.constant(x) * 2.0, mesh, combo)

    @tf.function
    def distribute(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            t = distribute_tensor(v * 2.0, device_mesh=mesh, placements=combo)
            loss = tf.reduce_sum(tf.square(full_tensor(t, mesh=mesh)))
        return t, tape.gradient(loss, v)

    inside, grad = distribute(tf.constant(x))
    _check_value(2.0 * x, layout, inside)
    assert dtensor.fetch_layout(inside) == dtensor.fetch_layout(eager)
    assert_values_equal(full_tensor(eager).numpy(), full_tensor(inside).numpy())
    assert_values_equal(8.0 * x, full_tensor(grad).numpy())


@pytest.mark.parametrize("mesh,combo,shape", COMBOS)
def test_from_local_gradient_is_each_devices_block(mesh, combo, shape):
    x = random_array(shape, seed=3)
    c = random_array(shape, seed=4)
    layout = Layout.from_placements(mesh, combo, 2)
    blocks = to_local(distribute_tensor(tf.constant(x), mesh, combo))
    with tf.GradientTape() as tape:
        tape.watch(blocks)
        t = from_local(blocks, mesh, combo)
        loss = tf.reduce_sum(full_tensor(t) * c)
    grads = tape.gradient(loss, blocks)
    scale = np.prod([mesh.dim_size(n) for n, p in zip(mesh.dim_names, combo)
                     if p == Partial("mean")])
    for grad, (bshape, offset) in zip(grads, layout.device_blocks(shape)):
        region = tuple(slice(o, o + s) for o, s in zip(offset, bshape))
        assert not dtensor.is_dtensor(grad)
        assert_values_equal(c[region] / scale, grad.numpy())


# ---------------------------------------------------------------------------------------
# One local tensor for every device, uneven shapes, the seed's flows
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh,combo,global_shape,grad_of_c", [
    (MESH_4, [Shard(0)], (8, 3), lambda c: c.reshape(4, 2, 3).sum(0)),
    (MESH_4, [Replicate()], (2, 3), lambda c: c),
    (MESH_4, [Partial("sum")], (2, 3), lambda c: 4 * c),
    (MESH_4, [Partial("mean")], (2, 3), lambda c: c),
    (MESH_4, [Partial("max")], (2, 3), lambda c: c),
    (MESH_2X2, [Replicate(), Shard(0)], (4, 3), lambda c: c.reshape(2, 2, 3).sum(0)),
    (MESH_2X2, [Shard(1), Partial("sum")], (2, 6), lambda c: 2 * (c[:, :3] + c[:, 3:])),
], ids=lambda v: format_placements(v) if isinstance(v, list) else None)
def test_from_local_one_tensor_is_every_devices_block(mesh, combo, global_shape, grad_of_c):
    local = tf.constant(random_array((2, 3), seed=5))
    c = random_array(global_shape, seed=6)
    with tf.GradientTape() as tape:
        tape.watch(local)
        t = from_local(local, mesh, combo)
        loss = tf.reduce_sum(full_tensor(t) * c)
    assert tuple(t.shape) == global_shape and placements_of(t) == tuple(combo)
    assert all(np.array_equal(b.numpy(), local.numpy()) for b in to_local(t))
    assert_values_equal(grad_of_c(c), tape.gradient(loss, local).numpy())


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, tf.bfloat16.as_numpy_dtype])
@pytest.mark.parametrize("combo", [[Shard(0), Shard(1)], [Partial("max"), Replicate()],
                                   [Replicate(), Partial("sum")]], ids=format_placements)
def test_dtypes_survive(dtype, combo):
    x = random_array((5, 3), dtype=np.int32, low=-3, high=3).astype(dtype)
    t = distribute_tensor(tf.constant(x), MESH_2X2, combo)
    assert t.dtype == tf.as_dtype(dtype) and tuple(t.shape) == (5, 3)
    for whole in (full_tensor(t), full_tensor(from_local(to_local(t), MESH_2X2, combo))):
        assert whole.dtype == tf.as_dtype(dtype)
        np.testing.assert_array_equal(x, whole.numpy())


def test_reductions_a_dtype_lacks_name_the_placements():
    # Refused where the placements are given (it was at the first reduction).
    with pytest.raises(tf_dtensor.RelayoutError,
                       match=r"`distribute_tensor` to placements \[R, P\(sum\)\] @ "
                             r"mesh\(x=2,y=2\): .*pending sum.*string"):
        distribute_tensor(tf.constant(["a", "b"]), MESH_2X2, [Replicate(), Partial("sum")])


def test_booleans_sum_as_a_logical_or():
    # As TF's collective ops reduce them (over an int32 wire), in every lowering.
    t = distribute_tensor(tf.constant([True, False]), MESH_2X2, [Replicate(), Partial("sum")])
    np.testing.assert_array_equal(full_tensor(t).numpy(), [True, False])


def test_mean_over_uneven_shards_counts_the_true_number_of_rows():
    # PyTorch users reported silent wrong means here: 5 rows on 4 devices (2, 2, 1, 0).
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    t = distribute_tensor(tf.constant(x), MESH_4, [Shard(0)])
    assert [b.shape[0] for b in to_local(t)] == [2, 2, 1, 0]
    for run in (tf.reduce_mean, tf.function(tf.reduce_mean)):
        assert_values_equal(np.float32(x.mean()), full_tensor(run(t)).numpy())
    assert_values_equal(x.mean(0), full_tensor(tf.reduce_mean(t, 0)).numpy())


def test_from_local_uneven_blocks_and_shape_check():
    blocks = [tf.ones([2, 3]), tf.ones([2, 3]), tf.ones([1, 3]), tf.zeros([0, 3])]
    t = from_local(blocks, MESH_4, [Shard(0)], shape=(5, 3))
    assert tuple(t.shape) == (5, 3)
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"`from_local`: the blocks make a tensor of shape \[5, 3\] for "
                             r"\[S\(0\)\] @ mesh\(x=4\), but `shape` is \[6, 3\]"):
        from_local(blocks, MESH_4, [Shard(0)], shape=(6, 3))


def test_from_local_wrong_blocks_name_the_placements():
    with pytest.raises(tf_dtensor.PackError,
                       match=r"`from_local` with \[R, S\(0\)\] @ mesh\(x=2,y=2\): .*4"):
        from_local([tf.ones([2, 3])] * 3, MESH_2X2, [Replicate(), Shard(0)])


def test_seed_flows_on_a_2x2_mesh():
    # Row-wise, column-wise, replicated; an all-gather rebuilds the global tensor.
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    x = random_array((4, 4), seed=8)
    t = distribute_tensor(tf.constant(x), mesh, [Replicate(), Shard(0)])
    assert [b.shape for b in to_local(t)] == [(2, 4)] * 4
    chain = [[Shard(0), Shard(1)], [Replicate(), Shard(1)], [Partial(), Replicate()],
             [Shard(1), Replicate()], [Replicate(), Replicate()]]
    for placements in chain:
        t = redistribute(t, placements)
        assert placements_of(t) == tuple(placements)
        assert_values_equal(x, full_tensor(t).numpy())


# ---------------------------------------------------------------------------------------
# Messages speak placements
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,message", [
    (lambda x: distribute_tensor(x, MESH_2X2, [Shard(0)]), tf_dtensor.LayoutError,
     r"`distribute_tensor`: \[S\(0\)\] has 1 placement\(s\) but mesh\(x=2,y=2\) has 2 "
     r"dimension\(s\); give one placement per mesh dimension"),
    (lambda x: distribute_tensor(x, MESH_2X2, [Shard(2), Replicate()]), tf_dtensor.LayoutError,
     r"`distribute_tensor`: S\(2\) on mesh dimension `x` of \[S\(2\), R\] @ mesh\(x=2,y=2\) "
     r"names axis 2, but the tensor has rank 2; use an axis in \[-2, 2\)"),
    (lambda x: distribute_tensor(x, MESH_2X2, [Partial("median"), Replicate()]), ValueError,
     r"Partial\(reduce_op\): 'median' is not one of avg, max, mean, min, prod, product, sum"),
    (lambda x: distribute_tensor(x, MESH_2X2, [Shard(0), "R"]), TypeError,
     r"'R' in `placements` is not a placement"),
    (lambda x: distribute_tensor(x, "mesh", [Shard(0)]), tf_dtensor.MeshError,
     r"`distribute_tensor` takes a `Mesh`"),
    (lambda x: redistribute(x, [Shard(0)]), tf_dtensor.LayoutError,
     r"`redistribute` takes a DTensor"),
    (lambda x: Layout.from_placements(MESH_4, [Shard(0), Shard(1)], 2), tf_dtensor.LayoutError,
     r"`Layout.from_placements`: \[S\(0\), S\(1\)\] has 2 placement"),
    (lambda x: placements_of([1.0]), tf_dtensor.LayoutError, r"`placements_of` takes a DTensor"),
    (lambda x: to_local(x), tf_dtensor.LayoutError, r"`to_local` takes a DTensor"),
])
def test_error_messages(call, error, message):
    with pytest.raises(error, match=message):
        call(tf.ones([4, 6]))


def test_traced_functions_explain_what_they_need():
    t = distribute_tensor(tf.ones([4, 6]), MESH_2X2, [Shard(0), Replicate()])
    with pytest.raises(RuntimeError, match=r"`redistribute` was called while tracing.*"
                                           r"Pass `mesh=`"):
        tf.function(lambda v: redistribute(v, [Replicate(), Replicate()]))(t)
    with pytest.raises(RuntimeError, match=r"`full_tensor` was called while tracing"):
        tf.function(full_tensor)(t)
    with pytest.raises(RuntimeError, match=r"`from_local` places blocks on devices"):
        tf.function(lambda v: from_local(v, MESH_2X2, [Replicate(), Replicate()]))(t)


# ---------------------------------------------------------------------------------------
# PyTorch's signatures and defaults
# ---------------------------------------------------------------------------------------

def test_placements_default_to_replicate_and_the_mesh_to_the_default_mesh():
    # PyTorch replicates when `placements` is omitted and takes the mesh of the enclosing
    # `with device_mesh:`; both raised TypeError here.
    x = random_array((5, 3), seed=12)
    for t in (distribute_tensor(tf.constant(x), MESH_2X2),
              from_local(tf.constant(x), device_mesh=MESH_2X2)):
        _check_value(x, Layout.replicated(MESH_2X2, 2), t)
        assert placements_of(t) == (Replicate(), Replicate())
    with dtensor.default_mesh(MESH_4):
        t = distribute_tensor(tf.constant(x), placements=[Shard(0)])
        back = from_local(to_local(t), placements=[Shard(0)], shape=(5, 3))
    for u in (t, back):
        _check_value(x, Layout(["x", U], MESH_4), u)
    with pytest.raises(TypeError, match=r"`distribute_tensor` needs a mesh .*"
                                        r"`dtensor.default_mesh\(mesh\)`"):
        distribute_tensor(tf.constant(x), placements=[Shard(0)])


def test_redistribute_takes_pytorchs_argument_order_and_device_mesh():
    # `t.redistribute(device_mesh, placements)` becomes `redistribute(t, mesh, placements)`;
    # that raised "takes a `Mesh` as `mesh`; got list", and `device_mesh=` a TypeError.
    x = random_array((5, 6), seed=13)
    t = distribute_tensor(tf.constant(x), MESH_2X2, [Shard(0), Replicate()])
    target = [Replicate(), Shard(1)]
    layout = Layout.from_placements(MESH_2X2, target, 2)
    for moved in (redistribute(t, MESH_2X2, target),
                  redistribute(t, device_mesh=MESH_2X2, placements=target),
                  redistribute(t, placements=target, mesh=MESH_2X2),
                  tf.function(lambda v: redistribute(v, MESH_2X2, target))(t),
                  tf.function(lambda v: redistribute(v, target, device_mesh=MESH_2X2))(t)):
        _check_value(x, layout, moved)
    # To another mesh, in PyTorch's order.
    _check_value(x, Layout(["x", U], MESH_4), redistribute(t, MESH_4, [Shard(0)]))
    with pytest.raises(TypeError, match=r"`redistribute` got both `mesh` and `device_mesh`"):
        redistribute(t, target, mesh=MESH_2X2, device_mesh=MESH_4)


def test_from_local_checks_pytorchs_stride():
    # PyTorch passes `shape` and `stride` together; `stride` was an unknown keyword.
    blocks = to_local(distribute_tensor(tf.ones([5, 3]), MESH_4, [Shard(0)]))
    t = from_local(blocks, MESH_4, [Shard(0)], shape=(5, 3), stride=(3, 1))
    assert tuple(t.shape) == (5, 3) and placements_of(t) == (Shard(0),)
    assert tuple(from_local(tf.ones([2, 0]), MESH_4, [Shard(0)], stride=[1, 1]).shape) == (8, 0)
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"`from_local`: `stride` \[1, 5\] is not the row-major stride "
                             r"\[3, 1\] of the global shape \[5, 3\] .* \[S\(0\)\] @ "
                             r"mesh\(x=4\).* pass \(3, 1\) or no `stride`"):
        from_local(blocks, MESH_4, [Shard(0)], shape=(5, 3), stride=(1, 5))


def test_partial_takes_pytorchs_reduction_names():
    # PyTorch names the product "product" (it raised ValueError) and asks
    # `is_partial(reduce_op)` (it raised TypeError).
    assert Partial("product") == Partial("prod")
    t = distribute_tensor(tf.constant([2.0, 3.0]), MESH_4, [Partial("product")])
    assert placements_of(t) == (Partial("prod"),)
    assert_values_equal(np.array([2.0, 3.0], np.float32), full_tensor(t).numpy())
    assert Partial().is_partial() and Partial().is_partial("sum")
    assert Partial("avg").is_partial("avg") and Partial("avg").is_partial("mean")
    assert not Partial().is_partial("max") and not Partial("max").is_partial("min")
    assert not Replicate().is_partial("sum") and not Shard(0).is_partial()


def test_to_local_and_placements_of_name_themselves():
    # Inside a tf.function they blamed `unpack` / `fetch_layout`, which the user never
    # called; placements_of of a regular tensor named fetch_layout too.
    t = distribute_tensor(tf.ones([4, 6]), MESH_2X2, [Shard(0), Replicate()])
    with pytest.raises(RuntimeError, match=r"`to_local` reads the blocks.*tracing"):
        tf.function(lambda v: to_local(v))(t)
    with pytest.raises(RuntimeError, match=r"`placements_of` reads a layout.*tracing"):
        tf.function(lambda v: tf.identity(v) if placements_of(v) else v)(t)
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"`placements_of` takes a DTensor; got a `EagerTensor`"):
        placements_of(tf.ones([2]))


def test_errors_raised_while_tracing_keep_their_class():
    # AutoGraph rebuilt them as a bare StagingError: `except LayoutError` around the call of
    # a tf.function missed a wrong placement.
    t = distribute_tensor(tf.ones([4, 6]), MESH_2X2, [Shard(0), Replicate()])
    with pytest.raises(tf_dtensor.LayoutError, match=r"`redistribute`: S\(2\) on mesh "
                                                     r"dimension `x` .* has rank 2"):
        tf.function(lambda v: redistribute(v, [Shard(2), Replicate()], mesh=MESH_2X2))(t)
    with pytest.raises(tf_dtensor.LayoutError, match=r"\[S\(0\)\] has 1 placement"):
        tf.function(lambda v: distribute_tensor(v, MESH_2X2, [Shard(0)]))(tf.ones([4]))
    with pytest.raises(tf_dtensor.MeshError, match=r"`redistribute` takes a `Mesh`"):
        tf.function(lambda v: redistribute(v, [Replicate(), Replicate()], mesh="x"))(t)


def test_top_level_names():
    for name in ("Shard", "Replicate", "Partial", "init_device_mesh", "distribute_tensor",
                 "from_local", "to_local", "full_tensor", "redistribute", "placements_of"):
        assert getattr(tf_dtensor, name) is getattr(tf_dtensor.placements, name)


def test_full_tensor_of_a_dvariable_reads_it():
    """`full_tensor` of a DVariable gives its whole value (it used to raise TypeError),
    eagerly and inside a tf.function, and a tape sees the read."""
    value = random_array((5, 3))
    layout = Layout(["x", U], MESH_4)
    variable = dtensor.DVariable(dtensor.pack(
        [value[a:b] for a, b in _row_blocks(5, 4)], layout))
    assert_values_equal(value, full_tensor(variable))
    assert_values_equal(value, dtensor.unpack(
        tf.function(lambda: full_tensor(variable, mesh=MESH_4))())[0])
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(full_tensor(variable) * 2.0)
    grad = tape.gradient(total, variable)
    assert dtensor.fetch_layout(grad) == layout
    assert_values_equal(np.full((5, 3), 2.0, np.float32), full_tensor(grad))


def _row_blocks(rows: int, pieces: int):
    """torch.chunk's row ranges: ceil(rows / pieces) each, the last ones smaller or empty."""
    size = -(-rows // pieces)
    return [(min(i * size, rows), min((i + 1) * size, rows)) for i in range(pieces)]
