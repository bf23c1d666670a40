"""Core 2 layouts: uneven shards and Partial (pending-reduction) layouts.

Every sharded result is checked against one plain device: values, dtype, global shape and
the layout the planner (`debug.explain`) predicts, eagerly, inside `tf.function` and
through gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, assert_values_equal,
                             check_op, collective_lowering, cpus, layout_of, layouts_for,
                             random_array, reassemble, spec_id, to_dtensor)
import tf_dtensor
from tf_dtensor import debug, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESH_4 = dtensor.create_mesh([("x", 4)], devices=cpus(4))
U = UNSHARDED


# ---------------------------------------------------------------------------------------
# Shard geometry
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("size,pieces", [
    (5, [(2, 0), (2, 2), (1, 4), (0, 5)]),   # torch.chunk: ceil-sized, the last one empty
    (8, [(2, 0), (2, 2), (2, 4), (2, 6)]),
    (3, [(1, 0), (1, 1), (1, 2), (0, 3)]),
    (1, [(1, 0), (0, 1), (0, 1), (0, 1)]),
    (0, [(0, 0), (0, 0), (0, 0), (0, 0)]),
])
def test_shard_geometry_follows_torch_chunk(size, pieces):
    layout = Layout(["x"], MESH_4)
    got = [(shape[0], offset[0]) for shape, offset in layout.device_blocks([size])]
    assert got == pieces
    assert layout.is_even([size]) == (size % 4 == 0)


def test_shard_geometry_two_axes():
    layout = Layout(["y", "x"], MESH_2X2)
    assert layout.shard_geometry([3, 5], [1, 0]) == ((1, 3), (2, 0))
    assert layout.shard_geometry([3, 5], [0, 1]) == ((2, 2), (0, 3))
    with pytest.raises(tf_dtensor.LayoutError, match="one entry per axis"):
        layout.shard_geometry([3], [0])


def test_local_shape_from_global_shape_keeps_tf_even_contract():
    # TF's method promises one local shape; uneven shapes have several.
    with pytest.raises(tf_dtensor.LayoutError, match="not divisible"):
        Layout(["x"], MESH_4).local_shape_from_global_shape([5])
    assert Layout(["x"], MESH_4).local_shape([5]) == [2]


# ---------------------------------------------------------------------------------------
# Partial layouts: construction and text forms
# ---------------------------------------------------------------------------------------

def test_partial_layout_forms_round_trip():
    layout = Layout(["x", U], MESH_2X2, partial={"y": "sum"})
    assert layout.short() == "[x,*] +partial(y:sum) @ mesh(x=2,y=2)"
    assert layout.partial == {"y": "sum"} and layout.is_partial
    assert "partial:y=sum," in layout.to_string()
    assert Layout.from_string(layout.to_string()) == layout
    assert layout != Layout(["x", U], MESH_2X2)
    assert layout.without_partial() == Layout(["x", U], MESH_2X2)
    assert hash(layout) != hash(layout.without_partial())
    assert not layout.is_fully_replicated()
    assert "partial={'y': 'sum'}" in repr(layout)
    # A layout without pending reductions keeps TF's string form exactly.
    assert "partial" not in Layout(["x", U], MESH_2X2).to_string()


@pytest.mark.parametrize("specs,partial,message", [
    (["y"], {"y": "sum"}, "already shards an axis"),
    ([U], {"z": "sum"}, "does not have"),
    ([U], {"x": "median"}, "is not one of"),
    ([U], [("x", "sum"), ("x", "max")], "partial twice"),
])
def test_partial_layout_checked_at_construction(specs, partial, message):
    with pytest.raises(tf_dtensor.LayoutError, match=message):
        Layout(specs, MESH_2X2, partial=partial)


def test_partial_layout_has_no_proto():
    with pytest.raises(tf_dtensor.LayoutError, match="LayoutProto cannot hold"):
        Layout([U], MESH_2X2, partial={"x": "sum"}).as_proto()


def test_parted_layout_cannot_be_partial():
    with pytest.raises(tf_dtensor.LayoutError, match="only static layouts"):
        Layout([U], MESH_2X2).to_parted().with_partial({"x": "sum"})


# ---------------------------------------------------------------------------------------
# Uneven shards through pack, relayout and ops
# ---------------------------------------------------------------------------------------

def test_pack_uneven_blocks_and_global_shape():
    layout = Layout(["x"], MESH_4)
    parts = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]), tf.constant([5.0]), tf.zeros([0])]
    packed = dtensor.pack(parts, layout)
    assert packed.shape == (5,)
    assert_dtensor_equal(np.arange(1.0, 6.0, dtype=np.float32), layout, packed)
    assert [p.shape[0] for p in dtensor.unpack(packed)] == [2, 2, 1, 0]


def test_pack_rejects_blocks_the_geometry_does_not_give():
    parts = [tf.constant([1.0]), tf.constant([2.0, 3.0]), tf.constant([4.0]), tf.constant([5.0])]
    with pytest.raises(tf_dtensor.PackError,
                       match=r"pack component 0 has shape \[1\].*block of shape \[2\]"):
        dtensor.pack(parts, Layout(["x"], MESH_4))


@pytest.mark.parametrize("lowering", [
    pytest.param("", id="default"),
    pytest.param("ops", id="ops"),
])
def test_uneven_relayout_moving_both_mesh_dims(lowering):
    """[x,y,*] -> [y,*,x] with axis 1 cut 3, 2 by y (the fuzzer's MaxPool3DGradGrad case
    [2,5,3,2,4] [x,y,*,*,*] -> [y,*,*,*,x] reduced to the relayout). The ops lowering's
    all-to-all reshaped every block alike, though axis 1's blocks differ."""
    value = np.arange(40, dtype=np.float32).reshape(2, 5, 4)
    target = layout_of("[y,*,x]", MESH_2X2)
    with collective_lowering(lowering):
        moved = dtensor.relayout(to_dtensor(value, layout_of("[x,y,*]", MESH_2X2)), target)
    assert_dtensor_equal(value, target, moved)


