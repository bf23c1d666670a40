"""examples/train_mlp.py: data-parallel training on the mesh matches one plain device.

The comparisons run in this process, on the 8 virtual CPUs of conftest; one short
subprocess runs the script itself (arguments, plot, checkpoint).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import numpy as np
import pytest

from test_examples import EXAMPLES, run_example

pytest.importorskip("sklearn", reason="the example's default data set comes from scikit-learn")

STEPS = 4


def _load_example():
    path = os.path.join(EXAMPLES, "train_mlp.py")
    spec = importlib.util.spec_from_file_location("train_mlp", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs.
    spec.loader.exec_module(module)
    return module


train_mlp = _load_example()


@pytest.fixture(scope="module")
def data():
    return train_mlp.load_digits_28x28()


@pytest.fixture(scope="module")
def plain_history(data):
    return train_mlp.train(epochs=1, steps_per_epoch=STEPS, plain=True, data=data)


@pytest.fixture(scope="module")
def dtensor_history(data):
    return train_mlp.train(mesh_size=8, epochs=1, steps_per_epoch=STEPS, data=data)


def test_digits_are_upscaled_to_mnist_shape(data):
    x_train, y_train, x_test, y_test = data
    assert x_train.shape == (1280, 784) and x_test.shape == (517, 784)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_test)) == set(range(10))


def test_first_steps_match_the_plain_run(plain_history, dtensor_history):
    # Same initial weights (stateless seeds) and the same batches in the same order; the
    # only difference allowed is the order of the gradient all-reduce's additions.
    assert len(dtensor_history.step_loss) == len(plain_history.step_loss) == STEPS
    np.testing.assert_allclose(dtensor_history.step_loss[:3], plain_history.step_loss[:3],
                               rtol=1e-3)


def test_accuracy_reaches_the_plain_run(plain_history, dtensor_history):
    assert plain_history.test_acc[0] > 0.5  # The short epoch has learned something.
    assert dtensor_history.test_acc[0] >= plain_history.test_acc[0] - 0.02
    np.testing.assert_allclose(dtensor_history.train_acc, plain_history.train_acc, atol=0.02)


def test_adam_step_counter_advances_inside_tf_function(data):
    # The guide's Python float `t` would stay 1 inside the traced train_step.
    mesh, weight_layout = train_mlp.setup(8, plain=False)
    model = train_mlp.build_model(weight_layout)
    optimizer = train_mlp.Adam(model.trainable_variables)
    train_mlp.fit(model, optimizer, data, mesh, epochs=1, steps_per_epoch=2, log=lambda _: None)
    assert float(optimizer.t.numpy()) == 3.0


def test_checkpoint_restores_into_a_fresh_model(data):
    mesh, weight_layout = train_mlp.setup(8, plain=False)
    model = train_mlp.build_model(weight_layout)
    optimizer = train_mlp.Adam(model.trainable_variables)
    train_mlp.fit(model, optimizer, data, mesh, epochs=1, steps_per_epoch=2, log=lambda _: None)
    trained = train_mlp.evaluate(model, data, mesh)
    with tempfile.TemporaryDirectory() as directory:
        restored = train_mlp.checkpoint_round_trip(model, optimizer, data, mesh, weight_layout,
                                                   directory)
    assert restored == pytest.approx(trained, rel=1e-6)


def test_script_runs_end_to_end(tmp_path):
    plot = tmp_path / "metrics.png"
    out = run_example("train_mlp.py", "--epochs", "1", "--steps-per-epoch", "2",
                      "--plot", str(plot))
    assert "Mesh: <Mesh object with dims=[('batch', 8)]" in out
    assert "Epoch 1/1: training loss" in out
    assert "Restored from the checkpoint into a fresh model" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
    else:
        assert plot.stat().st_size > 0


@pytest.mark.multi_client
def test_multi_client_example_matches_one_device(plain_history):
    """examples/multi_client.py: the same model and steps as two client processes of two
    devices each (launched by the example through tf_dtensor.launch); both clients see the
    losses of one plain device."""
    out = run_example("multi_client.py", "--nproc", "2", "--steps-per-epoch", str(STEPS))
    for k in range(2):
        line = next(l for l in out.splitlines() if f"client {k} step losses:" in l)
        losses = [float(v) for v in line.split("step losses:")[1].split()]
        np.testing.assert_allclose(losses, plain_history.step_loss, rtol=1e-4,
                                   err_msg=f"client {k}")
