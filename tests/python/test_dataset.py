"""`DTensorDataset`: batches equal the single-device batches, with the requested layouts,
eagerly and inside tf.function; the MNIST-style training flow matches one device."""

from __future__ import annotations

import json
import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf

import dtensor_testing
from dtensor_testing import assert_dtensor_equal, layout_of
from tf_dtensor import config, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESH_2X2 = dtensor_testing.MESH_2X2
# A batch dimension and a model dimension.
MESH_BM = dtensor.create_mesh([("batch", 2), ("model", 2)], devices=dtensor_testing.cpus(4))
MESH_B4 = dtensor.create_mesh([("batch", 4)], devices=dtensor_testing.cpus(4))

NUM_EXAMPLES = 37  # Not a multiple of the global batch: the remainder is dropped.
FEATURES = np.arange(NUM_EXAMPLES * 4, dtype=np.float32).reshape(NUM_EXAMPLES, 4) / 7.0
LABELS = (np.arange(NUM_EXAMPLES, dtype=np.int64) * 3) % 5


def reference_batches(arrays, global_batch_size):
    """The single-device batches: `dataset.batch(global_batch_size, drop_remainder=True)`."""
    count = len(np.asarray(tf.nest.flatten(arrays)[0])) // global_batch_size
    return [tf.nest.map_structure(lambda a: np.asarray(a)[k * global_batch_size:
                                                         (k + 1) * global_batch_size], arrays)
            for k in range(count)]


def assert_batches(expected_batches, layouts, actual_batches):
    assert len(actual_batches) == len(expected_batches), (
        f"{len(actual_batches)} batches, expected {len(expected_batches)}")
    for expected, actual in zip(expected_batches, actual_batches):
        tf.nest.assert_same_structure(expected, actual)
        for e, l, a in zip(tf.nest.flatten(expected), tf.nest.flatten(layouts),
                           tf.nest.flatten(actual)):
            assert_dtensor_equal(e, l, a)


# ---------------------------------------------------------------------------------------
# Values and layouts, eagerly
# ---------------------------------------------------------------------------------------

CASES = [
    # (mesh, batch_dim, feature layout spec, label layout spec, global batch)
    pytest.param(dtensor_testing.MESH_1D, "x", "[x,*]", "[x]", 4, id="[x,*]@mesh(x=2)"),
    pytest.param(dtensor_testing.MESH_8, "x", "[x,*]", "[x]", 8, id="[x,*]@mesh(x=8)"),
    pytest.param(MESH_2X2, "x", "[x,y]", "[x]", 4, id="[x,y]"),
    pytest.param(MESH_2X2, "x", "[x,*]", "[x]", 6, id="[x,*]-batch6"),
    pytest.param(MESH_2X2, "y", "[y,x]", "[y]", 4, id="[y,x]-inner-batch-dim"),
    pytest.param(MESH_2X2, None, "[*,y]", "[*]", 4, id="[*,y]-no-batch-dim"),
    pytest.param(MESH_2X2, None, "[x,*]", "[x]", 4, id="[x,*]-no-batch-dim"),
]


