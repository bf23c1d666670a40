"""Numerical checks of cc/rules/elementwise_rules.cc: unary ops, binary ops with
broadcasting, the activation gradients, SelectV2, IdentityN.

    [x,*] + [x,*] -> [x,*]     [x,*] * [*] -> [x,*]     relu([*,y]) -> [*,y]
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, check_op,
                             collective_lowering, layout_of,
                             layout_params, layouts_for, random_array, reassemble,
                             run_without_fallback, spec_id, spec_params, to_dtensor)
from tf_dtensor.dtensor import Layout

SHAPE = (4, 8)

# name -> (fn, the TF op it runs, input range)
UNARY_OPS = {
    "Relu": (tf.nn.relu, "Relu", (-2.0, 2.0)),
    "Tanh": (tf.math.tanh, "Tanh", (-2.0, 2.0)),
    "Sigmoid": (tf.math.sigmoid, "Sigmoid", (-2.0, 2.0)),
    "Exp": (tf.math.exp, "Exp", (-2.0, 2.0)),
    "Log": (tf.math.log, "Log", (0.5, 4.0)),
    "Neg": (tf.math.negative, "Neg", (-2.0, 2.0)),
    "Square": (tf.math.square, "Square", (-2.0, 2.0)),
    "Sqrt": (tf.math.sqrt, "Sqrt", (0.5, 4.0)),
    "Rsqrt": (tf.math.rsqrt, "Rsqrt", (0.5, 4.0)),
    "Cast": (lambda x: tf.cast(x, tf.int32), "Cast", (-10.0, 10.0)),
    "Identity": (tf.identity, "Identity", (-2.0, 2.0)),
    "ZerosLike": (lambda x: tf.raw_ops.ZerosLike(x=x), "ZerosLike", (-2.0, 2.0)),
    "OnesLike": (lambda x: tf.raw_ops.OnesLike(x=x), "OnesLike", (-2.0, 2.0)),
    # Keras' Discretization layer.
    "Bucketize": (lambda x: tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5]),
                  "Bucketize", (-2.0, 2.0)),
}


# Every op shares the Pointwise rule: each runs on three layouts that together shard both
# axes over both mesh dims, and Relu on every layout of both meshes.
@pytest.mark.parametrize("name", sorted(UNARY_OPS))
@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]",), ("[y,*]",), ("[*,x]",)))
def test_unary(name, layouts):
    fn, op_name, (low, high) = UNARY_OPS[name]
    check_op(fn, op_name, [random_array(SHAPE, low=low, high=high)], layouts)


@pytest.mark.parametrize("layouts", layout_params(SHAPE))
def test_relu(layouts):
    check_op(tf.nn.relu, "Relu", [random_array(SHAPE)], layouts)


def test_cast_to_int32_truncates_on_every_shard(mesh_2x2):
    x = np.array([[-2.7, -1.5, 0.5, 1.9]] * 4, dtype=np.float32)
    out = check_op(lambda t: tf.cast(t, tf.int32), "Cast", [x], [layout_of("[x,y]", mesh_2x2)])
    assert out.dtype == tf.int32


# Small integers stored as floats, so that Equal/Greater/Less see ties.
def _operands(seed):
    a = random_array(SHAPE, np.int32, -2, 2, seed=seed).astype(np.float32)
    b = random_array(SHAPE, np.int32, -2, 2, seed=seed + 1).astype(np.float32)
    return a, b


@pytest.mark.parametrize("layouts", layout_params(SHAPE, SHAPE))
def test_add(layouts):
    check_op(tf.add, "AddV2", list(_operands(0)), layouts)


BINARY_OPS = {
    "Add": (lambda a, b: tf.raw_ops.Add(x=a, y=b), "Add"),
    "Sub": (tf.subtract, "Sub"),
    "Mul": (tf.multiply, "Mul"),
    "RealDiv": (tf.math.truediv, "RealDiv"),
    "Maximum": (tf.maximum, "Maximum"),
    "Minimum": (tf.minimum, "Minimum"),
    "Equal": (tf.equal, "Equal"),
    "Greater": (tf.greater, "Greater"),
    "Less": (tf.less, "Less"),
}

MIXED_PAIRS = spec_params(MESH_2X2, ("[x,y]", "[x,y]"), ("[x,*]", "[*,y]"), ("[y,x]", "[x,y]"))


@pytest.mark.parametrize("name", sorted(BINARY_OPS))
@pytest.mark.parametrize("layouts", MIXED_PAIRS)
def test_binary(name, layouts):
    fn, op_name = BINARY_OPS[name]
    a, b = _operands(1)
    if name == "RealDiv":
        b = random_array(SHAPE, low=0.5, high=2.0, seed=3)
    check_op(fn, op_name, [a, b], layouts)


def test_comparison_outputs_are_bool(mesh_2x2):
    a, b = _operands(2)
    out = check_op(tf.equal, "Equal", [a, b], [layout_of("[x,y]", mesh_2x2)] * 2)
    assert out.dtype == tf.bool


@pytest.mark.parametrize("layouts", layout_params((4, 8), (8,), meshes=[MESH_2X2]))
def test_broadcast_matrix_plus_row(layouts):
    check_op(tf.add, "AddV2", [random_array((4, 8)), random_array((8,), seed=1)], layouts)


@pytest.mark.parametrize("layouts", layout_params((4, 8), (4, 1), meshes=[MESH_2X2]))
def test_broadcast_matrix_plus_column(layouts):
    check_op(tf.add, "AddV2", [random_array((4, 8)), random_array((4, 1), seed=1)], layouts)


@pytest.mark.parametrize("layouts", layout_params((4, 1), (1, 8), meshes=[MESH_2X2]))
def test_broadcast_column_plus_row(layouts):
    check_op(tf.add, "AddV2", [random_array((4, 1)), random_array((1, 8), seed=1)], layouts)


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]", "[y]"), ("[*,y]", "[x]"),
                                                ("[x,*]", "[*]")))
def test_broadcast_maximum_with_row(layouts):
    check_op(tf.maximum, "Maximum", [random_array((4, 8)), random_array((8,), seed=1)], layouts)


def _where(cond, a, b):
    return tf.where(cond, a, b)


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2,
    ("[x,y]", "[x,y]", "[x,y]"),
    ("[x,*]", "[*,y]", "[*,*]"),
    ("[*,*]", "[y,x]", "[x,y]"),
    ("[y,*]", "[*,*]", "[*,x]"),
))
def test_select_v2(layouts):
    cond = random_array(SHAPE, np.bool_, seed=4)
    check_op(_where, "SelectV2", [cond, random_array(SHAPE), random_array(SHAPE, seed=1)],
             layouts)


@pytest.mark.parametrize("layouts", spec_params(
    MESH_2X2,
    ("[y]", "[x,y]", "[x,*]"),
    ("[*]", "[x,*]", "[*,y]"),
    ("[x]", "[*,*]", "[y,*]"),
))
def test_select_v2_broadcast_condition(layouts):
    cond = random_array((8,), np.bool_, seed=5)
    check_op(_where, "SelectV2", [cond, random_array(SHAPE), random_array(SHAPE, seed=1)],
             layouts)


# Activation gradients: Pointwise like their ops. Each takes the upstream gradient and the
# op's input or output; the lambdas take the two in the op's input order, and the range
# applies to the input or output.
GRAD_OPS = {
    "ReluGrad": (lambda g, x: tf.raw_ops.ReluGrad(gradients=g, features=x), 1, (-2.0, 2.0)),
    "Relu6Grad": (lambda g, x: tf.raw_ops.Relu6Grad(gradients=g, features=x), 1, (-2.0, 8.0)),
    "EluGrad": (lambda g, y: tf.raw_ops.EluGrad(gradients=g, outputs=y), 1, (-0.9, 2.0)),
    "SeluGrad": (lambda g, y: tf.raw_ops.SeluGrad(gradients=g, outputs=y), 1, (-0.9, 2.0)),
    "SoftplusGrad": (lambda g, x: tf.raw_ops.SoftplusGrad(gradients=g, features=x), 1,
                     (-2.0, 2.0)),
    "SoftsignGrad": (lambda g, x: tf.raw_ops.SoftsignGrad(gradients=g, features=x), 1,
                     (-2.0, 2.0)),
    "LeakyReluGrad": (lambda g, x: tf.raw_ops.LeakyReluGrad(gradients=g, features=x), 1,
                      (-2.0, 2.0)),
    "SigmoidGrad": (lambda y, g: tf.raw_ops.SigmoidGrad(y=y, dy=g), 0, (0.1, 0.9)),
    "TanhGrad": (lambda y, g: tf.raw_ops.TanhGrad(y=y, dy=g), 0, (-0.9, 0.9)),
    "SqrtGrad": (lambda y, g: tf.raw_ops.SqrtGrad(y=y, dy=g), 0, (0.5, 2.0)),
    "RsqrtGrad": (lambda y, g: tf.raw_ops.RsqrtGrad(y=y, dy=g), 0, (0.5, 2.0)),
    "ReciprocalGrad": (lambda y, g: tf.raw_ops.ReciprocalGrad(y=y, dy=g), 0, (0.5, 2.0)),
}


@pytest.mark.parametrize("name", sorted(GRAD_OPS))
@pytest.mark.parametrize("layouts", MIXED_PAIRS)
def test_activation_gradient(name, layouts):
    fn, value_index, (low, high) = GRAD_OPS[name]
    arrays = [random_array(SHAPE, seed=1), random_array(SHAPE, seed=1)]
    arrays[value_index] = random_array(SHAPE, low=low, high=high)
    check_op(fn, name, arrays, layouts)


def test_softsign_gradient_runs_sharded_without_fallback(mesh_2x2):
    # Found by the fuzzer: tf.nn.softsign's gradient (SoftsignGrad) had no rule.
    x = random_array(SHAPE, seed=3)
    layout = layout_of("[x,y]", mesh_2x2)

    def grad(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.nn.softsign(t)
        return tape.gradient(y, t)

    expected = grad(tf.constant(x))
    for run in (grad, tf.function(grad)):
        assert_dtensor_equal(expected, layout,
                             run_without_fallback(run, to_dtensor(x, layout)))


@pytest.mark.parametrize("layouts", spec_params(MESH_2X2, ("[x,y]", "[*,x]"), ("[*,*]", "[y,*]")))
def test_identity_n_keeps_each_layout(layouts):
    def first(a, b):
        return tf.identity_n([a, b])[0]

    def second(a, b):
        return tf.identity_n([a, b])[1]

    arrays = [random_array(SHAPE), random_array(SHAPE, seed=1)]
    check_op(first, "IdentityN", arrays, layouts, output=0)
    check_op(second, "IdentityN", arrays, layouts, output=1)


def test_stop_gradient_and_zeros_like_follow_the_input(mesh_2x2):
    layout = [layout_of("[x,y]", mesh_2x2)]
    check_op(tf.stop_gradient, "StopGradient", [random_array(SHAPE)], layout)
    check_op(tf.zeros_like, "ZerosLike", [random_array(SHAPE)], layout)
    check_op(tf.ones_like, "OnesLike", [random_array(SHAPE)], layout)


# Golden plans from the header of elementwise_rules.cc: no communication unless the
# inputs disagree (slicing a replicated input to the output layout is reported too).
PLANS = [
    ("AddV2", ["[x,*]", "[x,*]"], [[4, 8], [4, 8]], "[x,*]", []),
    ("Mul", ["[x,*]", "[*]"], [[4, 8], [8]], "[x,*]", []),
    ("Mul", ["[*,*]", "[y]"], [[4, 8], [8]], "[*,y]", ["input 0: slice axis 1 over y [*,*] -> [*,y]"]),
    ("Relu", ["[*,y]"], [[4, 8]], "[*,y]", []),
    ("AddV2", ["[x,y]", "[x,y]"], [[4, 8], [4, 8]], "[x,y]", []),
]


@pytest.mark.parametrize("op_name,specs,shapes,expected,collectives", [
    pytest.param(*case, id=f"{case[0]}-" + "-".join(case[1])) for case in PLANS])
def test_pointwise_plan(op_name, specs, shapes, expected, collectives, mesh_2x2):
    layouts = [layout_of(s, mesh_2x2) for s in specs]
    plan = tf_dtensor.debug.explain(op_name, layouts, shapes)
    assert plan["outputs"] == [layout_of(expected, mesh_2x2)]
    assert plan["collectives"] == collectives


# ---------------------------------------------------------------------------------------
# The remaining elementwise math ops (issue 10 audit): every op registered in the audit,
# on every layout of an uneven shape on both meshes, in tf.function and through its
# gradient, in strict mode.
# ---------------------------------------------------------------------------------------

AUDIT_SHAPE = (3, 4)  # 3 rows: uneven over a mesh dim of 2


def _floats(low, high):
    return lambda seed, shape=AUDIT_SHAPE: random_array(shape, low=low, high=high, seed=seed)


def _complex(seed, shape=AUDIT_SHAPE):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-2, 2, shape) + 1j * rng.uniform(-2, 2, shape)).astype(np.complex64)


def _ints(low, high):
    return lambda seed, shape=AUDIT_SHAPE: random_array(shape, np.int32, low, high, seed=seed)


def _integral(low, high):
    """Small integers stored as floats (Polygamma's order)."""
    return lambda seed, shape=AUDIT_SHAPE: random_array(shape, np.int32, low, high,
                                                        seed=seed).astype(np.float32)


POSITIVE, UNIT = _floats(0.5, 3.0), _floats(0.05, 0.95)
SPECIAL = tf.math.special

# name -> (fn, one input maker per argument, differentiable); attributes the planner reads
# are in AUDIT_ATTRS.
AUDIT_OPS = {
    "Angle": (tf.math.angle, [_complex], True),
    "ApproximateEqual": (lambda a, b: tf.raw_ops.ApproximateEqual(x=a, y=b, tolerance=0.5),
                         [_floats(-2, 2), _floats(-2, 2)], False),
    "BesselI0": (SPECIAL.bessel_i0, [POSITIVE], True),
    "BesselI0e": (SPECIAL.bessel_i0e, [POSITIVE], True),
    "BesselI1": (SPECIAL.bessel_i1, [POSITIVE], True),
    "BesselI1e": (SPECIAL.bessel_i1e, [POSITIVE], True),
    "BesselJ0": (SPECIAL.bessel_j0, [POSITIVE], True),
    "BesselJ1": (SPECIAL.bessel_j1, [POSITIVE], True),
    "BesselK0": (SPECIAL.bessel_k0, [POSITIVE], True),
    "BesselK0e": (SPECIAL.bessel_k0e, [POSITIVE], True),
    "BesselK1": (SPECIAL.bessel_k1, [POSITIVE], True),
    "BesselK1e": (SPECIAL.bessel_k1e, [POSITIVE], True),
    "BesselY0": (SPECIAL.bessel_y0, [POSITIVE], True),
    "BesselY1": (SPECIAL.bessel_y1, [POSITIVE], True),
    "Betainc": (tf.math.betainc, [POSITIVE, POSITIVE, UNIT], True),
    "Bitcast": (lambda x: tf.bitcast(x, tf.int32), [_floats(-2, 2)], False),
    "Bitcast.to_bytes": (lambda x: tf.bitcast(x, tf.uint8), [_floats(-2, 2)], False),
    "Bitcast.from_bytes": (lambda x: tf.bitcast(x, tf.float32),
                           [lambda seed: random_array(AUDIT_SHAPE + (4,), np.int32, 0, 255,
                                                      seed=seed).astype(np.uint8)], False),
    "CheckNumericsV2": (lambda x: tf.raw_ops.CheckNumericsV2(tensor=x, message="bad"),
                        [_floats(-2, 2)], False),
    "Complex": (tf.complex, [_floats(-2, 2), _floats(-2, 2)], True),
    "ComplexAbs": (tf.math.abs, [_complex], True),
    "Conj": (tf.math.conj, [_complex], True),
    "Dawsn": (SPECIAL.dawsn, [_floats(-2, 2)], True),
    "DebugGradientIdentity": (lambda x: tf.raw_ops.DebugGradientIdentity(input=x),
                              [_floats(-2, 2)], False),
    "Digamma": (tf.math.digamma, [POSITIVE], True),
    "Erfinv": (tf.math.erfinv, [_floats(-0.9, 0.9)], True),
    "Expint": (SPECIAL.expint, [POSITIVE], True),
    "FresnelCos": (SPECIAL.fresnel_cos, [_floats(-2, 2)], True),
    "FresnelSin": (SPECIAL.fresnel_sin, [_floats(-2, 2)], True),
    "Igamma": (tf.math.igamma, [POSITIVE, POSITIVE], True),
    "IgammaGradA": (lambda a, x: tf.raw_ops.IgammaGradA(a=a, x=x), [POSITIVE, POSITIVE], False),
    "Igammac": (tf.math.igammac, [POSITIVE, POSITIVE], True),
    "Imag": (tf.math.imag, [_complex], True),
    "InvGrad": (lambda y, dy: tf.raw_ops.InvGrad(y=y, dy=dy), [POSITIVE, _floats(-2, 2)], False),
    "LeftShift": (tf.bitwise.left_shift, [_ints(-8, 8), _ints(0, 5)], False),
    "Lgamma": (tf.math.lgamma, [POSITIVE], True),
    "MulNoNan": (tf.math.multiply_no_nan, [_floats(-2, 2), _integral(-1, 1)], True),
    "Ndtri": (tf.math.ndtri, [UNIT], True),
    "NextAfter": (tf.math.nextafter, [_floats(-2, 2), _floats(-2, 2)], False),
    "Polygamma": (tf.math.polygamma, [_integral(0, 2), POSITIVE], True),
    "PopulationCount": (lambda x: tf.raw_ops.PopulationCount(x=x), [_ints(-100, 100)], False),
    "RandomGammaGrad": (lambda a, s: tf.raw_ops.RandomGammaGrad(alpha=a, sample=s),
                        [POSITIVE, POSITIVE], False),
    "Real": (tf.math.real, [_complex], True),
    "RightShift": (tf.bitwise.right_shift, [_ints(-100, 100), _ints(0, 5)], False),
    "SoftsignGrad": (lambda g, x: tf.raw_ops.SoftsignGrad(gradients=g, features=x),
                     [_floats(-2, 2), _floats(-2, 2)], False),
    "Spence": (SPECIAL.spence, [POSITIVE], True),
    "Zeta": (tf.math.zeta, [_floats(1.5, 4.0), POSITIVE], True),
}


AUDIT_ATTRS = {
    "Bitcast": {"T": tf.float32, "type": tf.int32},
    "Bitcast.to_bytes": {"T": tf.float32, "type": tf.uint8},
    "Bitcast.from_bytes": {"T": tf.uint8, "type": tf.float32},
}


def _audit_arrays(name):
    return [make(seed=i + 1) for i, make in enumerate(AUDIT_OPS[name][1])]


def _audit_layout_params():
    params = []
    for name in sorted(AUDIT_OPS):
        arrays = _audit_arrays(name)
        for mesh in (MESH_1D, MESH_2X2):
            # Every layout (uneven included) for all inputs alike, and for input 0 against
            # replicated others (a relayout of the others to input 0's layout).
            combos = []
            for layout in layouts_for(mesh, arrays[0].shape, uneven=True):
                combos.append(tuple(Layout(layout.sharding_specs[:a.ndim], mesh)
                                    for a in arrays))
                if len(arrays) > 1:
                    combos.append((layout,) + tuple(Layout.replicated(mesh, a.ndim)
                                                    for a in arrays[1:]))
            for combo in dict.fromkeys(combos):
                ident = "-".join(spec_id(l) for l in combo)
                params.append(pytest.param(name, combo, id=f"{name}-{ident}@{mesh.short()}"))
    return params


def _op_name(name):
    return name.split(".")[0]


@pytest.mark.parametrize("name,layouts", _audit_layout_params())
def test_audited_op_every_layout(name, layouts):
    check_op(AUDIT_OPS[name][0], _op_name(name), _audit_arrays(name), layouts,
             attrs=AUDIT_ATTRS.get(name))


@pytest.mark.parametrize("name", sorted(AUDIT_OPS))
def test_audited_op_in_function(name):
    arrays = _audit_arrays(name)
    specs = ["[x,y]", "[*,x]"] if arrays[0].ndim == 2 else ["[x,y,*]", "[*,x,*]"]
    for spec in specs:
        layouts = [layout_of(spec, MESH_2X2)] + [
            layout_of("[" + ",".join(["*"] * a.ndim) + "]", MESH_2X2) for a in arrays[1:]]
        check_op(tf.function(AUDIT_OPS[name][0]), _op_name(name), arrays, layouts,
                 attrs=AUDIT_ATTRS.get(name))


def _loss_grads(fn):
    def run(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            y = fn(*args)
            loss = tf.reduce_sum(tf.math.real(y * tf.math.conj(y)) if y.dtype.is_complex
                                 else y * y)
        return [loss] + tape.gradient(loss, list(args))
    return run


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("specs", [("[x,y]", "[x,y]"), ("[y,*]", "[*,*]")],
                         ids=["same", "mixed"])
@pytest.mark.parametrize("name", sorted(n for n, (_, _, grad) in AUDIT_OPS.items() if grad))
def test_audited_op_gradient(name, specs, in_function):
    fn, _, _ = AUDIT_OPS[name]
    arrays = _audit_arrays(name)
    layouts = [layout_of(specs[0] if i == 0 else specs[1], MESH_2X2) for i in range(len(arrays))]
    grads = _loss_grads(fn)
    expected = grads(*[tf.constant(a) for a in arrays])
    run = tf.function(grads) if in_function else grads
    actual = run_without_fallback(run, *[to_dtensor(a, l) for a, l in zip(arrays, layouts)])
    for e, a in zip(expected, actual):
        assert (e is None) == (a is None)
        if e is not None:
            assert tuple(a.shape) == tuple(e.shape)
            np.testing.assert_allclose(reassemble(a), e.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("layouts", layout_params((4, 4, 4), (4,), meshes=[MESH_2X2]))
def test_bias_add(layouts, data_format):
    check_op(lambda v, b: tf.nn.bias_add(v, b, data_format=data_format), "BiasAdd",
             [random_array((4, 4, 4)), random_array((4,), seed=2)], layouts,
             attrs={"data_format": data_format})


def test_bias_add_keeps_the_bias_sharding_on_a_whole_channel_axis(mesh_2x2):
    # The value's channels are whole and the bias is sharded over a mesh dimension the value
    # does not use: each device slices its channels (as TensorFlow's DTensor does), no gather.
    value, bias = random_array((2, 4, 4)), random_array((4,), seed=3)
    got = tf.nn.bias_add(to_dtensor(value, layout_of("*,y,*", mesh_2x2)),
                         to_dtensor(bias, layout_of("x", mesh_2x2)))
    assert tf_dtensor.dtensor.fetch_layout(got) == layout_of("*,y,x", mesh_2x2)
    np.testing.assert_allclose(reassemble(got), value + bias, rtol=1e-6)
    # A bias sharded over a dimension the value uses elsewhere is gathered instead.
    got = tf.nn.bias_add(to_dtensor(value, layout_of("*,y,*", mesh_2x2)),
                         to_dtensor(bias, layout_of("y", mesh_2x2)))
    assert tf_dtensor.dtensor.fetch_layout(got) == layout_of("*,y,*", mesh_2x2)
    np.testing.assert_allclose(reassemble(got), value + bias, rtol=1e-6)


# The string ops that map each element alone had no rule: their sharded inputs were
# gathered (a warning, and under the ops lowering, the one of several clients, an
# UnimplementedError: TF's collective ops cannot all-gather strings). Each device now maps
# its own block. 7 rows over x=2: uneven blocks.
STRINGS = np.array([[b"ab", b"  Hi ", b"a1b", b"42"], [b"x-y", b"", b"zz", b"7"]] * 3 +
                   [[b"q", b"A", b"bb", b"-3"]], dtype=object)
STRING_OPS = {
    "StringLength": tf.strings.length,
    "StringUpper": tf.strings.upper,
    "StringStrip": tf.strings.strip,
    "StringJoin": lambda s: tf.strings.join([s, s, "!"], separator="-"),
    "Substr": lambda s: tf.strings.substr(s, 0, 2),
    "StringToHashBucketFast": lambda s: tf.strings.to_hash_bucket_fast(s, 5),
    "StaticRegexReplace": lambda s: tf.strings.regex_replace(s, "[a-z]", "#"),
    "RegexFullMatch": lambda s: tf.strings.regex_full_match(s, tf.constant("a.*")),
    "AsString": lambda s: tf.strings.as_string(tf.strings.length(s)),
    "EncodeBase64": tf.io.encode_base64,
}


@pytest.mark.parametrize("lowering", ["", "ops"], ids=["default", "ops"])
@pytest.mark.parametrize("op_name", sorted(STRING_OPS))
def test_string_ops_map_each_block_without_a_gather(op_name, lowering, mesh_2x2):
    layout = layout_of("[x,y]", mesh_2x2)
    fn = STRING_OPS[op_name]
    expected = fn(tf.constant(STRINGS))
    with collective_lowering(lowering):
        for run in (fn, tf.function(fn)):
            got = run_without_fallback(run, to_dtensor(STRINGS, layout))
            assert_dtensor_equal(expected, layout, got)
