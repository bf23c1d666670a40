"""tf_dtensor.keras.layers: Keras layers with layout arguments (TF's Keras-2 DTensor style)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tf_dtensor
from tf_dtensor import dtensor
from tf_dtensor.keras import layers
from tf_dtensor.placements import Replicate, Shard

import keras_testing as kt

MESH = dtensor.create_mesh([("batch", 2), ("model", 4)], devices=[f"CPU:{i}" for i in range(8)])
RNG = np.random.RandomState(7)


def L(*specs):
    return dtensor.Layout(list(specs), MESH)


U = dtensor.UNSHARDED


def test_dense_layouts_as_layouts_and_placements_train_like_plain_keras():
    def build(sharded):
        keras.utils.set_random_seed(1)
        dense = layers.Dense if sharded else keras.layers.Dense
        extra1 = dict(kernel_layout=L(U, "model"), bias_layout=[Replicate(), Shard(0)],
                      mesh=MESH) if sharded else {}
        extra2 = dict(kernel_layout=L("model", U)) if sharded else {}
        model = keras.Sequential([keras.Input((8,)), dense(16, activation="relu", name="d1",
                                                           **extra1),
                                  dense(2, name="d2", **extra2)])
        model.compile(optimizer="adam", loss="mse")
        return model

    x, y = RNG.randn(32, 8).astype("float32"), RNG.randn(32, 2).astype("float32")
    steps = kt.batches(x, y, 8)
    got = kt.train_steps(lambda: build(True), None, steps)
    kt.assert_same_steps(got, kt.train_steps(lambda: build(False), None, steps))
    model = build(True)
    assert kt.layouts(model) == {
        "d1/kernel": "[*,model] @ mesh(batch=2,model=4)",
        "d1/bias": "[model] @ mesh(batch=2,model=4)",
        "d2/kernel": "[model,*] @ mesh(batch=2,model=4)",
        # No argument, no distribution: replicated on the layer's mesh.
        "d2/bias": "[*] @ mesh(batch=2,model=4)",
    }
    plans = {kt.short_path(p.path): p.rule for p in tf_dtensor.keras.explain(model, None)}
    assert plans["d1/kernel"] == "layer argument"


def test_every_layer_places_its_weights():
    keras.utils.set_random_seed(0)
    cases = [
        (layers.EinsumDense("ab,bc->ac", output_shape=16, bias_axes="c",
                            kernel_layout=L(U, "model"), bias_layout=L("model")),
         (4, 8), {"kernel": "[*,model]", "bias": "[model]"}),
        (layers.Embedding(20, 8, embeddings_layout=L(U, "model")), (4, 3),
         {"embeddings": "[*,model]"}),
        (layers.Conv2D(8, 3, kernel_layout=L(U, U, U, "model"), bias_layout=L("model")),
         (2, 6, 6, 3), {"kernel": "[*,*,*,model]", "bias": "[model]"}),
        (layers.LayerNormalization(gamma_layout=L("model"), beta_layout=L("model")), (4, 8),
         {"gamma": "[model]", "beta": "[model]"}),
        (layers.BatchNormalization(gamma_layout=L("model"), beta_layout=L("model"),
                                   moving_mean_layout=L("model"),
                                   moving_variance_layout=L("model")), (4, 8),
         {"gamma": "[model]", "beta": "[model]", "moving_mean": "[model]",
          "moving_variance": "[model]"}),
        (layers.MultiHeadAttention(num_heads=4, key_dim=2,
                                   query_kernel_layout=L(U, "model", U),
                                   key_kernel_layout=L(U, "model", U),
                                   value_kernel_layout=L(U, "model", U),
                                   output_kernel_layout=L("model", U, U),
                                   query_bias_layout=L("model", U)), (2, 5, 8),
         {"query/kernel": "[*,model,*]", "key/kernel": "[*,model,*]",
          "value/kernel": "[*,model,*]", "attention_output/kernel": "[model,*,*]",
          "query/bias": "[model,*]"}),
    ]
    for layer, shape, want in cases:
        inputs = (RNG.randint(0, 20, shape) if isinstance(layer, keras.layers.Embedding)
                  else RNG.randn(*shape).astype("float32"))
        inputs = dtensor.copy_to_mesh(inputs, dtensor.Layout.replicated(MESH, len(shape)))
        outputs = layer(inputs, inputs) if isinstance(layer, keras.layers.MultiHeadAttention) \
            else layer(inputs)
        assert dtensor.is_dtensor(outputs)
        got = {w.path.split("/", 1)[1]: w._value.layout.short().split(" @")[0]
               for w in layer.weights if w.path.split("/", 1)[1] in want}
        assert got == want, type(layer).__name__


def test_layout_arguments_serialize_and_reload(tmp_path):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)),
                              layers.Dense(16, name="d1", kernel_layout=L(U, "model")),
                              keras.layers.Dense(2, name="d2")])
    config = model.get_layer("d1").get_config()
    assert dtensor.Layout.from_string(config["kernel_layout"]) == L(U, "model")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("d1"), layers.Dense)
    assert kt.layouts(loaded)["d1/kernel"] == "[*,model] @ mesh(batch=2,model=4)"
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_plain_layers_beside_sharded_ones_join_the_mesh():
    # A plain Keras layer (no layout) in a model whose other weights are DVariables: its
    # weights, the optimizer's counters and the metrics move onto the mesh, replicated.
    def build(sharded):
        keras.utils.set_random_seed(2)
        first = layers.Dense(16, name="d1", kernel_layout=L(U, "model")) if sharded \
            else keras.layers.Dense(16, name="d1")
        model = keras.Sequential([keras.Input((8,)), first, keras.layers.Dense(2, name="d2")])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    x, y = RNG.randn(16, 8).astype("float32"), RNG.randn(16, 2).astype("float32")
    steps = kt.batches(x, y, 8)
    kt.assert_same_steps(kt.train_steps(lambda: build(True), None, steps),
                         kt.train_steps(lambda: build(False), None, steps))


@pytest.mark.parametrize("built", ["with_input", "by_first_step"])
def test_a_model_on_its_layers_mesh_trains_there_under_a_distribution_of_other_devices(built):
    # Layer arguments put d1 on a (2,2) mesh of cpu:0-3; fit under a DataParallel of
    # cpu:4-7 laid d2's weights and the batch out on that mesh, and the step failed
    # ("got inputs on different meshes"). The model keeps to its own mesh. Built by its
    # first step (no input shape, made under the distribution), it failed the same way in
    # that step, which laid d2's weights out by the DataParallel.
    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)],
                               devices=[f"CPU:{i}" for i in range(4)])

    def build(sharded):
        keras.utils.set_random_seed(2)
        first = layers.Dense(16, name="d1", kernel_layout=dtensor.Layout([U, "model"], mesh)) \
            if sharded else keras.layers.Dense(16, name="d1")
        inputs = [keras.Input((8,))] if built == "with_input" else []
        model = keras.Sequential(inputs + [first, keras.layers.Dense(2, name="d2")])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    x, y = RNG.randn(16, 8).astype("float32"), RNG.randn(16, 2).astype("float32")
    plain = build(False)
    want = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    model = build(True) if built == "with_input" else None
    with keras.distribution.DataParallel(devices=kt.DEVICES[4:]).scope():
        if model is None:
            model = build(True)
        got = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    for w, p in zip(model.weights, plain.weights):
        np.testing.assert_allclose(np.array(w), np.array(p), rtol=1e-5, atol=1e-6)
    assert kt.layouts(model) == {"d1/kernel": "[*,model] @ mesh(batch=2,model=2)",
                                 "d1/bias": "[*] @ mesh(batch=2,model=2)",
                                 "d2/kernel": "[*,*] @ mesh(batch=2,model=2)",
                                 "d2/bias": "[*] @ mesh(batch=2,model=2)"}


def test_placements_without_a_mesh_say_what_to_pass():
    layer = layers.Dense(4, kernel_layout=[Shard(1), Replicate()])
    with pytest.raises(ValueError, match="pass `mesh=`"):
        layer.build((2, 8))


def test_a_layout_argument_of_another_rank_names_the_variable_and_the_argument():
    """The message was "Layout [model] has rank 1 but the value has rank 2", naming neither
    the layer's variable nor the argument that gave the layout."""
    layer = layers.Dense(8, kernel_layout=L("model"))
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"Cannot lay out Keras variable `dense\w*/kernel` \(shape \(4, 8\)\) "
                             r"by its layer's layout argument: `kernel_layout`: Layout \[model\] "
                             r"@ mesh\(batch=2,model=4\) has rank 1 but the value has rank 2"):
        layer.build((2, 4))
