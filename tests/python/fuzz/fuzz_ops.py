"""The fuzzer's op table: one entry per TensorFlow op with a rule in the registry.

An entry says how to draw a valid call of the raw op: `draw(d)` returns a `Call` whose
`args` map the op definition's input names to `T(array)` (a tensor argument the fuzzer lays
out on the mesh), `H(value)` (a host argument such as a shape or an axis, or small data
passed as a plain tensor) or a list of `T` (list inputs such as AddN's), plus attributes.
The fuzzer then draws the mesh and the layouts and runs the checks (fuzz_engine.py).

Adding an op is a few lines:

    @op("Cumsum")
    def _(d):
        x = d.array(d.shape(1, 3))
        return Call({"x": T(x), "axis": H(d.axis(x.ndim))},
                    {"exclusive": d.bool(), "reverse": d.bool()})

Ops that the fuzzer does not run are in `EXCLUDED`, each with the reason and the test
that covers it instead.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import tensorflow as tf

from fuzz_engine import FLOATS, H, T, Call, Drawer, OpSpec

OPS: Dict[str, OpSpec] = {}

INTS = (tf.int32, tf.int64, tf.int8)
# Also drawn: bfloat16 and complex64 values. A dtype an op's kernel does not take on one
# CPU device is a case TensorFlow refuses, which the engine skips (not a mismatch).
NUMBERS = FLOATS + INTS + (tf.bfloat16, tf.complex64)


def op(name: str, grad: bool = True, creation: bool = False,
       function_reads_whole: bool = False):
    """Registers the decorated draw function as the entry for `name`."""
    def register(draw: Callable[[Drawer], Call]):
        assert name not in OPS, f"{name} is in the table twice"
        OPS[name] = OpSpec(name, draw, grad=grad, creation=creation,
                           function_reads_whole=function_reads_whole)
        return draw
    return register


# ---------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------

# name -> (dtypes, value range); the range keeps the op inside its domain.
UNARY = {
    "Abs": (NUMBERS, (-2, 2)), "Acos": (FLOATS, (-0.9, 0.9)), "Acosh": (FLOATS, (1.1, 3)),
    "Asin": (FLOATS, (-0.9, 0.9)), "Asinh": (FLOATS, (-2, 2)), "Atan": (FLOATS, (-2, 2)),
    "Atanh": (FLOATS, (-0.9, 0.9)), "Ceil": (FLOATS, (-2, 2)), "Cos": (FLOATS, (-2, 2)),
    "Cosh": (FLOATS, (-2, 2)), "Elu": (FLOATS, (-2, 2)), "Erf": (FLOATS, (-2, 2)),
    "Erfc": (FLOATS, (-2, 2)), "Exp": (FLOATS, (-2, 2)), "Expm1": (FLOATS, (-2, 2)),
    "Floor": (FLOATS, (-2, 2)), "Inv": (FLOATS, (0.5, 2)), "Log": (FLOATS, (0.5, 3)),
    "Log1p": (FLOATS, (-0.5, 2)), "Neg": (NUMBERS, (-2, 2)), "Reciprocal": (FLOATS, (0.5, 2)),
    "Relu": (NUMBERS, (-2, 2)), "Relu6": (FLOATS, (-2, 8)), "Rint": (FLOATS, (-2, 2)),
    "Round": (FLOATS, (-2, 2)), "Rsqrt": (FLOATS, (0.5, 3)), "Selu": (FLOATS, (-2, 2)),
    "Sigmoid": (FLOATS, (-2, 2)), "Sign": (NUMBERS, (-2, 2)), "Sin": (FLOATS, (-2, 2)),
    "Sinh": (FLOATS, (-2, 2)), "Softplus": (FLOATS, (-2, 2)), "Softsign": (FLOATS, (-2, 2)),
    "Sqrt": (FLOATS, (0.5, 3)), "Square": (NUMBERS, (-2, 2)), "Tan": (FLOATS, (-1, 1)),
    "Tanh": (FLOATS, (-2, 2)), "OnesLike": (NUMBERS, (-2, 2)), "ZerosLike": (NUMBERS, (-2, 2)),
    "Identity": (NUMBERS, (-2, 2)), "StopGradient": (NUMBERS, (-2, 2)),
}
UNARY_NO_GRAD = {"Snapshot": NUMBERS, "IsFinite": FLOATS, "IsInf": FLOATS, "IsNan": FLOATS, "Invert": INTS,
                 "LogicalNot": (tf.bool,)}


def _unary(dtypes, low=-2.0, high=2.0):
    def draw(d):
        return Call([T(d.array(d.shape(), d.dtype(dtypes), low, high))])
    return draw


for _name, (_dtypes, (_low, _high)) in UNARY.items():
    op(_name)(_unary(_dtypes, _low, _high))
for _name, _dtypes in UNARY_NO_GRAD.items():
    op(_name, grad=False)(_unary(_dtypes))


@op("PreventGradient", grad=False)
def _(d):
    return Call({"input": T(d.array(d.shape()))})


@op("CheckNumerics")
def _(d):
    return Call({"tensor": T(d.array(d.shape(), d.dtype()))}, {"message": "fuzz"})


@op("LeakyRelu")
def _(d):
    return Call({"features": T(d.array(d.shape(), d.dtype()))}, {"alpha": 0.3})


@op("Cast")
def _(d):
    source = d.dtype(NUMBERS + (tf.bool,))
    return Call({"x": T(d.array(d.shape(), source, -3, 3))}, {"DstT": d.dtype(NUMBERS)})


# name -> (dtypes, range of the first argument, range of the second)
BINARY = {
    "Add": NUMBERS, "AddV2": NUMBERS, "Sub": NUMBERS, "Mul": NUMBERS,
    "Maximum": NUMBERS, "Minimum": NUMBERS, "SquaredDifference": NUMBERS,
    "Atan2": FLOATS, "MulNoNan": FLOATS, "Xlogy": FLOATS, "Xlog1py": FLOATS,
    "Xdivy": FLOATS, "DivNoNan": FLOATS,
}
DIVISIONS = {"Div": NUMBERS, "RealDiv": FLOATS, "FloorDiv": NUMBERS, "FloorMod": NUMBERS,
             "Mod": INTS, "TruncateDiv": INTS, "TruncateMod": INTS, "Pow": FLOATS}
COMPARISONS = {"Equal": NUMBERS, "NotEqual": NUMBERS, "Greater": NUMBERS,
               "GreaterEqual": NUMBERS, "Less": NUMBERS, "LessEqual": NUMBERS,
               "LogicalAnd": (tf.bool,), "LogicalOr": (tf.bool,), "BitwiseAnd": INTS,
               "BitwiseOr": INTS, "BitwiseXor": INTS}


def _binary(dtypes, low=-2.0, high=2.0, grad=True):
    def draw(d):
        dtype = d.dtype(dtypes)
        a = d.shape()
        b = d.broadcastable(a)
        if d.bool():
            a, b = b, a
        x, y = d.array(a, dtype, low, high), d.array(b, dtype, low, high)
        return Call([T(x), T(y)], grad=grad)
    return draw


for _name, _dtypes in BINARY.items():
    op(_name)(_binary(_dtypes))
for _name, _dtypes in DIVISIONS.items():
    op(_name)(_binary(_dtypes, 1.0, 4.0))       # positive: no division by zero
for _name, _dtypes in COMPARISONS.items():
    op(_name, grad=False)(_binary(_dtypes, -1.0, 1.0))   # small integers: ties happen


# Gradient ops of activations: (gradients, features) of one shape.
ACTIVATION_GRADS = {
    "EluGrad": ("gradients", "outputs"), "LeakyReluGrad": ("gradients", "features"),
    "Relu6Grad": ("gradients", "features"), "ReluGrad": ("gradients", "features"),
    "SeluGrad": ("gradients", "outputs"), "SoftplusGrad": ("gradients", "features"),
    "SoftsignGrad": ("gradients", "features"),
    "ReciprocalGrad": ("y", "dy"), "RsqrtGrad": ("y", "dy"), "SigmoidGrad": ("y", "dy"),
    "SqrtGrad": ("y", "dy"), "TanhGrad": ("y", "dy"),
}


def _same_shape_pair(first, second, low=0.5, high=2.0):
    def draw(d):
        shape, dtype = d.shape(), d.dtype()
        return Call({first: T(d.array(shape, dtype, low, high)),
                     second: T(d.array(shape, dtype, -2, 2))})
    return draw


for _name, (_first, _second) in ACTIVATION_GRADS.items():
    op(_name, grad=False)(_same_shape_pair(_first, _second))


@op("AddN")
def _(d):
    shape, dtype = d.shape(), d.dtype(NUMBERS)
    return Call({"inputs": [T(d.array(shape, dtype)) for _ in range(d.int(1, 3))]})


@op("Select")
def _(d):
    shape, dtype = d.shape(1, 3), d.dtype(NUMBERS)
    cond_shape = shape if d.bool() else shape[:1]
    return Call({"condition": T(d.array(cond_shape, tf.bool)), "t": T(d.array(shape, dtype)),
                 "e": T(d.array(shape, dtype))})


@op("SelectV2")
def _(d):
    shape, dtype = d.shape(), d.dtype(NUMBERS)
    return Call({"condition": T(d.array(d.broadcastable(shape), tf.bool)),
                 "t": T(d.array(shape, dtype)), "e": T(d.array(d.broadcastable(shape), dtype))})


@op("ClipByValue")
def _(d):
    shape, dtype = d.shape(), d.dtype(NUMBERS)
    bound = () if d.bool() else shape
    return Call({"t": T(d.array(shape, dtype, -3, 3)), "clip_value_min": T(d.array(bound, dtype, -2, -1)),
                 "clip_value_max": T(d.array(bound, dtype, 1, 2))})


@op("BiasAdd")
def _(d):
    shape, dtype = d.shape(2, 4), d.dtype(NUMBERS)
    return Call({"value": T(d.array(shape, dtype)), "bias": T(d.array(shape[-1:], dtype))})


@op("BiasAddGrad")
def _(d):
    return Call({"out_backprop": T(d.array(d.shape(2, 4), d.dtype()))})


# ---------------------------------------------------------------------------------------
# Reductions and scans
# ---------------------------------------------------------------------------------------

def _axes(d: Drawer, rank: int):
    """Reduction axes: a scalar axis, or a list of distinct (possibly negative) axes."""
    if rank and d.bool():
        return d.axis(rank)
    return sorted({d.axis(rank, negative=False) for _ in range(d.int(0, rank))})


def _reduction(dtypes, low=-2.0, high=2.0):
    def draw(d):
        x = d.array(d.shape(0, 4), d.dtype(dtypes), low, high)
        return Call([T(x), H(_axes(d, x.ndim), tf.int32)], {"keep_dims": d.bool()})
    return draw


for _name, _dtypes in {"Sum": NUMBERS, "Mean": FLOATS, "Max": NUMBERS, "Min": NUMBERS,
                       "Prod": FLOATS, "EuclideanNorm": FLOATS}.items():
    op(_name)(_reduction(_dtypes, 0.5, 1.5) if _name == "Prod" else _reduction(_dtypes))
for _name in ("All", "Any"):
    op(_name, grad=False)(_reduction((tf.bool,)))


for _name in ("ArgMax", "ArgMin"):
    @op(_name, grad=False)
    def _(d):
        x = d.array(d.shape(1, 4), d.dtype(NUMBERS), -50, 50)
        return Call([T(x), H(d.axis(x.ndim), tf.int32)], {"output_type": d.dtype(INTS)})


@op("L2Loss")
def _(d):
    return Call([T(d.array(d.shape(0, 4), d.dtype()))])


# tf.debugging.enable_check_numerics' summary (mode 8) and tfdbg's (2-5). TF infers no
# shape for it in a graph; a tf.function's result has the one it ran with.
@op("DebugNumericSummaryV2", grad=False)
def _(d):
    x = d.array(d.shape(0, 4), d.dtype())
    if x.size and d.bool():
        x.flat[d.int(0, x.size - 1)] = d.choice([np.inf, -np.inf, np.nan])
    return Call([T(x)], {"tensor_debug_mode": d.choice([2, 3, 4, 5, 8]), "tensor_id": 7})


for _name in ("Cumsum", "Cumprod", "CumulativeLogsumexp"):
    @op(_name)
    def _(d):
        x = d.array(d.shape(1, 4), d.dtype(), 0.5, 1.5)
        return Call([T(x), H(d.axis(x.ndim), tf.int32)],
                    {"exclusive": d.bool(), "reverse": d.bool()})


# ---------------------------------------------------------------------------------------
# Contractions
# ---------------------------------------------------------------------------------------

@op("MatMul")
def _(d):
    m, k, n = d.size(), d.size(), d.size()
    ta, tb, dtype = d.bool(), d.bool(), d.dtype()
    a = d.array((k, m) if ta else (m, k), dtype)
    b = d.array((n, k) if tb else (k, n), dtype)
    return Call([T(a), T(b)], {"transpose_a": ta, "transpose_b": tb})


def _batch_matmul(broadcast: bool, v3: bool = False):
    def draw(d):
        batch = d.shape(1 if not broadcast else 0, 2)
        m, k, n = d.size(), d.size(), d.size()
        adj_x, adj_y, dtype = d.bool(), d.bool(), d.dtype()
        other = d.broadcastable(batch) if broadcast else batch
        if broadcast and d.bool():
            batch, other = other, batch
        x = d.array(tuple(batch) + ((k, m) if adj_x else (m, k)), dtype)
        y = d.array(tuple(other) + ((n, k) if adj_y else (k, n)), dtype)
        attrs = {"adj_x": adj_x, "adj_y": adj_y}
        if v3:
            attrs["Tout"] = dtype
        return Call([T(x), T(y)], attrs)
    return draw


op("BatchMatMul")(_batch_matmul(False))
op("BatchMatMulV2")(_batch_matmul(True))
op("BatchMatMulV3")(_batch_matmul(True, v3=True))

# Equations over letters that name sizes; each draw picks one and its operand shapes.
EINSUMS = ["ij,jk->ik", "bij,bjk->bik", "ij->ji", "ij->i", "ij,ij->ij", "ij,j->i",
           "bsh,hd->bsd", "bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd", "i,j->ij", "ijk->kij",
           "ii->i", "ij,kj->ik", "abc,cd->abd", "ij,jk,kl->il", "i,i->"]


@op("Einsum")
def _(d):
    equation = d.choice(EINSUMS)
    sizes = {letter: d.size(1, 6) for letter in sorted(set(equation) - set(",->"))}
    dtype = d.dtype()
    operands = [T(d.array([sizes[c] for c in term], dtype))
                for term in equation.split("->")[0].split(",")]
    return Call({"inputs": operands}, {"equation": equation})


# ---------------------------------------------------------------------------------------
# Shapes: reshape, transpose, tile, pad, slice, split, concat, pack
# ---------------------------------------------------------------------------------------

def _factorizations(n: int):
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


@op("Reshape")
def _(d):
    x = d.array(d.shape(0, 4), d.dtype(NUMBERS))
    n = x.size
    kind = d.int(0, 3)
    if kind == 0:
        shape = [n]
    elif kind == 1:
        shape = list(d.choice(_factorizations(n)))
    elif kind == 2:
        a, b = d.choice(_factorizations(n))
        shape = [a] + list(d.choice(_factorizations(b)))
    else:
        shape = list(x.shape)[::-1] if x.ndim else []
        if shape and d.bool():
            shape[d.int(0, len(shape) - 1)] = -1
    return Call([T(x), H(shape, tf.int32)])


@op("ExpandDims")
def _(d):
    x = d.array(d.shape(0, 3), d.dtype(NUMBERS))
    return Call([T(x), H(d.int(-x.ndim - 1, x.ndim), tf.int32)])


@op("Squeeze")
def _(d):
    shape = [d.choice([1, 1, 2, 3, 5]) for _ in range(d.int(1, 4))]
    shape[d.int(0, len(shape) - 1)] = 1
    ones = [i for i, s in enumerate(shape) if s == 1]
    dims = sorted({d.choice(ones) for _ in range(d.int(1, len(ones)))})
    return Call([T(d.array(shape, d.dtype(NUMBERS)))], {"axis": dims if d.bool() else []})


@op("Transpose")
def _(d):
    x = d.array(d.shape(0, 4), d.dtype(NUMBERS))
    return Call([T(x), H(d.permutation(x.ndim), tf.int32)])


@op("InvertPermutation", grad=False)
def _(d):
    return Call([T(np.asarray(d.permutation(d.size()), np.int32))])


@op("Tile")
def _(d):
    x = d.array(d.shape(0, 3), d.dtype(NUMBERS))
    return Call([T(x), H([d.int(1, 3) for _ in range(x.ndim)], tf.int32)])


@op("BroadcastTo")
def _(d):
    target = d.shape(0, 4)
    return Call([T(d.array(d.broadcastable(target), d.dtype(NUMBERS))), H(target, tf.int32)])


def _paddings(d: Drawer, rank: int, limit: int = 3):
    return [[d.int(0, limit), d.int(0, limit)] for _ in range(rank)]


@op("Pad")
def _(d):
    x = d.array(d.shape(0, 3), d.dtype(NUMBERS))
    return Call([T(x), H(_paddings(d, x.ndim), tf.int32)])


@op("PadV2")
def _(d):
    x = d.array(d.shape(0, 3), d.dtype(NUMBERS))
    return Call([T(x), H(_paddings(d, x.ndim), tf.int32), H(np.asarray(1.5).astype(x.dtype))])


@op("MirrorPad")
def _(d):
    x = d.array(d.shape(1, 3, low=2), d.dtype(NUMBERS))
    mode = d.choice(["REFLECT", "SYMMETRIC"])
    most = [s - 1 if mode == "REFLECT" else s for s in x.shape]
    paddings = [[d.int(0, m), d.int(0, m)] for m in most]
    return Call([T(x), H(paddings, tf.int32)], {"mode": mode})


@op("MirrorPadGrad", grad=False)
def _(d):
    out = d.shape(1, 3, low=2)
    mode = d.choice(["REFLECT", "SYMMETRIC"])
    most = [s - 1 if mode == "REFLECT" else s for s in out]
    paddings = [[d.int(0, m), d.int(0, m)] for m in most]
    shape = [s + p[0] + p[1] for s, p in zip(out, paddings)]
    return Call([T(d.array(shape, d.dtype())), H(paddings, tf.int32)], {"mode": mode})


@op("ReverseV2")
def _(d):
    x = d.array(d.shape(0, 4), d.dtype(NUMBERS))
    return Call([T(x), H(_axes(d, x.ndim), tf.int32)])


@op("ReverseSequence")
def _(d):
    x = d.array(d.shape(2, 4), d.dtype(NUMBERS))
    batch, seq = d.choice([(a, b) for a in range(x.ndim) for b in range(x.ndim) if a != b])
    lengths = d.array((x.shape[batch],), d.dtype((tf.int32, tf.int64)), 0, x.shape[seq])
    return Call([T(x), T(lengths)], {"seq_dim": seq, "batch_dim": batch})


@op("Roll")
def _(d):
    x = d.array(d.shape(1, 4), d.dtype(NUMBERS))
    axes = [d.axis(x.ndim) for _ in range(d.int(1, 3))]
    shifts = [d.int(-9, 9) for _ in axes]
    return Call([T(x), H(shifts, tf.int32), H(axes, tf.int32)])


@op("Slice")
def _(d):
    x = d.array(d.shape(1, 4), d.dtype(NUMBERS))
    begin = [d.int(0, s - 1) for s in x.shape]
    size = [d.choice([-1, d.int(0, s - b)]) for s, b in zip(x.shape, begin)]
    return Call([T(x), H(begin, tf.int32), H(size, tf.int32)])


def _strided_spec(d: Drawer, shape):
    begin, end, strides = [], [], []
    for s in shape:
        stride = d.choice([1, 1, 2, -1, 3])
        begin.append(d.int(-s, s))
        end.append(d.int(-s, s))
        strides.append(stride)
    masks = {name: d.int(0, 2 ** len(shape) - 1) if d.bool() else 0
             for name in ("begin_mask", "end_mask")}
    if d.int(0, 3) == 0:
        masks["shrink_axis_mask"] = 1 << d.int(0, len(shape) - 1)
    return begin, end, strides, masks


@op("StridedSlice")
def _(d):
    x = d.array(d.shape(1, 4), d.dtype(NUMBERS))
    begin, end, strides, masks = _strided_spec(d, x.shape)
    if "shrink_axis_mask" in masks:   # a shrunk axis takes one valid index
        axis = masks["shrink_axis_mask"].bit_length() - 1
        begin[axis], end[axis], strides[axis] = 0, 1, 1
        masks["begin_mask"] &= ~(1 << axis)
        masks["end_mask"] &= ~(1 << axis)
    return Call([T(x), H(begin, tf.int32), H(end, tf.int32), H(strides, tf.int32)], masks)


@op("StridedSliceGrad", grad=False)
def _(d):
    shape = d.shape(1, 3)
    begin, end, strides, masks = _strided_spec(d, shape)
    masks.pop("shrink_axis_mask", None)
    sliced = tf.strided_slice(tf.zeros(shape), begin, end, strides, **masks).shape
    return Call([H(list(shape), tf.int32), H(begin, tf.int32), H(end, tf.int32),
                 H(strides, tf.int32), T(d.array(sliced, d.dtype()))], masks)


@op("ConcatV2")
def _(d):
    shape, dtype = list(d.shape(1, 3)), d.dtype(NUMBERS)
    axis = d.axis(len(shape))
    pieces = []
    for _ in range(d.int(1, 3)):
        piece = list(shape)
        piece[axis] = d.size(1, 5)
        pieces.append(T(d.array(piece, dtype)))
    return Call({"values": pieces, "axis": H(axis, tf.int32)})


@op("Concat")
def _(d):
    call = OPS["ConcatV2"].draw(d)
    return Call({"concat_dim": call.args["axis"], "values": call.args["values"]})


@op("Pack")
def _(d):
    shape, dtype = d.shape(0, 3), d.dtype(NUMBERS)
    return Call({"values": [T(d.array(shape, dtype)) for _ in range(d.int(1, 3))]},
                {"axis": d.int(-len(shape) - 1, len(shape))})


@op("Unpack")
def _(d):
    x = d.array(d.shape(1, 3, high=5), d.dtype(NUMBERS))
    axis = d.axis(x.ndim)
    return Call([T(x)], {"num": x.shape[axis], "axis": axis})


@op("Split")
def _(d):
    num = d.int(1, 3)
    shape = list(d.shape(1, 3))
    axis = d.axis(len(shape))
    shape[axis] = num * d.size(1, 3)
    return Call([H(axis, tf.int32), T(d.array(shape, d.dtype(NUMBERS)))], {"num_split": num})


@op("SplitV")
def _(d):
    x = d.array(d.shape(1, 3), d.dtype(NUMBERS))
    axis = d.axis(x.ndim)
    sizes, left = [], x.shape[axis]
    while left:
        sizes.append(d.int(0 if sizes else 1, left))
        left -= sizes[-1]
    if d.bool():
        sizes[d.int(0, len(sizes) - 1)] = -1
    return Call([T(x), H(sizes, tf.int32), H(axis, tf.int32)], {"num_split": len(sizes)})


for _name in ("Shape", "Size", "Rank"):
    @op(_name, grad=False)
    def _(d):
        return Call([T(d.array(d.shape(0, 4), d.dtype(NUMBERS)))])
OPS["Shape"].draw = lambda d: Call([T(d.array(d.shape(0, 4)))], {"out_type": d.dtype(INTS)})


@op("ShapeN", grad=False)
def _(d):
    return Call({"input": [T(d.array(d.shape(0, 3))) for _ in range(d.int(1, 3))]})


@op("IdentityN")
def _(d):
    return Call({"input": [T(d.array(d.shape(0, 3), d.dtype())) for _ in range(d.int(1, 3))]})


# Its output shape depends on the values (a tf.function's result has the one it ran with).
@op("BroadcastGradientArgs", grad=False)
def _(d):
    a = d.shape(0, 4)
    b = d.broadcastable(a)
    return Call([T(np.asarray(a, np.int32)), T(np.asarray(b, np.int32))])


@op("ConcatOffset", grad=False)
def _(d):
    # The shapes of a concat's inputs (they agree but on the axis); the axis may be negative.
    shape = d.shape(1, 4)
    axis = d.int(0, len(shape) - 1)
    dtype = d.choice([np.int32, np.int64])
    shapes = []
    for _ in range(d.int(2, 4)):   # TF's op takes two shapes or more
        shape = list(shape)
        shape[axis] = d.int(0, 5)
        shapes.append(T(np.asarray(shape, dtype)))
    if d.bool():
        axis -= len(shape)
    return Call({"concat_dim": H(axis, tf.int32), "shape": shapes})


def _stitch(d):
    # A permutation of 0..n-1 in two index vectors; each data block its indices' shape
    # followed by one element shape. The output's size depends on the index values.
    n = d.int(2, 6)
    perm = np.asarray(d.permutation(n), np.int32)
    k = d.int(1, n - 1)
    element = d.shape(0, 2)
    parts = [perm[:k], perm[k:]]
    return Call({"indices": [T(p) for p in parts],
                 "data": [T(d.array((len(p),) + element)) for p in parts]})


op("DynamicStitch", grad=False)(_stitch)
op("ParallelDynamicStitch", grad=False)(_stitch)


@op("Fill", creation=True)
def _(d):
    return Call([H(list(d.shape(0, 3)), tf.int32), H(np.asarray(2.5, np.float32))])


@op("Empty", grad=False, creation=True)
def _(d):
    # init: zeros (without it the values are unset, nothing to compare).
    return Call([H(list(d.shape(0, 3)), tf.int32)],
                {"dtype": d.dtype((tf.float32, tf.int32, tf.bool)), "init": True})


@op("Range", creation=True)
def _(d):
    start, delta = d.int(-5, 5), d.choice([1, 2, 3, -1])
    limit = start + delta * d.int(1, 12)
    return Call([H(start, tf.int32), H(limit, tf.int32), H(delta, tf.int32)])


@op("LinSpace", creation=True)
def _(d):
    return Call([H(np.float32(-1.0)), H(np.float32(d.int(1, 5))), H(d.int(1, 12), tf.int32)])


STATELESS = {
    "StatelessRandomNormal": {}, "StatelessRandomUniform": {},
    "StatelessTruncatedNormal": {}, "StatelessRandomUniformFullInt": {"dtype": tf.int64},
}

for _name, _attrs in STATELESS.items():
    @op(_name, grad=False, creation=True)
    def _(d, _attrs=_attrs):
        seed = H(np.asarray([d.int(0, 99), d.int(0, 99)], np.int64))
        return Call([H(list(d.shape(1, 3)), tf.int32), seed], dict(_attrs))


STATELESS_V2 = {
    "StatelessRandomNormalV2": {}, "StatelessRandomUniformV2": {},
    "StatelessTruncatedNormalV2": {}, "StatelessRandomUniformFullIntV2": {"dtype": tf.int64},
    "StatelessRandomUniformIntV2": {},
}

for _name, _attrs in STATELESS_V2.items():
    @op(_name, grad=False, creation=True)
    def _(d, _attrs=_attrs, _name=_name):
        key = H(np.asarray([d.int(0, 99)], np.uint64))
        counter = H(np.asarray([d.int(0, 99), 0], np.uint64))
        args = [H(list(d.shape(1, 3)), tf.int32), key, counter, H(1, tf.int32)]
        if _name == "StatelessRandomUniformIntV2":
            args += [H(0, tf.int32), H(100, tf.int32)]
        return Call(args, dict(_attrs))


@op("StatelessRandomUniformInt", grad=False, creation=True)
def _(d):
    seed = H(np.asarray([d.int(0, 99), d.int(0, 99)], np.int64))
    return Call([H(list(d.shape(1, 3)), tf.int32), seed, H(0, tf.int32), H(100, tf.int32)])


# ---------------------------------------------------------------------------------------
# Gathers, segments, one-hot, top-k
# ---------------------------------------------------------------------------------------

@op("GatherV2")
def _(d):
    params = d.array(d.shape(1, 3), d.dtype(NUMBERS))
    axis = d.axis(params.ndim)
    batch_dims = 0
    indices = d.array(d.shape(0, 2), d.dtype(INTS), 0, params.shape[axis] - 1)
    return Call([T(params), T(indices), H(axis, tf.int32)], {"batch_dims": batch_dims})


@op("Gather")
def _(d):
    params = d.array(d.shape(1, 3), d.dtype(NUMBERS))
    indices = d.array(d.shape(0, 2), d.dtype(INTS), 0, params.shape[0] - 1)
    return Call([T(params), T(indices)])


for _name in ("UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
              "UnsortedSegmentProd"):
    @op(_name)
    def _(d):
        data = d.array(d.shape(1, 3), d.dtype(NUMBERS), 0.5, 1.5)
        prefix = data.shape[:d.int(1, data.ndim)]
        segments = d.int(1, 6)
        ids = d.array(prefix, d.dtype(INTS), -1 if d.bool() else 0, segments - 1)
        return Call([T(data), T(ids), H(segments, tf.int32)])


# The sorted segment ops: ids sorted, as many segments as the largest id says (data-dependent
# inside tf.function).
for _name in ("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd"):
    @op(_name, function_reads_whole=True)
    def _(d):
        data = d.array(d.shape(1, 3), d.dtype(), 0.5, 1.5)
        ids = np.sort(d.array(data.shape[:1], d.dtype((tf.int32, tf.int64)), 0, 4))
        return Call([T(data), T(ids)])


def _sparse_segments(d, rows):
    """indices into `rows` rows and sorted segment ids for them."""
    count = d.int(1, 6)
    indices = d.array((count,), tf.int32, 0, rows - 1)
    ids = np.sort(d.array((count,), tf.int32, 0, 3))
    return indices, ids


for _name in ("SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN"):
    @op(_name, function_reads_whole=True)
    def _(d):
        data = d.array(d.shape(1, 3), d.dtype())
        indices, ids = _sparse_segments(d, data.shape[0])
        return Call([T(data), T(indices), T(ids)])

    @op(_name + "WithNumSegments")
    def _(d):
        data = d.array(d.shape(1, 3), d.dtype())
        indices, ids = _sparse_segments(d, data.shape[0])
        return Call([T(data), T(indices), T(ids), H(int(ids.max()) + d.int(1, 3), tf.int32)])

    @op(_name + "Grad", grad=False)
    def _(d):
        rows = d.size(1, 6)
        indices, ids = _sparse_segments(d, rows)
        grad = d.array((int(ids.max()) + 1,) + d.shape(0, 2), d.dtype())
        return Call([T(grad), T(indices), T(ids), H(rows, tf.int32)])

    @op(_name + "GradV2", grad=False, function_reads_whole=True)
    def _(d):
        rows = d.size(1, 6)
        indices, ids = _sparse_segments(d, rows)
        grad = d.array((int(ids.max()) + 1,) + d.shape(0, 2), d.dtype())
        return Call([T(grad), T(indices), T(ids), H(rows, tf.int32)])


@op("OneHot")
def _(d):
    depth = d.int(1, 6)
    indices = d.array(d.shape(0, 2), d.dtype(INTS), -1, depth)
    dtype = d.dtype()
    on, off = H(np.asarray(2.0).astype(dtype.as_numpy_dtype)), H(np.asarray(-1.0).astype(
        dtype.as_numpy_dtype))
    return Call([T(indices), H(depth, tf.int32), on, off], {"axis": d.int(-1, indices.ndim)},
                grad=False)


@op("TopKV2")
def _(d):
    x = d.array(d.shape(1, 3), d.dtype(NUMBERS), -1000, 1000)
    return Call([T(x), H(d.int(0, x.shape[-1]), tf.int32)])


@op("InTopKV2", grad=False)
def _(d):
    batch, classes = d.size(), d.size()
    predictions = d.array((batch, classes), tf.float32)
    targets = d.array((batch,), d.dtype(INTS), 0, classes - 1)
    return Call([T(predictions), T(targets), H(d.int(0, classes), targets.dtype)])


# ---------------------------------------------------------------------------------------
# Softmax and losses
# ---------------------------------------------------------------------------------------

for _name in ("Softmax", "LogSoftmax"):
    @op(_name)
    def _(d):
        return Call([T(d.array(d.shape(1, 4), d.dtype()))])


@op("SoftmaxCrossEntropyWithLogits")
def _(d):
    batch, classes, dtype = d.size(), d.size(), d.dtype()
    labels = d.array((batch, classes), dtype, 0, 1)
    return Call([T(d.array((batch, classes), dtype)), T(labels / labels.sum(-1, keepdims=True))],
                grad=False)


@op("SparseSoftmaxCrossEntropyWithLogits")
def _(d):
    batch, classes = d.size(), d.size()
    labels = d.array((batch,), d.dtype(INTS), 0, classes - 1)
    return Call([T(d.array((batch, classes), d.dtype())), T(labels)], grad=False)


import fuzz_ops_conv  # noqa: E402,F401 - registers the convolution and pooling entries
import fuzz_ops_math  # noqa: E402,F401 - registers the math, linear algebra, FFT and image entries
import fuzz_ops_model  # noqa: E402 - batch norm, N-d gathers/scatters, data-dependent shapes

# ---------------------------------------------------------------------------------------
# Not fuzzed, with the reason and where they are tested instead
# ---------------------------------------------------------------------------------------

_RESOURCE = ("resource handles have no values to compare; DVariable behaviour is tested in "
             "tests/python/test_variable.py and test_checkpoint*.py")
_STATEFUL_RANDOM = ("stateful random ops draw different values per run, so there is no "
                    "single-device value to compare; tests/python/test_rules_creation.py")
EXCLUDED = {
    "AssignAddVariableOp": _RESOURCE, "AssignSubVariableOp": _RESOURCE,
    "AssignVariableOp": _RESOURCE, "DestroyResourceOp": _RESOURCE,
    "ReadVariableOp": _RESOURCE, "VarHandleOp": _RESOURCE, "VarIsInitializedOp": _RESOURCE,
    "VariableShape": _RESOURCE,
    "RandomStandardNormal": _STATEFUL_RANDOM, "RandomUniform": _STATEFUL_RANDOM,
    "RandomUniformInt": _STATEFUL_RANDOM, "TruncatedNormal": _STATEFUL_RANDOM,
    "TfDTensorRelayout": "the relayout op itself; every case uses it to build its inputs, and "
                         "tests/python/test_uneven_partial.py checks it directly",
    "TfDTensorRelayoutLike": "relayout_like; tests/python/test_api.py",
    "_EagerConst": "an eager constant (a creation op of TensorFlow's Python layer); "
                   "tests/python/test_rules_creation.py",
    "StatelessRandomGetAlg": "no inputs and a host result; tests/python/test_rules_creation.py",
    "StatelessRandomGetKeyCounter": "feeds the V2 stateless ops; test_rules_creation.py",
    "StatelessRandomGetKeyCounterAlg": "feeds the V2 stateless ops; test_rules_creation.py",
    **fuzz_ops_model.EXCLUDED,
}
