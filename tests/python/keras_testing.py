"""Helpers for the Keras tests: the same model trained plain and sharded, step by step."""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Callable, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.keras import _hooks

DEVICES = [f"cpu:{i}" for i in range(8)]


def data_parallel():
    return keras.distribution.DataParallel(devices=DEVICES)


def model_parallel(rules: dict, shape=(2, 4)):
    mesh = keras.distribution.DeviceMesh(shape, ["batch", "model"], DEVICES)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in rules.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def custom_step(model, optimizer):
    """A custom loop's step (not traced): the squared error, its gradients, the update."""
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


@contextlib.contextmanager
def scope(distribution):
    if distribution is None:
        yield
    else:
        with distribution.scope():
            yield


def layouts(model) -> dict:
    """Variable path under the model (`d1/kernel`) -> layout short form, for every variable
    on a mesh (Keras numbers model names: `sequential_3/d1/kernel`)."""
    return {short_path(v.path): v._value.layout.short() for v in model.weights
            if _hooks.is_distributed(v)}


def short_path(path: str) -> str:
    """`sequential_3/d1/kernel` -> `d1/kernel` (Keras numbers Sequential models' names)."""
    return re.sub(r"^sequential(_\d+)?/", "", path)


def train_steps(build: Callable[[], keras.Model], distribution, batches: Sequence,
                unsupported_ok: bool = False) -> List[dict]:
    """Builds the model under `distribution` and runs `train_on_batch` on each batch.

    Returns, per step, the logs and every weight as numpy. Fails if an op ran replicated
    for want of a rule (`UnsupportedOpWarning`), unless `unsupported_ok`.
    """
    with scope(distribution), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tf_dtensor.UnsupportedOpWarning)
        model = build()
        steps = []
        for x, y in batches:
            logs = model.train_on_batch(x, y, return_dict=True)
            steps.append({"logs": {k: float(v) for k, v in logs.items()},
                          "weights": [np.array(w) for w in model.weights]})
    if not unsupported_ok:
        unsupported = [str(w.message) for w in caught
                       if issubclass(w.category, tf_dtensor.UnsupportedOpWarning)]
        assert not unsupported, unsupported
    return steps


def assert_same_steps(got: List[dict], want: List[dict], rtol=1e-5, atol=1e-6) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert g["logs"].keys() == w["logs"].keys()
        for key in w["logs"]:
            np.testing.assert_allclose(g["logs"][key], w["logs"][key], rtol=rtol, atol=atol,
                                       err_msg=f"step {step}: {key}")
        for i, (gw, ww) in enumerate(zip(g["weights"], w["weights"])):
            assert gw.dtype == ww.dtype and gw.shape == ww.shape
            np.testing.assert_allclose(gw, ww, rtol=rtol, atol=atol,
                                       err_msg=f"step {step}: weight {i}")


def batches(x: np.ndarray, y: np.ndarray, size: int):
    return [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]


def fetch_layout_short(tensor) -> Optional[str]:
    return dtensor.fetch_layout(tensor).short() if dtensor.is_dtensor(tensor) else None