@pytest.mark.parametrize("mesh,batch_dim,feature_spec,label_spec,global_batch", CASES)
@pytest.mark.parametrize("structure", ["single", "tuple", "dict"])
def test_batches_equal_single_device_batches(mesh, batch_dim, feature_spec, label_spec,
                                            global_batch, structure):
    feature_layout = layout_of(feature_spec, mesh)
    label_layout = layout_of(label_spec, mesh)
    arrays, layouts = {
        "single": (FEATURES, feature_layout),
        "tuple": ((FEATURES, LABELS), (feature_layout, label_layout)),
        "dict": ({"x": FEATURES, "y": LABELS}, {"x": feature_layout, "y": label_layout}),
    }[structure]
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices(arrays), mesh=mesh, layouts=layouts,
        global_batch_size=global_batch, batch_dim=batch_dim)
    assert_batches(reference_batches(arrays, global_batch), layouts, list(dataset))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("mesh,spec,batch_dim,global_batch", [
    (MESH_BM, "[batch,model]", "batch", 4),   # 5 columns over model=2: blocks 3 and 2
    (MESH_B4, "[batch,*]", None, 6),          # 6 rows over batch=4 and no batch_dim: 2,2,2,0
])
def test_uneven_blocks_hold_the_whole_batch(mesh, spec, batch_dim, global_batch, traced):
    # Eagerly each device took n // k rows or columns: the remainder was silently lost.
    features = np.arange(24 * 5, dtype=np.float32).reshape(24, 5)
    layout = layout_of(spec, mesh)
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(features), mesh=mesh,
                                     layouts=layout, global_batch_size=global_batch,
                                     batch_dim=batch_dim)
    iterator = iter(dataset)
    first = tf.function(lambda it: next(it))(iterator) if traced else next(iterator)
    assert_dtensor_equal(features[:global_batch], layout, first)


def test_element_spec_is_the_global_batch(mesh_2x2):
    layouts = (Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2))
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)), mesh=mesh_2x2, layouts=layouts,
        global_batch_size=8, batch_dim="x")
    assert isinstance(dataset, tf.data.Dataset)
    assert dataset.element_spec == (tf.TensorSpec([8, 4], tf.float32),
                                    tf.TensorSpec([8], tf.int64))
    assert iter(dataset).element_spec == dataset.element_spec



def test_layouts_in_a_list_for_tuple_elements_give_the_tuple_batches(mesh_2x2):
    # TensorFlow's nest refused a list where the elements are a tuple (TypeError, "don't
    # have the same nested structure"); the layouts are one per element all the same.
    layouts = [Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2)]
    arrays = (FEATURES, LABELS)
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices(arrays), mesh=mesh_2x2, layouts=layouts,
        global_batch_size=4, batch_dim="x")
    batches = list(dataset)
    assert isinstance(batches[0], tuple)
    assert_batches(reference_batches(arrays, 4), tuple(layouts), batches)


@pytest.mark.parametrize("make_layouts,error_class,shown", [
    (lambda l: l, ValueError, "`layouts` is [x,*] @ mesh(x=2,y=2)"),
    (lambda l: (l,), ValueError, "`layouts` is ([x,*] @ mesh(x=2,y=2),)"),
    (lambda l: {"a": l, "b": l}, TypeError, "'a': [x,*] @ mesh(x=2,y=2)"),
    (lambda l: (l, [l]), ValueError, "[[x,*] @ mesh(x=2,y=2)]"),
], ids=["one-layout", "too-few", "dict", "too-deep"])
def test_layouts_nested_unlike_the_elements_name_both_structures(mesh_2x2, make_layouts,
                                                                error_class, shown):
    # The message was TensorFlow's nest error, with reprs of TensorSpecs and Layouts and no
    # word of DTensorDataset; the class is still the one TensorFlow's DTensorDataset raises.
    layouts = make_layouts(Layout(["x", UNSHARDED], mesh_2x2))
    with pytest.raises(error_class) as raised:
        dtensor.DTensorDataset(
            tf.data.Dataset.from_tensor_slices((FEATURES, FEATURES)), mesh=mesh_2x2,
            layouts=layouts, global_batch_size=4, batch_dim="x")
    message = str(raised.value)
    assert message.startswith("DTensorDataset: `layouts` must hold one Layout per dataset element")
    assert "The elements are (float32[4], float32[4])" in message
    assert shown in message

def test_iterator_next_and_stop_iteration(mesh_1d):
    layout = Layout(["x", UNSHARDED], mesh_1d)
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(FEATURES[:10]),
                                     mesh=mesh_1d, layouts=layout, global_batch_size=4,
                                     batch_dim="x")
    iterator = iter(dataset)
    assert_dtensor_equal(FEATURES[0:4], layout, next(iterator))
    assert_dtensor_equal(FEATURES[4:8], layout, iterator.get_next())
    with pytest.raises(StopIteration):
        next(iterator)
    # Each iterator starts again from the beginning.
    assert_dtensor_equal(FEATURES[0:4], layout, next(iter(dataset)))


