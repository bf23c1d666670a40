"""The collective ledger (`debug.collectives()`): every collective issued, eagerly and per
tf.function call, with its kind, mesh dimensions, bytes per device, op and cause. Each
test also checks the sharded result against numpy, so a ledger that lists the right
collectives for a wrong computation fails; and the ledger's collectives are compared with
what `debug.explain` plans for the same op, under both collective lowerings."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_2X2, assert_dtensor_equal, collective_lowering, cpus, layout_of,
                             reassemble, to_dtensor)
from tf_dtensor import debug, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout, create_mesh

U = UNSHARDED
RNG = np.random.RandomState(7)
A = RNG.rand(8, 16).astype(np.float32)
W = RNG.rand(16, 4).astype(np.float32)


def _row_parallel():
    """x [*,y] @ w [y,*]: each device multiplies its columns of x by its rows of w; the
    partial products need one all-reduce over y."""
    return (to_dtensor(A, layout_of("[*,y]", MESH_2X2)),
            to_dtensor(W, layout_of("[y,*]", MESH_2X2)))


@pytest.mark.parametrize("policy", ["shared", "ops"])
def test_row_parallel_matmul_costs_exactly_one_all_reduce_over_y(policy):
    a, w = _row_parallel()
    with collective_lowering(policy), debug.collectives() as ledger:
        out = tf.matmul(a, w)
    np.testing.assert_allclose(reassemble(out), A @ W, rtol=1e-5)
    assert len(ledger) == 1, ledger.table()
    (r,) = ledger
    assert (r.kind, r.reduction, r.mesh_dims, r.group_size) == ("all-reduce", "sum", ("y",), 2)
    assert (r.op, r.requested, r.where) == ("MatMul", False, "eager")
    assert r.shape == (8, 4) and r.dtype == tf.float32 and r.mesh == "mesh(x=2,y=2)"
    # The [8,4] float32 result is whole on every device before the reduction: 128 bytes,
    # of which each of the 2 devices of a group receives 2 * (2-1)/2 in a ring.
    assert r.block_bytes == 8 * 4 * 4 and r.bytes_per_device == 128
    assert ledger.total_bytes() == 128 and ledger.count(kind="all-reduce", mesh_dim="y") == 1
    # What explain plans for the op is what ran.
    plan = debug.explain("MatMul", [a_layout for a_layout in
                                    (layout_of("[*,y]", MESH_2X2), layout_of("[y,*]", MESH_2X2))],
                         [[8, 16], [16, 4]])
    assert [c for c in plan["collectives"] if "all-reduce" in c] and \
        all("over y" in c for c in plan["collectives"]), plan["collectives"]


@pytest.mark.parametrize("policy", ["shared", "ops"])
@pytest.mark.parametrize("source,target,kind,dims,factor", [
    ("[x,*]", "[*,*]", "all-gather", ("x",), 1.0),        # (g-1) * block
    ("[x,y]", "[*,*]", "all-gather", ("x",), 1.0),        # axis 0 first, then axis 1
    ("[x,*]", "[*,x]", "all-to-all", ("x",), 0.5),        # (g-1)/g * block
])
def test_relayouts_are_listed_as_asked_with_their_bytes(policy, source, target, kind, dims,
                                                        factor):
    t = to_dtensor(A, layout_of(source, MESH_2X2))
    with collective_lowering(policy), debug.collectives() as ledger:
        out = dtensor.relayout(t, layout_of(target, MESH_2X2))
    np.testing.assert_array_equal(reassemble(out), A)
    assert dtensor.fetch_layout(out) == layout_of(target, MESH_2X2)
    first = ledger[0]
    assert (first.kind, first.mesh_dims, first.op, first.requested) == (kind, dims, "TfDTensorRelayout", True)
    block = A.nbytes // layout_of(source, MESH_2X2).num_shards(0) // \
        layout_of(source, MESH_2X2).num_shards(1)
    assert first.block_bytes == block and first.bytes_per_device == int(factor * block)
    assert first.layout_in == source
    if source == "[x,y]":  # then axis 1 over y: its block is twice as large now
        assert [(r.kind, r.mesh_dims) for r in ledger] == [("all-gather", ("x",)),
                                                           ("all-gather", ("y",))]
        assert ledger[1].block_bytes == 2 * block and ledger[1].layout_in == "[*,y]"
    else:
        assert len(ledger) == 1, ledger.table()


def test_a_tf_function_lists_its_collectives_once_per_call():
    a, w = _row_parallel()

    @tf.function
    def step(a, w):
        return tf.nn.relu(tf.matmul(a, w))

    want = np.maximum(A @ W, 0)
    np.testing.assert_allclose(reassemble(step(a, w)), want, rtol=1e-5)  # traced outside
    with debug.collectives() as ledger:
        for _ in range(3):
            np.testing.assert_allclose(reassemble(step(a, w)), want, rtol=1e-5)
    assert len(ledger) == 3, ledger.table()
    assert {r.where for r in ledger} == {ledger[0].where} and "step" in ledger[0].where
    assert all(r.kind == "all-reduce" and r.mesh_dims == ("y",) for r in ledger)
    # Relu needs the whole sum: the pending all-reduce is done where MatMul makes it,
    # once for all its readers.
    assert ledger[0].op == "MatMul", ledger.table()
    assert ledger.count(where="step") == 3 and ledger.total_bytes() == 3 * 128
    assert "step" in ledger.table() and "all-reduce(sum) over y" in ledger.table()


def _line_of(marker: str) -> str:
    """"test_ledger.py:N", N the line of this file that holds `marker`."""
    with open(__file__) as f:
        (n,) = [i for i, text in enumerate(f, 1) if marker in text and "_line_of" not in text]
    return f"{os.path.basename(__file__)}:{n}"


def test_each_collective_names_the_users_line():
    a, w = _row_parallel()

    @tf.function
    def step(a, w):
        return tf.matmul(a, w)

    def helper(t):  # the line inside the user's own helper, not the call of helper
        return dtensor.relayout(t, layout_of("[*,*]", MESH_2X2))  # line: helper relayout

    with debug.collectives() as ledger:
        eager = tf.matmul(a, w)  # line: eager matmul
        gathered = helper(a)
        called = step(a, w)  # line: function call
    np.testing.assert_allclose(reassemble(eager), A @ W, rtol=1e-5)
    np.testing.assert_allclose(reassemble(called), A @ W, rtol=1e-5)
    np.testing.assert_allclose(reassemble(gathered), A, rtol=1e-6)
    lines = [r.line for r in ledger]
    assert all(os.path.isabs(l.rsplit(":", 1)[0]) for l in lines), lines
    assert [os.path.basename(l) for l in lines] == [
        _line_of("# line: eager matmul"), _line_of("# line: helper relayout"),
        _line_of("# line: function call")], ledger.table()
    assert ledger.count(line=_line_of("# line: eager matmul")) == 1
    assert ledger.select(line=_line_of("# line: function call"))[0].where != "eager"
    assert _line_of("# line: helper relayout") in ledger.table()


def test_a_pending_sum_read_by_two_ops_is_reduced_once():
    """Two ops that need the whole sum of one partial value share its all-reduce (the
    ledger found each reading its own: a Keras step reduced every gradient twice)."""
    a, w = _row_parallel()

    @tf.function
    def two_readers(a, w):
        p = tf.matmul(a, w)
        q, r = tf.identity_n([p, p])
        return tf.nn.relu(q), tf.exp(r), tf.nn.relu(p) + tf.exp(p)

    two_readers(a, w)
    with debug.collectives() as ledger:
        relu, exp, both = two_readers(a, w)
    product = A @ W
    np.testing.assert_allclose(reassemble(relu), np.maximum(product, 0), rtol=1e-5)
    np.testing.assert_allclose(reassemble(exp), np.exp(product), rtol=1e-5)
    np.testing.assert_allclose(reassemble(both), np.maximum(product, 0) + np.exp(product),
                               rtol=1e-5)
    assert len(ledger) == 1 and ledger[0].mesh_dims == ("y",), ledger.table()


def test_a_loop_body_collective_is_marked_per_iteration():
    a, w = _row_parallel()

    @tf.function
    def repeated(a, w, n):
        total = tf.zeros([8, 4])
        for _ in tf.range(n):
            total += tf.nn.relu(tf.matmul(a, w))
        return total

    with debug.collectives() as ledger:
        out = repeated(a, w, tf.constant(3))
    np.testing.assert_allclose(reassemble(out), 3 * np.maximum(A @ W, 0), rtol=1e-5)
    looped = [r for r in ledger if r.in_loop]
    assert looped and all(r.mesh_dims == ("y",) for r in looped), ledger.table()
    assert "per iteration" in ledger.table()
    assert f"of which {len(looped)} per iteration" in ledger.table().splitlines()[-1]


def test_both_branches_of_a_conditional_are_listed_and_marked():
    a, w = _row_parallel()

    @tf.function
    def pick(a, w, flag):
        # Both branches give the result's shape [8, 4] (a DTensor result has one shape).
        return tf.cond(flag, lambda: tf.nn.relu(tf.matmul(a, w)),
                       lambda: tf.nn.relu(dtensor.relayout(a, layout_of("[*,*]", MESH_2X2))
                                          [:, :4]))

    with debug.collectives() as ledger:
        out = pick(a, w, tf.constant(True))
    np.testing.assert_allclose(reassemble(out), np.maximum(A @ W, 0), rtol=1e-5)
    branch = [r for r in ledger if r.in_branch]
    assert {r.kind for r in branch} == {"all-reduce", "all-gather"}, ledger.table()
    # Each names its branch: the matmul's all-reduce the true one, the relayout the other.
    then, = [r for r in branch if r.kind == "all-reduce"]
    other, = [r for r in branch if r.kind == "all-gather"]
    assert then.branch.endswith(" then") and other.branch.endswith(" else"), ledger.table()
    assert then.branch[:-len(" then")] == other.branch[:-len(" else")]  # one conditional
    assert ledger.select(branch="then") == [then] and ledger.select(branch="else") == [other]
    assert f"if {then.branch} runs" in ledger.table() and f"if {other.branch} runs" in \
        ledger.table()


def test_collectives_of_nested_conditionals_and_cases_name_their_branch_path():
    a, w = _row_parallel()

    @tf.function
    def pick(a, w, flag, index):
        def outer_then():
            return tf.cond(tf.logical_not(flag), lambda: tf.matmul(a, w),
                           lambda: tf.matmul(a, w) * 2.0)
        picked = tf.cond(flag, outer_then, lambda: tf.matmul(a, w) * 3.0)
        cased = tf.switch_case(index, [lambda: tf.matmul(a, w), lambda: tf.matmul(a, w) + 1.0])
        return picked, cased

    with debug.collectives() as ledger:
        picked, cased = pick(a, w, tf.constant(True), tf.constant(1))
    np.testing.assert_allclose(reassemble(picked), 2 * (A @ W), rtol=1e-5)
    np.testing.assert_allclose(reassemble(cased), A @ W + 1.0, rtol=1e-5)
    branches = sorted(r.branch for r in ledger)
    assert all(r.in_branch for r in ledger) and len(branches) == 5, ledger.table()
    nested = [b for b in branches if " / " in b]
    assert len(nested) == 2, branches
    assert all(b.split(" / ")[0].endswith(" then") for b in nested), branches
    assert sorted(b.split(" / ")[1].rsplit(" ", 1)[1] for b in nested) == ["else", "then"]
    cases = [b for b in branches if " branch " in b]
    assert sorted(b[-1] for b in cases) == ["0", "1"], branches
    assert len([b for b in branches if b.endswith(" else") and " / " not in b]) == 1


def test_the_total_says_which_collectives_are_alternatives_or_per_iteration():
    # The total adds every branch's collectives, though one branch runs per call: the
    # table's total row said only "2 ... 256 B" for a cond whose taken branch issued one
    # all-reduce (or none), and count() had no way to leave the branches out.
    a, w = _row_parallel()
    rows = to_dtensor(A, layout_of("[x,*]", MESH_2X2))

    @tf.function
    def step(a, w, rows, flag):
        gathered = dtensor.relayout(rows, layout_of("[*,*]", MESH_2X2))  # always runs
        picked = tf.cond(flag, lambda: tf.matmul(a, w), lambda: tf.matmul(a, w) * 2.0)
        return gathered, picked

    with debug.collectives() as ledger:
        step(a, w, rows, tf.constant(True))
    assert ledger.count() == 3 and ledger.count(in_branch=True) == 2, ledger.table()
    assert [r.kind for r in ledger.select(in_branch=False)] == ["all-gather"]
    total = ledger.table().splitlines()[-1]
    assert total.startswith("total") and "of which 2 (256 B) if their branches run" in total, \
        ledger.table()
    assert "per iteration" not in total


def test_nothing_is_recorded_outside_and_ledgers_nest():
    a, w = _row_parallel()
    tf.matmul(a, w)  # before any ledger
    with debug.collectives() as outer:
        tf.matmul(a, w)
        with debug.collectives() as inner:
            dtensor.relayout(to_dtensor(A, layout_of("[x,*]", MESH_2X2)),
                             layout_of("[*,*]", MESH_2X2))
        assert repr(outer).startswith("<Ledger open")
    tf.matmul(a, w)  # after
    assert [r.kind for r in inner] == ["all-gather"]
    assert [r.kind for r in outer] == ["all-reduce", "all-gather"]
    assert outer.count(requested=True) == 1 and outer.count(requested=False) == 1
    with debug.collectives() as later:
        pass
    assert len(later) == 0 and later.total_bytes() == 0


def test_local_ops_issue_no_collectives():
    t = to_dtensor(A, layout_of("[x,y]", MESH_2X2))
    with debug.collectives() as ledger:
        out = tf.exp(t) * 2 + t
    np.testing.assert_allclose(reassemble(out), np.exp(A) * 2 + A, rtol=1e-5)
    assert len(ledger) == 0, ledger.table()


def test_training_step_ledger_matches_the_data_parallel_plan():
    """The training guide's step, data parallel over x: each call all-reduces the
    gradients over x (combined into few collective ops), nothing else."""
    mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4)])
    rng = np.random.RandomState(3)
    w0, b0 = rng.rand(6, 3).astype(np.float32), np.zeros([3], np.float32)
    x, y = rng.rand(8, 6).astype(np.float32), rng.rand(8, 3).astype(np.float32)
    w = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(w0), Layout.replicated(mesh, 2)))
    b = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(b0), Layout.replicated(mesh, 1)))
    xs = dtensor.copy_to_mesh(tf.constant(x), Layout.batch_sharded(mesh, "x", 2))
    ys = dtensor.copy_to_mesh(tf.constant(y), Layout.batch_sharded(mesh, "x", 2))

    @tf.function
    def train(xs, ys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(xs, w) + b - ys) ** 2)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    with debug.collectives() as ledger:
        loss = train(xs, ys)
    # Against plain TensorFlow on one device.
    pw, pb = tf.Variable(w0), tf.Variable(b0)
    with tf.GradientTape() as tape:
        want = tf.reduce_mean((tf.matmul(x, pw) + pb - y) ** 2)
    gw, gb = tape.gradient(want, [pw, pb])
    np.testing.assert_allclose(dtensor.unpack(loss)[0].numpy(), want.numpy(), rtol=1e-5)
    np.testing.assert_allclose(dtensor.unpack(w.read_value())[0].numpy(),
                               w0 - 0.1 * gw.numpy(), rtol=1e-5)
    assert len(ledger) == 3, ledger.table()  # the loss and both gradients
    assert all(r.kind == "all-reduce" and r.mesh_dims == ("x",) for r in ledger), ledger.table()
    # Each gradient's reduction moves its whole value: 2 * (4-1)/4 of its bytes.
    by_shape = {r.shape: r for r in ledger}
    assert by_shape[(6, 3)].bytes_per_device == 2 * 3 * (6 * 3 * 4) // 4
    assert by_shape[(3,)].bytes_per_device == 2 * 3 * (3 * 4) // 4


def test_ledger_png(tmp_path):
    pytest.importorskip("matplotlib")
    a, w = _row_parallel()
    with debug.collectives() as ledger:
        tf.matmul(a, w)
        dtensor.relayout(to_dtensor(A, layout_of("[x,y]", MESH_2X2)), layout_of("[*,*]", MESH_2X2))
    path = tmp_path / "ledger.png"
    ledger.plot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


@pytest.mark.parametrize("policy", ["shared", "ops"])
def test_an_adam_step_reduces_each_gradient_once(policy):
    """Adam reads the gradient (pending over batch) in b1·m + (1-b1)·g and in g²: the
    expansion reduces it once, where it is made, for all its readers (it used to reduce
    the sum for m, and both factors of g², three all-reduces)."""
    mesh = dtensor.create_mesh([("batch", 4)], devices=[f"CPU:{i}" for i in range(4)])
    xs = RNG.rand(16, 8).astype(np.float32)
    w0 = RNG.rand(8, 4).astype(np.float32)
    with collective_lowering(policy):
        x = to_dtensor(xs, layout_of("[batch,*]", mesh))
        w, m, v = (dtensor.DVariable(to_dtensor(a, Layout.replicated(mesh, 2)))
                   for a in (w0, np.zeros_like(w0), np.zeros_like(w0)))

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
            g = tape.gradient(loss, w)
            m.assign(0.9 * m + 0.1 * g)
            v.assign(0.999 * v + 0.001 * g * g)
            w.assign_sub(0.01 * m / (tf.sqrt(v) + 1e-7))
            return loss

        with debug.collectives() as ledger:
            loss = step(x)
    g = 2 * xs.T @ (xs @ w0)
    m_want, v_want = 0.1 * g, 0.001 * g * g
    np.testing.assert_allclose(reassemble(loss), np.sum((xs @ w0) ** 2), rtol=1e-5)
    np.testing.assert_allclose(reassemble(m.read_value()), m_want, rtol=1e-5)
    np.testing.assert_allclose(reassemble(v.read_value()), v_want, rtol=1e-4)
    np.testing.assert_allclose(reassemble(w.read_value()),
                               w0 - 0.01 * m_want / (np.sqrt(v_want) + 1e-7), rtol=1e-4)
    gradients = ledger.select(kind="all-reduce", mesh_dim="batch")
    assert [r.shape for r in gradients if r.shape] == [(8, 4)], ledger.table()
    assert ledger.total_bytes() == 2 * 3 * 8 * 4 * 4 // 4 + 2 * 3 * 4 // 4, ledger.table()


def test_a_sum_pending_over_two_mesh_dimensions_is_one_all_reduce():
    """[*,*] +partial(x:sum,y:sum) -> [*,*]: one all-reduce over x+y (group of 4), not one
    per dimension."""
    parts = RNG.rand(4, 8, 4).astype(np.float32)
    partial = Layout([U, U], MESH_2X2, partial={"x": "sum", "y": "sum"})
    t = dtensor.pack([tf.constant(p) for p in parts], partial)
    with debug.collectives() as ledger:
        whole = dtensor.relayout(t, Layout.replicated(MESH_2X2, 2))
    np.testing.assert_allclose(reassemble(whole), parts.sum(axis=0), rtol=1e-5)
    assert len(ledger) == 1, ledger.table()
    (r,) = ledger
    assert (r.kind, r.mesh_dims, r.group_size) == ("all-reduce", ("x", "y"), 4)
    assert r.bytes_per_device == 2 * 3 * 8 * 4 * 4 // 4


@pytest.mark.parametrize("policy", ["shared", "ops"])
@pytest.mark.parametrize("rows", [8, 7, 1])  # even, uneven, and an empty block
def test_a_pending_sum_is_sliced_over_another_dimension_before_it_is_reduced(policy, rows):
    """[*,*] +partial(x:sum) -> [y,*]: each device's term is sliced to its rows over y
    first (no communication), so the all-reduce over x moves half the value. Before, the
    whole [*,*] was all-reduced and then sliced."""
    terms = RNG.rand(2, rows, 4).astype(np.float32)  # one per x, the same over y
    t = dtensor.pack([tf.constant(terms[x]) for x in (0, 0, 1, 1)],
                     Layout([U, U], MESH_2X2, partial={"x": "sum"}))
    target = layout_of("[y,*]", MESH_2X2)
    with collective_lowering(policy), debug.collectives() as ledger:
        out = dtensor.relayout(t, target)
    assert_dtensor_equal(terms[0] + terms[1], target, out)
    assert len(ledger) == 1, ledger.table()
    (r,) = ledger
    assert (r.kind, r.mesh_dims, r.layout_in, r.layout_out) == (
        "all-reduce", ("x",), "[y,*] +partial(x:sum)", "[y,*]"), ledger.table()
    assert r.block_bytes == -(-rows // 2) * 4 * 4, ledger.table()


def test_a_dense_embedding_gradient_is_reduced_only_over_each_device_s_rows():
    """The gradient of a gather from a table sharded [m,*], made dense (UnsortedSegmentSum
    of the batch-sharded rows: [*,*] +partial(b:sum)), and subtracted from the table: the
    all-reduce over b moves each device's rows of the table, not the whole table."""
    mesh = dtensor.create_mesh([("b", 2), ("m", 2)], devices=cpus(4))
    table_np = RNG.rand(40, 8).astype(np.float32)
    ids_np = np.array([[1, 5], [9, 13], [2, 2], [39, 0]], np.int32)
    table = dtensor.DVariable(to_dtensor(table_np, layout_of("[m,*]", mesh)))
    ids = to_dtensor(ids_np, layout_of("[b,*]", mesh))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2)
        table.assign_sub(0.1 * tf.convert_to_tensor(tape.gradient(loss, table)))
        return loss

    with debug.collectives() as ledger:
        loss = step()
    grad = np.zeros_like(table_np)
    np.add.at(grad, ids_np.ravel(), 2 * table_np[ids_np.ravel()])
    np.testing.assert_allclose(reassemble(loss), (table_np[ids_np] ** 2).sum(), rtol=1e-5)
    assert_dtensor_equal(table_np - 0.1 * grad, layout_of("[m,*]", mesh), table.read_value())
    (update,) = [r for r in ledger if r.op == "AssignSubVariableOp"]
    assert (update.kind, update.mesh_dims, update.layout_in) == (
        "all-reduce", ("b",), "[m,*] +partial(b:sum)"), ledger.table()
    assert update.block_bytes == 20 * 8 * 4, ledger.table()


