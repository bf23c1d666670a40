"""TensorList ops (tf.TensorArray, while_loop): a list records its elements' layout and
element ops pass it through; compared with one plain device in strict mode."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal,
                             assert_values_equal, collective_lowering, layout_of, random_array,
                             reassemble, run_without_fallback, to_dtensor)
from tf_dtensor import dtensor

_T, _B, _D = 5, 4, 3
_XS = random_array((_T, _B, _D), seed=31)
_W = random_array((_D, _D), seed=32, low=-0.5, high=0.5)
_W8 = random_array((8, 8), seed=35, low=-0.5, high=0.5)


def _scan(xs, w):
    """An RNN-style scan over time: h_t = tanh(x_t + h_{t-1} @ w), written to a TensorArray."""
    inputs = tf.TensorArray(tf.float32, size=_T).unstack(xs)
    outputs = tf.TensorArray(tf.float32, size=_T, element_shape=xs.shape[1:])
    h = tf.zeros_like(xs[0])

    def body(t, h, outputs):
        h = tf.tanh(inputs.read(t) + tf.matmul(h, w))
        return t + 1, h, outputs.write(t, h)

    _, _, outputs = tf.while_loop(lambda t, *_: t < _T, body, (0, h, outputs))
    return outputs.stack()


@pytest.mark.parametrize("spec,mesh", [("[*,x,*]", MESH_1D), ("[*,x,*]", MESH_2X2),
                                       ("[*,x,y]", MESH_2X2), ("[*,*,*]", MESH_1D)],
                         ids=["[*,x,*]@x=2", "[*,x,*]", "[*,x,y]", "[*,*,*]@x=2"])
def test_scan_over_time_with_sharded_batch(spec, mesh):
    layout = layout_of(spec, mesh)
    fn = tf.function(_scan)
    expected = fn(tf.constant(_XS), tf.constant(_W))
    w = to_dtensor(_W, layout_of("[*,*]", mesh))
    actual = run_without_fallback(fn, to_dtensor(_XS, layout), w)
    # The rows keep the input's layout through the loop (the state enters as
    # zeros_like(xs[0]) and loop variables keep their entry layouts).
    assert_dtensor_equal(expected, layout, actual)


def test_scan_gradients_match_one_device():
    layout = layout_of("[*,x,*]", MESH_2X2)

    def loss_and_grads(xs, w):
        with tf.GradientTape() as tape:
            tape.watch([xs, w])
            loss = tf.reduce_sum(_scan(xs, w) ** 2)
        return (loss, *tape.gradient(loss, [xs, w]))

    fn = tf.function(loss_and_grads)
    expected = fn(tf.constant(_XS), tf.constant(_W))
    actual = run_without_fallback(fn, to_dtensor(_XS, layout),
                                  to_dtensor(_W, layout_of("[*,*]", MESH_2X2)))
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == tuple(e.shape)
        assert_values_equal(e.numpy(), reassemble(a))
    assert dtensor.fetch_layout(actual[1]) == layout  # the gradient of xs stays sharded


def test_from_tensor_gathers_a_sharded_leading_axis():
    fn = tf.function(lambda xs: tf.TensorArray(tf.float32, size=_T).unstack(xs).read(2))
    actual = run_without_fallback(fn, to_dtensor(_XS, layout_of("[x,y,*]", MESH_2X2)))
    assert_dtensor_equal(_XS[2], layout_of("[y,*]", MESH_2X2), actual)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_push_back_pop_back_and_length(in_function):
    def fn(x):
        handle = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([_B, _D]),
                                            max_num_elements=-1, element_dtype=tf.float32)
        handle = tf.raw_ops.TensorListPushBack(input_handle=handle, tensor=x)
        handle = tf.raw_ops.TensorListPushBack(input_handle=handle, tensor=2.0 * x)
        length = tf.raw_ops.TensorListLength(input_handle=handle)
        handle, last = tf.raw_ops.TensorListPopBack(input_handle=handle,
                                                    element_shape=tf.constant([_B, _D]),
                                                    element_dtype=tf.float32)
        return last * tf.cast(length, tf.float32)

    x = _XS[0]
    layout = layout_of("[x,y]", MESH_2X2)
    run = tf.function(fn) if in_function else fn
    with dtensor.run_on(MESH_2X2):  # the list is made on the mesh eagerly too
        actual = run_without_fallback(run, to_dtensor(x, layout))
    assert_dtensor_equal(fn(tf.constant(x)), layout, actual)


def test_gather_scatter_concat_split():
    @tf.function
    def fn(xs, rows):
        lst = tf.raw_ops.TensorListScatterV2(tensor=xs, indices=tf.constant([2, 0, 1, 4, 3]),
                                             element_shape=tf.constant([_B, _D]),
                                             num_elements=_T)
        gathered = tf.raw_ops.TensorListGather(input_handle=lst, indices=tf.constant([4, 1]),
                                               element_shape=tf.constant([_B, _D]),
                                               element_dtype=tf.float32)
        parts = tf.raw_ops.TensorListSplit(tensor=rows,
                                           element_shape=tf.constant([-1, 4]),
                                           lengths=tf.constant([8, 12], tf.int64))
        joined, _ = tf.raw_ops.TensorListConcatV2(
            input_handle=parts, element_shape=tf.constant([-1, 4]),
            leading_dims=tf.constant([], tf.int64), element_dtype=tf.float32)
        return gathered, joined

    # Elements of uneven blocks (3 features over y=2) and of even ones.
    layout = layout_of("[*,*,y]", MESH_2X2)
    rows = random_array((20, 4), seed=33)
    gathered, joined = run_without_fallback(fn, to_dtensor(_XS, layout),
                                            to_dtensor(rows, layout_of("[x,y]", MESH_2X2)))
    expected = fn(tf.constant(_XS), tf.constant(rows))
    assert_dtensor_equal(expected[0], layout, gathered)
    assert_dtensor_equal(expected[1], layout_of("[*,y]", MESH_2X2), joined)


_SEQ = random_array((5, 8), seed=34)


def _loop_over_rows(kind, xs, w):
    """tf.scan, tf.map_fn or a TensorArray loop over the rows of xs, each step using the
    captured weight w (a vector [8] or a matrix [8,8])."""
    def step(h, x):
        return tf.tanh((h * w if len(w.shape) == 1 else tf.linalg.matvec(w, h)) + x)

    if kind == "scan":
        return tf.scan(step, xs, initializer=tf.zeros([8]))
    if kind == "map_fn":
        return tf.map_fn(lambda x: step(x, x), xs)
    rows = tf.TensorArray(tf.float32, size=5).unstack(xs)
    out = tf.TensorArray(tf.float32, size=5)

    def body(t, h, out):
        h = step(h, rows.read(t))
        return t + 1, h, out.write(t, h)

    _, _, out = tf.while_loop(lambda t, *_: t < 5, body, (0, tf.zeros([8]), out))
    return out.stack()


@pytest.mark.parametrize("lowering", ["", "ops"], ids=["auto", "ops"])
@pytest.mark.parametrize("spec", ["[x]", "[*,x]"])
@pytest.mark.parametrize("kind", ["scan", "map_fn", "tensor_array"])
def test_loop_gradients_with_a_sharded_captured_weight(kind, spec, lowering):
    # The gradient loop sums the gradient of the list of rows it reads (zeros like the
    # rows: replicated elements of [8]) and each step's gradient rows (sharded by the
    # weight: blocks of [1]): AddN of two lists whose elements are laid out differently.
    value = _W8 if spec == "[*,x]" else _W8[0]

    def make(w):
        @tf.function
        def loss_and_grads(xs):
            with tf.GradientTape() as tape:
                tape.watch(xs)
                loss = tf.reduce_sum(_loop_over_rows(kind, xs, w) ** 2)
            return (loss, *tape.gradient(loss, [w, xs]))
        return loss_and_grads

    expected = make(tf.Variable(value))(tf.constant(_SEQ))
    w = dtensor.DVariable(to_dtensor(value, layout_of(spec, MESH_8)))
    with collective_lowering(lowering):
        actual = run_without_fallback(make(w), to_dtensor(_SEQ, layout_of("[*,*]", MESH_8)))
    for e, a in zip(expected, actual):
        assert tuple(a.shape) == tuple(e.shape)
        assert_values_equal(e.numpy(), reassemble(a))


@pytest.mark.parametrize("lowering", ["", "ops"], ids=["auto", "ops"])
@pytest.mark.parametrize("spec,joined", [("[x,*]", "[*,*]"), ("[*,x]", "[*,x]"),
                                         ("[x,*]@x=2", "[*,*]@x=2")],
                         ids=["[x,*]", "[*,x]", "[x,*]@x=2"])
def test_tensor_array_concat_in_a_function(spec, joined, lowering):
    # Elements sharded along the joined axis are gathered along it first (each device's
    # joined blocks would interleave the elements' rows); elements of differing lengths
    # (infer_shape=False) leave that size open.
    mesh = MESH_1D if spec.endswith("@x=2") else MESH_8
    spec, joined = spec.split("@")[0], joined.split("@")[0]
    xs = random_array((16, 8), seed=36)

    def concat(xs):
        equal = tf.TensorArray(tf.float32, size=3)

        def body(t, ta):
            return t + 1, ta.write(t, xs * tf.cast(t + 1, tf.float32))

        _, equal = tf.while_loop(lambda t, _: t < 3, body, (0, equal))
        unequal = tf.TensorArray(tf.float32, size=2, infer_shape=False)
        unequal = unequal.write(0, xs[:4]).write(1, 2.0 * xs[4:])
        return equal.concat(), unequal.concat()

    expected = tf.function(concat)(tf.constant(xs))
    with collective_lowering(lowering):
        actual = run_without_fallback(tf.function(concat), to_dtensor(xs, layout_of(spec, mesh)))
    assert_dtensor_equal(expected[0], layout_of(joined, mesh), actual[0])
    assert tuple(actual[1].shape) == tuple(expected[1].shape)
    assert_values_equal(expected[1].numpy(), reassemble(actual[1]))


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("rows,item,summed", [("[*,*,*]", "[x,*]", "[*,x,*]"),
                                              ("[*,x,*]", "[*,*]", "[*,x,*]"),
                                              ("[*,x,*]", "[*,y]", "[*,x,*]")],
                         ids=["[*,*,*]-[x,*]", "[*,x,*]-[*,*]", "[*,x,*]-[*,y]"])
def test_add_n_of_lists_gives_their_elements_one_layout(rows, item, summed, in_function):
    # The elements take the layout the others reach by slicing, else the first list's; the
    # reserved list's unset elements add as zeros.
    def fn(xs, x):
        rows_list = tf.raw_ops.TensorListFromTensor(tensor=xs, element_shape=-1)
        items = tf.raw_ops.TensorListReserve(element_shape=-1, num_elements=_T,
                                             element_dtype=tf.float32)
        items = tf.raw_ops.TensorListSetItem(input_handle=items, index=1, item=x)
        total = tf.raw_ops.AddN(inputs=[rows_list, items])
        return tf.raw_ops.TensorListStack(input_handle=total, element_shape=-1,
                                          element_dtype=tf.float32, num_elements=_T)

    fn = tf.function(fn) if in_function else fn
    expected = fn(tf.constant(_XS), tf.constant(_XS[0]))
    actual = run_without_fallback(fn, to_dtensor(_XS, layout_of(rows, MESH_2X2)),
                                  to_dtensor(_XS[0], layout_of(item, MESH_2X2)))
    assert_dtensor_equal(expected, layout_of(summed, MESH_2X2), actual)


# TensorListElementShape answers the element_shape the list was declared with, as one
# device does: -1 (a scalar) for an unknown rank, -1 sizes where unknown; it used to
# answer the elements' shape ([3] where one device says -1).
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("declared", [-1, [-1, -1], [-1, _D], [_B, -1], [_B, _D]],
                         ids=lambda d: "declared" + str(d).replace(" ", ""))
@pytest.mark.parametrize("spec", ["[*,x,y]", "[*,*,*]", "[*,*,x]"])
def test_element_shape_is_the_declared_one(spec, declared, in_function):
    def fn(xs):
        handle = tf.raw_ops.TensorListFromTensor(tensor=xs, element_shape=declared)
        return tf.raw_ops.TensorListElementShape(input_handle=handle, shape_type=tf.int32)

    # _XS is [5,4,3]: over x=2, y=2 its feature axis (3) is cut unevenly.
    expected = fn(tf.constant(_XS)).numpy()
    run = tf.function(fn) if in_function else fn
    actual = run_without_fallback(run, to_dtensor(_XS, layout_of(spec, MESH_2X2)))
    assert_dtensor_equal(expected, layout_of("[*]" if expected.ndim else "[]", MESH_2X2),
                         actual)
    assert actual.dtype == tf.int32