def test_regular_dataset_iterated_under_run_on_stays_on_the_host(mesh_1d):
    # tf.data ops placed on the DTensor device with no DTensor input run on the host and give
    # regular tensors, as in TensorFlow's DTensor. The Optional ops have sharding rules (for
    # functions that carry optionals); eagerly on host values they must still take the host
    # route, and give the values an iteration outside the scope gives.
    dataset = tf.data.Dataset.from_tensor_slices(FEATURES[:3]).batch(2)
    with dtensor.run_on(mesh_1d):
        iterator = iter(dataset)
        first = next(iterator)
        optional = iterator.get_next_as_optional()
        has_second, second = optional.has_value(), optional.get_value()
        has_third = iterator.get_next_as_optional().has_value()
        made = tf.experimental.Optional.from_value(tf.constant(FEATURES[0]))
        made_value = made.get_value()
        empty = tf.experimental.Optional.empty(tf.TensorSpec([4], tf.float32)).has_value()
    for value in (first, has_second, second, has_third, made_value, empty):
        assert not dtensor.is_dtensor(value)
    np.testing.assert_array_equal(first.numpy(), FEATURES[0:2])
    assert bool(has_second.numpy()) and not bool(has_third.numpy()) and not bool(empty.numpy())
    np.testing.assert_array_equal(second.numpy(), FEATURES[2:3])
    np.testing.assert_array_equal(made_value.numpy(), FEATURES[0])


def test_already_batched_per_replica_batches(mesh_2x2):
    layouts = (Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2))
    per_replica = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(
        3, drop_remainder=True)
    dataset = dtensor.DTensorDataset(per_replica, mesh=mesh_2x2, layouts=layouts,
                                     global_batch_size=6, batch_dim="x",
                                     dataset_already_batched=True)
    assert dataset.element_spec[0].shape == [6, 4]
    assert_batches(reference_batches((FEATURES, LABELS), 6), layouts, list(dataset))


def test_already_batched_on_a_1d_mesh(mesh_8):
    layout = Layout(["x", UNSHARDED], mesh_8)
    per_replica = tf.data.Dataset.from_tensor_slices(FEATURES).batch(1, drop_remainder=True)
    dataset = dtensor.DTensorDataset(per_replica, mesh=mesh_8, layouts=layout,
                                     global_batch_size=8, batch_dim="x",
                                     dataset_already_batched=True)
    assert_batches(reference_batches(FEATURES, 8), layout, list(dataset))


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_gives_the_same_batches(mesh_2x2, prefetch):
    layout = Layout(["x", "y"], mesh_2x2)
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices(FEATURES), mesh=mesh_2x2, layouts=layout,
        global_batch_size=4, batch_dim="x", prefetch=prefetch)
    assert_batches(reference_batches(FEATURES, 4), layout, list(dataset))


