"""The relayout planner picks the cheapest order of its steps.

Each relayout moves toward its target by steps of five kinds: a pending reduction done
(all-reduce, or reduce-scatter onto an axis the target shards over that mesh dimension), an
axis gathered, a mesh dimension moved onto the axis the target shards over it (all-to-all),
an axis sliced as the target shards it. The order matters: `[*,x] -> [y,*]` sliced over y
first moves a quarter of what gathering first moves, and `[x,y] -> [y,x]` needs no whole
gather at all when x is gathered first and y then moved. These tests run every pair of
layouts of a 2-D mesh (and a sample on a 3-D one), check the value, and compare the bytes
the ledger records with the cheapest sequence of such steps, found here by a search of
its own over the ledger's ring model."""

from __future__ import annotations

import heapq
import itertools
import random

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import assert_dtensor_equal, collective_lowering, cpus, layout_of
from tf_dtensor import debug, dtensor
from tf_dtensor.dtensor import UNSHARDED as U
from tf_dtensor.dtensor import Layout

MESH_2X4 = dtensor.create_mesh([("x", 2), ("y", 4)], devices=cpus(8))
MESH_2X2X2 = dtensor.create_mesh([("x", 2), ("y", 2), ("z", 2)], devices=cpus(8))


def _states(mesh, rank):
    """Every layout of `rank` axes on `mesh` (each axis unsharded or over one mesh
    dimension), with every set of pending sums over the mesh dimensions left free."""
    names = mesh.dim_names
    for specs in itertools.product([U] + list(names), repeat=rank):
        used = [s for s in specs if s != U]
        if len(set(used)) != len(used):
            continue
        free = [d for d in names if d not in used]
        for k in range(len(free) + 1):
            for partial in itertools.combinations(free, k):
                yield specs, frozenset(partial)


def _cheapest(mesh, shape, source, target):
    """Bytes per device of the cheapest steps from `source` to `target` (no pending sums),
    each step moving toward the target, in the ledger's ring model."""
    size = {d: mesh.dim_size(d) for d in mesh.dim_names}
    elements = float(np.prod(shape))
    goal = target[0]

    def block(specs):
        return 4 * elements / np.prod([size[s] for s in specs if s != U] or [1])

    def moves(state):
        specs, partial = state
        b = block(specs)
        used = {s for s in specs if s != U}
        for d in partial:
            g = size[d]
            yield (specs, partial - {d}), 2 * (g - 1) / g * b
            for i, want in enumerate(goal):
                if want == d and specs[i] == U and d not in used:
                    yield (specs[:i] + (d,) + specs[i + 1:], partial - {d}), (g - 1) / g * b
        if len(partial) > 1:
            g = np.prod([size[d] for d in partial])
            yield (specs, frozenset()), 2 * (g - 1) / g * b
        for i, s in enumerate(specs):
            if s != U and s != goal[i]:
                yield (specs[:i] + (U,) + specs[i + 1:], partial), (size[s] - 1) * b
                for j, want in enumerate(goal):
                    if j != i and want == s and specs[j] == U:
                        moved = list(specs)
                        moved[i], moved[j] = U, s
                        yield (tuple(moved), partial), (size[s] - 1) / size[s] * b
            if s == U and goal[i] != U and goal[i] not in used and goal[i] not in partial:
                yield (specs[:i] + (goal[i],) + specs[i + 1:], partial), 0.0

    best = {source: 0.0}
    queue = [(0.0, sorted(source[0]), sorted(source[1]), source)]
    while queue:
        cost, _, _, state = heapq.heappop(queue)
        if state == target:
            return cost
        if cost > best[state]:
            continue
        for nxt, step in moves(state):
            if cost + step < best.get(nxt, float("inf")):
                best[nxt] = cost + step
                heapq.heappush(queue, (cost + step, sorted(nxt[0]), sorted(nxt[1]), nxt))
    raise AssertionError(f"no steps from {source} to {target}")


def _layout(mesh, state, reductions=None):
    specs, partial = state
    reductions = reductions or {}
    return Layout(list(specs), mesh, partial={d: reductions.get(d, "sum") for d in partial}) \
        if partial else Layout(list(specs), mesh)


def _check_pair(mesh, value, source, target, policy):
    start = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(value),
                                                  Layout.replicated(mesh, value.ndim)),
                             _layout(mesh, (source[0], frozenset())))
    start = dtensor.relayout(start, _layout(mesh, source))  # the value on one device per sum
    with collective_lowering(policy), debug.collectives() as ledger:
        out = dtensor.relayout(start, _layout(mesh, target))
    assert_dtensor_equal(value, _layout(mesh, target), out)
    expected = _cheapest(mesh, value.shape, source, target)
    assert ledger.total_bytes() == pytest.approx(expected), (
        f"{source[0]} +partial{sorted(source[1])} -> {target[0]}: {ledger.total_bytes()} bytes "
        f"per device, the cheapest steps move {expected}\n{ledger.table()}")


@pytest.mark.parametrize("policy", ["shared", "ops"])
def test_every_relayout_on_a_2x4_mesh_takes_its_cheapest_steps(policy):
    value = np.random.RandomState(3).rand(8, 16).astype(np.float32)
    states = list(_states(MESH_2X4, 2))
    pairs = [(s, t) for s in states for t in states if not t[1] and s != t]
    assert len(pairs) == 91
    for source, target in pairs:
        _check_pair(MESH_2X4, value, source, target, policy)


