"""GPU tests (marker `gpu`): run whenever a GPU is visible, skipped otherwise (CI has none).

conftest.py splits the GPU into 8 logical GPUs with TensorFloat-32 off. Here: collectives
of every dtype TensorFlow's DTensor supports, under each lowering GPUs can use ("copies":
device-to-device copies, the default for GPUs of one process; "ops": TensorFlow's
collective ops, whose all-reduce has no int32 kernel on GPUs), a training step against
one GPU, and the numerical op checks and the fuzzer on GPU meshes (a subprocess with
TF_DTENSOR_TEST_DEVICE=GPU, so that every shared mesh is a GPU mesh).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import collective_lowering, reassemble
from tf_dtensor import dtensor

GPUS = [d.name for d in tf.config.list_logical_devices("GPU")]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(len(GPUS) < 8, reason="needs a GPU (split into 8 logical GPUs)"),
]

LOWERINGS = ("", "copies", "ops")
DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int64, np.int8,
          np.uint8, np.bool_, np.complex64)


def _mesh():
    return dtensor.create_mesh([("x", 8)], devices=GPUS)


def _value(dtype, shape=(16, 8)):
    rng = np.random.RandomState(0)
    if dtype == np.bool_:
        return rng.rand(*shape) > 0.5
    if dtype == np.complex64:
        return (rng.randint(-3, 4, shape) + 1j * rng.randint(-3, 4, shape)).astype(dtype)
    return rng.randint(-3 if np.dtype(dtype).kind != "u" else 0, 4, shape).astype(dtype)


def _reduce(x):
    return tf.reduce_any(x, axis=0) if x.dtype == tf.bool else tf.reduce_sum(x, axis=0)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_collectives_of_every_dtype(lowering, dtype):
    """All-reduce (a reduction over the sharded axis), all-gather and all-to-all of each
    dtype equal the same computation on one device, eagerly."""
    mesh = _mesh()
    value = _value(dtype)
    sharded = dtensor.pack(np.split(value, 8), dtensor.Layout(["x", "unsharded"], mesh))
    expected = _reduce(tf.constant(value)).numpy()
    with collective_lowering(lowering):
        reduced = _reduce(sharded)
        assert dtensor.fetch_layout(reduced).is_fully_replicated()
        for component in dtensor.unpack(reduced):
            np.testing.assert_array_equal(component.numpy(), expected)
        gathered = dtensor.relayout(sharded, dtensor.Layout.replicated(mesh, 2))
        for component in dtensor.unpack(gathered):
            np.testing.assert_array_equal(component.numpy(), value)
        swapped = dtensor.relayout(sharded, dtensor.Layout(["unsharded", "x"], mesh))
        got = np.concatenate([c.numpy() for c in dtensor.unpack(swapped)], axis=1)
        np.testing.assert_array_equal(got, value)
        # Pieces wide enough for every folded form of the copies lowering (aligned views
        # and a Transpose at the sources, a Transpose after the stitch at the targets),
        # which gave int32 wrong values on an H200: a gather and an all-to-all of columns.
        wide = _value(dtype, (16, 128))
        columns = dtensor.pack(np.split(wide, 8, axis=1),
                               dtensor.Layout(["unsharded", "x"], mesh))
        for component in dtensor.unpack(
                dtensor.relayout(columns, dtensor.Layout.replicated(mesh, 2))):
            np.testing.assert_array_equal(component.numpy(), wide)
        rows = dtensor.relayout(columns, dtensor.Layout(["x", "unsharded"], mesh))
        np.testing.assert_array_equal(np.concatenate([c.numpy() for c in dtensor.unpack(rows)]),
                                      wide)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_a_step_failing_on_one_gpu_leaves_collectives_usable(lowering):
    """One GPU's block holds a NaN: `check_numerics` fails there while the others enter the
    all-reduce. TensorFlow's collective executor (the `ops` lowering) is then aborted or the
    group cancelled, which failed every later collective of the process; the next steps, a
    relayout and an eager reduction must be right."""
    import tf_dtensor
    mesh = _mesh()
    layout = dtensor.Layout(["x", "unsharded"], mesh)
    value = _value(np.float32, (16, 64))
    broken = value.copy()
    broken[11, 3] = np.nan
    expected = value.sum(axis=0)
    with collective_lowering(lowering):
        step = tf.function(
            lambda x: tf.reduce_sum(tf.debugging.check_numerics(x, "step input"), axis=0))
        for _ in range(3):
            with pytest.raises(tf.errors.InvalidArgumentError, match="step input"):
                step(dtensor.pack(np.split(broken, 8), layout))
            for reduced in (step(dtensor.pack(np.split(value, 8), layout)),
                            tf.reduce_sum(dtensor.pack(np.split(value, 8), layout), axis=0)):
                for component in dtensor.unpack(reduced):
                    np.testing.assert_allclose(component.numpy(), expected, rtol=1e-5)
            gathered = tf_dtensor.relayout(dtensor.pack(np.split(value, 8), layout),
                                           dtensor.Layout.replicated(mesh, 2))
            for component in dtensor.unpack(gathered):
                np.testing.assert_array_equal(component.numpy(), value)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("lowering", LOWERINGS)
def test_training_step_matches_one_gpu(lowering, jit_compile):
    """A data-parallel MLP step (tf.function, gradients, DVariable updates) on 8 logical GPUs
    gives the losses and weights of the same step on one GPU; with jit_compile=True each
    device's part is compiled with XLA, as the step on one GPU is (Keras' default on GPUs)."""
    rng = np.random.RandomState(0)
    x_value = rng.rand(64, 32).astype(np.float32)
    y_value = rng.randint(0, 5, 64).astype(np.int64)
    inits = [rng.uniform(-0.3, 0.3, (32, 16)).astype(np.float32), np.zeros([16], np.float32),
             rng.uniform(-0.3, 0.3, (16, 5)).astype(np.float32), np.zeros([5], np.float32)]

    def make_step(variables):
        @tf.function(jit_compile=jit_compile)
        def step(x, y):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, variables[0]) + variables[1])
                logits = tf.matmul(h, variables[2]) + variables[3]
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            for v, g in zip(variables, tape.gradient(loss, variables)):
                v.assign_sub(0.5 * g)
            return loss
        return step

    with tf.device(GPUS[0]):
        plain_vars = [tf.Variable(v) for v in inits]
        plain_step = make_step(plain_vars)
        plain_losses = [plain_step(tf.constant(x_value), tf.constant(y_value)).numpy()
                        for _ in range(3)]
    mesh = dtensor.create_mesh([("batch", 8)], devices=GPUS)
    with collective_lowering(lowering):
        variables = [dtensor.DVariable(dtensor.copy_to_mesh(
            tf.constant(v), dtensor.Layout.replicated(mesh, v.ndim))) for v in inits]
        x = dtensor.pack(np.split(x_value, 8), dtensor.Layout.batch_sharded(mesh, "batch", 2))
        y = dtensor.pack(np.split(y_value, 8), dtensor.Layout.batch_sharded(mesh, "batch", 1))
        step = make_step(variables)
        losses = [dtensor.unpack(step(x, y))[0].numpy() for _ in range(3)]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for v, p in zip(variables, plain_vars):
        for component in dtensor.unpack(v.read_value()):
            np.testing.assert_allclose(component.numpy(), p.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_batches_of_run_time_size_match_one_gpu(lowering):
    """Batches whose size a tf.function knows only at run time (a tf.data iterator, the
    last batch partial, 2 rows over 8 GPUs): their shape (an all-gather of pieces of
    run-time size: sizes go round first under "ops"), a gated product's gradient (a sum
    over run-time axes, gathered) and a row of run-time size 1 broadcast against the
    batch, against one GPU."""
    value = (np.arange(40, dtype=np.float32).reshape(10, 4) - 7.0) / 9.0

    def step(iterator, to_mesh):
        x = next(iterator)
        r = tf.reduce_sum(x, tf.cast(tf.where(tf.shape(x) > 3)[:, 0], tf.int32), keepdims=True)
        x = to_mesh(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.tanh(x) * tf.sigmoid(x * 2.0) + x * r
            loss = tf.reduce_sum(y * y)
        return tf.shape(x), y, tape.gradient(loss, x)

    def batches():
        return iter(tf.data.Dataset.from_tensor_slices(value).batch(4))

    with tf.device(GPUS[0]):
        plain, iterator = tf.function(step), batches()
        want = [[t.numpy() for t in plain(iterator, lambda x: x)] for _ in range(3)]
    mesh = _mesh()
    layout = dtensor.Layout.batch_sharded(mesh, "x", 2)
    with collective_lowering(lowering):
        sharded, iterator = tf.function(step), batches()
        for expected in want:
            with dtensor.run_on(mesh):
                got = sharded(iterator, lambda x: dtensor.relayout(x, layout))
            for e, g in zip(expected, got):
                np.testing.assert_allclose(reassemble(g), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["data", "model"])
def test_keras_training_under_its_default_xla_matches_one_gpu(kind):
    """Keras resolves `jit_compile="auto"` to XLA on GPUs, and tf_dtensor then compiles each
    device's part of the step: a model trained under keras.distribution on 8 logical GPUs
    (DataParallel, or ModelParallel on 2x4) gives the losses and weights of the same model
    trained on one GPU, step by step."""
    keras = pytest.importorskip("keras")
    import tf_dtensor.keras  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import keras_testing as kt  # pylint: disable=import-outside-toplevel

    rng = np.random.RandomState(0)
    x, y = rng.randn(64, 16).astype("float32"), rng.randn(64, 4).astype("float32")

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((16,)),
                                  keras.layers.Dense(32, activation="relu", name="d1"),
                                  keras.layers.Dense(4, name="d2")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        return model

    devices = [f"gpu:{i}" for i in range(8)]
    if kind == "data":
        distribution = keras.distribution.DataParallel(devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices)
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map[".*d1/kernel"] = (None, "model")
        layout_map[".*d1/bias"] = ("model",)
        layout_map[".*d2/kernel"] = ("model", None)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                        batch_dim_name="batch")
    steps = kt.batches(x, y, 16)
    with tf.device(GPUS[0]):
        want = kt.train_steps(build, None, steps)
    with distribution.scope():
        model = build()
        model.train_on_batch(*steps[0])
        assert model.jit_compile is True, "Keras did not resolve jit_compile to XLA on a GPU"
    got = kt.train_steps(build, distribution, steps)
    kt.assert_same_steps(got, want, rtol=1e-4, atol=1e-5)


def test_numerical_checks_and_fuzzer_on_gpu_meshes():
    """The per-op numerical checks (test_rules_*) and the fuzzer's short run, with every
    shared mesh a GPU mesh, under the default GPU lowering and TensorFlow's collective ops."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = sorted(glob.glob(os.path.join(here, "test_rules_*.py"))) + [
        os.path.join(here, "fuzz", "test_fuzz.py")]
    env = dict(os.environ, TF_DTENSOR_TEST_DEVICE="GPU")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-m", "not gpu", *files], env=env, capture_output=True, text=True,
                         timeout=1800)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_nccl_asked_for_on_logical_gpus_of_one_gpu_keeps_the_copies(monkeypatch):
    """NCCL cannot run between logical GPUs of one physical GPU ("duplicate GPU"): with
    TensorFlow DTensor's switch set, such a mesh keeps the copies, and its collectives are
    right."""
    monkeypatch.setenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1")
    from tf_dtensor import config
    mesh = _mesh()
    assert config.collective_lowering(mesh) == "copies"
    value = _value(np.float32)
    sharded = dtensor.pack(np.split(value, 8), dtensor.Layout(["x", "unsharded"], mesh))
    np.testing.assert_allclose(dtensor.unpack(tf.reduce_sum(sharded, axis=0))[3].numpy(),
                               value.sum(axis=0))
