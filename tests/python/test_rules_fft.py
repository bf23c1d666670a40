"""Fourier transforms (cc/rules/fft_rules.cc): values, dtypes and shapes as on one device for
every layout, eagerly, in tf.function and through gradients; output layouts as TensorFlow's
DTensor gives them (a forward transform shifts the transformed axes' shardings one axis
right, an inverse one axis left, and the sharding pushed out goes to the nearest unsharded
axis on the left)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, layout_of, layouts_for, reassemble,
                             run_without_fallback, spec_id, to_dtensor)
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

RNG = np.random.RandomState(3)
B = 3  # uneven over a mesh dimension of 2


def _complex(shape):
    return (RNG.uniform(-1, 1, shape) + 1j * RNG.uniform(-1, 1, shape)).astype(np.complex64)


def _real(shape):
    return RNG.uniform(-1, 1, shape).astype(np.float32)


OPS = {
    "FFT": (tf.signal.fft, _complex((B, 4, 8))),
    "IFFT": (tf.signal.ifft, _complex((B, 4, 8))),
    "FFT2D": (tf.signal.fft2d, _complex((B, 4, 8))),
    "IFFT2D": (tf.signal.ifft2d, _complex((B, 4, 8))),
    "FFT3D": (tf.signal.fft3d, _complex((B, 2, 4, 4))),
    "IFFT3D": (tf.signal.ifft3d, _complex((B, 2, 4, 4))),
    "RFFT": (tf.signal.rfft, _real((B, 4, 8))),
    "IRFFT": (tf.signal.irfft, _complex((B, 4, 5))),
    "RFFT2D": (tf.signal.rfft2d, _real((B, 4, 8))),
    "IRFFT2D": (tf.signal.irfft2d, _complex((B, 4, 5))),
    "RFFT3D": (tf.signal.rfft3d, _real((B, 2, 4, 4))),
    "IRFFT3D": (tf.signal.irfft3d, _complex((B, 2, 4, 3))),
}


def _params():
    params = []
    for name in sorted(OPS):
        for mesh in (MESH_1D, MESH_2X2):
            for layout in layouts_for(mesh, OPS[name][1].shape, uneven=True):
                params.append(pytest.param(name, layout, id=f"{name}-{spec_id(layout)}"))
    return params


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name,layout", _params())
def test_values_match_one_device(name, layout, in_function):
    fn, array = OPS[name]
    expected = fn(tf.constant(array)).numpy()
    run = tf.function(fn) if in_function else fn
    actual = run_without_fallback(run, to_dtensor(array, layout))
    assert tuple(actual.shape) == expected.shape
    assert actual.dtype == tf.as_dtype(expected.dtype)
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-4, atol=1e-4)


# What TensorFlow's DTensor gives (tests/conformance/test_tf_surface.py runs these against it).
MESH_3D = dtensor.create_mesh([("b", 2), ("x", 2), ("y", 2)],
                              devices=[f"CPU:{i}" for i in range(8)])
LAYOUTS = [
    ("FFT", (4, 8, 8), "[*,*,y]", "[*,y,*]"),
    ("FFT", (4, 8, 8), "[b,x,y]", "[b,x,*]"),
    ("RFFT", (4, 8, 8), "[*,x,y]", "[y,x,*]"),
    ("FFT2D", (4, 8, 8), "[b,x,y]", "[b,*,x]"),
    ("FFT2D", (4, 8, 8), "[*,x,y]", "[y,*,x]"),
    ("FFT2D", (4, 8, 8), "[*,x,*]", "[*,*,x]"),
    ("FFT2D", (4, 4, 4, 4), "[*,b,x,y]", "[y,b,*,x]"),
    ("IFFT2D", (4, 8, 8), "[*,*,x]", "[*,x,*]"),
    ("IFFT2D", (4, 8, 8), "[*,x,y]", "[x,y,*]"),
    ("FFT3D", (4, 8, 8), "[b,x,y]", "[*,b,x]"),
    ("FFT3D", (4, 4, 4, 4), "[*,b,x,y]", "[y,*,b,x]"),
    ("FFT3D", (4, 4, 4, 4), "[*,*,*,y]", "[*,*,*,y]"),
    ("FFT", (2, 8), "[x,y]", "[x,*]"),
    ("FFT2D", (8, 8), "[x,y]", "[*,x]"),
]
_FN = {"FFT": tf.signal.fft, "RFFT": tf.signal.rfft, "FFT2D": tf.signal.fft2d,
       "IFFT2D": tf.signal.ifft2d, "FFT3D": tf.signal.fft3d}


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name,shape,spec,want", LAYOUTS,
                         ids=[f"{n}-{s}" for n, _, s, _ in LAYOUTS])
def test_shardings_move_as_in_tensorflow(name, shape, spec, want, in_function):
    array = _real(shape) if name == "RFFT" else _complex(shape)
    fn = _FN[name]
    expected = fn(tf.constant(array)).numpy()
    run = tf.function(fn) if in_function else fn
    actual = run_without_fallback(run, to_dtensor(array, layout_of(spec, MESH_3D)))
    assert dtensor.fetch_layout(actual) == layout_of(want, MESH_3D)
    np.testing.assert_allclose(reassemble(actual), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name", ["FFT", "IFFT", "FFT2D", "RFFT", "IRFFT", "RFFT2D"])
def test_gradients_match_one_device(name, in_function):
    fn, array = OPS[name]

    def loss_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            weights = tf.cast(tf.reshape(tf.range(tf.size(y)), tf.shape(y)) % 5, y.dtype)
            loss = tf.reduce_sum(tf.math.real(y * weights) if y.dtype.is_complex
                                 else y * weights)
        return loss, tape.gradient(loss, x)

    expected = [v.numpy() for v in loss_and_grad(tf.constant(array))]
    run = tf.function(loss_and_grad) if in_function else loss_and_grad
    layout = Layout(["x"] + [UNSHARDED] * (array.ndim - 2) + ["y"], MESH_2X2)
    actual = run_without_fallback(run, to_dtensor(array, layout))
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == e.shape
        np.testing.assert_allclose(reassemble(a), e, rtol=2e-3, atol=2e-3)
