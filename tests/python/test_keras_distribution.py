"""keras.distribution on tf_dtensor: meshes, layouts, DataParallel and ModelParallel training,
checked step by step against the same Keras model on one device."""

from __future__ import annotations

import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
import tf_dtensor.keras
from tf_dtensor import dtensor
from tf_dtensor.keras import _backend, _hooks, _trainer

import keras_testing as kt

RNG = np.random.RandomState(0)
X = RNG.randn(64, 16).astype("float32")
Y_REG = RNG.randn(64, 4).astype("float32")
Y_CLS = RNG.randint(0, 4, (64,)).astype("int32")


def mlp(optimizer="adam", loss="mse", metrics=("mae",), width=32, seed=1):
    def build():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((16,)),
                                  keras.layers.Dense(width, activation="relu", name="d1"),
                                  keras.layers.Dense(4, name="d2")])
        model.compile(optimizer=optimizer, loss=loss, metrics=list(metrics))
        return model
    return build


MLP_RULES = {".*d1/kernel": (None, "model"), ".*d1/bias": ("model",),
             ".*d2/kernel": ("model", None)}


def test_import_installs_the_backend_library():
    from keras.src.backend.tensorflow import distribution_lib
    assert _hooks.installed()
    for name in _backend.BACKEND_FUNCTIONS:
        assert getattr(distribution_lib, name) is getattr(_backend, name)


def test_list_devices_mesh_and_layout_convert():
    assert keras.distribution.list_devices("cpu") == kt.DEVICES
    assert keras.distribution.get_device_count("cpu") == 8
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], kt.DEVICES)
    backend_mesh = mesh.backend_mesh
    assert isinstance(backend_mesh, dtensor.Mesh)
    assert backend_mesh.dim_names == ["batch", "model"]
    assert backend_mesh.shape() == [2, 4]
    layout = keras.distribution.TensorLayout([None, "model"], mesh).backend_layout
    assert layout == dtensor.Layout([dtensor.UNSHARDED, "model"], backend_mesh)


def test_distribute_tensor_eagerly_and_in_function():
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], kt.DEVICES)
    layout = keras.distribution.TensorLayout(["batch", "model"], mesh)
    value = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    sharded = keras.distribution.distribute_tensor(value, layout)
    assert kt.fetch_layout_short(sharded) == "[batch,model] @ mesh(batch=2,model=4)"
    np.testing.assert_array_equal(np.array(tf_dtensor.keras._backend.to_numpy(sharded)), value)
    # Already laid out: returned as is.
    assert keras.distribution.distribute_tensor(sharded, layout) is sharded

    @tf.function
    def double_then_replicate(t):
        return keras.distribution.distribute_tensor(
            t * 2, keras.distribution.TensorLayout([None, None], mesh))

    out = double_then_replicate(sharded)
    assert kt.fetch_layout_short(out) == "[*,*] @ mesh(batch=2,model=4)"
    np.testing.assert_array_equal(out.numpy(), value * 2)


def test_data_parallel_mlp_matches_one_device_at_every_step():
    steps = kt.batches(X, Y_REG, 16)
    want = kt.train_steps(mlp(), None, steps)
    got = kt.train_steps(mlp(), kt.data_parallel(), steps)
    kt.assert_same_steps(got, want)


def test_model_parallel_mlp_matches_one_device_at_every_step():
    steps = kt.batches(X, Y_REG, 16)
    want = kt.train_steps(mlp(), None, steps)
    distribution = kt.model_parallel(MLP_RULES)
    got = kt.train_steps(mlp(), distribution, steps)
    kt.assert_same_steps(got, want)


def test_a_batch_dim_name_that_is_not_a_mesh_axis_is_refused_at_the_first_step():
    """A Sequential given no input shape is built in its first step, which ran before any
    batch was laid out by the distribution: a fit of one step took `batch_dim_name="nope"`
    silently (Keras' own check came at the second step; on JAX, Keras refuses it at the
    first batch with a ValueError)."""
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], kt.DEVICES)
    distribution = keras.distribution.ModelParallel(
        layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="nope")
    with distribution.scope():
        model = keras.Sequential([keras.layers.Dense(8)])
        model.compile(loss="mse")
        with pytest.raises(ValueError, match=r"ModelParallel\(batch_dim_name='nope'\): the "
                                             r"batch dimension must be an axis of its "
                                             r"DeviceMesh, whose axes are \['batch', 'model'\]"):
            model.fit(np.ones([8, 4], np.float32), np.ones([8, 8], np.float32), epochs=1,
                      verbose=0)


class InputLayoutProbe(keras.layers.Layer):
    """Passes its input on; run eagerly, records the input's layout (None: not a DTensor)."""

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self._record = record

    def call(self, x):
        if tf.executing_eagerly():
            self._record(kt.fetch_layout_short(x))
        return x


class SubclassedMLP(keras.Model):
    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self.probe = InputLayoutProbe(record)
        self.d1 = keras.layers.Dense(32, activation="relu", name="d1")
        self.d2 = keras.layers.Dense(4, name="d2")

    def call(self, x):
        return self.d2(self.d1(self.probe(x)))


def lazy_mlp(kind: str, record=lambda layout: None, run_eagerly=False, seed=1):
    """The MLP given no input shape: its variables are made by its first step."""
    def build():
        keras.utils.set_random_seed(seed)
        if kind == "sequential":
            model = keras.Sequential([InputLayoutProbe(record),
                                      keras.layers.Dense(32, activation="relu", name="d1"),
                                      keras.layers.Dense(4, name="d2")])
        else:
            model = SubclassedMLP(record)
        model.compile(optimizer="adam", loss="mse", metrics=["mae"], run_eagerly=run_eagerly)
        return model
    return build


def _distribution(kind: str):
    return kt.data_parallel() if kind == "data" else kt.model_parallel(MLP_RULES)


BATCH_LAYOUTS = {"data": "[batch,*] @ mesh(batch=8)",
                 "model": "[batch,*] @ mesh(batch=2,model=4)"}


@pytest.mark.parametrize("model_kind", ["sequential", "subclassed"])
@pytest.mark.parametrize("kind", ["data", "model"])
def test_a_model_built_by_its_first_step_gets_that_batch_sharded_as_later_ones(kind, model_kind):
    """A model given no input shape makes its variables in its first step. That step's
    batch reached the model as one regular tensor (every device computed the whole batch,
    with the right values): the hooks laid batches out on the mesh of the model's variables,
    and it had none yet. Run eagerly, the model sees each batch's layout."""
    seen = []
    steps = kt.batches(X[:48], Y_REG[:48], 16)
    want = kt.train_steps(lazy_mlp(model_kind), None, steps)
    got = kt.train_steps(lazy_mlp(model_kind, seen.append, run_eagerly=True),
                         _distribution(kind), steps)
    kt.assert_same_steps(got, want)
    assert seen == [BATCH_LAYOUTS[kind]] * 3


