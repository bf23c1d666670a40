"""The fuzzer's op table, continued: elementwise math (special functions, complex numbers,
bit ops) and the batch-parallel ops (linear algebra, FFT, image ops).

Imported by fuzz_ops.py after `op` is defined; see there for how an entry is written.

Inputs are drawn inside each op's domain: positive arguments for the gamma and Bessel
families, well-conditioned matrices for solves, inverses and determinants (A·Aᵀ + n·I,
or a triangular matrix with a dominant diagonal), symmetric matrices with well separated
eigenvalues for SelfAdjointEigV2.

Decompositions (Qr, Svd, SelfAdjointEigV2, Lu) are unique only up to signs (or, for Lu,
the pivoting); the sharded run gives every matrix to the same CPU kernel as the
reference does, so their raw outputs are compared, and the draws keep the outputs well
defined: distinct singular values and eigenvalues (random matrices; eigenvalues spaced by
1), no rank deficiency.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from fuzz_engine import FLOATS, H, T, Call, Drawer
from fuzz_ops import INTS, _strided_spec, op

COMPLEX = (tf.complex64, tf.complex128)
_REAL_OF = {tf.complex64: tf.float32, tf.complex128: tf.float64}


def _complex(d: Drawer, shape: Sequence[int], dtype: tf.DType) -> np.ndarray:
    real = _REAL_OF[dtype]
    return (d.array(shape, real) + 1j * d.array(shape, real)).astype(dtype.as_numpy_dtype)


def _tol(dtype: tf.DType) -> float:
    """Float32 decompositions and special functions: the local kernels see the same values,
    but vectorised and scalar paths may round differently in the last bits."""
    return 1e-8 if tf.as_dtype(dtype) in (tf.float64, tf.complex128) else 1e-4


def _broadcast_pair(d: Drawer, first, second, dtypes=FLOATS, grad=True, tol=None):
    """Two broadcasting arguments drawn from the (low, high) ranges `first` and `second`."""
    dtype = d.dtype(dtypes)
    a = d.shape()
    b = d.broadcastable(a)
    if d.bool():
        a, b = b, a
    return Call([T(d.array(a, dtype, *first)), T(d.array(b, dtype, *second))], grad=grad,
                tol=tol if tol is not None else _tol(dtype))


# ---------------------------------------------------------------------------------------
# Elementwise: special functions
# ---------------------------------------------------------------------------------------

# name -> value range inside the domain (and away from poles)
SPECIAL = {
    "BesselI0": (-2, 2), "BesselI0e": (-2, 2), "BesselI1": (-2, 2), "BesselI1e": (-2, 2),
    "BesselJ0": (-3, 3), "BesselJ1": (-3, 3), "BesselK0": (0.5, 3), "BesselK0e": (0.5, 3),
    "BesselK1": (0.5, 3), "BesselK1e": (0.5, 3), "BesselY0": (0.5, 3), "BesselY1": (0.5, 3),
    "Dawsn": (-2, 2), "Digamma": (0.5, 3), "Erfinv": (-0.9, 0.9), "Expint": (0.5, 2),
    "FresnelCos": (-2, 2), "FresnelSin": (-2, 2), "Lgamma": (0.5, 3), "Ndtri": (0.05, 0.95),
    "Spence": (0.5, 2),
}

for _name, (_low, _high) in SPECIAL.items():
    @op(_name)
    def _(d, _low=_low, _high=_high):
        dtype = d.dtype()
        return Call([T(d.array(d.shape(), dtype, _low, _high))], tol=_tol(dtype))


# TensorFlow's own gradient of DebugGradientIdentity fails outside a tfdbg session
# (debug_gradients.py: "'_MockOp' object has no attribute 'name'"), without tf_dtensor too.
@op("DebugGradientIdentity", grad=False)
def _(d):
    return Call([T(d.array(d.shape(), d.dtype()))])


@op("CheckNumericsV2")
def _(d):
    return Call([T(d.array(d.shape(), d.dtype()))], {"message": "fuzz"})


# Binary special functions: (range of the first argument, of the second).
SPECIAL_BINARY = {
    "Igamma": ((0.5, 3), (0.1, 3)), "Igammac": ((0.5, 3), (0.1, 3)),
    # Polygamma's order is a non-negative integer; its gradient is taken for x only.
    "Zeta": ((1.5, 4), (0.5, 3)),
}
for _name, (_first, _second) in SPECIAL_BINARY.items():
    op(_name)(lambda d, _first=_first, _second=_second: _broadcast_pair(d, _first, _second))


@op("Polygamma")
def _(d):
    call = _broadcast_pair(d, (0, 3), (0.5, 3))
    call.args[0].value = np.round(call.args[0].value)
    return call


for _name, _first, _second in (("IgammaGradA", (0.5, 3), (0.1, 3)),
                               ("RandomGammaGrad", (0.5, 3), (0.1, 3)),
                               ("NextAfter", (-2, 2), (-2, 2))):
    op(_name, grad=False)(
        lambda d, _first=_first, _second=_second: _broadcast_pair(d, _first, _second))


@op("Betainc")
def _(d):
    # a, b and x: one shape, or scalars.
    shape, dtype = d.shape(), d.dtype()
    args = [T(d.array(shape if d.bool() else (), dtype, low, high))
            for low, high in ((0.5, 3), (0.5, 3), (0.05, 0.95))]
    args[2] = T(d.array(shape, dtype, 0.05, 0.95))
    return Call(args, tol=_tol(dtype))


@op("ApproximateEqual", grad=False)
def _(d):
    shape, dtype = d.shape(), d.dtype()
    x = d.array(shape, dtype)
    y = x + d.array(shape, dtype, -0.2, 0.2)
    return Call([T(x), T(y)], {"tolerance": 0.1})


@op("InvGrad", grad=False)
def _(d):
    shape, dtype = d.shape(), d.dtype()
    return Call([T(d.array(shape, dtype, 0.5, 2)), T(d.array(shape, dtype))])


@op("Cross")
def _(d):
    shape, dtype = d.shape(0, 2) + (3,), d.dtype()
    return Call([T(d.array(shape, dtype)), T(d.array(shape, dtype))])


# ---------------------------------------------------------------------------------------
# Elementwise: complex numbers (no gradients: the engine differentiates real floats only)
# ---------------------------------------------------------------------------------------

for _name in ("Angle", "ComplexAbs", "Real", "Imag"):
    @op(_name, grad=False)
    def _(d):
        dtype = d.dtype(COMPLEX)   # Tout: the CPU kernels take the matching real type only
        return Call([T(_complex(d, d.shape(), dtype))], {"Tout": _REAL_OF[dtype]})


@op("Conj", grad=False)
def _(d):
    return Call([T(_complex(d, d.shape(), d.dtype(COMPLEX)))])


@op("Complex", grad=False)
def _(d):
    call = _broadcast_pair(d, (-2, 2), (-2, 2))
    dtype = call.args[0].value.dtype
    call.attrs["Tout"] = tf.complex64 if dtype == np.float32 else tf.complex128
    return call


# ---------------------------------------------------------------------------------------
# Elementwise: bits
# ---------------------------------------------------------------------------------------

@op("PopulationCount", grad=False)
def _(d):
    return Call([T(d.array(d.shape(), d.dtype(INTS), -1000, 1000))])


for _name in ("LeftShift", "RightShift"):
    @op(_name, grad=False)
    def _(d):
        return _broadcast_pair(d, (-1000, 1000), (0, 31), INTS)


# Bytes per element of the types Bitcast is drawn with.
_BITCAST = {tf.uint8: 1, tf.int16: 2, tf.int32: 4, tf.float32: 4, tf.int64: 8,
            tf.float64: 8}


@op("Bitcast", grad=False)
def _(d):
    source, target = d.choice(list(_BITCAST)), d.choice(list(_BITCAST))
    shape = d.shape(0, 3)
    if _BITCAST[source] < _BITCAST[target]:   # the trailing axis holds one target's bytes
        shape += (_BITCAST[target] // _BITCAST[source],)
    return Call([T(d.array(shape, source, -100, 100))], {"type": target})


# ---------------------------------------------------------------------------------------
# Elementwise: strings (each element mapped alone; strings are never partial)
# ---------------------------------------------------------------------------------------

_WORDS = ("ab", "Hello", "  pad ", "aab", "x-y", "42", "Zz9", "ba")


def _strings(d: Drawer, shape: Sequence[int] = None, words: Sequence[str] = _WORDS,
             sharded: bool = True) -> T:
    """Strings from `words`. TF's collective ops cannot all-gather strings, so under the
    ops lowering a relayout of strings between two shardings is refused by design: the
    inputs after the first of a multi-input op stay replicated (sliced, never gathered)."""
    shape = d.shape() if shape is None else shape
    picks = d.array(shape, tf.int32, 0, len(words) - 1)
    return T(np.vectorize(lambda i: words[i].encode(), otypes=[object])(picks)
             if picks.size else np.zeros(shape, object), partial=False, sharded=sharded)


# name -> attributes drawn for one string input
_STRING_UNARY = {
    "EncodeBase64": lambda d: {"pad": d.bool()},
    "StaticRegexFullMatch": lambda d: {"pattern": d.choice(["a+b", ".*a.*", "[0-9]+"])},
    "StaticRegexReplace": lambda d: {"pattern": d.choice(["a", "[A-Z]", " +"]),
                                     "rewrite": d.choice(["", "#"]),
                                     "replace_global": d.bool()},
    "StringLength": lambda d: {"unit": d.choice(["BYTE", "UTF8_CHAR"])},
    "StringLower": lambda d: {},
    "StringStrip": lambda d: {},
    "StringToHashBucket": lambda d: {"num_buckets": d.int(1, 9)},
    "StringToHashBucketFast": lambda d: {"num_buckets": d.int(1, 9)},
    "StringToHashBucketStrong": lambda d: {"num_buckets": d.int(1, 9), "key": [d.int(0, 9), 7]},
    "StringUpper": lambda d: {},
    "UnicodeTranscode": lambda d: {"input_encoding": "UTF-8", "output_encoding": "UTF-16-BE"},
}

for _name, _attrs in _STRING_UNARY.items():
    @op(_name, grad=False)
    def _(d, _attrs=_attrs):
        return Call([_strings(d)], _attrs(d))


@op("DecodeBase64", grad=False)
def _(d):
    encoded = [tf.io.encode_base64(w).numpy().decode() for w in _WORDS]
    return Call([_strings(d, words=encoded)])


@op("StringToNumber", grad=False)
def _(d):
    return Call([_strings(d, words=("1", "-2", "42", "0", "7.5"))],
                {"out_type": d.dtype((tf.float32, tf.float64))})


@op("AsString", grad=False)
def _(d):
    dtype = d.dtype((tf.float32, tf.int32, tf.int64))
    return Call([T(d.array(d.shape(), dtype, -100, 100))])


@op("UnicodeScript", grad=False)
def _(d):
    return Call([T(d.array(d.shape(), tf.int32, 0, 0x3000))])


@op("RegexFullMatch", grad=False)
def _(d):
    return Call([_strings(d), H(d.choice(["a+b", ".*a.*"]), tf.string)])


@op("RegexReplace", grad=False)
def _(d):
    return Call([_strings(d), H(d.choice(["a", "[A-Z]"]), tf.string), H("#", tf.string)],
                {"replace_global": d.bool()})


@op("StringJoin", grad=False)
def _(d):
    shape = d.shape()
    # Inputs of one shape, or scalars among them (TF's kernel broadcasts nothing else).
    inputs = [_strings(d, shape if d.int(0, 3) else (), sharded=i == 0)
              for i in range(d.int(1, 3))]
    return Call([inputs], {"separator": d.choice(["", "-"])})


@op("Substr", grad=False)
def _(d):
    strings = _strings(d, words=("abc", "Hello", "xyz9", "four"))  # 3 bytes or more
    shape = strings.value.shape
    if d.bool():   # one position and length for every string
        return Call([strings, H(d.int(0, 3), tf.int32), H(d.int(0, 3), tf.int32)],
                    {"unit": d.choice(["BYTE", "UTF8_CHAR"])})
    return Call([strings, T(d.array(shape, tf.int32, 0, 3), sharded=False),
                 T(d.array(shape, tf.int32, 0, 3), sharded=False)])


# ---------------------------------------------------------------------------------------
# Batch-parallel: linear algebra
# ---------------------------------------------------------------------------------------

def _batch(d: Drawer):
    return d.shape(0, 2, high=5)


def _spd(d: Drawer, batch, n, dtype) -> np.ndarray:
    """A symmetric positive definite matrix per batch element: A·Aᵀ + n·I."""
    a = d.array(tuple(batch) + (n, n), dtype, -1, 1)
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(a.dtype)


def _well_conditioned(d: Drawer, batch, n, dtype) -> np.ndarray:
    """A general (non-symmetric) matrix with a dominant diagonal: invertible, and far from
    any sign change of its determinant."""
    a = d.array(tuple(batch) + (n, n), dtype, -1, 1)
    return (a + (n + 1) * np.eye(n)).astype(a.dtype)


@op("Cholesky")
def _(d):
    dtype = d.dtype()
    return Call([T(_spd(d, _batch(d), d.size(1, 5), dtype))], tol=_tol(dtype))


@op("CholeskyGrad", grad=False)
def _(d):
    batch, n, dtype = _batch(d), d.size(1, 5), d.dtype()
    chol = np.linalg.cholesky(_spd(d, batch, n, dtype)).astype(dtype.as_numpy_dtype)
    return Call([T(chol), T(d.array(chol.shape, dtype))], tol=_tol(dtype))


for _name in ("MatrixDeterminant", "LogMatrixDeterminant"):
    @op(_name)
    def _(d):
        dtype = d.dtype()
        return Call([T(_well_conditioned(d, _batch(d), d.size(1, 5), dtype))], tol=_tol(dtype))


@op("MatrixInverse")
def _(d):
    dtype = d.dtype()
    return Call([T(_well_conditioned(d, _batch(d), d.size(1, 5), dtype))],
                {"adjoint": d.bool()}, tol=_tol(dtype))


@op("MatrixSquareRoot")
def _(d):
    dtype = d.dtype()
    return Call([T(_spd(d, _batch(d), d.size(1, 4), dtype))], tol=_tol(dtype))


@op("Lu", grad=False)
def _(d):
    dtype = d.dtype()
    return Call([T(_well_conditioned(d, _batch(d), d.size(1, 5), dtype))],
                {"output_idx_type": d.dtype(INTS)}, tol=_tol(dtype))


@op("MatrixSolve")
def _(d):
    batch, n, dtype = _batch(d), d.size(1, 5), d.dtype()
    rhs = d.array(tuple(batch) + (n, d.size(1, 4)), dtype)
    return Call([T(_well_conditioned(d, batch, n, dtype)), T(rhs)], {"adjoint": d.bool()},
                tol=_tol(dtype))


@op("MatrixTriangularSolve")
def _(d):
    # The batch axes broadcast (as in BatchMatMulV2).
    batch, n, dtype, lower = _batch(d), d.size(1, 5), d.dtype(), d.bool()
    other = d.broadcastable(batch)
    if d.bool():
        batch, other = other, batch
    matrix = _well_conditioned(d, batch, n, dtype)
    matrix = np.tril(matrix) if lower else np.triu(matrix)
    rhs = d.array(tuple(other) + (n, d.size(1, 4)), dtype)
    return Call([T(matrix), T(rhs)], {"lower": lower, "adjoint": d.bool()}, tol=_tol(dtype))


@op("MatrixSolveLs")
def _(d):
    # fast: Cholesky of the normal equations, which needs rows >= cols and full rank; the
    # gradient exists only on that path.
    batch, cols, dtype = _batch(d), d.size(1, 4), d.dtype()
    rows = cols + d.int(0, 2)
    matrix = d.array(tuple(batch) + (rows, cols), dtype)
    matrix[..., :cols, :] += (cols + 1) * np.eye(cols, dtype=matrix.dtype)
    rhs = d.array(tuple(batch) + (rows, d.size(1, 3)), dtype)
    l2 = np.float64(d.choice([0.0, 0.5]))
    fast = d.int(0, 3) != 0
    return Call([T(matrix), T(rhs), T(np.asarray(l2))], {"fast": fast}, grad=fast,
                tol=_tol(dtype) if fast else 1e-3)


@op("Qr")
def _(d):
    batch, dtype, full = _batch(d), d.dtype(), d.bool()
    x = d.array(tuple(batch) + (d.size(1, 5), d.size(1, 5)), dtype)
    # TensorFlow's QR gradient is not implemented for full_matrices with rows > cols.
    return Call([T(x)], {"full_matrices": full}, grad=not full, tol=_tol(dtype))


# Without compute_uv (compute_v) TensorFlow's u and v (v) are placeholders: uninitialised
# scalars eagerly, shape [0] in a graph. Only the values are compared then, and there is no
# gradient (TensorFlow has none without the vectors).
@op("Svd")
def _(d):
    batch, dtype, full, uv = _batch(d), d.dtype(), d.bool(), d.int(0, 3) != 0
    rows, cols = d.size(1, 5), d.size(1, 5)
    x = d.array(tuple(batch) + (rows, cols), dtype)
    # TensorFlow's SVD gradient is not implemented for full_matrices with rows != cols.
    return Call([T(x)], {"full_matrices": full, "compute_uv": uv},
                grad=uv and not (full and rows != cols), tol=_tol(dtype),
                compare=None if uv else [0])


@op("SelfAdjointEigV2")
def _(d):
    # Q·diag(λ)·Qᵀ with eigenvalues 1 apart: each eigenvector is defined up to its sign,
    # and the same kernel picks the same sign for the same matrix.
    batch, n, dtype, compute_v = _batch(d), d.size(1, 5), d.dtype(), d.int(0, 3) != 0
    q, _ = np.linalg.qr(d.array(tuple(batch) + (n, n), tf.float64))
    eigen = np.arange(n) - n / 2 + d.array(tuple(batch) + (1,), tf.float64, -0.3, 0.3)
    x = (q * eigen[..., None, :]) @ np.swapaxes(q, -1, -2)
    x = ((x + np.swapaxes(x, -1, -2)) / 2).astype(dtype.as_numpy_dtype)
    return Call([T(x)], {"compute_v": compute_v}, grad=compute_v, tol=_tol(dtype),
                compare=None if compute_v else [0])   # see Svd


@op("MatrixBandPart")
def _(d):
    x = d.array(_batch(d) + (d.size(1, 5), d.size(1, 5)), d.dtype())
    return Call([T(x), H(d.int(-1, x.shape[-2]), tf.int64), H(d.int(-1, x.shape[-1]), tf.int64)])


@op("MatrixDiag")
def _(d):
    return Call([T(d.array(_batch(d) + (d.size(1, 5),), d.dtype()))])


@op("MatrixDiagPart")
def _(d):
    return Call([T(d.array(_batch(d) + (d.size(1, 5), d.size(1, 5)), d.dtype()))])


@op("MatrixSetDiag")
def _(d):
    batch, rows, cols, dtype = _batch(d), d.size(1, 5), d.size(1, 5), d.dtype()
    return Call([T(d.array(batch + (rows, cols), dtype)),
                 T(d.array(batch + (min(rows, cols),), dtype))])


_ALIGNS = ["RIGHT_LEFT", "LEFT_RIGHT", "LEFT_LEFT", "RIGHT_RIGHT"]


def _diagonals(d: Drawer, v3: bool):
    """(matrix, k, align attrs, the diagonals MatrixDiagPart takes from the matrix): k a
    scalar or a band [lo, hi] of diagonals that exist in a rows x cols matrix."""
    batch, rows, cols, dtype = _batch(d), d.size(1, 5), d.size(1, 5), d.dtype()
    matrix = d.array(batch + (rows, cols), dtype)
    lo = d.int(-rows + 1, cols - 1)
    k = lo if d.bool() else [lo, d.int(lo, cols - 1)]
    attrs = {"align": d.choice(_ALIGNS)} if v3 else {}
    part = tf.raw_ops.MatrixDiagPartV3 if v3 else tf.raw_ops.MatrixDiagPartV2
    diagonal = part(input=matrix, k=k, padding_value=tf.zeros((), dtype), **attrs).numpy()
    return matrix, k, attrs, diagonal


def _padding(d: Drawer, dtype) -> T:
    return T(np.asarray(d.choice([0.0, 9.0]), dtype))


for _v3 in (False, True):
    @op("MatrixDiagPartV3" if _v3 else "MatrixDiagPartV2")
    def _(d, _v3=_v3):
        matrix, k, attrs, _ = _diagonals(d, _v3)
        return Call([T(matrix), H(k, tf.int32), _padding(d, matrix.dtype)], attrs)

    @op("MatrixDiagV3" if _v3 else "MatrixDiagV2")
    def _(d, _v3=_v3):
        matrix, k, attrs, diagonal = _diagonals(d, _v3)
        rows, cols = matrix.shape[-2:]
        return Call([T(diagonal), H(k, tf.int32), H(rows, tf.int32), H(cols, tf.int32),
                     _padding(d, matrix.dtype)], attrs)

    @op("MatrixSetDiagV3" if _v3 else "MatrixSetDiagV2")
    def _(d, _v3=_v3):
        matrix, k, attrs, diagonal = _diagonals(d, _v3)
        return Call([T(matrix), T(d.array(diagonal.shape, matrix.dtype)), H(k, tf.int32)],
                    attrs)


# ---------------------------------------------------------------------------------------
# Batch-parallel: FFT (complex in, complex out; no gradients: complex inputs are not
# differentiated by the engine)
# ---------------------------------------------------------------------------------------

for _rank, _suffix in ((1, ""), (2, "2D"), (3, "3D")):
    for _name in ("FFT", "IFFT"):
        @op(_name + _suffix, grad=False)
        def _(d, _rank=_rank):
            dtype = d.dtype(COMPLEX)
            shape = d.shape(0, 2, high=4) + tuple(d.size(1, 6) for _ in range(_rank))
            return Call([T(_complex(d, shape, dtype))], tol=_tol(dtype))

    @op("RFFT" + _suffix, grad=False)
    def _(d, _rank=_rank):
        dtype = d.dtype()
        shape = d.shape(0, 2, high=4) + tuple(d.size(1, 6) for _ in range(_rank))
        # The kernel crops the signal to fft_length but does not pad it.
        length = [d.int(1, s) for s in shape[-_rank:]]
        complex_type = tf.complex64 if dtype == tf.float32 else tf.complex128
        return Call([T(d.array(shape, dtype)), H(length, tf.int32)], {"Tcomplex": complex_type},
                    tol=_tol(dtype))

    @op("IRFFT" + _suffix, grad=False)
    def _(d, _rank=_rank):
        dtype = d.dtype(COMPLEX)
        shape = d.shape(0, 2, high=4) + tuple(d.size(1, 6) for _ in range(_rank))
        # The kernel reads fft_length of each outer axis and fft_length // 2 + 1 of the
        # inner one, so the input must hold that many (it crops, it does not pad).
        length = [d.int(1, s) for s in shape[-_rank:-1]] + [d.int(1, 2 * shape[-1] - 1)]
        return Call([T(_complex(d, shape, dtype)), H(length, tf.int32)],
                    {"Treal": _REAL_OF[dtype]}, tol=_tol(dtype))


# ---------------------------------------------------------------------------------------
# Batch-parallel: images (NHWC)
# ---------------------------------------------------------------------------------------

def _images(d: Drawer, dtype=tf.float32, channels=None, min_rank=4, max_rank=4):
    batch = d.shape(min_rank - 3, max_rank - 3, high=4)
    shape = batch + (d.size(1, 6), d.size(1, 6), channels or d.size(1, 4))
    return d.array(shape, dtype, 0, 1)


@op("AdjustContrastv2", grad=False)
def _(d):
    x = _images(d, min_rank=3)
    return Call([T(x), T(np.float32(d.choice([0.5, 1.5, 2.0])))], tol=1e-4)


@op("AdjustHue", grad=False)
def _(d):
    x = _images(d, channels=3, min_rank=1)
    return Call([T(x), T(np.float32(d.array((), tf.float32, -0.5, 0.5)))], tol=1e-4)


@op("AdjustSaturation", grad=False)
def _(d):
    x = _images(d, channels=3, min_rank=1)
    return Call([T(x), T(np.float32(d.array((), tf.float32, 0.2, 2)))], tol=1e-4)


@op("LRN")
def _(d):
    attrs = {"depth_radius": d.int(0, 3), "bias": 1.0, "alpha": 0.5, "beta": 0.75}
    return Call([T(_images(d))], attrs, tol=1e-4)


@op("LRNGrad", grad=False)
def _(d):
    image = _images(d)
    attrs = {"depth_radius": d.int(0, 3), "bias": 1.0, "alpha": 0.5, "beta": 0.75}
    out = tf.raw_ops.LRN(input=image, **attrs).numpy()
    return Call([T(d.array(image.shape)), T(image), T(out)], attrs, tol=1e-4)


for _name in ("LowerBound", "UpperBound"):
    @op(_name, grad=False)
    def _(d):
        rows = d.size(1, 5)
        ordered = np.sort(d.array((rows, d.size(1, 6)), d.dtype()), axis=-1)
        values = d.array((rows, d.size(1, 5)), ordered.dtype)
        return Call([T(ordered), T(values)], {"out_type": d.dtype((tf.int32, tf.int64))})


@op("Bucketize", grad=False)
def _(d):
    x = d.array(d.shape(0, 4), d.dtype((tf.float32, tf.float64, tf.int32)))
    return Call([T(x)], {"boundaries": sorted({d.int(-2, 2) / 2 for _ in range(d.int(1, 4))})})


@op("HistogramFixedWidth", grad=False)
def _(d):
    dtype = d.dtype((tf.float32, tf.float64, tf.int32))
    values = d.array(d.shape(0, 3), dtype, -3, 6)  # some below and above the range
    low = d.int(-2, 1)
    value_range = np.asarray([low, low + d.int(1, 4)], dtype.as_numpy_dtype)
    return Call([T(values), T(value_range), H(d.int(1, 6), tf.int32)],
                {"dtype": d.dtype((tf.int32, tf.int64))})


@op("DenseBincount", grad=False)
def _(d):
    index = d.dtype((tf.int32, tf.int64))
    size = d.int(1, 6)
    ids = d.array(d.shape(1, 2), index, 0, size + 1)  # ids of size and more are dropped
    # Weights of the ids' shape, or none (an empty vector, read whole).
    weights = (T(d.array(ids.shape, d.dtype((tf.float32, tf.float64, tf.int32)), 0, 3))
               if d.bool() else T(np.zeros([0], np.float32), sharded=False))
    return Call([T(ids), H(size, index), weights], {"binary_output": d.bool()})


@op("RGBToHSV")
def _(d):
    dtype = d.dtype()
    return Call([T(d.array(d.shape(0, 3) + (3,), dtype, 0, 1))], tol=_tol(dtype))


@op("HSVToRGB", grad=False)
def _(d):
    dtype = d.dtype()
    return Call([T(d.array(d.shape(0, 3) + (3,), dtype, 0, 1))], tol=_tol(dtype))


@op("ExtractImagePatches")
def _(d):
    window, rates = [d.int(1, 3), d.int(1, 3)], [d.int(1, 2), d.int(1, 2)]
    # VALID needs the (dilated) window inside the image.
    image = [d.int((k - 1) * r + 1, (k - 1) * r + 5) for k, r in zip(window, rates)]
    x = d.array((d.size(1, 4), *image, d.size(1, 4)), d.dtype(), 0, 1)
    attrs = {"ksizes": [1, *window, 1], "strides": [1, d.int(1, 2), d.int(1, 2), 1],
             "rates": [1, *rates, 1], "padding": d.choice(["SAME", "VALID"])}
    return Call([T(x)], attrs)


# Its gradient runs SparseTensorDenseMatMul (a sparse patch matrix times the gradient).
@op("ExtractVolumePatches")
def _(d):
    batch = (d.size(1, 3),)
    x = d.array(batch + (d.size(1, 4), d.size(1, 4), d.size(1, 4), d.size(1, 3)), d.dtype())
    attrs = {"ksizes": [1] + [d.int(1, 2) for _ in range(3)] + [1],
             "strides": [1] + [d.int(1, 2) for _ in range(3)] + [1],
             "padding": d.choice(["SAME", "VALID"])}
    return Call([T(x)], attrs)


def _resize_attrs(d: Drawer, area: bool = False):
    corners = d.bool()
    if area:
        return {"align_corners": corners}
    # TensorFlow refuses align_corners together with half_pixel_centers.
    return {"align_corners": corners, "half_pixel_centers": not corners and d.bool()}


def _size(d: Drawer):
    return [d.size(1, 7), d.size(1, 7)]


@op("ResizeArea", grad=False)
def _(d):
    return Call([T(_images(d, d.dtype())), H(_size(d), tf.int32)],
                _resize_attrs(d, area=True), tol=1e-4)


for _name in ("ResizeBicubic", "ResizeBilinear", "ResizeNearestNeighbor"):
    @op(_name)
    def _(d):
        return Call([T(_images(d, d.dtype())), H(_size(d), tf.int32)], _resize_attrs(d),
                    tol=1e-4)


for _name, _forward in (("ResizeBicubicGrad", tf.raw_ops.ResizeBicubic),
                        ("ResizeBilinearGrad", tf.raw_ops.ResizeBilinear)):
    @op(_name, grad=False)
    def _(d, _forward=_forward):
        image, size, attrs = _images(d, d.dtype()), _size(d), _resize_attrs(d)
        resized = _forward(images=image, size=size, **attrs)
        return Call([T(d.array(resized.shape, tf.float32)), T(image)], attrs, tol=1e-4)


def _crop_args(d: Drawer):
    """An image, boxes (corners in [0, 1], flipped ones included), box_ind, crop_size."""
    image = _images(d)
    boxes = d.size(1, 6)
    return (image, d.array((boxes, 4), tf.float32, -0.2, 1.2),
            d.array((boxes,), tf.int32, 0, image.shape[0] - 1), [d.size(1, 4), d.size(1, 4)])


@op("CropAndResize")
def _(d):
    image, boxes, box_ind, crop = _crop_args(d)
    return Call([T(image), T(boxes), T(box_ind), H(crop, tf.int32)],
                {"method": d.choice(["bilinear", "nearest"]),
                 "extrapolation_value": d.choice([0.0, 0.5])}, tol=1e-4)


@op("CropAndResizeGradImage", grad=False)
def _(d):
    image, boxes, box_ind, crop = _crop_args(d)
    grads = d.array((boxes.shape[0], *crop, image.shape[3]), tf.float32)
    return Call([T(grads), T(boxes), T(box_ind), H(list(image.shape), tf.int32)],
                {"T": tf.float32, "method": d.choice(["bilinear", "nearest"])}, tol=1e-4)


@op("CropAndResizeGradBoxes", grad=False)
def _(d):
    image, boxes, box_ind, crop = _crop_args(d)
    grads = d.array((boxes.shape[0], *crop, image.shape[3]), tf.float32)
    return Call([T(grads), T(image), T(boxes), T(box_ind)], tol=1e-4)


@op("ResizeNearestNeighborGrad", grad=False)
def _(d):
    image, size, attrs = _images(d, d.dtype()), _size(d), _resize_attrs(d)
    resized = tf.raw_ops.ResizeNearestNeighbor(images=image, size=size, **attrs)
    return Call([T(d.array(resized.shape, image.dtype)), H(list(image.shape[1:3]), tf.int32)],
                attrs)


# ---------------------------------------------------------------------------------------
# TensorStridedSliceUpdate
# ---------------------------------------------------------------------------------------

@op("TensorStridedSliceUpdate")
def _(d):
    x = d.array(d.shape(1, 4), d.dtype())
    begin, end, strides, masks = _strided_spec(d, x.shape)
    if "shrink_axis_mask" in masks:   # a shrunk axis takes one valid index
        axis = masks["shrink_axis_mask"].bit_length() - 1
        begin[axis], end[axis], strides[axis] = 0, 1, 1
        masks["begin_mask"] &= ~(1 << axis)
        masks["end_mask"] &= ~(1 << axis)
    sliced = tf.strided_slice(x, begin, end, strides, **masks).shape
    value_shape = d.broadcastable(sliced) if d.int(0, 3) == 0 else tuple(sliced)
    return Call([T(x), H(begin, tf.int32), H(end, tf.int32), H(strides, tf.int32),
                 T(d.array(value_shape, x.dtype))], masks)
