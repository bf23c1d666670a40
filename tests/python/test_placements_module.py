"""Tests of tf_dtensor/_module.py: distribute_module, distribute_parameter and state dicts
for tf.Modules and Keras layers, each against the same module unsharded (values,
gradients, one training step) and through a checkpoint file."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import MESH_2X2
from tf_dtensor import dtensor
from tf_dtensor.placements import (LoadResult, Partial, Replicate, Shard, distribute_module,
                                   distribute_parameter, distribute_tensor, full_tensor,
                                   init_device_mesh, load_state_dict, named_modules,
                                   named_parameters, placements_of, save_state_dict,
                                   state_dict)

MESH_4 = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))


class Linear(tf.Module):
    """PyTorch's nn.Linear: weight [out, in], y = x @ weight^T + bias."""

    def __init__(self, n_in, n_out, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.weight = tf.Variable(rng.standard_normal((n_out, n_in)).astype(np.float32))
        self.bias = tf.Variable(rng.standard_normal((n_out,)).astype(np.float32))

    def __call__(self, x):
        return tf.matmul(x, self.weight, transpose_b=True) + self.bias


class TwoLayer(tf.Module):
    """The seed's module: relu(fc1(x) + fc2(x))."""

    def __init__(self, seed=0, hidden=8):
        super().__init__()
        self.fc1 = Linear(8, hidden, seed)
        self.fc2 = Linear(8, hidden, seed + 1)

    def __call__(self, x):
        return tf.nn.relu(self.fc1(x) + self.fc2(x))


def _close(expected, actual, atol=1e-5, rtol=1e-5):
    """Values equal up to float rounding (sharded sums add in another order)."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


def _inputs(batch=6):
    return tf.constant(np.random.default_rng(9).standard_normal((batch, 8)).astype(np.float32))


def _shard_linears(weight, bias=None):
    """A partition_fn laying out each Linear's weight (and bias, if given) as placed."""
    def partition_fn(name, module, mesh):
        if isinstance(module, Linear):
            distribute_parameter(module, "weight", mesh, weight)
            if bias is not None:
                distribute_parameter(module, "bias", mesh, bias)
    return partition_fn


def _full(t):
    """The whole value of a DTensor or DVariable."""
    return full_tensor(t.read_value() if isinstance(t, tf.Variable) else t)


def _value(t):
    return _full(t) if dtensor.is_dtensor(t) else t


def _sgd_step(model, x, lr=0.1):
    """One step of plain SGD; a gradient comes in the layout its rule gives, so it is
    relaid out to its variable's before the update."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(x)))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
        layout = getattr(v, "layout", None) or getattr(getattr(v, "value", None), "layout", None)
        v.assign_sub(lr * (dtensor.relayout(g, layout) if layout is not None else g))
    return loss, grads


# ---------------------------------------------------------------------------------------
# tf.Module
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh,weight,bias,hidden", [
    (MESH_4, [Shard(0)], [Shard(0)], 8),
    (MESH_4, [Shard(0)], [Shard(0)], 6),      # uneven: 6 rows over 4 devices, 2, 2, 2, 0
    (MESH_4, [Shard(1)], None, 8),
    (MESH_4, [Replicate()], [Replicate()], 8),
    (MESH_2X2, [Replicate(), Shard(0)], [Replicate(), Shard(0)], 8),
    (MESH_2X2, [Shard(0), Shard(-1)], [Shard(0), Replicate()], 6),
], ids=lambda p: ("[" + ",".join(str(q) for q in p) + "]" if isinstance(p, list)
                  else p.short() if hasattr(p, "short") else str(p)))
def test_tf_module_matches_unsharded(mesh, weight, bias, hidden):
    x = _inputs()
    reference, model = TwoLayer(hidden=hidden), TwoLayer(hidden=hidden)
    distribute_module(model, mesh, partition_fn=_shard_linears(weight, bias))
    rank2 = tuple(Shard(p.dim % 2) if isinstance(p, Shard) else p for p in weight)
    assert placements_of(model.fc1.weight) == rank2
    # What partition_fn left alone is replicated.
    assert placements_of(model.fc2.bias) == tuple(bias or [Replicate()] * len(weight))
    _close(reference(x), _full(model(x)))
    # Values, gradients and parameters after each SGD step agree with the unsharded module.
    for step in range(2):
        ref_loss, ref_grads = _sgd_step(reference, x)
        loss, grads = _sgd_step(model, x)
        _close(ref_loss, _value(loss), rtol=1e-4)
        for a, b in zip(ref_grads, grads):
            _close(a, _value(b), atol=1e-4)
    for (name, a), (_, b) in zip(named_parameters(reference), named_parameters(model)):
        _close(a, _full(b), atol=1e-4)
    assert placements_of(model.fc1.weight) == rank2  # the step kept the layouts


def test_shard_params_makes_dvariables_with_the_placements():
    model = distribute_module(TwoLayer(), MESH_4,
                              partition_fn=_shard_linears([Shard(0)], [Shard(0)]))
    params = dict(named_parameters(model))
    assert list(params) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert all(isinstance(v, dtensor.DVariable) and v.trainable for v in params.values())
    assert {n: placements_of(v) for n, v in params.items()} == {n: (Shard(0),) for n in params}
    assert model.fc1.weight is params["fc1.weight"]
    assert [n for n, _ in named_modules(model)] == ["", "fc1", "fc2"]


def test_partition_fn_sees_every_submodule_and_the_rest_is_replicated():
    class Nested(tf.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [Linear(4, 4, 1), {"inner": Linear(4, 2, 2)}]
            self.pair = (tf.Variable(tf.ones([3])), Linear(2, 2, 3))
            self.scale = tf.Variable(2.0, trainable=False)

    calls = []
    model = Nested()
    distribute_module(model, MESH_2X2,
                      partition_fn=lambda name, module, mesh: calls.append(name))
    assert calls == ["", "blocks.0", "blocks.1.inner", "pair.1"]
    params = dict(named_parameters(model))
    assert list(params) == ["pair.0", "scale", "blocks.0.weight", "blocks.0.bias",
                            "blocks.1.inner.weight", "blocks.1.inner.bias", "pair.1.weight",
                            "pair.1.bias"]
    for name, variable in params.items():
        assert isinstance(variable, dtensor.DVariable), name
        assert placements_of(variable) == (Replicate(), Replicate()), name
    # Replaced where they live: in the list, the dict and the rebuilt tuple.
    assert model.blocks[1]["inner"].weight is params["blocks.1.inner.weight"]
    assert model.pair[0] is params["pair.0"] and not model.scale.trainable
    _close(np.ones(3, np.float32), _full(model.pair[0]))


def test_tied_variable_is_replaced_everywhere():
    model = tf.Module()
    model.encoder, model.decoder = Linear(4, 4, 1), Linear(4, 4, 2)
    model.decoder.weight = model.encoder.weight  # tied
    distribute_module(model, MESH_4, partition_fn=_shard_linears([Shard(1)]))
    assert model.decoder.weight is model.encoder.weight
    assert placements_of(model.decoder.weight) == (Shard(1),)
    assert [n for n, _ in named_parameters(model)] == [
        "encoder.weight", "encoder.bias", "decoder.bias"]


def test_input_fn_and_output_fn_wrap_the_call():
    seen = []

    def input_fn(module, inputs, mesh):
        seen.append(("in", type(module).__name__, len(inputs)))
        return tuple(distribute_tensor(t, mesh, [Shard(0)]) for t in inputs)  # batch-sharded

    def output_fn(module, outputs, mesh):
        seen.append(("out", placements_of(outputs)))
        return _full(outputs)

    x = _inputs(8)
    model = distribute_module(TwoLayer(), MESH_4, input_fn=input_fn, output_fn=output_fn)
    y = model(x)
    assert seen == [("in", "TwoLayer", 1), ("out", (Shard(0),))]
    assert not dtensor.is_dtensor(y)
    _close(TwoLayer()(x), y)
    assert isinstance(model, TwoLayer) and type(model).__name__ == "TwoLayer"


def test_distribute_module_errors():
    model = distribute_module(TwoLayer(), MESH_4)
    with pytest.raises(RuntimeError, match="already applied"):
        distribute_module(model, MESH_4)
    with pytest.raises(KeyError, match="`fc1.weight`, `fc1.bias`"):
        distribute_parameter(model, "fc1.kernel", MESH_4, [Shard(0)])
    with pytest.raises(TypeError, match="tf.Module` or a Keras layer"):
        distribute_module(object(), MESH_4)
    with pytest.raises(TypeError, match="has no `__call__`"):
        distribute_module(tf.Module(), MESH_4, input_fn=lambda m, i, mesh: i)


def test_distribute_parameter_redistributes_a_dvariable():
    model = distribute_module(TwoLayer(), MESH_2X2)
    before = _full(model.fc1.weight)
    distribute_parameter(model, "fc1.weight", MESH_2X2, [Shard(1), Shard(0)])
    assert placements_of(model.fc1.weight) == (Shard(1), Shard(0))
    _close(before, _full(model.fc1.weight))


# ---------------------------------------------------------------------------------------
# Keras
# ---------------------------------------------------------------------------------------

def _keras_model(keras, seed):
    class TwoDense(keras.Model):
        def __init__(self):
            super().__init__()
            self.fc1 = keras.layers.Dense(8)
            self.fc2 = keras.layers.Dense(8)

        def build(self, input_shape):
            self.fc1.build(input_shape)
            self.fc2.build(input_shape)

        def call(self, x):
            return tf.nn.relu(self.fc1(x) + self.fc2(x))

    model = TwoDense()
    model.build((None, 8))
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("mesh,placements", [
    (MESH_4, [Shard(1)]), (MESH_2X2, [Replicate(), Shard(1)]), (MESH_2X2, [Shard(0), Shard(1)]),
], ids=lambda p: "[" + ",".join(str(q) for q in p) + "]" if isinstance(p, list) else p.short())
def test_keras_model_matches_unsharded(mesh, placements):
    keras = pytest.importorskip("keras")
    x = _inputs()
    reference, model = _keras_model(keras, 3), _keras_model(keras, 3)

    def partition_fn(name, module, mesh):
        if isinstance(module, keras.layers.Dense):
            distribute_parameter(module, "kernel", mesh, placements)

    distribute_module(model, mesh, partition_fn=partition_fn)
    assert [n for n, _ in named_parameters(model)] == [
        "fc1.kernel", "fc1.bias", "fc2.kernel", "fc2.bias"]
    # The Keras variables stay; their backing variables are DVariables.
    assert isinstance(model.fc1.kernel, keras.Variable)
    assert placements_of(model.fc1.kernel.value) == tuple(placements)
    assert placements_of(model.fc2.bias.value) == (Replicate(),) * len(placements)
    _close(reference(x), _full(model(x)), atol=1e-5)
    for _ in range(2):
        ref_loss, ref_grads = _sgd_step(reference, x, lr=0.01)
        loss, grads = _sgd_step(model, x, lr=0.01)
        _close(ref_loss, _value(loss), rtol=1e-4)
        for a, b in zip(ref_grads, grads):
            _close(a, _value(b), atol=1e-3)
    _close(reference(x), _full(model(x)), atol=1e-4)


def test_keras_sequential_names_and_keras_optimizer():
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                              keras.layers.Dense(2)])
    expected = model(_inputs()).numpy()
    distribute_module(model, MESH_4, partition_fn=lambda name, module, mesh: (
        distribute_parameter(module, "kernel", mesh, [Shard(1)])
        if name == "layers.0" else None))
    assert [n for n, _ in named_parameters(model)] == [
        "layers.0.kernel", "layers.0.bias", "layers.1.kernel", "layers.1.bias"]
    _close(expected, _full(model(_inputs())), atol=1e-5)
    # Keras' SGD updates the DVariables once gradients are in their layouts.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(_inputs()))
    grads = tape.gradient(loss, model.trainable_variables)
    grads = [dtensor.relayout(g, v.value.layout) for g, v in zip(grads, model.trainable_variables)]
    keras.optimizers.SGD(0.1).apply_gradients(zip(grads, model.trainable_variables))
    assert placements_of(model.layers[0].kernel.value) == (Shard(1),)


def test_keras_layer_alone_and_unbuilt():
    keras = pytest.importorskip("keras")
    layer = keras.layers.Dense(4)
    layer.build((None, 3))
    distribute_module(layer, MESH_4)
    assert placements_of(layer.kernel.value) == (Replicate(),)
    lazy = keras.Sequential([keras.layers.Dense(4)])
    assert named_parameters(lazy) == []  # no variables before it is built


# ---------------------------------------------------------------------------------------
# State dicts
# ---------------------------------------------------------------------------------------

def _sharded_model():
    return distribute_module(TwoLayer(seed=5), MESH_4,
                             partition_fn=_shard_linears([Shard(0)], [Shard(0)]))


def test_state_dict_holds_dtensors_by_name():
    model = _sharded_model()
    sd = state_dict(model)
    assert list(sd) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for name, value in sd.items():
        assert placements_of(value) == (Shard(0),)
    _close(Linear(8, 8, 5).weight, _full(sd["fc1.weight"]))


@pytest.mark.parametrize("source", ["file", "dict"])
def test_state_dict_round_trip_into_a_differently_sharded_module(tmp_path, source):
    model = _sharded_model()
    target = distribute_module(TwoLayer(seed=50), MESH_2X2,
                               partition_fn=_shard_linears([Replicate(), Shard(1)]))
    if source == "file":
        prefix = str(tmp_path / "model")
        save_state_dict(model, prefix)
        reader = tf.train.load_checkpoint(prefix)
        # An ordinary checkpoint: the global values under the state dict's names.
        assert sorted(reader.get_variable_to_shape_map()) == [
            "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        _close(_full(model.fc2.weight), reader.get_tensor("fc2.weight"))
        result = load_state_dict(target, prefix)
    else:
        result = load_state_dict(target, state_dict(model))
    assert result == LoadResult([], [])
    # The target keeps its own layouts and now holds the source's values.
    assert placements_of(target.fc1.weight) == (Replicate(), Shard(1))
    assert placements_of(target.fc1.bias) == (Replicate(), Replicate())
    for (_, a), (_, b) in zip(named_parameters(model), named_parameters(target)):
        _close(_full(a), _full(b))
    x = _inputs()
    _close(_full(model(x)), _full(target(x)), atol=1e-5)


def test_load_state_dict_into_plain_and_keras_modules(tmp_path):
    model = _sharded_model()
    plain = TwoLayer(seed=70)  # not distributed: regular variables get the whole values
    load_state_dict(plain, state_dict(model))
    _close(_full(model.fc1.weight), plain.fc1.weight)
    save_state_dict(state_dict(model), str(tmp_path / "sd"))
    plain = TwoLayer(seed=71)
    load_state_dict(plain, str(tmp_path / "sd"))
    _close(_full(model.fc2.bias), plain.fc2.bias)


def test_load_state_dict_accepts_arrays_partial_and_other_meshes():
    model = _sharded_model()
    values = {name: np.full(v.shape, i, np.float32)
              for i, (name, v) in enumerate(named_parameters(model))}
    values["fc1.bias"] = distribute_tensor(tf.range(8.0), MESH_2X2, [Partial(), Shard(0)])
    values["fc2.bias"] = distribute_tensor(tf.range(8.0) * 2, MESH_4, [Partial()])
    load_state_dict(model, values)
    _close(np.full([8, 8], 2, np.float32), _full(model.fc2.weight))
    _close(np.arange(8, dtype=np.float32), _full(model.fc1.bias))
    _close(np.arange(8, dtype=np.float32) * 2, _full(model.fc2.bias))
    assert placements_of(model.fc1.bias) == (Shard(0),)


def test_load_state_dict_strict_and_shapes(tmp_path):
    model = _sharded_model()
    sd = state_dict(model)
    del sd["fc2.bias"]
    sd["extra"] = tf.zeros([2])
    with pytest.raises(ValueError, match=r"missing keys \['fc2.bias'\], unexpected keys "
                                         r"\['extra'\]"):
        load_state_dict(model, sd)
    assert load_state_dict(model, sd, strict=False) == LoadResult(["fc2.bias"], ["extra"])
    with pytest.raises(ValueError, match=r"`fc1.weight`: \[8, 4\] in the state dict, "
                                         r"\[8, 8\] in the module"):
        load_state_dict(model, {**state_dict(model), "fc1.weight": tf.zeros([8, 4])})
    prefix = str(tmp_path / "small")
    save_state_dict({"fc1.weight": tf.zeros([4, 8])}, prefix)
    with pytest.raises(ValueError, match=r"`fc1.weight`: \[4, 8\] in checkpoint"):
        load_state_dict(model, prefix, strict=False)


def test_checkpoint_state_dict_calls_inside_a_function_name_themselves(tmp_path):
    """They read and write on the host: inside a tf.function save_state_dict's error named
    name_based_save, and load_state_dict read the file at trace time."""
    model = _sharded_model()
    prefix = str(tmp_path / "sd")
    save_state_dict(model, prefix)

    @tf.function
    def save():
        save_state_dict(model, prefix)

    @tf.function
    def load():
        load_state_dict(model, prefix)

    with pytest.raises(ValueError, match=r"`save_state_dict` must run eagerly"):
        save()
    with pytest.raises(ValueError, match=r"`load_state_dict` must run eagerly"):
        load()


def test_distributed_module_trains_inside_tf_function():
    x = _inputs()
    reference = TwoLayer(seed=11)
    model = distribute_module(TwoLayer(seed=11), MESH_2X2,
                              partition_fn=_shard_linears([Shard(0), Shard(1)]))
    layouts = [v.layout for v in model.trainable_variables]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x)))
        grads = tape.gradient(loss, model.trainable_variables)
        for v, g, layout in zip(model.trainable_variables, grads, layouts):
            v.assign_sub(0.1 * dtensor.relayout(g, layout))
        return loss

    for _ in range(2):
        ref_loss, _ = _sgd_step(reference, x)
        _close(ref_loss, _full(step()), rtol=1e-4)
    for (_, a), (_, b) in zip(named_parameters(reference), named_parameters(model)):
        _close(a, _full(b), atol=1e-4)