@pytest.mark.parametrize("model_kind", ["sequential", "subclassed"])
@pytest.mark.parametrize("kind", ["data", "model"])
def test_a_model_built_by_its_first_fit_step_is_data_parallel_from_that_step(kind, model_kind):
    """The same through `fit`'s compiled step: its first step issues the batch-dimension
    all-reduces of the gradients that later steps issue (it issued none: the batch was
    replicated), and fit trains as on one device."""
    plain = lazy_mlp(model_kind)()
    want = plain.fit(X[:48], Y_REG[:48], batch_size=16, shuffle=False, verbose=0).history
    per_step = []

    class Count(keras.callbacks.Callback):
        """A ledger around each step (a ledger is filled when its block ends)."""

        def on_train_batch_begin(self, batch, logs=None):
            self.block = tf_dtensor.debug.collectives()
            self.ledger = self.block.__enter__()

        def on_train_batch_end(self, batch, logs=None):
            self.block.__exit__(None, None, None)
            per_step.append(self.ledger.count(mesh_dim="batch"))

    with _distribution(kind).scope():
        model = lazy_mlp(model_kind)()
        got = model.fit(X[:48], Y_REG[:48], batch_size=16, shuffle=False, verbose=0,
                        callbacks=[Count()]).history
    _assert_same_training(got, want, model, plain)
    assert per_step[0] > 0 and per_step == [per_step[0]] * 3
    layouts = {"/".join(v.path.split("/")[-2:]): v._value.layout.short()
               for v in model.weights}
    assert layouts == (MLP_LAYOUTS if kind == "model" else {
        path: "[*,*] @ mesh(batch=8)" if path.endswith("kernel") else "[*] @ mesh(batch=8)"
        for path in MLP_LAYOUTS})


@pytest.mark.parametrize("kind", ["data", "model"])
def test_evaluate_and_predict_as_a_models_first_step_match_one_device(kind):
    """`evaluate` and `predict` of a model they build, and after `fit`, under either
    distribution: the same values as one-device Keras, every batch laid out batch-sharded."""
    seen = []
    x, y = X[:40], Y_REG[:40]
    plain = lazy_mlp("subclassed")()
    want_predicted = plain.predict(x, batch_size=16, verbose=0)
    want_loss = plain.evaluate(x, y, batch_size=16, verbose=0)
    with _distribution(kind).scope():
        predicting = lazy_mlp("subclassed", seen.append, run_eagerly=True)()
        np.testing.assert_allclose(predicting.predict(x, batch_size=16, verbose=0),
                                   want_predicted, rtol=1e-5, atol=1e-6)
        evaluating = lazy_mlp("subclassed")()
        np.testing.assert_allclose(evaluating.evaluate(x, y, batch_size=16, verbose=0),
                                   want_loss, rtol=1e-5)
    # 40 rows in batches of 16: the last one (8 rows) is laid out as the others.
    assert seen == [BATCH_LAYOUTS[kind]] * 3
    plain.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    with _distribution(kind).scope():
        evaluating.fit(x, y, batch_size=16, shuffle=False, verbose=0)
        np.testing.assert_allclose(evaluating.evaluate(x, y, batch_size=16, verbose=0),
                                   plain.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-5)
        np.testing.assert_allclose(evaluating.predict(x, batch_size=16, verbose=0),
                                   plain.predict(x, batch_size=16, verbose=0),
                                   rtol=1e-5, atol=1e-6)


OPTIMIZERS = {
    "SGD-momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    "Adam": lambda: keras.optimizers.Adam(0.01), "AdamW": lambda: keras.optimizers.AdamW(0.01),
    "Adamax": lambda: keras.optimizers.Adamax(0.01), "Nadam": lambda: keras.optimizers.Nadam(0.01),
    "RMSprop": lambda: keras.optimizers.RMSprop(0.01),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0), "Ftrl": lambda: keras.optimizers.Ftrl(0.1),
    "Lion": lambda: keras.optimizers.Lion(0.001),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.01),
}


