"""Numerical checks of cc/rules/batch_parallel_rules.cc: ops independent over leading batch
axes (linear algebra, image ops). The batch axes stay sharded, the core axes are
gathered:

    cholesky([x,*,y] of [B, N, N]) -> [x,*,*]      (Fourier transforms: test_rules_fft.py)
    matrix_solve([x,*,*], [*,*,*]) -> [x,*,*]      adjust_hue([x,y,*,*]) -> [x,y,*,*]
    lrn([x,y,*,*]) -> [x,y,*,*]                    searchsorted([x,y], [x,*]) -> [x,*]
    max_pool_with_argmax([x,*,*,y]) -> [x,*,*,*]   (the indices flatten h, w and c)
    resize([x,y,*,z]) -> [x,*,*,z]                 (each channel alone: channels keep theirs)

The expected output layout is derived here, independently of the C++ rule: the first
input's batch specs, then the others' for batch axes still unsharded, core axes unsharded.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, assert_dtensor_equal, cpus, layout_of,
                             layouts_for, reassemble, run_without_fallback, spec_id, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

B = 3  # uneven over a mesh dim of 2


def _spd(shape, seed):
    """Well-conditioned symmetric positive definite matrices."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, size=shape).astype(np.float32)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=np.float32)).astype(np.float32)


