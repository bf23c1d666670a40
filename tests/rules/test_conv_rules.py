"""Golden table for convolutions and pooling (cc/rules/conv_rules.cc)."""

import pytest

from golden import backward, layout, spec
from tf_dtensor import debug


def plan(op, specs, shapes, **kwargs):
    """golden.plan with host arguments: an empty spec is a host input (its value in
    int_values); its planned layout reads as None."""
    result = debug.explain(op, [layout(s) if s else None for s in specs], shapes, **kwargs)
    return ([spec(l) if l is not None else None for l in result["inputs"]],
            [spec(l) for l in result["outputs"]], result["collectives"])

X, W = [4, 6, 6, 4], [3, 3, 4, 4]

# (x, filter) -> (x runs as, filter runs as, output, collectives)
CONV2D = [
    ("[x,*,*,*]", "[*,*,*,*]", "[x,*,*,*]", "[*,*,*,*]", "[x,*,*,*]", []),
    ("[*,*,*,*]", "[*,*,*,y]", "[*,*,*,*]", "[*,*,*,y]", "[*,*,*,y]", []),
    ("[x,*,*,*]", "[*,*,*,y]", "[x,*,*,*]", "[*,*,*,y]", "[x,*,*,y]", []),
    # Input channels: partial sums; the replicated side is sliced to match.
    ("[*,*,*,x]", "[*,*,x,*]", "[*,*,*,x]", "[*,*,x,*]", "[*,*,*,*]",
     ["all-reduce(sum) of output 0 over x"]),
    ("[x,*,*,y]", "[*,*,*,*]", "[x,*,*,y]", "[*,*,y,*]", "[x,*,*,*]",
     ["relayout input 1 [*,*,*,*] -> [*,*,y,*]", "all-reduce(sum) of output 0 over y"]),
    # Spatial axes are gathered (no halo exchange yet); so is the filter's window.
    ("[*,x,y,*]", "[x,*,*,*]", "[*,*,*,*]", "[*,*,*,*]", "[*,*,*,*]",
     ["relayout input 0 [*,x,y,*] -> [*,*,*,*]", "relayout input 1 [x,*,*,*] -> [*,*,*,*]"]),
    # Batch claims x first: the output channels give it up.
    ("[x,*,*,*]", "[*,*,*,x]", "[x,*,*,*]", "[*,*,*,*]", "[x,*,*,*]",
     ["relayout input 1 [*,*,*,x] -> [*,*,*,*]"]),
]


@pytest.mark.parametrize("x,w,x_runs,w_runs,out,collectives", CONV2D,
                         ids=[f"{c[0]}-{c[1]}" for c in CONV2D])
def test_conv2d(x, w, x_runs, w_runs, out, collectives):
    inputs, outputs, emitted = plan("Conv2D", [x, w], [X, W])
    assert inputs == [x_runs, w_runs]
    assert outputs == [out]
    assert emitted == collectives


def test_conv2d_nchw_reads_channels_at_axis_1():
    inputs, outputs, emitted = plan("Conv2D", ["[x,y,*,*]", "[*,*,*,*]"], [[4, 4, 6, 6], W],
                                    attrs={"data_format": "NCHW"})
    assert inputs == ["[x,y,*,*]", "[*,*,y,*]"]
    assert outputs == ["[x,*,*,*]"]
    assert emitted[-1] == "all-reduce(sum) of output 0 over y"


def test_conv2d_backward_asks_for_batch_and_out_channels():
    assert backward("Conv2D", [X, W], ["[x,*,*,y]"]) == ["[x,*,*,*]", "[*,*,*,y]"]


def test_conv2d_backprop_input_makes_input_sizes_local():
    # input_sizes is the global shape; the op runs on a batch shard.
    inputs, outputs, emitted = plan("Conv2DBackpropInput", ["", "[*,*,*,*]", "[x,*,*,*]"],
                                    [[4], W, X], int_values={0: X})
    assert inputs[1:] == ["[*,*,*,*]", "[x,*,*,*]"]
    assert outputs == ["[x,*,*,*]"]
    assert emitted == []