def embedding_model(optimizer):
    def build():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(10, 3, name="e"),
                                  keras.layers.Flatten(), keras.layers.Dense(1, name="d")])
        model.compile(optimizer=optimizer(), loss="mse")
        return model
    return build


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_keras_optimizer_trains_as_on_one_device(name):
    # Nadam and Adafactor build in the first train step, from plain numbers: their
    # variables' values came in as the traced graph's constants and failed to lay out.
    optimizer = OPTIMIZERS[name]
    steps = kt.batches(X, Y_REG, 16)
    kt.assert_same_steps(kt.train_steps(mlp(optimizer=optimizer(), metrics=()),
                                        kt.data_parallel(), steps),
                         kt.train_steps(mlp(optimizer=optimizer(), metrics=()), None, steps),
                         rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_keras_optimizer_takes_an_embeddings_sparse_gradient(name):
    # RMSprop, Adagrad and Adadelta make an Embedding's sparse gradient dense in a cond
    # branch with a ScatterNd whose shape is the variable's (VariableShape, passed into the
    # branch) and a Fill of data-dependent size; the ScatterNd of bools sums as a logical or;
    # Adadelta's segment sum takes ids of data-dependent length beside sharded rows.
    optimizer = OPTIMIZERS[name]
    ids = (np.arange(64).reshape(16, 4) * 7) % 10
    targets = np.linspace(-1, 1, 16, dtype="float32").reshape(16, 1)
    steps = kt.batches(ids.astype("int32"), targets, 8)
    kt.assert_same_steps(kt.train_steps(embedding_model(optimizer), kt.data_parallel(), steps),
                         kt.train_steps(embedding_model(optimizer), None, steps),
                         rtol=2e-5, atol=2e-6)


def test_adam_on_a_row_sharded_embedding_reduces_only_each_device_s_rows():
    """Adam makes an Embedding's sparse gradient dense ([*,*] +partial(batch:sum) from a
    batch-sharded step); the table is sharded [model,*] on mesh(batch=2, model=4). Each
    dense gradient is sliced to the device's rows before its all-reduce over batch, which
    then moves a quarter of the table (it moved all of it before 2026-11-30)."""
    rules = {".*e/embeddings": ("model", None)}
    ids = ((np.arange(64).reshape(16, 4) * 7) % 40).astype("int32")
    targets = np.linspace(-1, 1, 16, dtype="float32").reshape(16, 1)

    def build():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(40, 8, name="e"),
                                  keras.layers.Flatten(), keras.layers.Dense(1, name="d")])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        return model

    steps = kt.batches(ids, targets, 8)
    kt.assert_same_steps(kt.train_steps(build, kt.model_parallel(rules), steps),
                         kt.train_steps(build, None, steps), rtol=2e-5, atol=2e-6)
    with kt.model_parallel(rules).scope():
        model = build()
        model.train_on_batch(ids[:8], targets[:8])
        with tf_dtensor.debug.collectives() as ledger:
            model.train_on_batch(ids[8:], targets[8:])
    table = [r for r in ledger if r.shape == (40, 8)]
    assert table and all(r.kind == "all-reduce" and r.mesh_dims == ("batch",) and
                         r.layout_in == "[model,*] +partial(batch:sum)" for r in table), \
        ledger.table()
    # A [10,8] float32 block per device, all-reduced over 2: 2*(2-1)/2 of 320 bytes.
    assert all(r.bytes_per_device == 10 * 8 * 4 for r in table), ledger.table()


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "SimpleRNN"])
def test_recurrent_layers_train_as_on_one_device(layer):
    # Their while loop's gradient sizes its zeros with VariableShape of the weights' handles
    # (refused as a shape not known before the run, so RNNs could not train sharded).
    def build():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((5, 3)), getattr(keras.layers, layer)(4, name="r"),
                                  keras.layers.Dense(1, name="d")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model
    rng = np.random.RandomState(5)
    x = rng.randn(16, 5, 3).astype("float32")
    y = rng.randn(16, 1).astype("float32")
    steps = kt.batches(x, y, 8)
    kt.assert_same_steps(kt.train_steps(build, kt.data_parallel(), steps),
                         kt.train_steps(build, None, steps), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_recurrent_layers_fit_with_a_partial_last_batch(layer):
    # The last batch (4 of 20 rows) retraces the step with an unknown batch size: TF's
    # gradient of the loop then pops the shapes it pushed each iteration from a list, which
    # were refused as reduction axes known only at run time.
    def fit(distribution):
        with kt.scope(distribution):
            keras.utils.set_random_seed(4)
            model = keras.Sequential([keras.Input((5, 3)), getattr(keras.layers, layer)(4),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            rng = np.random.RandomState(5)
            history = model.fit(rng.randn(20, 5, 3).astype("float32"),
                                rng.randn(20, 1).astype("float32"), batch_size=8, epochs=2,
                                shuffle=False, verbose=0).history
            return history["loss"], [_backend.to_numpy(w) for w in model.weights]
    got_loss, got_weights = fit(kt.data_parallel())
    want_loss, want_weights = fit(None)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for got, want in zip(got_weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["string", "integer"])
def test_lookup_layers_inside_a_model_fit_as_on_one_device(kind):
    # TF infers no shape for their table's lookup inside the step; it is the keys' shape.
    if kind == "string":
        x = tf.constant(np.array(list("abcdabcdabcdabce"))[:, None])
        lookup, dtype = keras.layers.StringLookup(), "string"
    else:
        x = tf.constant(np.random.RandomState(0).randint(0, 5, (16, 1)))
        lookup, dtype = keras.layers.IntegerLookup(), "int64"
    lookup.adapt(x)
    y = np.random.RandomState(1).randn(16, 1).astype("float32")

    def fit(distribution):
        with kt.scope(distribution):
            keras.utils.set_random_seed(0)
            inputs = keras.Input((1,), dtype=dtype)
            hidden = keras.layers.Flatten()(keras.layers.Embedding(30, 4)(lookup(inputs)))
            model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
            model.compile("sgd", "mse")
            loss = model.fit(x, y, batch_size=8, epochs=1, verbose=0).history["loss"]
            return loss, model.predict(x, batch_size=8, verbose=0)
    got_loss, got = fit(kt.data_parallel())
    want_loss, want = fit(None)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_convert_to_numpy_of_a_sharded_value_gathers_it():
    # As Keras' JAX backend does; it raised (a sharded DTensor is not copied to the host).
    distribution = kt.data_parallel()
    with distribution.scope():
        value = X[:8]
        sharded = keras.distribution.distribute_tensor(
            tf.constant(value), distribution.get_data_layout(value.shape))
        assert kt.fetch_layout_short(sharded).startswith("[batch,*]")
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(sharded), value)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(sharded * 2.0), value * 2)


def test_adam_with_compiled_metrics_does_not_drift():
    # A prototype drifted by ~0.02 after four Adam steps with a compiled metric.
    build = mlp(loss="sparse_categorical_crossentropy", metrics=("accuracy", "sparse_top_k_categorical_accuracy"))
    steps = kt.batches(X, Y_CLS, 8)
    want = kt.train_steps(build, None, steps)
    got = kt.train_steps(build, kt.model_parallel(MLP_RULES), steps)
    kt.assert_same_steps(got, want)


def test_variables_and_optimizer_slots_get_their_layouts():
    with kt.model_parallel(MLP_RULES).scope():
        model = mlp()()
        model.train_on_batch(X[:16], Y_REG[:16])
    mesh = "mesh(batch=2,model=4)"
    assert kt.layouts(model) == {
        "d1/kernel": f"[*,model] @ {mesh}", "d1/bias": f"[model] @ {mesh}",
        "d2/kernel": f"[model,*] @ {mesh}", "d2/bias": f"[*] @ {mesh}"}
    slots = {v.path: v._value.layout.short() for v in model.optimizer.variables
             if "d1_kernel" in v.path}
    assert set(slots.values()) == {f"[*,model] @ {mesh}"} and len(slots) == 2
    # Metrics, the iteration counter and the loss tracker live on the mesh too.
    for variable in model.optimizer.variables + model.metrics_variables:
        assert _hooks.is_distributed(variable), variable.path
    # The components are blocks, not copies: d1's kernel is 16x8 on each device.
    (component, *_) = dtensor.unpack(model.get_layer("d1").kernel.value.read_value())
    assert component.shape == (16, 8)


MLP_LAYOUTS = {"d1/kernel": "[*,model] @ mesh(batch=2,model=4)",
               "d1/bias": "[model] @ mesh(batch=2,model=4)",
               "d2/kernel": "[model,*] @ mesh(batch=2,model=4)",
               "d2/bias": "[*] @ mesh(batch=2,model=4)"}


def _slot_layouts(model) -> dict:
    """Optimizer slot path -> (its layout, its weight's layout), short forms."""
    weights = {v.path.replace("/", "_"): v for v in model.trainable_weights}
    pairs = {}
    for slot in model.optimizer.variables:
        for prefix, weight in weights.items():
            if slot.name.startswith(prefix + "_"):
                pairs[slot.path] = (slot._value.layout.short(), weight._value.layout.short())
    return pairs


@pytest.mark.parametrize("kind", ["data", "model"])
def test_model_built_before_set_distribution_is_laid_out_at_its_first_fit(kind):
    # Built (and compiled) before the distribution was set, the model kept its plain
    # variables: fit trained it on one device beside the optimizer's replicated slots, and
    # a LayoutMap key that also matched a slot failed on the slot's rank. Its variables are
    # now laid out at the first step as if made under the distribution.
    plain = mlp()()
    want = plain.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                     verbose=0).history
    distribution = kt.data_parallel() if kind == "data" else kt.model_parallel(MLP_RULES)
    model = mlp()()
    with distribution.scope():
        got = model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                        verbose=0).history
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
        for w, p in zip(model.weights, plain.weights):
            np.testing.assert_allclose(np.array(w), np.array(p), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model.predict(X[:8], verbose=0),
                                   plain.predict(X[:8], verbose=0), rtol=1e-5, atol=1e-6)
    if kind == "model":
        assert kt.layouts(model) == MLP_LAYOUTS
    else:
        assert set(kt.layouts(model).values()) == {"[*,*] @ mesh(batch=8)",
                                                   "[*] @ mesh(batch=8)"}
    slots = _slot_layouts(model)
    assert len(slots) == 8 and all(slot == weight for slot, weight in slots.values())
    for variable in _trainer._state_variables(model):
        assert _hooks.is_distributed(variable), variable.path


