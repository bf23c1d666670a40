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


# Losses of x [8,4] (sharded), labels [8], w [4,6] and b [6] (replicated) that send the
# gradient through the other families' rules.
GRADIENT_CASES = {
    "sigmoid_tanh": lambda x, y, w, b: tf.reduce_sum(tf.sigmoid(x @ w) * tf.tanh(x @ w)),
    "softmax": lambda x, y, w, b: tf.reduce_mean(tf.nn.softmax(x @ w) + tf.nn.log_softmax(x @ w)),
    "moments": lambda x, y, w, b: tf.reduce_sum(
        tf.nn.batch_normalization(x, *tf.nn.moments(x, [0]), None, None, 1e-3)),
    "stack_unstack": lambda x, y, w, b: tf.reduce_sum(
        tf.stack([x, x * 2]) * tf.stack(tf.unstack(x, axis=1), axis=1)[None]),
    "concat_split": lambda x, y, w, b: tf.reduce_sum(
        tf.concat([x, x * 2], axis=1) ** 2) + tf.reduce_sum(
            tf.split(x, 2, axis=1)[0] * tf.split(x, [1, 3], axis=1)[1][:, :1]),
    "slice_pad": lambda x, y, w, b: tf.reduce_sum(
        x[:, 1:3] * tf.slice(x, [0, 0], [8, 2])) + tf.reduce_sum(tf.pad(x, [[1, 1], [0, 0]]) ** 2),
    "gather": lambda x, y, w, b: tf.reduce_sum(tf.gather(x @ w, [0, 2, 3], axis=1) ** 2) +
    tf.reduce_sum(tf.gather(w, [0, 2, 3]) ** 2),
    "one_hot": lambda x, y, w, b: tf.reduce_sum(tf.one_hot(y, 6) * (x @ w)),
    "tile_broadcast_to": lambda x, y, w, b: tf.reduce_sum(tf.tile(x, [2, 1]) ** 2) +
    tf.reduce_sum(tf.broadcast_to(b, [8, 6]) * (x @ w)),
    "keepdims": lambda x, y, w, b: tf.reduce_sum(x / tf.reduce_sum(x, axis=1, keepdims=True)),
    "reduce_axis": lambda x, y, w, b: tf.reduce_sum(tf.reduce_sum(x, axis=0) ** 2) +
    tf.reduce_sum(tf.reduce_max(x, axis=1)),
    "reshape_transpose": lambda x, y, w, b: tf.reduce_sum(tf.reshape(x, [4, 8]) ** 2) +
    tf.reduce_sum(tf.transpose(x) @ x),
    "maximum_where": lambda x, y, w, b: tf.reduce_sum(tf.maximum(x, 0.1) + tf.minimum(x, 0.2)) +
    tf.reduce_sum(tf.where(x > 0, x, 0.1 * x)),
    "sigmoid_cross_entropy": lambda x, y, w, b: tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(x), logits=x)),
    "expand_squeeze_identity": lambda x, y, w, b: tf.reduce_sum(
        tf.squeeze(tf.expand_dims(x, 1), 1) ** 2) + tf.reduce_sum(
            tf.identity_n([x, x])[0] + tf.stop_gradient(x)),
    "cast_reverse_cumsum": lambda x, y, w, b: tf.reduce_sum(
        tf.cast(tf.cast(x, tf.float64), tf.float32) * tf.reverse(x, [1])) + tf.reduce_sum(
            tf.cumsum(x, axis=1) ** 2),
    "norms_and_clipping": lambda x, y, w, b: tf.norm(x) + tf.reduce_sum(
        tf.math.l2_normalize(x, axis=1)) + tf.reduce_sum(tf.clip_by_norm(x, 1.0)) +
    tf.reduce_sum(tf.clip_by_value(x, -1, 1)),
    "logsumexp": lambda x, y, w, b: tf.reduce_sum(tf.reduce_logsumexp(x, axis=1)),
}

X_LAYOUTS = [
    pytest.param(MESH_1D, "[x,*]", id="[x,*]@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,*]", id="[x,*]"),
    pytest.param(MESH_2X2, "[*,y]", id="[*,y]"),
    pytest.param(MESH_2X2, "[x,y]", id="[x,y]"),
    pytest.param(MESH_2X2, "[y,x]", id="[y,x]"),
]


@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
@pytest.mark.parametrize("mesh,spec", X_LAYOUTS)
def test_gradients_through_every_family(mesh, spec, name):
    loss_fn = GRADIENT_CASES[name]
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(8, 4)).astype(np.float32),
              rng.integers(0, 3, size=(8,)).astype(np.int64),
              rng.normal(size=(4, 6)).astype(np.float32), np.zeros(6, np.float32)]

    def run(x, y, w, b):
        with tf.GradientTape() as tape:
            tape.watch([x, w, b])
            loss = loss_fn(x, y, w, b)
        return [loss] + [None if g is None else tf.convert_to_tensor(g)
                         for g in tape.gradient(loss, [x, w, b])]

    expected = run(*[tf.constant(a) for a in arrays])
    batch = layout_of(spec, mesh).sharding_specs[0]
    layouts = [layout_of(spec, mesh),
               layout_of("[*]" if batch == dtensor.UNSHARDED else f"[{batch}]", mesh),
               layout_of("[*,*]", mesh), layout_of("[*]", mesh)]
    with no_fallback():
        actual = run(*[to_dtensor(a, l) for a, l in zip(arrays, layouts)])
    for want, got in zip(expected, actual):
        assert (want is None) == (got is None)
        if want is not None:
            assert_dtensor_equal(want, dtensor.fetch_layout(got), got)