def _uniform(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _complex(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(np.complex64)


def _lower(shape, seed):
    return (np.tril(_uniform(shape, seed)) + 2 * np.eye(shape[-1], dtype=np.float32))


# name -> (fn, arrays, core axes per input, core axes of the output, float tolerance)
MAT = (B, 4, 4)
IMG = (B, 4, 6, 3)
OPS = {
    "Cholesky": (tf.linalg.cholesky, [_spd(MAT, 0)], [2], 2),
    "MatrixInverse": (tf.linalg.inv, [_spd(MAT, 1)], [2], 2),
    "MatrixDeterminant": (tf.linalg.det, [_spd(MAT, 2)], [2], 0),
    "LogMatrixDeterminant": (lambda x: tf.linalg.slogdet(x)[1], [_spd(MAT, 3)], [2], 0),
    "Qr.q": (lambda x: tf.linalg.qr(x)[0], [_uniform(MAT, 4)], [2], 2),
    "Qr.r": (lambda x: tf.linalg.qr(x)[1], [_uniform(MAT, 4)], [2], 2),
    "SelfAdjointEigV2.e": (lambda x: tf.linalg.eigh(x)[0], [_spd(MAT, 5)], [2], 1),
    "SelfAdjointEigV2.v": (lambda x: tf.linalg.eigh(x)[1], [_spd(MAT, 5)], [2], 2),
    "SelfAdjointEigV2.values_only": (tf.linalg.eigvalsh, [_spd(MAT, 5)], [2], 1),
    "Svd.s": (lambda x: tf.linalg.svd(x, compute_uv=False), [_uniform(MAT, 6)], [2], 1),
    "Svd.u": (lambda x: tf.linalg.svd(x)[1], [_uniform(MAT, 6)], [2], 2),
    "Lu": (lambda x: tf.linalg.lu(x)[0], [_spd(MAT, 7)], [2], 2),
    "MatrixSquareRoot": (tf.linalg.sqrtm, [_spd(MAT, 8)], [2], 2),
    "MatrixBandPart": (lambda x: tf.linalg.band_part(x, 1, 0), [_uniform(MAT, 9)], [2], 2),
    "MatrixDiag": (tf.linalg.diag, [_uniform((B, 4), 10)], [1], 2),
    "MatrixDiag.band": (lambda d: tf.linalg.diag(d, k=(-1, 1), num_rows=4, num_cols=4),
                        [_uniform((B, 3, 4), 11)], [2], 2),
    "MatrixDiagPart": (tf.linalg.diag_part, [_uniform(MAT, 12)], [2], 1),
    "MatrixDiagPart.band": (lambda x: tf.linalg.diag_part(x, k=(-1, 1)),
                            [_uniform(MAT, 13)], [2], 2),
    "MatrixDiagPart.v1": (lambda x: tf.raw_ops.MatrixDiagPart(input=x), [_uniform(MAT, 14)],
                          [2], 1),
    "MatrixDiag.v1": (lambda d: tf.raw_ops.MatrixDiag(diagonal=d), [_uniform((B, 4), 15)],
                      [1], 2),
    "MatrixSetDiag": (tf.linalg.set_diag, [_uniform(MAT, 16), _uniform((B, 4), 17)], [2, 1], 2),
    "MatrixSolve": (tf.linalg.solve, [_spd(MAT, 18), _uniform((B, 4, 2), 19)], [2, 2], 2),
    "MatrixTriangularSolve": (tf.linalg.triangular_solve,
                              [_lower(MAT, 20), _uniform((B, 4, 2), 21)], [2, 2], 2),
    "MatrixSolveLs": (tf.linalg.lstsq, [_spd(MAT, 24), _uniform((B, 4, 2), 25)], [2, 2], 2),
    "CholeskyGrad": (lambda l, g: tf.raw_ops.CholeskyGrad(l=l, grad=g),
                     [np.linalg.cholesky(_spd(MAT, 26)).astype(np.float32), _uniform(MAT, 27)],
                     [2, 2], 2),
    "Cross": (tf.linalg.cross, [_uniform((B, 4, 3), 22), _uniform((B, 4, 3), 23)], [1, 1], 1),
    "ResizeBilinear": (lambda x: tf.image.resize(x, [6, 8], "bilinear"), [_uniform(IMG, 50)],
                       [3], 3),
    "ResizeNearestNeighbor": (lambda x: tf.image.resize(x, [8, 3], "nearest"),
                              [_uniform(IMG, 51)], [3], 3),
    "ResizeBicubic": (lambda x: tf.image.resize(x, [6, 8], "bicubic"), [_uniform(IMG, 52)],
                      [3], 3),
    "ResizeArea": (lambda x: tf.image.resize(x, [2, 3], "area"), [_uniform(IMG, 53)], [3], 3),
    "AdjustContrastv2": (lambda x: tf.image.adjust_contrast(x, 1.5), [_uniform(IMG, 54)], [3], 3),
    "AdjustHue": (lambda x: tf.image.adjust_hue(x, 0.2), [_uniform(IMG, 55, 0.0, 1.0)], [1], 1),
    "AdjustSaturation": (lambda x: tf.image.adjust_saturation(x, 1.3),
                         [_uniform(IMG, 56, 0.0, 1.0)], [1], 1),
    "RGBToHSV": (tf.image.rgb_to_hsv, [_uniform(IMG, 57, 0.0, 1.0)], [1], 1),
    "HSVToRGB": (tf.image.hsv_to_rgb, [_uniform(IMG, 58, 0.0, 1.0)], [1], 1),
    "ExtractImagePatches": (lambda x: tf.image.extract_patches(
        x, sizes=[1, 2, 2, 1], strides=[1, 2, 2, 1], rates=[1, 1, 1, 1], padding="VALID"),
                            [_uniform(IMG, 59)], [3], 3),
    "MaxPoolWithArgmax.output": (lambda x: tf.nn.max_pool_with_argmax(x, 2, 2, "SAME")[0],
                                 [_uniform(IMG, 66)], [3], 3),
    "MaxPoolWithArgmax.argmax": (lambda x: tf.nn.max_pool_with_argmax(x, 2, 2, "SAME")[1],
                                 [_uniform(IMG, 66)], [3], 3),
    "LRN": (lambda x: tf.nn.local_response_normalization(x, depth_radius=1, bias=1.0,
                                                          alpha=0.5, beta=0.75),
            [_uniform(IMG, 61)], [1], 1),
    # tf.searchsorted's reshapes to 2-D are left out: raw ops check the rule alone.
    "LowerBound": (lambda s, v: tf.raw_ops.LowerBound(sorted_inputs=s, values=v),
                   [np.sort(_uniform((B, 6), 62), axis=-1), _uniform((B, 4), 63)], [1, 1], 1),
    "UpperBound": (lambda s, v: tf.raw_ops.UpperBound(sorted_inputs=s, values=v),
                   [np.sort(_uniform((B, 6), 64), axis=-1), _uniform((B, 4), 65)], [1, 1], 1),
    "ExtractVolumePatches": (lambda x: tf.extract_volume_patches(
        x, ksizes=[1, 2, 2, 2, 1], strides=[1, 2, 2, 2, 1], padding="VALID"),
                             [_uniform((B, 2, 4, 4, 2), 60)], [4], 4),
}


def expected_layout(layouts, shapes, core, core_out) -> Layout:
    """Batch axes (right-aligned) take the first spanning input's sharding, in input order,
    each mesh dim once; the output's core axes are unsharded."""
    batch_rank = max(len(s) - c for s, c in zip(shapes, core))
    batch = [UNSHARDED] * batch_rank
    sizes = [1] * batch_rank
    for shape, c in zip(shapes, core):
        lead = len(shape) - c
        for a in range(lead):
            f = batch_rank - lead + a
            sizes[f] = max(sizes[f], shape[a])
    used = set()
    for f in range(batch_rank):
        for layout, shape, c in zip(layouts, shapes, core):
            lead = len(shape) - c
            a = f - (batch_rank - lead)
            if a < 0 or shape[a] != sizes[f]:
                continue
            spec = layout.sharding_specs[a]
            if spec != UNSHARDED and spec not in used:
                batch[f] = spec
                used.add(spec)
                break
    return Layout(batch + [UNSHARDED] * core_out, layouts[0].mesh)


# Image ops that treat each channel alone: height and width are core, the channels keep
# their sharding after the batch axes (a mesh dim once).
PER_CHANNEL = {"ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea",
               "AdjustContrastv2"}


def check_batch_op(name, layouts, in_function=False):
    """Runs OPS[name] on one device and on DTensors laid out as `layouts` (strict mode):
    values, dtype, global shape and the output layout must agree."""
    fn, arrays, core, core_out = OPS[name]
    expected = fn(*[tf.constant(a) for a in arrays]).numpy()
    inputs = [to_dtensor(a, l) for a, l in zip(arrays, layouts)]
    actual = run_without_fallback(tf.function(fn) if in_function else fn, *inputs)
    layout = expected_layout(layouts, [a.shape for a in arrays], core, core_out)
    if name in PER_CHANNEL:
        specs = list(layout.sharding_specs)
        channel = layouts[0].sharding_specs[-1]
        if channel not in specs:
            specs[-1] = channel
        layout = Layout(specs, layout.mesh)
    assert dtensor.fetch_layout(actual) == layout, (
        f"layout is {dtensor.fetch_layout(actual).short()}, expected {layout.short()}")
    assert tuple(actual.shape) == expected.shape
    assert actual.dtype == tf.as_dtype(expected.dtype)
    got = reassemble(actual)
    if name in _SIGN_FREE:
        got, expected = _canonical_signs(got), _canonical_signs(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


# Singular vectors are unique up to the sign of each column; a kernel picks the signs, and
# GPU kernels pick them differently for different batch sizes (a shard's and the whole's).
_SIGN_FREE = {"Svd.u"}


def _canonical_signs(u: np.ndarray) -> np.ndarray:
    """u with each column's largest-magnitude entry made positive."""
    biggest = np.take_along_axis(u, np.abs(u).argmax(axis=-2)[..., None, :], axis=-2)
    return u * np.where(biggest < 0, -1.0, 1.0).astype(u.dtype)


def _every_layout(name):
    """Every layout of each input (uneven included) on both meshes; the second input of a
    two-input op runs each of its layouts against a replicated first and vice versa."""
    _, arrays, _, _ = OPS[name]
    params = []
    for mesh in (MESH_1D, MESH_2X2):
        per_input = [layouts_for(mesh, a.shape, uneven=True) for a in arrays]
        combos = []
        if len(arrays) == 1:
            combos = [(l,) for l in per_input[0]]
        else:
            replicated = [Layout.replicated(mesh, a.ndim) for a in arrays]
            for i, options in enumerate(per_input):
                for l in options:
                    combo = list(replicated)
                    combo[i] = l
                    if tuple(combo) not in combos:
                        combos.append(tuple(combo))
            combos.append(tuple(per_input[0][-1:] + per_input[1][1:2]))
        for combo in combos:
            ident = "-".join(spec_id(l) for l in combo)
            params.append(pytest.param(name, combo, id=f"{name}-{ident}@{mesh.short()}"))
    return params


@pytest.mark.parametrize("name,layouts", [p for n in sorted(OPS) for p in _every_layout(n)])
def test_every_layout(name, layouts):
    check_batch_op(name, layouts)


FUNCTION_SPECS = {2: ["[x,y]"], 3: ["[x,y,*]", "[*,x,y]"], 4: ["[x,*,y,*]", "[y,x,*,*]"],
                  5: ["[x,*,*,y,*]"]}


@pytest.mark.parametrize("name", sorted(OPS))
def test_in_function(name):
    _, arrays, _, _ = OPS[name]
    for spec in FUNCTION_SPECS[arrays[0].ndim]:
        layouts = [layout_of(spec if i == 0 else "[" + ",".join(["*"] * a.ndim) + "]", MESH_2X2)
                   for i, a in enumerate(arrays)]
        check_batch_op(name, layouts, in_function=True)


def test_two_batch_axes_broadcast_in_triangular_solve():
    # matrix [1, 2, 4, 4] broadcasts against rhs [3, 2, 4, 2]: batch axis 0 comes from rhs.
    matrix, rhs = _lower((1, 2, 4, 4), 60), _uniform((3, 2, 4, 2), 61)
    layouts = [layout_of("[*,y,*,*]", MESH_2X2), layout_of("[x,*,*,*]", MESH_2X2)]
    expected = tf.linalg.triangular_solve(matrix, rhs).numpy()
    actual = run_without_fallback(tf.linalg.triangular_solve,
                                  *[to_dtensor(a, l) for a, l in zip([matrix, rhs], layouts)])
    assert_dtensor_equal(expected, layout_of("[x,y,*,*]", MESH_2X2), actual)


# Gradients: composed of these ops and others that have rules; strict mode proves none
# fell back.
GRAD_OPS = ["Cholesky", "MatrixInverse", "MatrixDeterminant", "LogMatrixDeterminant", "Qr.q",
            "Qr.r", "SelfAdjointEigV2.e", "Svd.s", "MatrixBandPart", "MatrixDiag",
            "MatrixDiagPart", "MatrixSetDiag", "MatrixSolve", "MatrixTriangularSolve", "Cross",
            "ResizeBilinear",
            "ResizeNearestNeighbor", "ResizeBicubic", "RGBToHSV",
            "ExtractImagePatches", "ExtractVolumePatches", "MatrixDiag.band", "LRN",
            "MaxPoolWithArgmax.output"]


def _grads(fn):
    def run(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            y = fn(*args)
            weights = tf.cast(tf.reshape(tf.range(tf.size(y)), tf.shape(y)) % 5, y.dtype)
            loss = tf.reduce_sum(tf.math.real(y * weights) if y.dtype.is_complex
                                 else y * weights)
        return [loss] + tape.gradient(loss, list(args))
    return run


GRAD_SPECS = [pytest.param(MESH_1D, "x", id="batch_x@mesh(x=2)"),
              pytest.param(MESH_2X2, "x,y", id="batch_x-last_y"),
              pytest.param(MESH_2X2, "y,x", id="batch_y-last_x")]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,dims", GRAD_SPECS)
@pytest.mark.parametrize("name", GRAD_OPS)
def test_gradient_matches_one_device(name, mesh, dims, in_function):
    fn, arrays, _, _ = OPS[name]
    dims = dims.split(",")
    # Input 0: batch axis over the first dim, last axis over the second (gathered).
    layouts = []
    for i, a in enumerate(arrays):
        specs = [UNSHARDED] * a.ndim
        if i == 0:
            specs[0] = dims[0]
            if len(dims) > 1:
                specs[-1] = dims[1]
        layouts.append(Layout(specs, mesh))
    grads = _grads(fn)
    expected = [v.numpy() for v in grads(*[tf.constant(a) for a in arrays])]
    run = tf.function(grads) if in_function else grads
    actual = run_without_fallback(run, *[to_dtensor(a, l) for a, l in zip(arrays, layouts)])
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == e.shape
        np.testing.assert_allclose(reassemble(a), e, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("method", ["bilinear", "nearest", "bicubic"])
def test_resize_keeps_sharded_channels_through_its_gradient(method, in_function):
    """An upsampling in a channel-sharded (model-parallel) network: no gather."""
    x = _uniform((2, 4, 6, 4), 70)
    layout = layout_of("[x,*,*,y]", MESH_2X2)

    def run(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.image.resize(t, [7, 9], method)
            loss = tf.reduce_sum(y * y)
        return [y, tape.gradient(loss, t)]

    expected = [v.numpy() for v in run(tf.constant(x))]
    actual = run_without_fallback(tf.function(run) if in_function else run, to_dtensor(x, layout))
    assert_dtensor_equal(expected[0], layout_of("[x,*,*,y]", MESH_2X2), actual[0])
    assert_dtensor_equal(expected[1], layout, actual[1])


def test_resize_gathers_channels_that_would_leave_a_device_none():
    # 3 channels over x=4: one device would hold no channel, which TF's kernel refuses.
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = _uniform((2, 4, 4, 3), 71)
    out = run_without_fallback(lambda t: tf.image.resize(t, [6, 6]),
                               to_dtensor(x, layout_of("[*,*,*,x]", mesh)))
    assert_dtensor_equal(tf.image.resize(x, [6, 6]), layout_of("[*,*,*,*]", mesh), out)


@pytest.mark.parametrize("include_batch", [False, True], ids=["image_index", "batch_index"])
def test_max_pool_with_argmax_indices_match_one_device(include_batch):
    """The indices count positions in the whole image (and batch): a sharded channel axis,
    or with include_batch_in_index a sharded batch, would make them local."""
    x = _uniform((4, 4, 6, 4), 72)
    fn = lambda t: tf.nn.max_pool_with_argmax(t, 2, 2, "SAME",
                                              include_batch_in_index=include_batch)
    expected = [v.numpy() for v in fn(tf.constant(x))]
    actual = run_without_fallback(fn, to_dtensor(x, layout_of("[x,*,*,y]", MESH_2X2)))
    want = layout_of("[*,*,*,*]" if include_batch else "[x,*,*,*]", MESH_2X2)
    for e, a in zip(expected, actual):
        assert_dtensor_equal(e, want, a)


def test_max_pool_argmax_gradient_gathers_a_batch_that_leaves_a_device_none():
    # 3 images over x=4: the gradient kernel must not see an empty block.
    mesh = dtensor.create_mesh([("x", 4)], devices=cpus(4))
    x = _uniform((3, 4, 4, 2), 73)

    def run(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y, _ = tf.nn.max_pool_with_argmax(t, 2, 2, "SAME")
            loss = tf.reduce_sum(y * y)
        return [y, tape.gradient(loss, t)]

    expected = [v.numpy() for v in run(tf.constant(x))]
    actual = run_without_fallback(run, to_dtensor(x, layout_of("[x,*,*,*]", mesh)))
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(reassemble(a), e, rtol=1e-5, atol=1e-6)
    assert dtensor.fetch_layout(actual[0]) == layout_of("[*,*,*,*]", mesh)