def _assert_same_training(got, want, model, plain):
    """fit's histories agree, and so do the weights and optimizer variables after it."""
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    for w, p in zip(model.weights + model.optimizer.variables,
                    plain.weights + plain.optimizer.variables):
        np.testing.assert_allclose(np.array(w), np.array(p), rtol=1e-5, atol=1e-6,
                                   err_msg=w.path)


def test_model_trained_on_one_device_continues_on_the_distribution_as_on_one_device():
    # The optimizer was built (slots made, weights keyed) before the distribution was set:
    # its slots move into their weights' layouts and it still finds every weight.
    plain, model = mlp()(), mlp()()
    for m in (plain, model):
        m.fit(X[:32], Y_REG[:32], batch_size=16, epochs=1, shuffle=False, verbose=0)
    want = plain.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                     verbose=0).history
    with kt.model_parallel(MLP_RULES).scope():
        got = model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                        verbose=0).history
    _assert_same_training(got, want, model, plain)
    assert kt.layouts(model) == MLP_LAYOUTS
    slots = _slot_layouts(model)
    assert len(slots) == 8 and all(slot == weight for slot, weight in slots.values())


MOVES = {
    "data(cpu:0-3)->data(cpu:4-7)": (
        lambda: keras.distribution.DataParallel(devices=kt.DEVICES[:4]),
        lambda: keras.distribution.DataParallel(devices=kt.DEVICES[4:]),
        "[*,*] @ mesh(batch=4)"),
    "data->model": (kt.data_parallel, lambda: kt.model_parallel(MLP_RULES),
                    "[*,model] @ mesh(batch=2,model=4)"),
    "model(2,4)->model(4,2)": (lambda: kt.model_parallel(MLP_RULES),
                               lambda: kt.model_parallel(MLP_RULES, shape=(4, 2)),
                               "[*,model] @ mesh(batch=4,model=2)")}


@pytest.mark.parametrize("move", list(MOVES))
def test_model_laid_out_by_one_distribution_moves_to_another_at_its_first_fit(move):
    # Made and trained under one distribution, then fit under another (another mesh): the
    # batch went to the new mesh and the weights stayed on the old one, and the step
    # failed ("'MatMul' got inputs on different meshes"). The model now moves to the new
    # distribution's layouts, optimizer state and all, and trains on as on one device.
    first, second, d1_kernel = MOVES[move]
    plain = mlp()()
    plain.fit(X[:32], Y_REG[:32], batch_size=16, epochs=1, shuffle=False, verbose=0)
    want = plain.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                     verbose=0).history
    with first().scope():
        model = mlp()()
        model.fit(X[:32], Y_REG[:32], batch_size=16, epochs=1, shuffle=False, verbose=0)
    distribution = second()
    with distribution.scope():
        got = model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                        verbose=0).history
    _assert_same_training(got, want, model, plain)
    assert kt.layouts(model)["d1/kernel"] == d1_kernel, kt.layouts(model)
    mesh = distribution.device_mesh.backend_mesh
    for variable in _trainer._state_variables(model):
        assert variable._value.layout.mesh == mesh, variable.path
    slots = _slot_layouts(model)
    assert len(slots) == 8 and all(slot == weight for slot, weight in slots.values())


def test_layout_map_rank_mismatch_names_the_variable_its_shape_layout_and_fix():
    distribution = kt.model_parallel({".*d1/.*": (None, "model")})  # also matches d1/bias
    with distribution.scope(), pytest.raises(tf_dtensor.LayoutError) as caught:
        mlp()()
    message = str(caught.value)
    for part in ("Keras variable `sequential", "d1/bias` (shape (32,), rank 1)",
                 "[*,model] @ mesh(batch=2,model=4)", "LayoutMap['.*d1/.*']",
                 "rank 2", "Give that key a layout of rank 1", "(None,)",
                 "narrow its regex", "tf_dtensor.keras.explain(model)"):
        assert part in message, (part, message)


def test_layout_map_key_matching_a_layer_output_of_another_rank_names_the_output_and_key():
    # A key whose regex also matches `{layer path}/output`: Keras lays the layer's output
    # out by it, and the rank-3 output cannot take the kernel's rank-2 layout. The error
    # was a bare "Layout [*,model] ... has rank 2 but the value has rank 3"; it now names
    # the output, the key and the fix, and keeps its class through Keras' rebuilding of
    # errors raised in a layer's call (TensorFlow's OpError signature).
    with kt.model_parallel({".*d1.*": (None, "model")}).scope():
        model = keras.Sequential([keras.Input((5, 12)),
                                  keras.layers.Dense(16, name="d1", use_bias=False)])
        with pytest.raises(tf_dtensor.LayoutError) as caught:
            model(np.ones((8, 5, 12), np.float32))
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    for part in ("output of Keras layer `sequential", "d1` (rank 3)",
                 "[*,model] @ mesh(batch=2,model=4)", "LayoutMap['.*d1.*'] matches",
                 "d1/output` and gives a layout of rank 2", "(None, None, None)",
                 "narrow the regex"):
        assert part in message, (part, message)