def test_a_mapped_dataset_is_batched_after_the_map(mesh_2x2):
    layouts = {"x": Layout(["x", "y"], mesh_2x2), "y": Layout(["x"], mesh_2x2)}
    source = tf.data.Dataset.range(20).map(
        lambda i: {"x": tf.fill([4], tf.cast(i, tf.float32)), "y": i * 2})
    dataset = dtensor.DTensorDataset(source, mesh=mesh_2x2, layouts=layouts,
                                     global_batch_size=4, batch_dim="x")
    expected = {"x": np.repeat(np.arange(20, dtype=np.float32)[:, None], 4, axis=1),
                "y": np.arange(20, dtype=np.int64) * 2}
    assert_batches(reference_batches(expected, 4), layouts, list(dataset))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("transform,picks", [
    ("repeat(2)", list(range(9)) * 2),
    ("skip(2).take(3)", [2, 3, 4]),
    ("prefetch(2).repeat(2).take(11)", (list(range(9)) * 2)[:11]),
    ("cache().repeat(3)", list(range(9)) * 3),
    ("with_options(tf.data.Options())", list(range(9))),
])
def test_batch_transformations_give_the_single_device_batches(mesh_2x2, transform, picks,
                                                               traced):
    # tf.data's transformations wrapped the unbatched source: "Incompatible shapes at
    # component 0: expected [4,4] but got [4]" when the iterator was made (TF's too).
    layouts = (Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2))
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)), mesh=mesh_2x2,
        layouts=layouts, global_batch_size=4, batch_dim="x")
    transformed = eval(f"dataset.{transform}")  # pylint: disable=eval-used
    assert isinstance(transformed, dtensor.DTensorDataset)
    assert transformed.element_spec == dataset.element_spec
    assert int(transformed.cardinality()) == len(picks) == len(transformed)
    reference = reference_batches((FEATURES, LABELS), 4)
    expected = [reference[k] for k in picks]
    if not traced:
        assert_batches(expected, layouts, list(transformed))
        return

    features, labels = _sums_in_function(transformed)
    np.testing.assert_allclose(dtensor_testing.reassemble(features),
                               _column_sums([x for x, _ in expected]), rtol=1e-5)
    assert int(dtensor_testing.reassemble(labels)) == sum(int(y.sum()) for _, y in expected)


def test_the_source_dataset_is_untouched_by_a_batch_transformation(mesh_2x2):
    layout = Layout(["x", "y"], mesh_2x2)
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(FEATURES),
                                     mesh=mesh_2x2, layouts=layout, global_batch_size=4,
                                     batch_dim="x")
    dataset.repeat(3)
    assert len(dataset) == 9
    assert_batches(reference_batches(FEATURES, 4), layout, list(dataset))


@pytest.mark.parametrize("method,args", [("map", (lambda x: x,)), ("batch", (2,)),
                                         ("shuffle", (4,)), ("unbatch", ()),
                                         ("reduce", (0, lambda a, b: a))])
def test_other_transformations_are_refused_by_name(mesh_2x2, method, args):
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(FEATURES),
                                     mesh=mesh_2x2, layouts=Layout(["x", "y"], mesh_2x2),
                                     global_batch_size=4, batch_dim="x")
    with pytest.raises(NotImplementedError,
                       match=rf"`DTensorDataset.{method}` is not supported.*\[x,y\] @ "
                             rf"mesh\(x=2,y=2\).*Apply `{method}` to the dataset you pass"):
        getattr(dataset, method)(*args)


# ---------------------------------------------------------------------------------------
# Inside tf.function
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,batch_dim", [("[x,y]", "x"), ("[x,*]", "x"), ("[*,y]", None)])
def test_next_inside_function(mesh_2x2, spec, batch_dim):
    layouts = (layout_of(spec, mesh_2x2), Layout([batch_dim or UNSHARDED], mesh_2x2))
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)), mesh=mesh_2x2,
        layouts=layouts, global_batch_size=4, batch_dim=batch_dim)
    iterator = iter(dataset)

    @tf.function
    def step(it):
        return next(it)

    expected = reference_batches((FEATURES, LABELS), 4)
    assert_batches(expected[:1], layouts, [step(iterator)])
    # Eager and function calls share the iterator's position.
    assert_batches(expected[1:2], layouts, [next(iterator)])
    assert_batches(expected[2:4], layouts, [step(iterator), iterator.get_next()])


def _column_sums(batches):
    return sum(np.asarray(b).sum(axis=0) for b in batches)


def test_for_over_iterator_inside_function(mesh_2x2):
    layout = Layout(["x", "y"], mesh_2x2)
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(FEATURES),
                                     mesh=mesh_2x2, layouts=layout, global_batch_size=4,
                                     batch_dim="x")

    @tf.function
    def total(it):
        result = tf.zeros([4])
        for batch in it:
            result += tf.reduce_sum(batch, axis=0)
        return result

    got = dtensor_testing.reassemble(total(iter(dataset)))
    np.testing.assert_allclose(got, _column_sums(reference_batches(FEATURES, 4)), rtol=1e-5)


