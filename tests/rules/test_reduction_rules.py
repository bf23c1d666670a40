"""Golden table for reductions and softmax (cc/rules/reduction_rules.cc)."""

import pytest

from golden import plan

CASES = [
    # (op, input, axes, keep_dims) -> (output, collectives)
    ("Sum", "[x,*]", [1], False, "[x]", []),
    ("Sum", "[x,*]", [0], False, "[*]", ["all-reduce(sum) of output 0 over x"]),
    ("Sum", "[x,y]", [0, 1], False, "[]", ["all-reduce(sum) of output 0 over x,y"]),
    ("Sum", "[x,y]", [0], True, "[*,y]", ["all-reduce(sum) of output 0 over x"]),
    ("Max", "[*,y]", [-1], False, "[*]", ["all-reduce(max) of output 0 over y"]),
    ("Min", "[x,*]", [0], False, "[*]", ["all-reduce(min) of output 0 over x"]),
    ("Prod", "[x,*]", [0], False, "[*]", ["all-reduce(prod) of output 0 over x"]),
    ("Mean", "[x,*]", [0], False, "[*]", ["all-reduce(sum) of output 0 over x"]),
    # ArgMax and boolean reductions gather the reduced axis instead.
    ("ArgMax", "[x,y]", [0], False, "[y]", ["relayout input 0 [x,y] -> [*,y]"]),
    ("All", "[x,*]", [0], False, "[*]", ["relayout input 0 [x,*] -> [*,*]"]),
]


@pytest.mark.parametrize("op,layout,axes,keep,out,collectives", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}{'-keep' if c[3] else ''}" for c in CASES])
def test_reduction(op, layout, axes, keep, out, collectives):
    _, outputs, emitted = plan(op, [layout, "[*]"], [[8, 8], [len(axes)]],
                               int_values={1: axes}, attrs={"keep_dims": keep})
    assert outputs == [out]
    assert emitted == collectives


def test_reduction_axis_out_of_range_names_the_op():
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        plan("Sum", ["[x,*]", "[*]"], [[8, 8], [1]], int_values={1: [5]})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_gathers_the_last_axis(op):
    inputs, outputs, emitted = plan(op, ["[x,y]"], [[8, 8]])
    assert outputs == ["[x,*]"]
    assert emitted == ["relayout input 0 [x,y] -> [x,*]"]