def test_error_classes_rebuilt_as_tensorflow_rebuilds_op_errors_keep_class_and_message():
    # Keras rebuilds an OpError raised in a layer's call as cls(node_def, op, message,
    # error_code); tf_dtensor's classes take that form as well as their own (message).
    for cls in (tf_dtensor.LayoutError, tf_dtensor.MeshError):
        rebuilt = cls(None, None, "new message", tf.errors.UNKNOWN)
        assert type(rebuilt) is cls and rebuilt.message == "new message"
        assert rebuilt.error_code == tf.errors.INVALID_ARGUMENT
        assert str(cls("own form")) == "own form"


def test_fit_evaluate_predict_with_callbacks_and_uneven_batches(capsys):
    # 60 samples in batches of 16: the last batch has 12 rows, which 8 devices do not divide.
    x, y = X[:60], Y_REG[:60]
    plain = mlp()()
    plain_history = plain.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    stopped = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            stopped.append((epoch, logs["loss"]))

    with kt.data_parallel().scope():
        model = mlp()()
        history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=1,
                            callbacks=[Record(), keras.callbacks.TerminateOnNaN()])
        out = capsys.readouterr().out
        assert "Epoch 3/3" in out and "4/4" in out  # Keras' own progress bar
        np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"],
                                   rtol=1e-5)
        assert [e for e, _ in stopped] == [0, 1, 2]
        np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0),
                                   plain.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-5)
        predicted = model.predict(x[:13], batch_size=5, verbose=0)
        assert isinstance(predicted, np.ndarray) and predicted.shape == (13, 4)
        np.testing.assert_allclose(predicted, plain.predict(x[:13], batch_size=5, verbose=0),
                                   rtol=1e-5, atol=1e-6)


def test_an_adopted_model_is_not_searched_for_plain_variables_at_every_step(monkeypatch):
    # Each step looked up the device of every variable of the model, its optimizer and its
    # metrics to find those still off the mesh (about 5 us each). Once the model is
    # adopted, a step looks again only after a Keras variable was made since, or the model
    # reaches another number of variables.
    model = mlp()()
    with kt.data_parallel().scope():
        model.fit(X[:32], Y_REG[:32], batch_size=16, epochs=1, verbose=0)
        searched = []
        search = _trainer._adopt_unchecked
        monkeypatch.setattr(_trainer, "_adopt_unchecked",
                            lambda *args: searched.append(1) or search(*args))
        model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=1, verbose=0)
        assert searched == []
        keras.Variable(np.zeros(3, np.float32))
        model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=1, verbose=0)
        assert searched == [1]
    for variable in _trainer._state_variables(model):
        assert _hooks.is_distributed(variable), variable.path


