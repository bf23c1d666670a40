"""`debug.check`: runs a function op by op sharded and on one device and names the first
op whose sharded result differs. A test-only fault (`_core.drop_all_reduce_for_testing`:
the all-reduces one op's rule asks for are dropped, as a broken rule would) must be found
at that op, with its layouts; and a correct program must check clean, without changing
the variables it writes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import MESH_2X2, collective_lowering, layout_of, reassemble, to_dtensor
from tf_dtensor import _core, debug, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

U = UNSHARDED
RNG = np.random.RandomState(11)
X = RNG.rand(8, 6).astype(np.float32)
W0 = RNG.rand(6, 4).astype(np.float32)


@contextlib.contextmanager
def broken(op: str):
    _core.drop_all_reduce_for_testing(op)
    try:
        yield
    finally:
        _core.drop_all_reduce_for_testing("")


def _model():
    x = to_dtensor(X, layout_of("[x,y]", MESH_2X2))
    w = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(W0), layout_of("[y,*]", MESH_2X2)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w))
            loss = tf.reduce_mean(tf.reduce_sum(h, axis=0) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss, tf.reduce_sum(h, axis=0)

    return x, w, step


def test_a_training_step_checks_clean_and_changes_no_variable():
    x, w, step = _model()
    report = debug.check(step, x)
    assert report.ok, str(report)
    assert "all" in str(report) and "agree with one device" in str(report)
    types = [o.type for o in report.ops]
    assert "MatMul" in types and "AssignSubVariableOp" in types and len(types) > 10, types
    matmul = next(o for o in report.ops if o.type == "MatMul")
    assert matmul.input_layouts[0] == "[x,y] @ mesh(x=2,y=2)"
    assert [c.label for c in matmul.collectives] == ["all-reduce(sum) over y"]
    np.testing.assert_array_equal(reassemble(w.read_value()), W0)


def test_a_dropped_reduction_is_found_at_its_op():
    x, w, step = _model()
    with broken("Sum"):
        report = debug.check(step, x)
        # The fault really breaks the op when it runs eagerly (inside the function the
        # expansion defers the sum's reduction to its reader).
        wrong = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)), axis=0)
    assert not np.allclose(dtensor.unpack(wrong)[0].numpy(), np.maximum(X @ W0, 0).sum(axis=0),
                           rtol=1e-4)
    assert not report.ok
    bad = report.first_mismatch
    assert bad.type == "Sum" and bad is report.ops[-1], str(report)
    assert bad.input_layouts[0] == "[x,*] @ mesh(x=2,y=2)" and "values differ" in bad.problem
    assert bad.collectives == []  # the all-reduce it needed was not issued
    assert "'" + bad.name + "' (Sum), differs from one device" in str(report)
    # Every op before it agreed.
    assert all(not o.problem for o in report.ops[:-1])
    # Without the fault the same program checks clean again.
    assert debug.check(step, x).ok


def test_a_python_function_is_traced_and_checked():
    t = to_dtensor(X, layout_of("[x,*]", MESH_2X2))

    def f(v):
        return tf.nn.softmax(v, axis=0) * tf.reduce_max(v)

    report = debug.check(f, t)
    assert report.ok, str(report)
    with broken("Max"):
        report = debug.check(f, t)
    assert not report.ok and report.first_mismatch.type == "Max", str(report)


def test_tolerances_apply_to_floating_point_outputs():
    t = to_dtensor(X.astype(np.float64), layout_of("[x,y]", MESH_2X2))
    report = debug.check(lambda v: tf.reduce_sum(tf.sin(v)), t, rtol=0.0, atol=0.0)
    # A sum in another order may differ in the last bits: with no tolerance at all, the
    # report says so, naming the sum; the default tolerance accepts it.
    assert report.ok or report.first_mismatch.type == "Sum", str(report)
    assert debug.check(lambda v: tf.reduce_sum(tf.sin(v)), t).ok


def test_the_transformer_training_step_checks_clean_and_a_broken_softmax_is_found():
    """examples/transformer.py's whole training step (forward, backward, Adam: some 900
    ops on mesh(batch=2, model=4)); then with the cross-entropy's reductions over the
    vocabulary dropped, check names that op."""
    from test_model_examples import transformer as example
    from tf_dtensor import dtensor as api

    placement = example.make_placement(api, (2, 4))
    config = example.Config()
    model = example.Transformer(config, placement)
    optimizer = example.Adam(list(model.weights.values()), placement, config.learning_rate)
    step = example.make_train_step(model, optimizer)
    tokens, targets = next(example.batches(config, 1))
    args = (placement.tensor(tokens, ("batch", U)), placement.tensor(targets, ("batch", U)))
    report = debug.check(step, *args)
    assert report.ok and len(report.ops) > 500, str(report)
    assert sum(len(o.collectives) for o in report.ops) > 20
    with broken("SparseSoftmaxCrossEntropyWithLogits"):
        report = debug.check(step, *args)
    bad = report.first_mismatch
    assert bad is not None and bad.type == "SparseSoftmaxCrossEntropyWithLogits", str(report)
    # The logits are sharded over `model` (the vocabulary): the softmax needs a max and a
    # sum over it, which the fault dropped.
    assert "model" in bad.input_layouts[0] and bad.collectives == [], str(report)


def test_nested_functions_and_control_flow_are_compared_whole():
    t = to_dtensor(X, layout_of("[x,*]", MESH_2X2))

    @tf.function
    def inner(v):
        return tf.reduce_sum(v, axis=0)

    @tf.function
    def outer(v):
        s = inner(v)
        picked = tf.cond(tf.reduce_sum(s) > 0, lambda: s * 2.0, lambda: s)
        total = tf.constant(0.0)
        for _ in tf.range(3):
            total += tf.reduce_max(v)
        return picked, total

    report = debug.check(outer, t)
    assert report.ok, str(report)
    types = {o.type for o in report.ops}
    assert types & {"PartitionedCall", "StatefulPartitionedCall"}, types
    assert types & {"If", "StatelessIf"} and types & {"While", "StatelessWhile"}, types
    call = next(o for o in report.ops if o.type.endswith("PartitionedCall"))
    # The nested function was expanded sharded: its sum over x all-reduced.
    assert [c.label for c in call.collectives] == ["all-reduce(sum) over x"], call


def test_a_relayout_inside_the_function_is_checked_as_an_identity_on_one_device():
    # The plain run once executed tf_dtensor's relayout op on the host CPU, which has no
    # kernel for it: check raised InvalidArgumentError instead of checking.
    t = to_dtensor(X, layout_of("[x,*]", MESH_2X2))

    @tf.function
    def f(v):
        moved = dtensor.relayout(v, layout_of("[*,y]", MESH_2X2))
        return tf.reduce_sum(dtensor.relayout_like(moved * 2.0, v), axis=0)

    report = debug.check(f, t)
    assert report.ok, str(report)
    relayout = next(o for o in report.ops if o.type == _core.RELAYOUT_OP)
    assert relayout.output_layouts == ["[*,y] @ mesh(x=2,y=2)"]
    assert _core.RELAYOUT_LIKE_OP in [o.type for o in report.ops]


def test_a_wrong_variable_write_is_found_at_the_write():
    # The assign returns nothing, and the variable's plain copy used to take the sharded
    # value after every write: a wrong write was never compared, and check said "all ops
    # agree".
    summands = Layout([U], MESH_2X2, partial={"y": "sum"})
    p = dtensor.pack([tf.constant([1., 2., 3., 4.]), tf.constant([10., 20., 30., 40.])] * 2,
                     summands)
    v = dtensor.DVariable(dtensor.copy_to_mesh(tf.zeros([4]), layout_of("[*]", MESH_2X2)))

    @tf.function
    def step(p):
        v.assign_add(p)
        return v.read_value()

    assert debug.check(step, p).ok
    with broken("AssignAddVariableOp"):
        report = debug.check(step, p)
    bad = report.first_mismatch
    assert bad is not None and bad.type == "AssignAddVariableOp", str(report)
    assert "the variable of input 0 after the op: values differ" in bad.problem, bad.problem
    assert bad.input_layouts == ["[*] @ mesh(x=2,y=2)", "[*] +partial(y:sum) @ mesh(x=2,y=2)"]
    np.testing.assert_array_equal(reassemble(v.read_value()), np.zeros(4))


def test_replicas_that_disagree_are_found_at_the_op_that_made_them():
    # A dropped reduction of a partial value whose first device holds the whole sum
    # leaves that device right and the other replicas wrong. The global value reads one
    # replica, so check used to blame the next op that read another replica (here the
    # relayout that slices columns on each device).
    t = to_dtensor(X[:, :4], layout_of("[*,*]", MESH_2X2))

    @tf.function
    def f(v):
        p = dtensor.relayout(v, Layout([U, U], MESH_2X2, partial={"y": "sum"}))
        columns = dtensor.relayout(tf.exp(p), layout_of("[*,y]", MESH_2X2))
        return tf.reduce_sum(columns, axis=1)

    with collective_lowering("ops"):
        assert debug.check(f, t).ok
        with broken("Exp"):
            report = debug.check(f, t)
    bad = report.first_mismatch
    assert bad is not None and bad.type == "Exp", str(report)
    assert "the block [0:8, 0:4] on CPU:1 differs from one device" in bad.problem, bad.problem


def test_a_gradient_assigned_to_a_sharded_variable_is_brought_to_its_layout():
    # Eagerly the gradient of a column-sharded weight came out replicated, and the eager
    # assign refuses another layout: check raised InvalidArgumentError ("Relayout the
    # value first") on a step that runs fine (inside the function the gradient is
    # reduce-scattered into the weight's layout). Uneven rows (5 over 4) and a cond too.
    from dtensor_testing import cpus

    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = to_dtensor(X[:5], layout_of("[x,*]", mesh))
    w = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(W0), layout_of("[*,x]", mesh)))

    @tf.function
    def step(x, flag):
        with tf.GradientTape() as tape:
            h = tf.matmul(x, w)
            loss = tf.cond(flag, lambda: tf.reduce_sum(h * h), lambda: tf.reduce_mean(h))
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    flag = dtensor.copy_to_mesh(tf.constant(True), Layout([], mesh))
    report = debug.check(step, x, flag)
    assert report.ok, str(report)
    assign = next(o for o in report.ops if o.type == "AssignSubVariableOp")
    assert assign.input_layouts[1] == "[*,x] @ mesh(x=4)"  # relaid out as in the function
    np.testing.assert_array_equal(reassemble(w.read_value()), W0)


def test_an_abstract_argument_is_refused_with_what_to_pass():
    # A debug.spec reached the user's function while tracing: a raw TypeError from inside
    # it ("unsupported operand type(s) for *: 'Spec' and 'int'").
    spec = debug.spec([8, 6], tf.float32, layout_of("[x,*]", MESH_2X2))
    with pytest.raises(TypeError, match="debug.check runs the function, so it needs values"):
        debug.check(lambda v: v * 2.0, spec)
