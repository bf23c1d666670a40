"""Golden table for Reshape, Transpose, ExpandDims, Squeeze (cc/rules/shape_rules.cc)."""

import pytest

from golden import plan

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