def two_output_model(steps_per_execution=1):
    keras.utils.set_random_seed(5)
    a, b = keras.Input((16,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Concatenate()([keras.layers.Dense(8, name="da")(a), b])
    model = keras.Model({"a": a, "b": b},
                        {"o1": keras.layers.Dense(4, name="o1")(hidden),
                         "o2": keras.layers.Dense(4, activation="softmax", name="o2")(hidden)})
    model.compile("adam", loss={"o1": "mse", "o2": "sparse_categorical_crossentropy"},
                  loss_weights={"o1": 1.0, "o2": 0.5}, metrics={"o2": ["accuracy"]},
                  steps_per_execution=steps_per_execution)
    return model


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_per_output_losses_of_fit_and_evaluate_with_a_partial_batch_match_one_device(
        steps_per_execution):
    # Keras weighs each output's loss metric by the static batch size `y_pred.shape[0]`,
    # `None` on one device, where the step is traced for the data iterator's element spec:
    # every batch counts once. Traced for the DTensor batches (sizes known) the full batches
    # counted per row and the partial one once: o1_loss differed (2.45 against 1.95).
    x = {"a": X[:44], "b": RNG.randn(44, 3).astype("float32")}
    y = {"o1": Y_REG[:44], "o2": Y_CLS[:44]}

    def run(distribution):
        with kt.scope(distribution):
            model = two_output_model(steps_per_execution)
            history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                                validation_data=(x, y)).history
            evaluated = model.evaluate(x, y, batch_size=6, verbose=0, return_dict=True)
            return history, evaluated, [_backend.to_numpy(w) for w in model.weights]

    got_history, got_evaluated, got_weights = run(kt.data_parallel())
    want_history, want_evaluated, want_weights = run(None)
    assert {"o1_loss", "o2_loss", "val_o1_loss"} <= set(want_history)
    assert got_history.keys() == want_history.keys()
    for key in want_history:
        np.testing.assert_allclose(got_history[key], want_history[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    assert got_evaluated.keys() == want_evaluated.keys()
    for key in want_evaluated:
        np.testing.assert_allclose(got_evaluated[key], want_evaluated[key], rtol=1e-5,
                                   err_msg=key)
    for got, want in zip(got_weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_batch_norm_of_a_sharded_activation_in_a_subclassed_model_fits_as_on_one_device(
        shape):
    # Keras' step runs for a batch of unknown size, so the gradient of the batch mean
    # broadcasts to `tf.shape(x)`, a value known only at run time: with the activation
    # sharded over `model`, BroadcastTo was refused ("needs its shape (input 1) as a
    # constant integer tensor"), and such a model could not fit.
    class Subclassed(keras.Model):  # built by its first call, inside the traced step
        def __init__(self):
            super().__init__()
            self.d1 = keras.layers.Dense(32, activation="relu", name="d1")
            self.bn = keras.layers.BatchNormalization(name="bn")
            self.d2 = keras.layers.Dense(4, name="d2")

        def call(self, x, training=False):
            return self.d2(self.bn(self.d1(x), training=training))

    def build():
        keras.utils.set_random_seed(1)
        model = Subclassed()
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    rules = dict(MLP_RULES, **{".*bn/(gamma|beta|moving_mean|moving_variance)": ("model",)})

    def run(distribution):
        with kt.scope(distribution):
            model = build()
            history = model.fit(X[:44], Y_CLS[:44], batch_size=8, epochs=2, shuffle=False,
                                verbose=0).history
            evaluated = model.evaluate(X[:44], Y_CLS[:44], batch_size=6, verbose=0)
            return history, evaluated, [_backend.to_numpy(w) for w in model.weights]

    got_history, got_evaluated, got_weights = run(kt.model_parallel(rules, shape))
    want_history, want_evaluated, want_weights = run(None)
    for key in want_history:
        np.testing.assert_allclose(got_history[key], want_history[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(got_evaluated, want_evaluated, rtol=1e-5)
    for got, want in zip(got_weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_metric_object_made_before_the_distribution_counts_every_batch():
    # Its variables are plain until the first traced step builds the compiled metrics and
    # the next step moves them onto the mesh; the step traced with the plain ones must be
    # traced again, or its updates miss the variables reset_state and result() use.
    def fit(metric, epochs=2):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[metric])
        return model, model.fit(X[:48], Y_CLS[:48], batch_size=8, epochs=epochs,
                                shuffle=False, verbose=0).history
    name = "sparse_top_k_categorical_accuracy"
    plain, want = fit(keras.metrics.SparseTopKCategoricalAccuracy(k=2))
    metric = keras.metrics.SparseTopKCategoricalAccuracy(k=2)  # before the distribution
    with kt.data_parallel().scope():
        model, got = fit(metric)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
        np.testing.assert_allclose(model.evaluate(X[:48], Y_CLS[:48], verbose=0),
                                   plain.evaluate(X[:48], Y_CLS[:48], verbose=0), rtol=1e-5)


def test_fit_on_a_tf_data_dataset_with_steps_per_execution():
    dataset = tf.data.Dataset.from_tensor_slices((X, Y_REG)).batch(16)
    plain = mlp()()
    plain.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    want = plain.fit(dataset, epochs=2, verbose=0).history["loss"]
    with kt.model_parallel(MLP_RULES).scope():
        model = mlp()()
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
        got = model.fit(dataset, epochs=2, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["data", "model"])
def test_dropout_draws_the_same_masks_as_one_device(kind):
    # The seed generator's state is a variable on the mesh; stateless random ops draw the
    # global mask, so each device's block of it is the one-device mask's block.
    def build():
        keras.utils.set_random_seed(6)
        model = keras.Sequential([keras.Input((16,)),
                                  keras.layers.Dense(32, activation="relu", name="d1"),
                                  keras.layers.Dropout(0.5, seed=3),
                                  keras.layers.Dense(4, name="d2")])
        model.compile(optimizer="sgd", loss="mse")
        return model

    distribution = kt.data_parallel() if kind == "data" else kt.model_parallel(MLP_RULES)
    steps = kt.batches(X[:48], Y_REG[:48], 16)
    kt.assert_same_steps(kt.train_steps(build, distribution, steps),
                         kt.train_steps(build, None, steps))


def test_custom_training_loop_with_gradient_tape():
    distribution = kt.model_parallel(MLP_RULES)
    with distribution.scope():
        model = mlp()()
        optimizer = keras.optimizers.Adam()
    plain = mlp()()
    plain_optimizer = keras.optimizers.Adam()

    def make_step(model, optimizer):
        return tf.function(kt.custom_step(model, optimizer))

    sharded_step, plain_step = make_step(model, optimizer), make_step(plain, plain_optimizer)

    for x, y in kt.batches(X, Y_REG, 16):
        data_layout = distribution.get_data_layout(x.shape)
        sharded_x = keras.distribution.distribute_tensor(x, data_layout)
        sharded_y = keras.distribution.distribute_tensor(
            y, distribution.get_data_layout(y.shape))
        with distribution.scope():
            loss = sharded_step(sharded_x, sharded_y)
        want = plain_step(tf.constant(x), tf.constant(y))
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("kind", ["data", "model"])
def test_a_model_built_in_a_custom_loops_first_step_is_data_parallel_from_that_step(kind):
    """A custom loop lays its batches out itself: a model its traced step builds makes its
    variables on the mesh in that step, which reduces the gradients over `batch` as later
    steps do, and trains as on one device."""
    distribution = _distribution(kind)
    with distribution.scope():
        model, optimizer = lazy_mlp("subclassed")(), keras.optimizers.Adam()
    plain, plain_optimizer = lazy_mlp("subclassed")(), keras.optimizers.Adam()
    sharded_step = tf.function(kt.custom_step(model, optimizer))
    plain_step = tf.function(kt.custom_step(plain, plain_optimizer))
    per_step = []
    for x, y in kt.batches(X[:48], Y_REG[:48], 16):
        x_sharded, y_sharded = (keras.distribution.distribute_tensor(
            v, distribution.get_data_layout(v.shape)) for v in (x, y))
        with distribution.scope(), tf_dtensor.debug.collectives() as ledger:
            loss = sharded_step(x_sharded, y_sharded)
        per_step.append(ledger.count(mesh_dim="batch"))
        np.testing.assert_allclose(float(loss), float(plain_step(x, y)), rtol=1e-5)
    assert per_step[0] > 0 and per_step == [per_step[0]] * 3
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

def cnn():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(4, name="head")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.mark.parametrize("kind", ["data", "model"])
def test_cnn_with_batch_norm_matches_one_device(kind):
    images = RNG.randn(32, 8, 8, 3).astype("float32")
    labels = RNG.randint(0, 4, (32,)).astype("int32")
    distribution = kt.data_parallel() if kind == "data" else kt.model_parallel(
        {".*conv/kernel": (None, None, None, "model"),
         ".*bn/(gamma|beta|moving_mean|moving_variance)": ("model",),
         ".*head/kernel": ("model", None)})
    steps = kt.batches(images, labels, 16)
    kt.assert_same_steps(kt.train_steps(cnn, distribution, steps),
                         kt.train_steps(cnn, None, steps), rtol=1e-4, atol=1e-5)


def transformer():
    keras.utils.set_random_seed(4)
    tokens = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(20, 16, name="embed")(tokens)
    a = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4, name="mha")(h, h)
    h = keras.layers.LayerNormalization(name="ln")(h + a)
    h = keras.layers.Dense(32, activation="gelu", name="up")(h)
    h = keras.layers.Dense(16, name="down")(h)
    out = keras.layers.Dense(20, name="logits")(h)
    model = keras.Model(tokens, out)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    return model


TRANSFORMER_RULES = {
    ".*embed/embeddings": (None, "model"),
    ".*mha/(query|key|value)/kernel": (None, "model", None),
    ".*mha/(query|key|value)/bias": ("model", None),
    ".*mha/attention_output/kernel": ("model", None, None),
    ".*up/kernel": (None, "model"), ".*up/bias": ("model",),
    ".*down/kernel": ("model", None)}


@pytest.mark.parametrize("kind", ["data", "model"])
def test_transformer_with_multi_head_attention_matches_one_device(kind):
    tokens = RNG.randint(0, 20, (16, 6)).astype("int32")
    targets = RNG.randint(0, 20, (16, 6)).astype("int32")
    distribution = kt.data_parallel() if kind == "data" else kt.model_parallel(TRANSFORMER_RULES)
    steps = kt.batches(tokens, targets, 8)
    got = kt.train_steps(transformer, distribution, steps)
    kt.assert_same_steps(got, kt.train_steps(transformer, None, steps), rtol=1e-4, atol=1e-5)
    if kind == "model":
        with distribution.scope():
            model = transformer()
        assert kt.layouts(model)["mha/query/kernel"].startswith("[*,model,*]")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_matches_one_device(policy):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        steps = kt.batches(X[:32], Y_REG[:32], 16)
        # SGD: Adam turns a gradient that is zero up to rounding into a full-size step,
        # whose sign is the rounding's.
        want = kt.train_steps(mlp(optimizer="sgd"), None, steps)
        got = kt.train_steps(mlp(optimizer="sgd"), kt.model_parallel(MLP_RULES), steps)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert got[0]["weights"][0].dtype == np.float32  # variables stay float32
    # Sharded matmuls add partial sums in the compute dtype in another order than one
    # device: they agree to that dtype's precision (its machine epsilon), not float32's.
    eps = float(np.finfo(np.float16).eps) if policy == "mixed_float16" else 2.0 ** -7
    kt.assert_same_steps(got, want, rtol=eps, atol=eps / 10)


@pytest.mark.parametrize("kind", ["data", "model"])
def test_loss_scale_optimizer_scales_the_loss_by_its_current_scale_at_every_step(kind):
    # The optimizer is built in the step's first trace, and its variables are made on the
    # mesh outside the function, where tf.function does not see them: the step was never
    # traced again, and `scale_loss` kept the unbuilt optimizer's constant initial scale
    # (128) while gradients were divided by the current one (256 from the third step): the
    # updates came out halved, then quartered. float32: the scaling itself is exact.
    def build():
        return mlp(optimizer=keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=128.0, dynamic_growth_steps=2))()

    distribution = kt.data_parallel() if kind == "data" else kt.model_parallel(MLP_RULES)
    steps = kt.batches(X[:48], Y_REG[:48], 16) * 2
    got = kt.train_steps(build, distribution, steps)
    kt.assert_same_steps(got, kt.train_steps(build, None, steps))
    plain = build()
    want = plain.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                     verbose=0).history
    with distribution.scope():
        model = build()
        fitted = model.fit(X[:48], Y_REG[:48], batch_size=16, epochs=2, shuffle=False,
                           verbose=0).history
    for key in want:
        np.testing.assert_allclose(fitted[key], want[key], rtol=1e-5, err_msg=key)
    assert float(model.optimizer.dynamic_scale) == 1024.0
    for w, p in zip(model.weights, plain.weights):
        np.testing.assert_allclose(np.array(w), np.array(p), rtol=1e-5, atol=1e-6)


def test_loss_scale_optimizer_built_in_a_custom_tf_function_loop_scales_as_on_one_device():
    # The same cause in a custom loop: the user's tf.function never traced again after
    # its first trace built the optimizer on the mesh, and kept the constant scale.
    distribution = kt.data_parallel()

    def setup():
        model = mlp()()
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=128.0, dynamic_growth_steps=2)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
                scaled = optimizer.scale_loss(loss)
            optimizer.apply(tape.gradient(scaled, model.trainable_variables),
                            model.trainable_variables)
            return loss
        return model, step

    plain, plain_step = setup()
    with distribution.scope():
        model, step = setup()
    for i, (x, y) in enumerate(kt.batches(X[:48], Y_REG[:48], 16) * 2):
        want = plain_step(tf.constant(x), tf.constant(y))
        with distribution.scope():
            got = step(*(keras.distribution.distribute_tensor(
                v, distribution.get_data_layout(v.shape)) for v in (x, y)))
        np.testing.assert_allclose(float(got), float(want), rtol=1e-5, err_msg=f"step {i}")
    for w, p in zip(model.weights, plain.weights):
        np.testing.assert_allclose(np.array(w), np.array(p), rtol=1e-5, atol=1e-6)


def test_output_activation_key_relays_out_the_layer_output():
    seen = []

    def record(t):
        seen.append(kt.fetch_layout_short(t))
        return t

    distribution = kt.model_parallel({**MLP_RULES, ".*d1/output": ("batch", "model")})
    with distribution.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="d1"),
                                  keras.layers.Lambda(record), keras.layers.Dense(4, name="d2")])
        out = model(keras.distribution.distribute_tensor(
            X[:8], distribution.get_data_layout((8, 16))))
    assert seen[-1] == "[batch,model] @ mesh(batch=2,model=4)"
    assert kt.fetch_layout_short(out) is not None