def _sums_in_function(dataset):
    """`for x, y in dataset` inside a tf.function: the features' column sums and the
    labels' sum over every batch."""
    @tf.function
    def total():
        features, labels = tf.zeros([4]), tf.constant(0, tf.int64)
        for x, y in dataset:
            features += tf.reduce_sum(x, axis=0)
            labels += tf.reduce_sum(y)
        return features, labels

    return total()


def test_for_over_dataset_inside_function(mesh_2x2):
    # TensorFlow's DTensor iterates the unbatched source here and fails; we iterate batches.
    layouts = (Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2))
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)), mesh=mesh_2x2,
        layouts=layouts, global_batch_size=4, batch_dim="x")

    features, labels = _sums_in_function(dataset)
    expected = reference_batches((FEATURES, LABELS), 4)
    np.testing.assert_allclose(dtensor_testing.reassemble(features),
                               _column_sums([x for x, _ in expected]), rtol=1e-5)
    assert int(dtensor_testing.reassemble(labels)) == sum(int(y.sum()) for _, y in expected)


@pytest.mark.parametrize("transform", ["", ".take(2)"])
def test_a_dataset_passed_into_a_function_yields_its_dtensor_batches(mesh_2x2, transform):
    # The function rebuilt a plain dataset from the unbatched source's variant and read
    # its rows as [4, 4] batches: silently wrong sums (TF's DTensor raises UnknownError).
    layouts = (Layout(["x", "y"], mesh_2x2), Layout(["x"], mesh_2x2))
    dataset = eval("dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices((FEATURES, "
                   "LABELS)), mesh=mesh_2x2, layouts=layouts, global_batch_size=4, "
                   "batch_dim='x')" + transform)  # pylint: disable=eval-used
    expected = reference_batches((FEATURES, LABELS), 4)[:len(dataset)]

    @tf.function
    def total(data):
        features, labels = tf.zeros([4]), tf.constant(0, tf.int64)
        for x, y in data:
            features += tf.reduce_sum(x, axis=0)
            labels += tf.reduce_sum(y)
        return features, labels

    @tf.function
    def first(data):
        return next(iter(data))

    features, labels = total(dataset)
    np.testing.assert_allclose(dtensor_testing.reassemble(features),
                               _column_sums([x for x, _ in expected]), rtol=1e-5)
    assert int(dtensor_testing.reassemble(labels)) == sum(int(y.sum()) for _, y in expected)
    assert_batches(expected[:1], layouts, [first(dataset)])
    # One component: the rows were summed into each column, with no error.
    single = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices(FEATURES),
                                    mesh=mesh_2x2, layouts=layouts[0], global_batch_size=4,
                                    batch_dim="x")

    @tf.function
    def column_sums(data):
        result = tf.zeros([4])
        for x in data:
            result += tf.reduce_sum(x, axis=0)
        return result

    np.testing.assert_allclose(dtensor_testing.reassemble(column_sums(single)),
                               _column_sums(reference_batches(FEATURES, 4)), rtol=1e-5)


# ---------------------------------------------------------------------------------------
# MNIST-style training: DTensorDataset -> tf.function train step (tape + optimizer)
# ---------------------------------------------------------------------------------------

class SGD:
    def __init__(self, variables, learning_rate=0.1):
        self.variables, self.learning_rate = variables, learning_rate

    def apply_gradients(self, grads):
        for grad, var in zip(grads, self.variables):
            var.assign_sub(self.learning_rate * grad)


