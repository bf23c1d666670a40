"""Saving sharded Keras models: .keras files, weights files and tf.train.Checkpoint, across
layout maps, meshes and plain Keras, bit-exactly."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_dtensor import api as dtensor_api
from tf_dtensor import dtensor
from tf_dtensor.keras import _hooks

import keras_testing as kt

RNG = np.random.RandomState(5)
X = RNG.randn(32, 16).astype("float32")
Y = RNG.randn(32, 4).astype("float32")

RULES_A = {".*d1/kernel": (None, "model"), ".*d1/bias": ("model",),
           ".*d2/kernel": ("model", None)}
RULES_B = {".*d1/kernel": ("model", None), ".*d2/kernel": (None, "model"),
           ".*d2/bias": ("model",)}


def mlp(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu",
                                                                     name="d1"),
                              keras.layers.Dense(4, name="d2")])
    model.compile(optimizer="adam", loss="mse")
    return model


def trained(distribution):
    with kt.scope(distribution):
        model = mlp()
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    return model


def assert_same_weights(got, want):
    for g, w in zip(got.get_weights(), want.get_weights()):
        np.testing.assert_array_equal(g, w)


def test_keras_file_round_trips_into_another_layout_map_and_plain_keras(tmp_path):
    model = trained(kt.model_parallel(RULES_A))
    path = str(tmp_path / "model.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert not any(_hooks.is_distributed(v) for v in plain.weights)
    assert_same_weights(plain, model)
    with kt.model_parallel(RULES_B).scope():
        resharded = keras.models.load_model(path)
    assert kt.layouts(resharded)["d1/kernel"] == "[model,*] @ mesh(batch=2,model=4)"
    assert_same_weights(resharded, model)
    # Loaded sharded or plain, training goes on identically.
    plain.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    with kt.model_parallel(RULES_B).scope():
        resharded.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for g, w in zip(resharded.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_weights_file_loads_across_meshes_and_from_plain_keras(tmp_path, monkeypatch):
    model = trained(kt.model_parallel(RULES_A))
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    with kt.model_parallel(RULES_B, shape=(4, 2)).scope():
        other_mesh = mlp(seed=9)
        other_mesh.load_weights(path)
    assert kt.layouts(other_mesh)["d1/kernel"] == "[model,*] @ mesh(batch=4,model=2)"
    assert_same_weights(other_mesh, model)
    # A plain model's file into a sharded model: each device receives its block, and
    # nothing copies a whole weight onto the mesh (copy_to_mesh) on the way.
    plain = trained(None)
    plain_path = str(tmp_path / "plain.weights.h5")
    plain.save_weights(plain_path)
    with kt.model_parallel(RULES_A).scope():
        sharded = mlp(seed=9)
        sharded.optimizer.build(sharded.trainable_variables)

        copy_to_mesh = dtensor_api.copy_to_mesh

        def refuse(value, layout, *args):
            if len(value.shape) > 0:  # (the optimizer's scalar counters may be made now)
                raise AssertionError("a whole weight was copied to the mesh while loading")
            return copy_to_mesh(value, layout, *args)

        monkeypatch.setattr(dtensor_api, "copy_to_mesh", refuse)
        sharded.load_weights(plain_path)
        monkeypatch.undo()
    assert_same_weights(sharded, plain)
    kernel = sharded.get_layer("d1").kernel.value.read_value()
    assert [c.shape for c in dtensor.unpack(kernel)] == [(16, 8)] * 8


def test_tf_train_checkpoint_round_trips_sharded_weights(tmp_path):
    model = trained(kt.model_parallel(RULES_A))
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    with kt.model_parallel(RULES_B).scope():
        restored = mlp(seed=9)
    tf.train.Checkpoint(model=restored).restore(prefix).assert_existing_objects_matched()
    assert kt.layouts(restored)["d2/kernel"] == "[*,model] @ mesh(batch=2,model=4)"
    assert_same_weights(restored, model)
    plain = mlp(seed=9)
    tf.train.Checkpoint(model=plain).restore(prefix).assert_existing_objects_matched()
    assert_same_weights(plain, model)


def test_get_and_set_weights_gather_and_scatter():
    with kt.model_parallel(RULES_A).scope():
        model = mlp()
        weights = [w * 2 for w in model.get_weights()]
        model.set_weights(weights)
    for got, want in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)
    assert kt.layouts(model)["d1/kernel"] == "[*,model] @ mesh(batch=2,model=4)"
