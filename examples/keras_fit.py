"""A Keras model sharded with a LayoutMap on tf_dtensor: fit, evaluate, save and reload.

Unchanged Keras code under `keras.distribution.ModelParallel` on a ("batch", 2) x ("model", 4)
mesh of 8 virtual CPUs: the hidden layers' kernels are split over "model", each batch over
"batch". The model trains with `fit` (Keras' own progress bar and callbacks), is saved as a
`.keras` file, reloaded both sharded and as a plain Keras model, and both reloads predict
the same as the trained model.

    python examples/keras_fit.py [--epochs N] [--samples N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import tensorflow as tf


def _virtual_cpus(n: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


def build_model(keras):
    inputs = keras.Input((64,))
    h = keras.layers.Dense(256, activation="relu", name="hidden1")(inputs)
    h = keras.layers.Dense(256, activation="relu", name="hidden2")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--out", default=None, help="folder for model.keras (default: a temp dir)")
    args = parser.parse_args()

    _virtual_cpus(8)
    import keras
    import tf_dtensor  # noqa: F401  (puts keras.distribution on tf_dtensor)
    import tf_dtensor.keras

    # Data: 10 Gaussian blobs in 64 dimensions.
    rng = np.random.RandomState(0)
    centers = rng.randn(10, 64).astype("float32") * 2
    labels = rng.randint(0, 10, args.samples).astype("int32")
    x = centers[labels] + rng.randn(args.samples, 64).astype("float32")

    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["hidden1/kernel"] = (None, "model")   # column-parallel
    layout_map["hidden1/bias"] = ("model",)
    layout_map["hidden2/kernel"] = ("model", None)   # row-parallel: one all-reduce
    distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                    batch_dim_name="batch")
    keras.distribution.set_distribution(distribution)

    keras.utils.set_random_seed(1)
    model = build_model(keras)
    tf_dtensor.keras.explain(model)
    history = model.fit(x, labels, batch_size=64, epochs=args.epochs, validation_split=0.1,
                        verbose=2)
    loss, accuracy = model.evaluate(x, labels, batch_size=128, verbose=0)
    print(f"evaluate: loss {loss:.4f} accuracy {accuracy:.4f}")
    assert history.history["loss"][-1] < history.history["loss"][0]

    out = args.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.keras")
    model.save(path)
    want = model.predict(x[:100], batch_size=50, verbose=0)
    reloaded = keras.models.load_model(path)           # sharded again, by the LayoutMap
    kernel = reloaded.get_layer("hidden1").kernel.value
    print("reloaded hidden1/kernel:", kernel.layout.short())
    keras.distribution.set_distribution(None)
    plain = keras.models.load_model(path)              # plain Keras on one device
    for name, other in (("sharded", reloaded), ("plain", plain)):
        got = other.predict(x[:100], batch_size=50, verbose=0)
        print(f"{name} reload predicts the same: max |diff| {np.abs(got - want).max():.2e}")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    print("saved to", path)


if __name__ == "__main__":
    main()