def test_conv2d_backprop_input_contracts_out_channels():
    inputs, outputs, emitted = plan("Conv2DBackpropInput", ["", "[*,*,*,y]", "[x,*,*,y]"],
                                    [[4], W, X], int_values={0: X})
    assert outputs == ["[x,*,*,*]"]
    assert emitted == ["all-reduce(sum) of output 0 over y"]


def test_conv2d_backprop_filter_batch_is_a_partial_sum():
    inputs, outputs, emitted = plan("Conv2DBackpropFilter", ["[x,*,*,*]", "", "[x,*,*,*]"],
                                    [X, [4], X], int_values={1: W})
    assert inputs[0] == "[x,*,*,*]" and inputs[2] == "[x,*,*,*]"
    assert outputs == ["[*,*,*,*]"]
    assert emitted == ["all-reduce(sum) of output 0 over x"]


def test_conv2d_backprop_filter_channels_pass_through():
    _, outputs, emitted = plan("Conv2DBackpropFilter", ["[x,*,*,y]", "", "[*,*,*,*]"],
                               [X, [4], X], int_values={1: W})
    assert outputs == ["[*,*,y,*]"]
    assert emitted == ["relayout input 2 [*,*,*,*] -> [x,*,*,*]",
                       "all-reduce(sum) of output 0 over x"]


def test_depthwise_multiplier_is_never_sharded():
    inputs, outputs, _ = plan("DepthwiseConv2dNative", ["[x,*,*,y]", "[*,*,*,y]"],
                              [X, [3, 3, 4, 2]])
    assert inputs == ["[x,*,*,y]", "[*,*,y,*]"]
    assert outputs == ["[x,*,*,y]"]


@pytest.mark.parametrize("op", ["MaxPool", "AvgPool"])
def test_pool_keeps_batch_and_channels(op):
    inputs, outputs, emitted = plan(op, ["[x,y,*,*]"], [X])
    assert inputs == ["[x,*,*,*]"]
    assert outputs == ["[x,*,*,*]"]
    assert emitted == ["relayout input 0 [x,y,*,*] -> [x,*,*,*]"]
    _, outputs, _ = plan(op, ["[y,*,*,x]"], [X])
    assert outputs == ["[y,*,*,x]"]


def test_max_pool_grad_lines_up_its_three_inputs():
    inputs, outputs, _ = plan("MaxPoolGrad", ["[x,*,*,y]", "[x,*,*,*]", "[*,*,*,y]"],
                              [X, [4, 3, 3, 4], [4, 3, 3, 4]])
    assert inputs == ["[x,*,*,y]", "[x,*,*,y]", "[x,*,*,y]"]
    assert outputs == ["[x,*,*,y]"]


def test_avg_pool_grad_makes_orig_input_shape_local():
    inputs, outputs, _ = plan("AvgPoolGrad", ["", "[x,*,*,y]"], [[4], [4, 3, 3, 4]],
                              int_values={0: X})
    assert outputs == ["[x,*,*,y]"]


def test_uneven_batch_stays_whole_where_a_shape_argument_is_local():
    # One local input_sizes serves every device: a batch of 3 over x=2 runs replicated.
    _, outputs, _ = plan("Conv2DBackpropInput", ["", "[*,*,*,*]", "[x,*,*,*]"],
                         [[4], W, [3, 6, 6, 4]], int_values={0: [3, 6, 6, 4]})
    assert outputs == ["[*,*,*,*]"]


def test_max_pool_grad_grad_keeps_batch_and_channels():
    _, outputs, _ = plan("MaxPoolGradGrad", ["[x,*,*,y]", "[x,*,*,y]", "[x,*,*,y]"],
                         [X, [4, 3, 3, 4], X])
    assert outputs == ["[x,*,*,y]"]


def test_conv3d_backprop_filter_ncdhw():
    _, outputs, emitted = plan("Conv3DBackpropFilterV2",
                               ["[x,y,*,*,*]", "", "[x,*,*,*,*]"],
                               [[4, 4, 4, 4, 4], [5], [4, 4, 4, 4, 4]],
                               int_values={1: [2, 2, 2, 4, 4]}, attrs={"data_format": "NCDHW"})
    assert outputs == ["[*,*,*,y,*]"]
    assert emitted == ["all-reduce(sum) of output 0 over x"]