def test_output_key_of_a_layer_with_several_outputs_lays_out_each_of_them():
    # An LSTM with return_state returns (output, h, c): Keras hands the whole tuple to
    # distribute_tensor with the one `lstm/output` layout (JAX lays out each leaf); it
    # raised AttributeError ('tuple' object has no attribute 'shape') at model build.
    seen = []

    def record(t):
        if tf.executing_eagerly():
            seen.append(kt.fetch_layout_short(t))
        return t

    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((5, 6))
        output, h, c = keras.layers.LSTM(8, return_state=True, name="lstm")(inputs)
        joined = keras.layers.Concatenate()([output, keras.layers.Lambda(record, output_shape=(8,))(h), c])
        model = keras.Model(inputs, keras.layers.Dense(4, name="out")(joined))
        model.compile(optimizer="sgd", loss="mse")
        return model

    sequences = RNG.randn(16, 5, 6).astype("float32")
    steps = kt.batches(sequences, Y_REG[:16], 8)
    distribution = kt.model_parallel({".*lstm/output": ("batch", "model"),
                                      ".*out/kernel": ("model", None)})
    kt.assert_same_steps(kt.train_steps(build, distribution, steps),
                         kt.train_steps(build, None, steps), rtol=1e-4, atol=1e-5)
    with distribution.scope():
        build()(keras.distribution.distribute_tensor(
            sequences[:8], distribution.get_data_layout((8, 5, 6))))
    assert seen == ["[batch,model] @ mesh(batch=2,model=4)"]


def test_output_key_of_a_layer_whose_outputs_differ_in_rank_names_the_layer_and_fix():
    with kt.model_parallel({".*mha/output": ("batch", None, "model")}).scope():
        inputs = keras.Input((5, 6))
        with pytest.raises(tf_dtensor.LayoutError) as error:
            keras.layers.MultiHeadAttention(2, 4, name="mha")(inputs, inputs,
                                                              return_attention_scores=True)
    message = str(error.value)
    for part in ["Keras layer `mha`", "LayoutMap['.*mha/output']", "`mha/output`",
                 "[batch,*,model] @ mesh(batch=2,model=4)", "ranks [3, 4]", "Narrow the key"]:
        assert part in message, message


