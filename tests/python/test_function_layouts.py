"""Layouts asked for inside tf.function (cc/graph/function_expander.cc and the request
solver, cc/propagation): `call_with_layout` of a function, whose request reaches the ops
that create the value, and `relayout` inside a function, with gradients through it.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, layout_of, random_array, reassemble,
                             run_python, spec_params, to_dtensor)
from function_testing import check_function, no_relayout
from tf_dtensor import dtensor

# Shared by the sections below.
_A = random_array((8, 8), seed=1)
_B = random_array((8, 4), seed=2)


# ---------------------------------------------------------------------------------------
# call_with_layout(tf.function(...))
# ---------------------------------------------------------------------------------------

_CREATION_LAYOUTS = (spec_params(MESH_1D, ("[x,*]",), ("[*,x]",), ("[*,*]",))
                     + spec_params(MESH_2X2, ("[x,y]",), ("[y,x]",), ("[*,y]",), ("[x,*]",))
                     + spec_params(MESH_8, ("[x,*]",), ("[*,x]",)))


@tf.function
def _ones_times_two_plus_one():
    return tf.ones([16, 8]) * 2.0 + 1.0


@tf.function
def _xavier_uniform(shape, seed, dtype=tf.float32):
    # As the DTensor training guide initialises its dense layers.
    fan_in, fan_out = shape
    limit = tf.math.sqrt(6.0 / (fan_in + fan_out))
    return tf.random.stateless_uniform(shape, seed=seed, minval=-limit, maxval=limit,
                                       dtype=dtype)


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_ones_arithmetic(layouts):
    (layout,) = layouts
    result = dtensor.call_with_layout(_ones_times_two_plus_one, layout)
    assert_dtensor_equal(np.full((16, 8), 3.0, np.float32), layout, result)


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_xavier_uniform_matches_one_device(layouts):
    (layout,) = layouts
    expected = _xavier_uniform(shape=(16, 8), seed=(3, 4))
    result = dtensor.call_with_layout(_xavier_uniform, layout, shape=(16, 8), seed=(3, 4))
    assert_dtensor_equal(expected, layout, result)
    limit = np.sqrt(6.0 / 24)
    values = reassemble(result)
    assert np.all(np.abs(values) <= limit) and values.std() > limit / 4


@pytest.mark.parametrize("layouts", _CREATION_LAYOUTS)
def test_call_with_layout_stateless_normal_with_tensor_seed(layouts):
    (layout,) = layouts
    normal = tf.function(tf.random.stateless_normal)
    seed = tf.constant([7, 8])
    expected = normal(shape=[16, 8], seed=seed)
    result = dtensor.call_with_layout(normal, layout, shape=[16, 8], seed=seed)
    assert_dtensor_equal(expected, layout, result)


_BROADCAST_CREATIONS = {
    "rank1_fill": lambda: tf.ones([8, 4]) + tf.fill([4], 2.0),
    "row_broadcast": lambda: tf.ones([1, 4]) * 3.0 + tf.zeros([8, 4]),
    "column_broadcast": lambda: tf.zeros([8, 4]) + tf.ones([8, 1]) * 2.0,
    "range": lambda: tf.ones([8, 4]) * tf.range(4.0),
    "random_product": lambda: (tf.random.stateless_uniform([8, 4], seed=[1, 2])
                               * tf.random.stateless_normal([4], seed=[3, 4])),
    "transpose_of_range": lambda: tf.transpose(tf.reshape(tf.range(32.0), [4, 8])),
}


@pytest.mark.parametrize("name", sorted(_BROADCAST_CREATIONS))
def test_call_with_layout_request_reaches_smaller_operands(name, mesh_2x2):
    # The request passes back through pointwise ops to operands of other shapes (a row,
    # a column, a rank-1 value), which cannot take it whole.
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(_BROADCAST_CREATIONS[name])
    assert_dtensor_equal(f(), layout, dtensor.call_with_layout(f, layout))


def _new_spmd_functions(before):
    """FunctionDefs of the SPMD functions expanded since `before` (a set of names)."""
    from tensorflow.python.eager import context
    names = [n for n in context.context().list_function_names()
             if "_tfd_spmd_" in n and n not in before]
    return [context.context().get_function_def(n) for n in names]


def _spmd_function_names():
    from tensorflow.python.eager import context
    return set(context.context().list_function_names())


@tf.function
def _ones_through_matmul_transpose_sum(a):
    w = tf.ones([64, 64])  # 1000 elements or more: a Fill op, not a constant
    return tf.reduce_sum(tf.matmul(a, tf.transpose(w)), axis=0, keepdims=True)


@pytest.mark.parametrize("mesh,spec,local_dims", [
    (MESH_1D, "[*,x]", [32, 64]),
    (MESH_2X2, "[*,y]", [32, 64]),
], ids=["[*,x]", "[*,y]"])
def test_call_with_layout_request_passes_back_through_matmul_transpose_and_sum(
        mesh, spec, local_dims):
    # MatMul, Transpose and Sum were not among the ops a request passed through before the
    # solver (cc/propagation/propagate.h): now their rules' Backward send the request
    # [*,x] on the result to the product ([*,x]), to transpose(w) ([*,x]) and to w
    # ([x,*]), so the ones are created sharded and the result needs no relayout.
    array = random_array((4, 64), seed=21)
    a = to_dtensor(array, layout_of("[*,*]", mesh))
    layout = layout_of(spec, mesh)
    before = _spmd_function_names()
    result = dtensor.call_with_layout(_ones_through_matmul_transpose_sum, layout, a)
    assert_dtensor_equal(_ones_through_matmul_transpose_sum(tf.constant(array)), layout, result)
    (expanded,) = _new_spmd_functions(before)
    nodes = {node.name: node for node in expanded.node_def}
    fills = [node for node in expanded.node_def if node.op == "Fill"]
    assert fills
    for fill in fills:
        dims = nodes[fill.input[0].split(":")[0]]
        assert list(tf.make_ndarray(dims.attr["value"].tensor)) == local_dims
    relayouts = [node.op for node in expanded.node_def
                 if node.op in ("Split", "SplitV", "Slice", "StridedSlice")]
    assert not relayouts


def test_call_with_layout_creation_into_dvariable(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    v = dtensor.DVariable(dtensor.call_with_layout(_xavier_uniform, layout, shape=(8, 4),
                                                   seed=(1, 2)))
    assert v.layout == layout
    assert_dtensor_equal(_xavier_uniform((8, 4), (1, 2)), layout, v.read_value())


# ---------------------------------------------------------------------------------------
# relayout inside tf.function
# ---------------------------------------------------------------------------------------

_RELAYOUT_CASES = (spec_params(MESH_1D, ("[x,*]", "[*,*]"), ("[*,*]", "[*,x]"),
                               ("[x,*]", "[*,x]"))
                   + spec_params(MESH_2X2, ("[x,y]", "[*,*]"), ("[*,*]", "[y,x]"),
                                 ("[x,*]", "[*,x]"), ("[x,y]", "[y,x]"))
                   + spec_params(MESH_8, ("[x,*]", "[*,x]")))


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_relayout_inside_function_is_honoured(layouts):
    source, target = layouts

    def program(a, relayout=dtensor.relayout):
        moved = relayout(a * 2.0, target)
        return moved, moved + 1.0

    moved, plus_one = check_function(program, [_A], [source],
                                     reference=lambda a: program(a, relayout=no_relayout))
    assert dtensor.fetch_layout(moved) == target
    assert dtensor.fetch_layout(plus_one) == target


def _relayout_loss(a, w, target):
    return tf.reduce_sum(tf.sin(dtensor.relayout(a, target)) * w)


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_gradient_flows_through_relayout_in_function_eager_tape(layouts):
    source, target = layouts
    w = random_array((8, 8), seed=30)
    loss_fn = tf.function(_relayout_loss)
    x, wd = to_dtensor(_A, source), to_dtensor(w, target)

    def grad(loss):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(x, wd, target)
        return value, tape.gradient(value, x)

    eager_loss, eager_grad = grad(_relayout_loss)
    loss, got = grad(loss_fn)
    expected = np.cos(_A) * w
    assert_values_equal(expected, reassemble(eager_grad))
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager_grad), got)
    assert_dtensor_equal(np.sum(np.sin(_A) * w, dtype=np.float32),
                         dtensor.fetch_layout(eager_loss), loss)


@pytest.mark.parametrize("layouts", _RELAYOUT_CASES)
def test_gradient_flows_through_relayout_in_function_tape_inside(layouts):
    source, target = layouts
    w = random_array((8, 8), seed=30)

    def grads(a, w):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = _relayout_loss(a, w, target)
        return tape.gradient(loss, a)

    expected = np.cos(_A) * w
    eager = grads(to_dtensor(_A, source), to_dtensor(w, target))
    assert_values_equal(expected, reassemble(eager))
    got = tf.function(grads)(to_dtensor(_A, source), to_dtensor(w, target))
    assert got is not None, "tape.gradient through dtensor.relayout in tf.function is None"
    assert_dtensor_equal(expected, dtensor.fetch_layout(eager), got)


def test_gradient_through_relayout_of_a_pending_sum_leaves_the_function_settled(mesh_2x2):
    # The relayout's input is a matmul whose contracted axis is sharded (a sum the
    # expansion defers); the relayout's gradient (relayout_like) takes that input's layout,
    # pending sums included. Those were the expansion's own, not the user's: the gradient
    # must leave the function reduced (it came back `[*,*] +partial(x,y)`, whose components
    # are summands: 32 and 0 where the gradient is 64).
    w = dtensor.DVariable(to_dtensor(np.ones([4, 6], np.float32), layout_of("[y,*]", mesh_2x2)))
    x = to_dtensor(np.ones([8, 4], np.float32), layout_of("[x,*]", mesh_2x2))
    target = layout_of("[x,y]", mesh_2x2)

    @tf.function
    def grads(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(dtensor.relayout(tf.matmul(x, w), target)))
        return tape.gradient(loss, w)

    g = grads(x)
    layout = dtensor.fetch_layout(g)
    assert not layout.is_partial, f"the gradient left the function pending: {layout}"
    assert_dtensor_equal(np.full([4, 6], 64.0, np.float32), layout, g)
    w.assign_sub(dtensor.relayout(0.01 * g, w.layout))
    assert_values_equal(np.full([4, 6], 1 - 0.64, np.float32), reassemble(w.read_value()))


def test_relayout_of_created_values_under_run_on(mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(lambda: dtensor.relayout(tf.ones([8, 4]) * 3.0, layout))
    with dtensor.run_on(mesh_2x2):
        result = f()
    assert_dtensor_equal(np.full((8, 4), 3.0, np.float32), layout, result)


_TRACE_FIRST = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tf_dtensor import dtensor
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    f = tf.function(lambda a: dtensor.relayout(a * 2.0, layout))
    # Traced before any DTensor exists (as a training step traced ahead of time).
    f.get_concrete_function(tf.TensorSpec([4, 2], tf.float32))
    x = dtensor.copy_to_mesh(tf.ones([4, 2]), dtensor.Layout.replicated(mesh, 2))
    y = f(x)
    assert dtensor.fetch_layout(y) == layout, dtensor.fetch_layout(y)
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in dtensor.unpack(y)]),
                                  np.full([4, 2], 2.0, np.float32))
    print("ok")
""")


def test_relayout_traced_before_the_device_is_first_used():
    # A fresh process: in this one the device is registered already.
    result = run_python(_TRACE_FIRST, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_relayout_of_plain_tensor_in_function_without_mesh_scope(mesh_2x2):
    # With no DTensor input and no mesh in scope the call never reaches tf_dtensor; the
    # relayout then fails with a message saying how to run it, and works under run_on.
    layout = layout_of("[x,y]", mesh_2x2)
    f = tf.function(lambda: dtensor.relayout(tf.ones([8, 4]) * 3.0, layout))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"run_on\(mesh\)"):
        f()
    with dtensor.run_on(mesh_2x2):
        got = f()
    assert_dtensor_equal(np.full((8, 4), 3.0, np.float32), layout, got)
