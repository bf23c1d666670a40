"""Golden table for elementwise ops (cc/rules/elementwise_rules.cc, propagation/merge.cc)."""

import pytest

from golden import MESH_2, plan

BINARY = [
    # (a, b, shapes) -> (a runs as, b runs as, output)
    ("[x,*]", "[x,*]", [[8, 8], [8, 8]], "[x,*]", "[x,*]", "[x,*]"),
    ("[x,*]", "[*,*]", [[8, 8], [8, 8]], "[x,*]", "[x,*]", "[x,*]"),
    ("[*,*]", "[*,y]", [[8, 8], [8, 8]], "[*,y]", "[*,y]", "[*,y]"),
    ("[x,*]", "[*,y]", [[8, 8], [8, 8]], "[x,y]", "[x,y]", "[x,y]"),
    ("[x,*]", "[*,x]", [[8, 8], [8, 8]], "[x,*]", "[x,*]", "[x,*]"),
    ("[x,*]", "[*]", [[8, 8], [8]], "[x,*]", "[*]", "[x,*]"),
    ("[x,y]", "[*]", [[8, 8], [8]], "[x,y]", "[y]", "[x,y]"),
    ("[x,y]", "[*,*]", [[8, 8], [8, 1]], "[x,y]", "[x,*]", "[x,y]"),
]


@pytest.mark.parametrize("a,b,shapes,a_runs,b_runs,out", BINARY,
                         ids=[f"{c[0]}-{c[1]}-{c[2][1]}" for c in BINARY])
def test_add(a, b, shapes, a_runs, b_runs, out):
    inputs, outputs, _ = plan("AddV2", [a, b], shapes)
    assert inputs == [a_runs, b_runs]
    assert outputs == [out]


def test_incompatible_shapes_name_the_op():
    with pytest.raises(ValueError, match="Incompatible shapes for 'Mul'"):
        plan("Mul", ["[*,*]", "[*,*]"], [[8, 8], [4, 8]])


def test_unary_keeps_layout_on_1d_mesh():
    _, outputs, emitted = plan("Relu", ["[x,*]"], [[8, 8]], mesh=MESH_2)
    assert outputs == ["[x,*]"]
    assert emitted == []


def test_select_v1_condition_follows_rows():
    inputs, outputs, _ = plan("Select", ["[*]", "[x,*]", "[x,*]"], [[8], [8, 8], [8, 8]])
    assert inputs == ["[x]", "[x,*]", "[x,*]"]
    assert outputs == ["[x,*]"]


def test_unknown_op_is_reported():
    import tf_dtensor
    with pytest.raises(tf_dtensor.UnsupportedOpError, match="'NoSuchOp' has no tf_dtensor rule"):
        plan("NoSuchOp", ["[x,*]"], [[8, 8]])


@pytest.mark.parametrize("data_format,value,bias", [("NHWC", "[x,*,y]", "[y]"),
                                                    ("NCHW", "[x,y,*]", "[y]")])
def test_bias_add_follows_the_channel_axis(data_format, value, bias):
    inputs, outputs, _ = plan("BiasAdd", [value, "[*]"], [[4, 8, 8], [8]],
                              attrs={"data_format": data_format})
    assert inputs == [value, bias]
    assert outputs == [value]