class Adam:
    """The guide's hand-written Adam, with the step count in a variable."""

    def __init__(self, variables, make_variable, learning_rate=0.01, beta_1=0.9, beta_2=0.999,
                 ep=1e-7):
        self.variables, self.learning_rate = variables, learning_rate
        self.beta_1, self.beta_2, self.ep = beta_1, beta_2, ep
        self.t = make_variable(np.ones([], np.float32), "[]")
        self.m = [make_variable(np.zeros(v.shape, np.float32), spec)
                  for v, spec in zip(variables, WEIGHT_SPECS)]
        self.s = [make_variable(np.zeros(v.shape, np.float32), spec)
                  for v, spec in zip(variables, WEIGHT_SPECS)]

    def apply_gradients(self, grads):
        for grad, var, m, s in zip(grads, self.variables, self.m, self.s):
            m.assign(self.beta_1 * m + (1 - self.beta_1) * grad)
            s.assign(self.beta_2 * s + (1 - self.beta_2) * tf.square(grad))
            m_hat = m / (1 - self.beta_1 ** self.t)
            s_hat = s / (1 - self.beta_2 ** self.t)
            var.assign_sub(self.learning_rate * (m_hat / (tf.sqrt(s_hat) + self.ep)))
        self.t.assign_add(1.0)


IMAGE, HIDDEN, CLASSES, GLOBAL_BATCH, STEPS = 16, 8, 5, 8, 4
rng = np.random.RandomState(0)
IMAGES = rng.uniform(size=(GLOBAL_BATCH * STEPS + 3, IMAGE)).astype(np.float32)
TARGETS = rng.randint(0, CLASSES, size=len(IMAGES)).astype(np.int64)
INITIAL = [rng.normal(scale=0.3, size=(IMAGE, HIDDEN)).astype(np.float32),
           np.zeros([HIDDEN], np.float32),
           rng.normal(scale=0.3, size=(HIDDEN, CLASSES)).astype(np.float32),
           np.zeros([CLASSES], np.float32)]
# Weight layouts on the (batch, model) mesh: the hidden layer is split over `model`.
WEIGHT_SPECS = ["[*,model]", "[model]", "[model,*]", "[*]"]


def loss_fn(weights, images, targets):
    w1, b1, w2, b2 = weights
    hidden = tf.nn.relu(tf.matmul(images, w1) + b1)
    logits = tf.matmul(hidden, w2) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits))


def train(batches, weights, optimizer, iterate_inside):
    """Runs STEPS training steps; returns the losses (floats)."""

    def step_body(images, targets):
        with tf.GradientTape() as tape:
            loss = loss_fn(weights, images, targets)
        optimizer.apply_gradients(tape.gradient(loss, weights))
        return loss

    if iterate_inside:
        step = tf.function(lambda it: step_body(*next(it)))
        iterator = iter(batches)
        losses = [step(iterator) for _ in range(STEPS)]
    else:
        step = tf.function(step_body)
        losses = [step(images, targets) for images, targets in batches]
    return [float(dtensor_testing.reassemble(l)) if dtensor.is_dtensor(l) else float(l)
            for l in losses]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("mesh", [MESH_B4, MESH_BM], ids=["mesh(batch=4)", "mesh(batch=2,model=2)"])
@pytest.mark.parametrize("iterate_inside", [False, True],
                         ids=["eager-iteration", "next-in-function"])
