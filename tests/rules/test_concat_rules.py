"""Golden table for ConcatV2, Pack, Unpack, Split, SplitV (cc/rules/concat_rules.cc)."""

import pytest

from golden import plan

# (values, axis) -> (values run as, output, collectives)
CONCATS = [
    (["[x,*]", "[x,*]"], 1, ["[x,*]", "[x,*]"], "[x,*]", []),
    (["[x,*]", "[*,y]"], 0, ["[*,y]", "[*,y]"], "[*,y]", ["relayout input 0 [x,*] -> [*,y]"]),
    # The first input that shards an axis wins; the others follow it.
    (["[x,y]", "[y,x]"], 1, ["[x,*]", "[x,*]"], "[x,*]",
     ["relayout input 0 [x,y] -> [x,*]", "relayout input 1 [y,x] -> [x,*]"]),
    (["[*,*]", "[y,*]"], -1, ["[y,*]", "[y,*]"], "[y,*]", ["relayout input 0 [*,*] -> [y,*]"]),
]


@pytest.mark.parametrize("values,axis,runs,out,collectives", CONCATS,
                         ids=[f"{'-'.join(c[0])}-axis{c[1]}" for c in CONCATS])
def test_concat(values, axis, runs, out, collectives):
    inputs, outputs, emitted = plan("ConcatV2", values + ["[]"], [[8, 8]] * len(values) + [[]],
                                    int_values={len(values): [axis]})
    assert inputs == runs + [None]
    assert outputs == [out]
    assert emitted == collectives


def test_concat_v1_takes_the_axis_first():
    inputs, outputs, _ = plan("Concat", ["[]", "[x,y]", "[x,y]"], [[], [8, 8], [8, 8]],
                              int_values={0: [0]})
    assert inputs == [None, "[*,y]", "[*,y]"]
    assert outputs == ["[*,y]"]


@pytest.mark.parametrize("axis,out", [(0, "[*,x,y]"), (1, "[x,*,y]"), (2, "[x,y,*]"),
                                      (-1, "[x,y,*]")])
def test_stack_inserts_an_unsharded_axis(axis, out):
    inputs, outputs, emitted = plan("Pack", ["[x,y]", "[x,y]"], [[8, 8], [8, 8]],
                                    attrs={"axis": axis})
    assert outputs == [out]
    assert emitted == []


def test_stack_of_disagreeing_values():
    inputs, outputs, _ = plan("Pack", ["[x,*]", "[y,x]"], [[8, 8], [8, 8]], attrs={"axis": 0})
    assert inputs == ["[x,*]", "[x,*]"]
    assert outputs == ["[*,x,*]"]


@pytest.mark.parametrize("axis,runs,out", [(0, "[*,y]", "[y]"), (1, "[x,*]", "[x]")])
def test_unstack_gathers_its_axis(axis, runs, out):
    inputs, outputs, _ = plan("Unpack", ["[x,y]"], [[8, 8]], attrs={"axis": axis, "num": 8})
    assert inputs == [runs]
    assert outputs == [out] * 8


def test_split_gathers_only_the_split_axis():
    inputs, outputs, emitted = plan("Split", ["[]", "[x,y]"], [[], [8, 8]], int_values={0: [1]},
                                    attrs={"num_split": 2})
    assert inputs == [None, "[x,*]"]
    assert outputs == ["[x,*]", "[x,*]"]
    assert emitted == ["relayout input 1 [x,y] -> [x,*]"]


def test_split_v_on_an_unsharded_axis_keeps_the_sharding():
    inputs, outputs, emitted = plan("SplitV", ["[x,*]", "[*]", "[]"], [[8, 8], [3], []],
                                    int_values={1: [2, 5, 1], 2: [1]}, attrs={"num_split": 3})
    assert outputs == ["[x,*]"] * 3
    assert emitted == []
