"""Golden table for StridedSlice, StridedSliceGrad, Slice, Pad and ReverseV2
(cc/rules/slice_rules.cc)."""

import pytest

from golden import plan

MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")

# (python form, begin, end, strides, masks, input) -> (input runs as, output)
STRIDED = [
    ("x[:,2:6]", [0, 2], [0, 6], [1, 1], {"begin_mask": 1, "end_mask": 1}, "[x,y]", "[x,*]",
     "[x,*]"),
    ("x[2:6]", [2], [6], [1], {}, "[x,y]", "[*,y]", "[*,y]"),
    ("x[...,0]", [0, 0], [0, 1], [1, 1], {"ellipsis_mask": 1, "shrink_axis_mask": 2}, "[x,y]",
     "[x,*]", "[x]"),
    ("x[:,None]", [0, 0], [0, 0], [1, 1], {"begin_mask": 1, "end_mask": 1, "new_axis_mask": 2},
     "[x,y]", "[x,y]", "[x,*,y]"),
    ("x[None,...,1:]", [0, 0, 1], [0, 0, 0], [1, 1, 1],
     {"new_axis_mask": 1, "ellipsis_mask": 2, "end_mask": 4}, "[x,y]", "[x,*]", "[*,x,*]"),
    ("x[::-1]", [0], [0], [-1], {"begin_mask": 1, "end_mask": 1}, "[x,y]", "[*,y]", "[*,y]"),
    ("x[0:8,-100:100]", [0, -100], [8, 100], [1, 1], {}, "[x,y]", "[x,y]", "[x,y]"),
]


@pytest.mark.parametrize("form,begin,end,strides,masks,layout,runs,out", STRIDED,
                         ids=[c[0] for c in STRIDED])
def test_strided_slice(form, begin, end, strides, masks, layout, runs, out):
    n = len(begin)
    inputs, outputs, _ = plan("StridedSlice", [layout, "[*]", "[*]", "[*]"],
                              [[8, 8], [n], [n], [n]],
                              int_values={1: begin, 2: end, 3: strides},
                              attrs={m: masks.get(m, 0) for m in MASKS})
    assert inputs[0] == runs
    assert outputs == [out]


def test_strided_slice_grad_keeps_dy_sharding_on_whole_axes():
    # The gradient of x[:, 2:6] for dy [x,y]: axis 1 was cut, so dy gathers it.
    inputs, outputs, emitted = plan("StridedSliceGrad", ["[*]", "[*]", "[*]", "[*]", "[x,y]"],
                                    [[2], [2], [2], [2], [8, 4]],
                                    int_values={0: [8, 8], 1: [0, 2], 2: [0, 6], 3: [1, 1]},
                                    attrs={"begin_mask": 1, "end_mask": 1})
    assert inputs == [None, None, None, None, "[x,*]"]
    assert outputs == ["[x,*]"]
    assert emitted == ["relayout input 4 [x,y] -> [x,*]"]


@pytest.mark.parametrize("begin,size,runs", [([0, 0], [-1, -1], "[x,y]"),
                                             ([0, 2], [8, 4], "[x,*]"),
                                             ([1, 0], [2, 8], "[*,y]")])
def test_slice(begin, size, runs):
    inputs, outputs, _ = plan("Slice", ["[x,y]", "[*]", "[*]"], [[8, 8], [2], [2]],
                              int_values={1: begin, 2: size})
    assert inputs[0] == runs
    assert outputs == [runs]


@pytest.mark.parametrize("op", ["Pad", "MirrorPad"])
def test_pad_gathers_padded_axes(op):
    inputs, outputs, _ = plan(op, ["[x,y]", "[*,*]"], [[8, 8], [2, 2]],
                              int_values={1: [0, 0, 1, 1]})
    assert inputs[0] == "[x,*]"
    assert outputs == ["[x,*]"]


def test_reverse_gathers_reversed_axes():
    inputs, outputs, _ = plan("ReverseV2", ["[x,y]", "[*]"], [[8, 8], [1]], int_values={1: [0]})
    assert outputs == ["[*,y]"]