UNEVEN_SHAPE = (5, 3)


def _uneven_layouts():
    params = []
    for mesh in (MESH_4, MESH_2X2):
        for layout in layouts_for(mesh, UNEVEN_SHAPE, uneven=True):
            if not layout.is_even(UNEVEN_SHAPE):
                params.append(pytest.param(layout, id=f"{spec_id(layout)}@{mesh.short()}"))
    return params


UNARY_OPS = [
    ("Relu", lambda t: tf.nn.relu(t)),
    ("AddV2", lambda t: t + t * 2.0),
    ("Sum", lambda t: tf.reduce_sum(t, axis=0)),
    ("Sum", lambda t: tf.reduce_sum(t, axis=1)),
    ("Mean", lambda t: tf.reduce_mean(t, axis=0)),
    ("Max", lambda t: tf.reduce_max(t, axis=0)),
    ("Min", lambda t: tf.reduce_min(t)),
    ("Softmax", lambda t: tf.nn.softmax(t)),
    ("Transpose", lambda t: tf.transpose(t)),  # perm is a host argument: no check_op
    ("Cumsum", lambda t: tf.cumsum(t, axis=0)),
    ("ConcatV2", lambda t: tf.concat([t, t], axis=1)),
    ("GatherV2", lambda t: tf.gather(t, [4, 0, 2])),
    ("BiasAdd", lambda t: tf.nn.bias_add(t, tf.constant([1.0, 2.0, 3.0]))),
    ("Mul", lambda t: t * tf.constant([[1.0], [2.0], [3.0], [4.0], [5.0]])),
    ("BatchMatMulV2", lambda t: tf.matmul(tf.reshape(t, [1, 5, 3]), tf.ones([3, 2]))),
    ("Tile", lambda t: tf.tile(t, [2, 1])),
    ("Pad", lambda t: tf.pad(t, [[1, 2], [0, 0]])),
    ("ReverseV2", lambda t: tf.reverse(t, [0])),
    ("SplitV", lambda t: tf.split(t, [2, 3], axis=0)[1]),
    ("StridedSlice", lambda t: t[1:4, ::2]),
    ("StridedSliceWhole", lambda t: t[:, 1]),
    ("Slice", lambda t: tf.slice(t, [0, 1], [-1, 2])),
    ("Reshape", lambda t: tf.reshape(t, [15])),
    ("ExpandDims", lambda t: tf.expand_dims(t, 1)),
    ("Squeeze", lambda t: tf.squeeze(tf.expand_dims(t, 0), 0)),
    ("ArgMax", lambda t: tf.argmax(t, axis=1)),
    ("Cumprod", lambda t: tf.math.cumprod(t, axis=1)),
    ("LogSoftmax", lambda t: tf.nn.log_softmax(t, axis=0)),
    ("OneHot", lambda t: tf.one_hot(tf.argmax(t, axis=1), 4)),
    ("SegmentSum", lambda t: tf.math.unsorted_segment_sum(t, [0, 1, 0, 1, 2], 3)),
    ("CrossEntropy", lambda t: tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.constant([0, 1, 2, 0, 1]), t)),
    ("L2Loss", lambda t: tf.nn.l2_loss(t)),
    ("Prod", lambda t: tf.reduce_prod(t, axis=0)),
    ("Fill", lambda t: tf.ones_like(t) + t),
]