def test_large_unmatched_variable_is_reported_and_replicated_on_the_mesh():
    tf_dtensor.keras.set_replicated_warning_bytes(1024)
    try:
        with kt.model_parallel({".*d1/kernel": (None, "model")}).scope():
            with pytest.warns(tf_dtensor.keras.ReplicatedVariableWarning) as record:
                model = mlp(width=64)()
        messages = [str(w.message) for w in record
                    if issubclass(w.category, tf_dtensor.keras.ReplicatedVariableWarning)]
        # d2/kernel (64x4 float32, 1 KiB) matched no rule; d1/kernel did; biases are small.
        assert len(messages) == 1, messages
        assert re.search(r"`sequential\w*/d2/kernel` \(shape \(64, 4\), float32, 1.0 KiB\)",
                         messages[0]), messages[0]
        assert "'.*d1/kernel'" in messages[0]
        assert kt.layouts(model)["d2/kernel"] == "[*,*] @ mesh(batch=2,model=4)"
        # DataParallel replicates by design: no warning.
        with kt.data_parallel().scope(), warnings.catch_warnings():
            warnings.simplefilter("error", tf_dtensor.keras.ReplicatedVariableWarning)
            mlp(width=64)()
    finally:
        tf_dtensor.keras.set_replicated_warning_bytes(1 << 20)


def test_explain_of_a_non_model_is_a_type_error_naming_explain():
    """It raised `AttributeError: 'int' object has no attribute 'weights'`."""
    with pytest.raises(TypeError, match=r"explain takes a Keras model or layer; got 3 \(int\)"):
        tf_dtensor.keras.explain(3)


def test_explain_lists_rule_layout_bytes_and_uneven_shapes(capsys):
    # d1 has 30 units: 30 over model=4 does not divide (blocks of 8, 8, 8, 6), and that is allowed.
    with kt.model_parallel(MLP_RULES).scope():
        model = mlp(width=30)()
        model.train_on_batch(X[:16], Y_REG[:16])
    plans = {kt.short_path(p.path): p for p in tf_dtensor.keras.explain(model)}
    printed = capsys.readouterr().out
    assert "LayoutMap['.*d1/kernel']" in printed and "no (uneven)" in printed
    kernel = plans["d1/kernel"]
    assert kernel.layout == "[*,model] @ mesh(batch=2,model=4)"
    assert kernel.bytes_per_device == 16 * 8 * 4 and not kernel.divides
    assert plans["d2/bias"].rule == "no LayoutMap rule matched: replicated"
    momentum = next(p for k, p in plans.items() if k.endswith("d1_kernel_momentum"))
    assert momentum.layout == kernel.layout and momentum.rule.startswith("its own layout=")
    iteration = next(p for k, p in plans.items() if k.endswith("/iteration"))
    assert iteration.dtype == "int64" and iteration.layout == "[] @ mesh(batch=2,model=4)"


def test_uneven_model_parallel_training_matches_one_device():
    steps = kt.batches(X[:30], Y_REG[:30], 10)  # batch 10 over batch=2; width 30 over model=4
    kt.assert_same_steps(kt.train_steps(mlp(width=30), kt.model_parallel(MLP_RULES), steps),
                         kt.train_steps(mlp(width=30), None, steps))


def test_two_matching_rules_are_an_error_as_in_keras():
    distribution = kt.model_parallel({".*kernel": (None, "model"), ".*d1/.*": (None, "model")})
    with distribution.scope(), pytest.raises(ValueError, match="matches"):
        mlp()()


def test_version_and_backend_are_checked():
    with pytest.raises(ImportError, match=re.escape("keras==3.15.*")):
        _hooks.check_version("3.16.0")
    _hooks.check_version("3.15.4")
    with pytest.raises(ImportError, match="KERAS_BACKEND=tensorflow"):
        _hooks.check_backend("jax")


def test_keras_hub_backbones_shard_with_their_own_layout_maps():
    keras_hub = pytest.importorskip("keras_hub")
    tokens = RNG.randint(0, 64, (4, 12)).astype("int32")
    data = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    configs = {
        keras_hub.models.GemmaBackbone: dict(num_query_heads=4, num_key_value_heads=4, head_dim=8),
        keras_hub.models.LlamaBackbone: dict(num_query_heads=4, num_key_value_heads=2)}
    for cls, extra in configs.items():
        def build():
            keras.utils.set_random_seed(3)
            return cls(vocabulary_size=64, num_layers=2, hidden_dim=32, intermediate_dim=64,
                       **extra)
        want = build().predict(data, verbose=0)
        mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], kt.DEVICES)
        distribution = keras.distribution.ModelParallel(
            layout_map=cls.get_layout_map(mesh), batch_dim_name="batch")
        with distribution.scope():
            model = build()
            got = model.predict(data, verbose=0)
        plans = tf_dtensor.keras.explain(model, print_fn=None)
        assert sum("model" in (p.layout or "") for p in plans) >= 10, cls.__name__
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=cls.__name__)


def test_collective_ledger_of_a_model_parallel_train_step():
    """`debug.collectives()` around a Keras train step lists what one step issues: d2's
    row-parallel matmul reduces over `model`, the gradients over `batch`; the step's loss
    matches the same step on one device."""
    plain = mlp(optimizer="sgd")()
    plain.train_on_batch(X[:16], Y_REG[:16])
    with kt.model_parallel(MLP_RULES).scope():
        model = mlp(optimizer="sgd")()
        model.train_on_batch(X[:16], Y_REG[:16])  # traces the step
        with tf_dtensor.debug.collectives() as ledger:
            got = model.train_on_batch(X[16:32], Y_REG[16:32], return_dict=True)  # the step
    want = plain.train_on_batch(X[16:32], Y_REG[16:32], return_dict=True)
    # Every collective names this test's train_on_batch line (Keras' own frames skipped).
    with open(__file__) as f:
        (n,) = [i for i, text in enumerate(f, 1) if text.rstrip().endswith("# the step")]
    assert {r.line for r in ledger} == {f"{__file__}:{n}"}, ledger.table()
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert len(ledger) > 0 and all(r.where != "eager" for r in ledger), ledger.table()
    assert ledger.count(kind="all-reduce", mesh_dim="model") >= 1, ledger.table()
    assert ledger.count(kind="all-reduce", mesh_dim="batch") >= 1, ledger.table()
    # d2's kernel gradient ([32,4], rows over model) is reduced over batch: each device
    # receives 2*(2-1)/2 of its [8,4] float32 block.
    grads = [r for r in ledger.select(kind="all-reduce", mesh_dim="batch") if r.shape == (32, 4)]
    assert len(grads) == 1 and grads[0].bytes_per_device == 8 * 4 * 4, ledger.table()
    # One all-reduce per gradient (each was reduced twice, once per reader, before).
    for shape in [(16, 32), (32,), (32, 4), (4,)]:
        assert len([r for r in ledger.select(mesh_dim="batch") if r.shape == shape]) == 1, shape