@pytest.mark.parametrize("policy", ["shared", "ops"])
def test_an_eager_reduction_shows_its_input_as_partial(policy):
    # A rule's eager all-reduce reduces partial results that still carry the result's
    # layout: the record said "[*,*] -> [*,*]", an all-reduce of a replicated value.
    # Now it reads as inside a tf.function: pending over the reduced dimension.
    a, w = _row_parallel()
    with collective_lowering(policy), debug.collectives() as ledger:
        tf.matmul(a, w)
        tf.reduce_sum(a, axis=1)

    @tf.function
    def f(a, w):
        return tf.matmul(a, w)

    with collective_lowering(policy), debug.collectives() as in_function:
        f(a, w)
    assert [(r.op, r.layout_in, r.layout_out) for r in ledger] == [
        ("MatMul", "[*,*] +partial(y:sum)", "[*,*]"), ("Sum", "[*] +partial(y:sum)", "[*]")]
    assert [(r.layout_in, r.layout_out) for r in in_function] == [
        ("[*,*] +partial(y:sum)", "[*,*]")]
    assert "[*,*] +partial(y:sum) -> [*,*]" in ledger.table()


def test_each_thread_s_ledger_holds_the_collectives_of_its_own_thread():
    # Two threads, each with a ledger open while the other runs ops: each ledger used to
    # hold both threads' collectives (one list shared by every open ledger).
    import threading

    a, w = _row_parallel()
    rows = to_dtensor(A, layout_of("[x,*]", MESH_2X2))
    started, finished = threading.Barrier(2), threading.Barrier(2)
    ledgers = {}

    def run(name, op):
        with debug.collectives() as ledger:
            started.wait()
            for _ in range(5):
                op()
            finished.wait()
        ledgers[name] = ledger

    threads = [threading.Thread(target=run, args=("matmul", lambda: tf.matmul(a, w))),
               threading.Thread(target=run, args=(
                   "relayout", lambda: dtensor.relayout(rows, layout_of("[*,*]", MESH_2X2))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(r.op, r.kind) for r in ledgers["matmul"]] == [("MatMul", "all-reduce")] * 5, \
        ledgers["matmul"].table()
    assert [(r.op, r.kind) for r in ledgers["relayout"]] == \
        [("TfDTensorRelayout", "all-gather")] * 5, ledgers["relayout"].table()
    # A thread without a ledger of its own (here the main thread's ops) still reaches an
    # open ledger of another thread: TensorFlow's executor threads issue work that way.
    opened, ran = threading.Event(), threading.Event()

    def watch():
        with debug.collectives() as ledger:
            opened.set()
            ran.wait()
        ledgers["watch"] = ledger

    watcher = threading.Thread(target=watch)
    watcher.start()
    opened.wait()
    tf.matmul(a, w)
    ran.set()
    watcher.join()
    assert [r.op for r in ledgers["watch"]] == ["MatMul"]


@pytest.mark.parametrize("policy", ["shared", "copies", "ops"])
def test_an_uneven_all_gather_counts_what_the_most_receiving_device_receives(policy):
    # [5, 3] over x=4: blocks of 2, 2, 1 and 0 rows (axes split as torch.chunk splits
    # them). Gathering them, the device holding none receives all 5 rows (15 floats, 60
    # bytes); the even model, (g-1) times the first block, said 6 rows (72 bytes).
    value = np.arange(15, dtype=np.float32).reshape(5, 3)
    mesh = create_mesh([("x", 4)], devices=cpus(4))
    with collective_lowering(policy), debug.collectives() as ledger:
        out = dtensor.relayout(to_dtensor(value, layout_of("x,*", mesh)), layout_of("*,*", mesh))
    assert_dtensor_equal(value, layout_of("*,*", mesh), out)
    gathers = [r for r in ledger if r.kind == "all-gather"]
    assert len(gathers) == 1, ledger.table()
    assert gathers[0].block_bytes == 2 * 3 * 4
    assert gathers[0].bytes_per_device == 5 * 3 * 4