# ---------------------------------------------------------------------------------------
# Autodiff beyond one gradient: jacobians, higher orders, forward mode, custom gradients,
# recomputation and per-example gradients, eagerly and inside tf.function, each against
# the same program on one device.
# ---------------------------------------------------------------------------------------

def _jacobian_pfor(x, w):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.tanh(tf.matmul(x, w))
    return [tape.jacobian(y, x, experimental_use_pfor=True)]


def _jacobian_loop_and_batch_jacobian(x, w):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = tf.tanh(tf.matmul(x, w))
    return [tape.jacobian(y, w, experimental_use_pfor=False),
            tape.batch_jacobian(y, x, experimental_use_pfor=False),
            tape.batch_jacobian(y, x, experimental_use_pfor=True)]


def _second_order(x, w):
    # A second derivative of an elementwise function, and a Hessian-vector product.
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, w])
        with tf.GradientTape(persistent=True) as inner:
            inner.watch([x, w])
            cubic = tf.reduce_sum(x * x * x + tf.sin(x))
            loss = tf.reduce_mean(tf.square(tf.tanh(tf.matmul(x, w))))
        dx = inner.gradient(cubic, x)
        dw = inner.gradient(loss, w)
    return [dx, outer.gradient(dx, x), outer.gradient(dw, w, output_gradients=w * 0.5 + 1.0)]


def _forward_mode(x, w):
    with tf.autodiff.ForwardAccumulator(primals=[x, w], tangents=[tf.cos(x), w * 2.0]) as acc:
        y = tf.nn.softplus(tf.matmul(x, w))
        total = tf.reduce_sum(y * y)
    return [acc.jvp(y), acc.jvp(total)]


def _custom_and_recomputed(x, w):
    @tf.custom_gradient
    def clipped_sin(value):
        def grad(upstream):
            return tf.clip_by_value(upstream * tf.cos(value), -0.1, 0.1) * 10.0
        return tf.sin(value), grad

    block = tf.recompute_grad(lambda a, b: tf.tanh(tf.matmul(a, b)))
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        loss = tf.reduce_sum(clipped_sin(x) * x) + tf.reduce_sum(tf.square(block(x, w)))
    return tape.gradient(loss, [x, w])


def _per_example_gradients(x, w):
    def one(row):
        with tf.GradientTape() as tape:
            tape.watch(w)
            loss = tf.reduce_sum(tf.square(tf.linalg.matvec(w, row, transpose_a=True)))
        return tape.gradient(loss, w)
    mapped = tf.map_fn(lambda row: tf.sin(row) * tf.reduce_max(row), x)
    return [tf.vectorized_map(one, x), mapped]


AUTODIFF_CASES = {
    "jacobian_pfor": _jacobian_pfor,
    "jacobian_loop_and_batch_jacobian": _jacobian_loop_and_batch_jacobian,
    "second_order": _second_order,
    "forward_mode": _forward_mode,
    "custom_and_recomputed": _custom_and_recomputed,
    "per_example_gradients": _per_example_gradients,
}

# (mesh, x's layout, x's shape): batch-sharded, model-sharded, a 2-D mesh, uneven rows.
AUTODIFF_LAYOUTS = [
    pytest.param(MESH_1D, "[x,*]", (4, 6), id="[x,*]@mesh(x=2)"),
    pytest.param(MESH_1D, "[*,x]", (4, 6), id="[*,x]@mesh(x=2)"),
    pytest.param(MESH_2X2, "[x,y]", (4, 6), id="[x,y]"),
    pytest.param(MESH_1D, "[x,*]", (5, 6), id="[x,*]@mesh(x=2)-uneven"),
]


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name", sorted(AUTODIFF_CASES))
@pytest.mark.parametrize("mesh,spec,shape", AUTODIFF_LAYOUTS)
def test_autodiff_features_match_one_device(mesh, spec, shape, name, in_function):
    program = AUTODIFF_CASES[name]
    x = random_array(shape, seed=1)
    w = random_array((shape[1], 3), low=-1.0, high=1.0, seed=2)
    run = tf.function(program) if in_function else program
    expected = run(tf.constant(x), tf.constant(w))
    with no_fallback():
        actual = run(to_dtensor(x, layout_of(spec, mesh)), to_dtensor(w, _replicated(w, mesh)))
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        assert_dtensor_equal(want, dtensor.fetch_layout(got), got)