@pytest.mark.parametrize("layout", _uneven_layouts())
@pytest.mark.parametrize("op_name,fn", UNARY_OPS,
                         ids=[f"{n}{i}" for i, (n, _) in enumerate(UNARY_OPS)])
def test_ops_on_uneven_shards(op_name, fn, layout):
    array = random_array(UNEVEN_SHAPE, seed=3)
    if op_name == "Relu":
        # Single-op functions: the planner's layout is checked too.
        check_op(fn, op_name, [array], [layout])
    elif op_name == "AddV2":  # the op itself: both its inputs in the layout
        check_op(lambda a, b: a + b, op_name, [array, array], [layout, layout])
    expected = fn(tf.constant(array)).numpy()
    value = to_dtensor(array, layout)
    for run in (fn, tf.function(fn)):
        result = run(value)
        assert tuple(result.shape) == expected.shape
        assert_values_equal(expected, reassemble(result))


@pytest.mark.parametrize("layout", _uneven_layouts()[:6])
def test_matmul_and_gradient_on_uneven_shards(layout):
    a = random_array(UNEVEN_SHAPE, seed=1)
    w = random_array((3, 4), seed=2)

    def loss(x, w):
        return tf.reduce_sum(tf.nn.tanh(tf.matmul(x, w)))

    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            value = loss(x, w)
        return [value] + tape.gradient(value, [x, w])

    expected = [g.numpy() for g in grads(tf.constant(a), tf.constant(w))]
    wl = Layout.replicated(layout.mesh, 2)
    for run in (grads, tf.function(grads)):
        got = run(to_dtensor(a, layout), to_dtensor(w, wl))
        for e, g in zip(expected, got):
            assert tuple(g.shape) == e.shape
            assert_values_equal(e, reassemble(g))


def test_mean_divides_by_the_true_count_with_an_empty_shard():
    # 5 rows over 4 devices: the last device holds none; the mean still divides by 5.
    array = np.arange(10, dtype=np.float32).reshape(5, 2)
    value = to_dtensor(array, Layout(["x", U], MESH_4))
    for run in (lambda t: tf.reduce_mean(t, 0), tf.function(lambda t: tf.reduce_mean(t, 0))):
        assert_values_equal(array.mean(0), reassemble(run(value)))


def test_dvariable_with_uneven_shards_trains():
    layout = Layout(["x", U], MESH_4)
    init = random_array((5, 2), seed=4)
    variable = dtensor.DVariable(to_dtensor(init, layout))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable * variable)
        variable.assign_sub(0.25 * tape.gradient(loss, variable))

    step()
    assert dtensor.fetch_layout(variable.read_value()) == layout
    assert_values_equal(init * 0.5, reassemble(variable.read_value()))


# ---------------------------------------------------------------------------------------
# Partial values: relayout and ops
# ---------------------------------------------------------------------------------------

def _partial(array, specs, partial, mesh=MESH_2X2):
    """A DTensor of `array` with pending reductions: made by relayout from replicated."""
    return to_dtensor(array, Layout(specs, mesh, partial=partial))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("target", ["[*,*]", "[y,*]", "[*,y]", "[x,y]", "[y,x]"])
def test_relayout_resolves_partial(op, target):
    array = random_array((4, 6), seed=5)
    value = _partial(array, [U, U], {"y": op})
    assert dtensor.fetch_layout(value).partial == {"y": op}
    assert_values_equal(array, reassemble(value))   # the terms reduce to the value
    body = target.strip("[]").split(",")
    layout = Layout([U if s == "*" else s for s in body], MESH_2X2)
    for run in (dtensor.relayout, tf.function(dtensor.relayout, reduce_retracing=True)):
        assert_dtensor_equal(array, layout, run(value, layout))


def test_sharded_to_partial_and_back():
    array = random_array((4, 6), seed=6)
    sharded = to_dtensor(array, Layout(["x", "y"], MESH_2X2))
    target = Layout(["x", U], MESH_2X2, partial={"y": "sum"})
    partial = dtensor.relayout(sharded, target)
    assert_dtensor_equal(array, target, partial)
    # The sum terms: the first device along y holds the block, the other zeros.
    terms = [c.numpy() for c in dtensor.unpack(partial)]
    assert np.count_nonzero(terms[1]) == 0 and np.array_equal(terms[0], array[:2])
    assert_dtensor_equal(array, Layout(["x", "y"], MESH_2X2), dtensor.relayout(partial, Layout(["x", "y"], MESH_2X2)))