def test_training_matches_one_device(optimizer, mesh, iterate_inside):
    source = tf.data.Dataset.from_tensor_slices((IMAGES, TARGETS))

    def make_plain(value, spec):
        del spec
        return tf.Variable(value)

    def make_dvariable(value, spec):
        specs = [s if s in mesh.dim_names else UNSHARDED
                 for s in layout_of(spec, MESH_BM).sharding_specs]
        return dtensor.DVariable(value, layout=Layout(specs, mesh))

    runs = {}
    for name, make_variable in (("plain", make_plain), ("dtensor", make_dvariable)):
        weights = [make_variable(w, spec) for w, spec in zip(INITIAL, WEIGHT_SPECS)]
        opt = SGD(weights) if optimizer == "sgd" else Adam(weights, make_variable)
        if name == "plain":
            batches = source.batch(GLOBAL_BATCH, drop_remainder=True)
        else:
            batches = dtensor.DTensorDataset(
                source, mesh=mesh, global_batch_size=GLOBAL_BATCH, batch_dim="batch",
                layouts=(Layout(["batch", UNSHARDED], mesh), Layout(["batch"], mesh)),
                prefetch=2)
        losses = train(batches, weights, opt, iterate_inside and name == "dtensor")
        values = [dtensor_testing.reassemble(w.read_value()) if name == "dtensor" else w.numpy()
                  for w in weights]
        runs[name] = (losses, values)
    assert len(runs["dtensor"][0]) == STEPS
    np.testing.assert_allclose(runs["dtensor"][0], runs["plain"][0], rtol=1e-5, atol=1e-6)
    assert runs["plain"][0][0] != runs["plain"][0][-1], "training did not change the loss"
    for got, want in zip(runs["dtensor"][1], runs["plain"][1]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------
# Multi-client: each client reads only the rows of its own batch replicas
# ---------------------------------------------------------------------------------------

_CLIENT_PROGRAM = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from tf_dtensor import dtensor
    from tf_dtensor.dtensor import Layout, Mesh
    client = dtensor.client_id()
    # (batch=4, model=2) over 8 devices, 4 per client: client c holds ids 4c..4c+3, which
    # are batch replicas 2c and 2c+1.
    mesh = Mesh(["batch", "model"], np.arange(8).reshape(4, 2),
                list(range(4 * client, 4 * client + 4)),
                [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)],
                global_devices=[f"/job:localhost/replica:0/task:{i // 4}/device:CPU:{i % 4}"
                                for i in range(8)])
    x = np.arange(41 * 4, dtype=np.float32).reshape(41, 4)
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices(x), mesh=mesh, global_batch_size=8,
        batch_dim="batch", layouts=Layout(["batch", "model"], mesh))
    out = {"shapes": [], "components": []}
    for batch in dataset:
        out["shapes"].append(batch.shape.as_list())
        out["components"].append([c.numpy().tolist() for c in dtensor.unpack(batch)])
    print(json.dumps(out))
