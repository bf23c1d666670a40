"""Golden table for Reshape, Transpose, ExpandDims, Squeeze (cc/rules/shape_rules.cc)."""

import pytest

from golden import layout, plan

RESHAPES = [
    # (input, shape, target) -> (input runs as, output)
    ("[x,*,*]", [4, 2, 8], [8, 8], "[x,*,*]", "[x,*]"),
    ("[x,*]", [8, 8], [4, 2, 8], "[x,*]", "[x,*,*]"),
    ("[*,x]", [8, 8], [64], "[*,*]", "[*]"),
    ("[x,*]", [8, 8], [64], "[x,*]", "[x]"),
    ("[x,y]", [8, 8], [8, 2, 4], "[x,y]", "[x,y,*]"),
    ("[x,*]", [8, 8], [-1, 4], "[x,*]", "[x,*]"),
    ("[*,y]", [8, 8], [2, 32], "[*,*]", "[*,*]"),
]


@pytest.mark.parametrize("layout,shape,target,runs,out", RESHAPES,
                         ids=[f"{r[0]}{r[1]}->{r[2]}" for r in RESHAPES])
def test_reshape(layout, shape, target, runs, out):
    inputs, outputs, _ = plan("Reshape", [layout, "[*]"], [shape, [len(target)]],
                              int_values={1: target})
    assert inputs[0] == runs
    assert outputs == [out]


def test_reshape_with_mismatched_count_is_an_error():
    with pytest.raises(ValueError, match="element counts differ"):
        plan("Reshape", ["[x,*]", "[*]"], [[8, 8], [1]], int_values={1: [60]})


@pytest.mark.parametrize("perm,out", [([1, 0], "[y,x]"), ([0, 1], "[x,y]")])
def test_transpose(perm, out):
    _, outputs, emitted = plan("Transpose", ["[x,y]", "[*]"], [[8, 8], [2]],
                               int_values={1: perm})
    assert outputs == [out]
    assert emitted == []


def test_expand_dims_and_squeeze():
    _, outputs, _ = plan("ExpandDims", ["[x,*]", "[]"], [[8, 8], []], int_values={1: [1]})
    assert outputs == ["[x,*,*]"]
    _, outputs, _ = plan("Squeeze", ["[x,*,*]"], [[8, 1, 8]], attrs={"squeeze_dims": [1]})
    assert outputs == ["[x,*]"]


@pytest.mark.parametrize("op,out", [("Shape", "[*]"), ("Size", "[]"), ("Rank", "[]")])
def test_shape_ops_are_replicated(op, out):
    _, outputs, _ = plan(op, ["[x,y]"], [[8, 8]])
    assert outputs == [out]


@pytest.mark.parametrize("layout,shape,target,runs,out", [
    ("[*,y]", [1, 8], [8], "[*,y]", "[y]"),
    ("[y]", [8], [1, 8], "[y]", "[*,y]"),
    ("[x,*,y]", [8, 1, 8], [8, 8, 1], "[x,*,y]", "[x,y,*]"),
], ids=["[*,y][1,8]->[8]", "[y][8]->[1,8]", "[x,*,y][8,1,8]->[8,8,1]"])
def test_reshape_around_size_one_axes_keeps_the_sharding(layout, shape, target, runs, out):
    inputs, outputs, emitted = plan("Reshape", [layout, "[*]"], [shape, [len(target)]],
                                    int_values={1: target})
    assert inputs[0] == runs
    assert outputs == [out]
    assert emitted == []


@pytest.mark.parametrize("layout,shape,target,runs,out", [
    ("[y]", [8], [4, 8], "[y]", "[*,y]"),
    ("[x,*]", [8, 1], [8, 8], "[x,*]", "[x,*]"),
    ("[x,y]", [8, 8], [2, 8, 8], "[x,y]", "[*,x,y]"),
])
def test_broadcast_to(layout, shape, target, runs, out):
    inputs, outputs, emitted = plan("BroadcastTo", [layout, "[*]"], [shape, [len(target)]],
                                    int_values={1: target})
    assert inputs == [runs, None]
    assert outputs == [out]
    assert emitted == []


def test_broadcast_to_takes_the_requested_sharding_of_new_axes():
    _, outputs, emitted = plan("BroadcastTo", ["[y]", "[*]"], [[8], [2]], int_values={1: [4, 8]},
                               requested=layout("[x,*]"))
    assert outputs == ["[x,y]"]
    assert emitted == []


@pytest.mark.parametrize("multiples,runs", [([1, 1], "[x,y]"), ([1, 3], "[x,*]"),
                                            ([2, 1], "[*,y]"), ([2, 2], "[*,*]")])
def test_tile(multiples, runs):
    inputs, outputs, _ = plan("Tile", ["[x,y]", "[*]"], [[8, 8], [2]], int_values={1: multiples})
    assert inputs == [runs, None]
    assert outputs == [runs]


@pytest.mark.parametrize("op,n", [("BroadcastGradientArgs", 2), ("InvertPermutation", 1)])
def test_integer_functions_are_replicated(op, n):
    _, outputs, emitted = plan(op, ["[*]"] * n, [[2]] * n, int_values={i: [2, 1] for i in range(n)})
    assert outputs == ["[*]"] * n
    assert emitted == []