LINEAR_CASES = [
    # (name, fn, number of partial inputs, stays partial)
    ("add", lambda p, q, r: p + q, True),
    ("sub", lambda p, q, r: p - q, True),
    ("neg", lambda p, q, r: -p, True),
    ("scale", lambda p, q, r: p * r, True),
    ("div", lambda p, q, r: p / (r * r + 1.0), True),
    ("matmul", lambda p, q, r: tf.matmul(p, tf.transpose(r)), True),
    ("transpose", lambda p, q, r: tf.transpose(p), True),
    ("reduce_sum", lambda p, q, r: tf.reduce_sum(p, axis=0), True),
    ("reshape", lambda p, q, r: tf.reshape(p, [24]), True),
    ("exp", lambda p, q, r: tf.exp(p), False),
    ("mul_pp", lambda p, q, r: p * q, False),
    ("add_pr", lambda p, q, r: p + r, False),
]


@pytest.mark.parametrize("name,fn,stays", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_linear_ops_keep_partial_and_nonlinear_ones_reduce(name, fn, stays):
    a, b, c = (random_array((4, 6), seed=s) for s in (7, 8, 9))
    expected = fn(tf.constant(a), tf.constant(b), tf.constant(c)).numpy()
    p = _partial(a, [U, U], {"y": "sum"})
    q = _partial(b, [U, U], {"y": "sum"})
    r = to_dtensor(c, Layout.replicated(MESH_2X2, 2))
    result = fn(p, q, r)
    assert dtensor.fetch_layout(result).is_partial == stays, dtensor.fetch_layout(result).short()
    assert_values_equal(expected, reassemble(result))
    assert_values_equal(expected, reassemble(tf.function(fn)(p, q, r)))


def test_function_defers_contraction_reduction_to_first_nonlinear_use():
    x = random_array((4, 6), seed=10)
    w = random_array((6, 3), seed=11)
    xs = to_dtensor(x, Layout([U, "x"], MESH_2X2))
    ws = to_dtensor(w, Layout(["x", U], MESH_2X2))

    @tf.function
    def f(x, w):
        h = tf.matmul(x, w)      # partial(x:sum): the all-reduce is deferred ...
        h = 2.0 * h + h          # ... through linear ops ...
        return tf.nn.relu(h), h  # ... to relu; the plain result is settled on return

    relu, linear = f(xs, ws)
    expected = 3.0 * x @ w
    assert_dtensor_equal(np.maximum(expected, 0), Layout.replicated(MESH_2X2, 2), relu)
    assert_dtensor_equal(expected, Layout.replicated(MESH_2X2, 2), linear)
    # Eagerly on plain inputs the product is reduced at once, as in TF DTensor.
    assert not dtensor.fetch_layout(tf.matmul(xs, ws)).is_partial


def test_partial_gradient_through_function():
    a = random_array((4, 6), seed=12)
    w = random_array((6, 3), seed=13)
    p = _partial(a, [U, U], {"x": "mean"})
    wd = to_dtensor(w, Layout.replicated(MESH_2X2, 2))

    def grads(p, w):
        with tf.GradientTape() as tape:
            tape.watch([p, w])
            loss = tf.reduce_sum(tf.square(tf.matmul(p, w)))
        return tape.gradient(loss, [p, w])

    expected = [g.numpy() for g in grads(tf.constant(a), tf.constant(w))]
    for run in (grads, tf.function(grads)):
        for e, g in zip(expected, run(p, wd)):
            assert_values_equal(e, reassemble(g))


def test_explain_shows_where_partial_is_reduced():
    p = Layout([U, U], MESH_2X2, partial={"y": "sum"})
    plan = debug.explain("Relu", [p], [[4, 6]])
    assert plan["collectives"] == ["input 0: all-reduce(sum) [*,*] +partial(y:sum) over y"]
    assert not plan["outputs"][0].is_partial
    plan = debug.explain("AddV2", [p, p], [[4, 6], [4, 6]])
    assert plan["outputs"][0] == p
    assert "outputs stay partial(y:sum)" in plan["collectives"]
    plan = debug.explain("MatMul", [p, Layout(["x", U], MESH_2X2)], [[4, 6], [6, 3]])
    assert plan["outputs"][0].partial == {"y": "sum", "x": "sum"}