""")


@pytest.mark.parametrize("client", [0, 1])
def test_each_client_reads_its_own_replicas(client):
    # The directory of the tf_dtensor this process imports (installed or the source tree).
    root = os.path.dirname(os.path.dirname(importlib.util.find_spec("tf_dtensor").origin))
    # Two clients as TensorFlow's DTensor counts them (DTENSOR_JOBS); nothing connects.
    env = dict(os.environ, DTENSOR_JOBS="localhost:9001,localhost:9002",
               DTENSOR_JOB_NAME="worker", DTENSOR_CLIENT_ID=str(client),
               TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _CLIENT_PROGRAM], env=env, cwd=root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    x = np.arange(41 * 4, dtype=np.float32).reshape(41, 4)
    assert len(out["shapes"]) == 5 and all(s == [8, 4] for s in out["shapes"])
    for k, components in enumerate(out["components"]):
        batch = x[8 * k:8 * (k + 1)]
        # Local device d = (replica 2*client + d // 2, model d % 2): 2 rows, 2 columns.
        expected = [batch[2 * (2 * client + d // 2):2 * (2 * client + d // 2) + 2,
                          2 * (d % 2):2 * (d % 2) + 2] for d in range(4)]
        for got, want in zip(components, expected):
            np.testing.assert_array_equal(np.asarray(got), want)
    # Inside tf.function across clients: test_multi_client.py's dataset test (a real
    # cluster; these clients connect to nothing).


def test_keras_fit_on_a_dtensor_dataset_counts_its_batches():
    # Keras read the source's cardinality (40 rows) as the step count: "Your input ran
    # out of data" every epoch, and the progress bar counted 40 steps.
    import keras
    import keras_testing

    rng = np.random.RandomState(5)
    x, y = rng.randn(40, 16).astype("float32"), rng.randn(40, 4).astype("float32")

    def fit(data, distribution):
        with keras_testing.scope(distribution):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4, name="d1")])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
            steps = keras.callbacks.History()
            model.fit(data() if callable(data) else data, epochs=2, verbose=0,
                      callbacks=[steps])
        return steps.history["loss"], steps.params["steps"]

    distribution = keras_testing.data_parallel()
    mesh = distribution.device_mesh.backend_mesh
    layouts = (Layout.batch_sharded(mesh, "batch", 2), Layout.batch_sharded(mesh, "batch", 2))
    dataset = dtensor.DTensorDataset(tf.data.Dataset.from_tensor_slices((x, y)), mesh=mesh,
                                     layouts=layouts, global_batch_size=16, batch_dim="batch")
    assert len(dataset) == 2
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ran out of data")
        losses, steps = fit(dataset, distribution)
    want_losses, want_steps = fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True), None)
    assert steps == want_steps == 2
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)


@pytest.mark.parametrize("lowering", ["shared", "copies", "ops"])
def test_collectives_in_a_loop_over_batches_of_changing_size(mesh_2x2, lowering):
    # Batches of 4, 4 and 2 rows, of a size known only at run time: the all-gather's
    # padded pieces and the all-reduce's partial sums change shape in the last iteration.
    # Under the `ops` lowering each collective kept one instance key in every iteration,
    # and TF's collective runtime holds one shape per key within a step: the last batch
    # aborted the collective ("Shape mismatch in the collective instance ... expected shape
    # [2,4] but another member in the group expected shape [4,4]").
    values = np.arange(40, dtype=np.float32).reshape(10, 4) / 10
    weight = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(4, 2)
    data = tf.data.Dataset.from_tensor_slices(values).batch(4)

    def run(w, to_mesh):
        @tf.function
        def loop(dataset, w):
            total = tf.constant(0.0)
            for batch in iter(dataset):
                whole = to_mesh(to_mesh(batch, "[x,*]"), "[*,*]")  # all-gather
                summed = tf.matmul(to_mesh(batch, "[*,x]"), to_mesh(w, "[x,*]"))  # all-reduce
                total += tf.reduce_sum(whole * whole) + tf.reduce_sum(summed * summed)
            return total
        return loop(data, w)

    want = run(tf.constant(weight), lambda x, spec: x).numpy()
    config.set_collective_lowering(lowering)
    try:
        w = dtensor_testing.to_dtensor(weight, layout_of("[*,*]", mesh_2x2))
        got = run(w, lambda x, spec: dtensor.relayout(x, layout_of(spec, mesh_2x2)))
        np.testing.assert_allclose(dtensor_testing.reassemble(got), want, rtol=1e-5)
    finally:
        config.set_collective_lowering("")


def test_a_loop_over_a_tf_data_iterator_trains_as_one_device(mesh_2x2):
    # Each batch of a regular dataset relaid out inside the loop: the loop's batches have
    # no static size, so the weight's gradient had shape [4, -1], and the update was
    # refused ("the value has shape [4, -1] but the DVariable has shape [4, 2]").
    values = np.arange(44, dtype=np.float32).reshape(11, 4) / 10
    data = tf.data.Dataset.from_tensor_slices(values).batch(4)  # the last batch has 3 rows
    start = np.full((4, 2), 0.1, np.float32)
    sharded = dtensor.DVariable(dtensor_testing.to_dtensor(start, layout_of("[*,y]", mesh_2x2)))
    plain = tf.Variable(start)

    def train(weight, layout):
        @tf.function
        def loop(dataset):
            total = tf.constant(0.0)
            for batch in iter(dataset):
                x = dtensor.relayout(batch, layout) if layout else batch
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.matmul(x, weight) ** 2)
                weight.assign_sub(0.1 * tape.gradient(loss, weight))
                total += loss
            return total
        return loop(data)

    got = dtensor_testing.reassemble(train(sharded, layout_of("[x,*]", mesh_2x2)))
    want = train(plain, None).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert_dtensor_equal(plain.numpy(), layout_of("[*,y]", mesh_2x2), sharded.read_value())
