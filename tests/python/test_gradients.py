"""Eager gradients over DTensors: `tf.GradientTape` through a data-parallel MLP.

The batch is sharded, the weights are replicated. Every forward and gradient op must have
a rule (strict mode, and `UnsupportedOpWarning` as an error), and the weight gradients
must equal the single-device gradients and come out replicated:

    x [x,*] @ w [*,*] -> [x,*]     + b, relu, cross entropy -> loss [x] -> mean -> []
    dw = x^T @ dlogits: [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]
    db = sum(dlogits, axis=0): partial(x) -> all-reduce -> [*]
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Dict, List, Sequence

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, layout_of,
                             random_array, to_dtensor)
from tf_dtensor import _device as dtensor_device
from tf_dtensor import dtensor
from tf_dtensor.dtensor import Layout

BATCH, FEATURES, HIDDEN, CLASSES = 16, 6, 10, 5

# (mesh, batch axis spec): the batch over every mesh dimension in turn.
BATCH_SHARDINGS = [
    pytest.param(MESH_1D, "x", id="mesh(x=2)-batch_x"),
    pytest.param(MESH_2X2, "x", id="mesh(x=2,y=2)-batch_x"),
    pytest.param(MESH_2X2, "y", id="mesh(x=2,y=2)-batch_y"),
    pytest.param(MESH_8, "x", id="mesh(x=8)-batch_x"),
]


@contextlib.contextmanager
def no_fallback():
    """Every op must have a rule: strict mode, and the fallback warning as an error."""
    device = dtensor_device.get()
    strict = device.strict
    device.strict = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", tf_dtensor.UnsupportedOpWarning)
            yield
    finally:
        device.strict = strict


def _params(seed: int = 0) -> Dict[str, np.ndarray]:
    return {
        "w1": random_array((FEATURES, HIDDEN), low=-0.5, high=0.5, seed=seed + 1),
        "b1": random_array((HIDDEN,), low=-0.1, high=0.1, seed=seed + 2),
        "w2": random_array((HIDDEN, CLASSES), low=-0.5, high=0.5, seed=seed + 3),
        "b2": random_array((CLASSES,), low=-0.1, high=0.1, seed=seed + 4),
    }


def _batch(seed: int = 0):
    x = random_array((BATCH, FEATURES), seed=seed + 10)
    labels = random_array((BATCH,), np.int32, 0, CLASSES - 1, seed=seed + 11)
    return x, labels


def _sparse_loss(x, labels, w1, b1, w2, b2):
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    logits = tf.matmul(hidden, w2) + b2
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def _dense_loss(x, labels, w1, b1, w2, b2):
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    logits = tf.matmul(hidden, w2) + b2
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.one_hot(labels, CLASSES), logits=logits))


def _bias_add_loss(x, labels, w1, b1, w2, b2):
    # Dense layers use BiasAdd, whose gradient is BiasAddGrad; tanh and sigmoid activations.
    hidden = tf.tanh(tf.nn.bias_add(tf.matmul(x, w1), b1))
    logits = tf.nn.bias_add(tf.matmul(tf.sigmoid(hidden), w2), b2)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def _regularized_loss(x, labels, w1, b1, w2, b2):
    # L2 weight decay and a squared-error term on softmax probabilities.
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    probs = tf.nn.softmax(tf.matmul(hidden, w2) + b2)
    target = tf.one_hot(labels, CLASSES)
    error = tf.reduce_mean(tf.reduce_sum(tf.square(probs - target), axis=1))
    return error + 1e-2 * (tf.nn.l2_loss(w1) + tf.nn.l2_loss(w2))


LOSSES = {
    "sparse_ce": _sparse_loss,
    "dense_ce": _dense_loss,
    "bias_add": _bias_add_loss,
    "regularized": _regularized_loss,
}


def _gradients(loss_fn: Callable, x, labels, params: Sequence) -> List:
    with tf.GradientTape() as tape:
        for p in params:
            tape.watch(p)
        loss = loss_fn(x, labels, *params)
    return [loss] + tape.gradient(loss, list(params))


def _expected(loss_fn: Callable, x, labels, params: Dict[str, np.ndarray]) -> List[np.ndarray]:
    values = _gradients(loss_fn, tf.constant(x), tf.constant(labels),
                        [tf.constant(v) for v in params.values()])
    return [v.numpy() for v in values]


def _replicated(value: np.ndarray, mesh) -> Layout:
    return Layout.replicated(mesh, value.ndim)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("mesh,batch_axis", BATCH_SHARDINGS)
def test_weight_gradients_are_replicated_and_exact(mesh, batch_axis, name):
    loss_fn = LOSSES[name]
    params = _params()
    x, labels = _batch()
    expected = _expected(loss_fn, x, labels, params)

    dx = to_dtensor(x, layout_of(f"[{batch_axis},*]", mesh))
    dlabels = to_dtensor(labels, layout_of(f"[{batch_axis}]", mesh))
    dparams = [to_dtensor(v, _replicated(v, mesh)) for v in params.values()]
    with no_fallback():
        actual = _gradients(loss_fn, dx, dlabels, dparams)

    for want, got in zip(expected, actual):
        assert_dtensor_equal(want, _replicated(want, mesh), got)


@pytest.mark.parametrize("mesh,batch_axis", BATCH_SHARDINGS)
def test_input_gradient_keeps_the_batch_sharding(mesh, batch_axis):
    params = _params()
    x, labels = _batch()

    def input_gradient(x_, labels_, params_):
        with tf.GradientTape() as tape:
            tape.watch(x_)
            loss = _sparse_loss(x_, labels_, *params_)
        return tape.gradient(loss, x_)

    expected = input_gradient(tf.constant(x), tf.constant(labels),
                              [tf.constant(v) for v in params.values()])
    layout = layout_of(f"[{batch_axis},*]", mesh)
    with no_fallback():
        actual = input_gradient(to_dtensor(x, layout),
                                to_dtensor(labels, layout_of(f"[{batch_axis}]", mesh)),
                                [to_dtensor(v, _replicated(v, mesh)) for v in params.values()])
    assert_dtensor_equal(expected, layout, actual)


@pytest.mark.parametrize("mesh,batch_axis", BATCH_SHARDINGS)
def test_training_steps_with_dvariables_match_one_device(mesh, batch_axis):
    """Three SGD steps on DVariables: the weights track the single-device run."""
    params = _params(seed=5)
    learning_rate = 0.5
    reference = [tf.Variable(v) for v in params.values()]
    variables = [dtensor.DVariable(to_dtensor(v, _replicated(v, mesh))) for v in params.values()]
    layout = layout_of(f"[{batch_axis},*]", mesh)
    for step in range(3):
        x, labels = _batch(seed=step)
        _, *grads = _gradients(_sparse_loss, tf.constant(x), tf.constant(labels), reference)
        for v, g in zip(reference, grads):
            v.assign_sub(learning_rate * g)
        dx = to_dtensor(x, layout)
        dlabels = to_dtensor(labels, layout_of(f"[{batch_axis}]", mesh))
        with no_fallback():
            _, *dgrads = _gradients(_sparse_loss, dx, dlabels, variables)
            for v, g in zip(variables, dgrads):
                v.assign_sub(learning_rate * g)
    for want, got in zip(reference, variables):
        assert_dtensor_equal(want.numpy(), _replicated(want.numpy(), mesh), got.read_value())


def test_accuracy_metric_has_rules(mesh_2x2):
    """argmax / equal / cast / reduce_mean over a batch-sharded prediction."""
    logits = random_array((BATCH, CLASSES), seed=3)
    _, labels = _batch()
    expected = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32),
                                               labels), tf.float32))
    with no_fallback():
        actual = tf.reduce_mean(tf.cast(tf.equal(
            tf.argmax(to_dtensor(logits, layout_of("[x,*]", mesh_2x2)), axis=1,
                      output_type=tf.int32),
            to_dtensor(labels, layout_of("[x]", mesh_2x2))), tf.float32))
    assert_dtensor_equal(expected, layout_of("[]", mesh_2x2), actual)