def test_relayouts_of_rank_3_on_a_2x2x2_mesh_take_their_cheapest_steps():
    value = np.random.RandomState(4).rand(4, 8, 8).astype(np.float32)
    states = list(_states(MESH_2X2X2, 3))
    pairs = [(s, t) for s in states for t in states if not t[1] and s != t]
    for source, target in random.Random(5).sample(pairs, 120):
        _check_pair(MESH_2X2X2, value, source, target, "shared")


@pytest.mark.parametrize("policy", ["shared", "ops"])
def test_every_relayout_on_a_2x4_mesh_inside_a_function_keeps_its_value_and_steps(policy):
    """The same pairs inside one tf.function each (graph collectives), against the eager
    ledger: a function issues what the eager relayout issued."""
    value = np.random.RandomState(9).rand(8, 16).astype(np.float32)
    states = list(_states(MESH_2X4, 2))
    pairs = [(s, t) for s in states for t in states if not t[1] and s != t]
    for source, target in random.Random(10).sample(pairs, 30):
        start = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(value),
                                                      Layout.replicated(MESH_2X4, 2)),
                                 _layout(MESH_2X4, (source[0], frozenset())))
        start = dtensor.relayout(start, _layout(MESH_2X4, source))
        to = _layout(MESH_2X4, target)
        with collective_lowering(policy), debug.collectives() as eager:
            dtensor.relayout(start, to)
        with collective_lowering(policy), debug.collectives() as traced:
            out = tf.function(lambda t: dtensor.relayout(t, to))(start)
        assert_dtensor_equal(value, to, out)
        assert [(r.kind, r.mesh_dims, r.layout_in) for r in traced] == \
            [(r.kind, r.mesh_dims, r.layout_in) for r in eager], traced.table()


@pytest.mark.parametrize("policy", ["shared", "ops"])
@pytest.mark.parametrize("reductions", [{"x": "sum", "y": "mean"}, {"x": "mean", "y": "sum"},
                                        {"x": "max", "y": "max"}, {"x": "sum", "y": "max"}])
def test_pending_reductions_of_several_kinds_are_each_done_as_their_own(policy, reductions):
    """A sum over x and a mean over y are two all-reduces (one over x+y would apply one
    kind to both): every pair from a value pending over both, or over one of them."""
    value = np.random.RandomState(11).rand(8, 16).astype(np.float32)
    states = [s for s in _states(MESH_2X4, 2) if s[1]]
    targets = [t for t in _states(MESH_2X4, 2) if not t[1]]
    for source in states:
        for target in targets:
            start = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(value),
                                                          Layout.replicated(MESH_2X4, 2)),
                                     _layout(MESH_2X4, (source[0], frozenset())))
            start = dtensor.relayout(start, _layout(MESH_2X4, source, reductions))
            with collective_lowering(policy):
                out = dtensor.relayout(start, _layout(MESH_2X4, target))
            assert_dtensor_equal(value, _layout(MESH_2X4, target), out)


@pytest.mark.parametrize("policy", ["shared", "ops", "copies"])
@pytest.mark.parametrize("mesh,shape", [(MESH_2X4, (7, 5)), (MESH_2X4, (3, 1)),
                                        (MESH_2X2X2, (3, 5, 1))])
def test_relayouts_of_uneven_and_empty_blocks_keep_their_values(policy, mesh, shape):
    """Orders the fixed one never took (a slice before a gather, an all-to-all after one,
    either before a pending sum is reduced) on blocks of unequal and zero size."""
    value = np.random.RandomState(7).rand(*shape).astype(np.float32)
    states = list(_states(mesh, len(shape)))
    pairs = [(s, t) for s in states for t in states if not t[1] and s != t]
    for source, target in random.Random(8).sample(pairs, min(len(pairs), 60)):
        start = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(value),
                                                      Layout.replicated(mesh, len(shape))),
                                 _layout(mesh, (source[0], frozenset())))
        start = dtensor.relayout(start, _layout(mesh, source))
        with collective_lowering(policy):
            out = dtensor.relayout(start, _layout(mesh, target))
        assert_dtensor_equal(value, _layout(mesh, target), out)


@pytest.mark.parametrize("source,target,steps", [
    # Sliced over y first: the all-gather over x moves a quarter of the value.
    ("[*,x]", "[y,*]", [("all-gather", ("x",), "[y,x]")]),
    # x gathered, y moved onto axis 0, x sliced: nothing gathered whole.
    ("[x,y]", "[y,x]", [("all-gather", ("x",), "[x,y]"), ("all-to-all", ("y",), "[*,y]")]),
])
def test_a_relayout_in_a_function_takes_the_same_steps(source, target, steps):
    value = np.random.RandomState(6).rand(8, 16).astype(np.float32)
    t = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(value),
                                              Layout.replicated(MESH_2X4, 2)),
                         layout_of(source, MESH_2X4))

    @tf.function
    def f(t):
        return dtensor.relayout(t, layout_of(target, MESH_2X4))

    for run in (lambda: dtensor.relayout(t, layout_of(target, MESH_2X4)), lambda: f(t)):
        with debug.collectives() as ledger:
            out = run()
        assert_dtensor_equal(value, layout_of(target, MESH_2X4), out)
        assert [(r.kind, r.mesh_dims, r.layout_in) for r in ledger] == steps, ledger.table()
