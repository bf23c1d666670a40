"""The fuzzer's op table, continued: model ops (batch normalisation, N-d gathers and
scatters, data-dependent shapes, TensorLists).

Imported by fuzz_ops.py after `op` is defined; see there for how an entry is written.
Resource and copy-on-read ops are in `EXCLUDED` below (merged into fuzz_ops.EXCLUDED),
each with the test that covers it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dtensor_testing import TEST_DEVICE
from fuzz_engine import FLOATS, H, T, V, Call, Drawer
from fuzz_ops import INTS, NUMBERS, OPS, op

# ---------------------------------------------------------------------------------------
# Batch normalisation
# ---------------------------------------------------------------------------------------

_BATCH_NORMS = {"FusedBatchNorm": tf.raw_ops.FusedBatchNorm,
                "FusedBatchNormV2": tf.raw_ops.FusedBatchNormV2,
                "FusedBatchNormV3": tf.raw_ops.FusedBatchNormV3}
# y, batch_mean, batch_variance; the reserve spaces are implementation-defined (on CPU the
# batch mean and biased variance, on GPU the inverse deviation and a workspace).
_BN_VALUES = (0, 1, 2)
# In inference TF's GPU kernel leaves batch_mean and batch_variance unwritten (on an H200
# they held the previous op's values): only y is defined there.
_BN_INFERENCE_GPU_VALUES = (0,)
# The gradients' reserve_space_4/5 are unused placeholders.
_BN_GRAD_VALUES = (0, 1, 2)


def _batch_norm(d: Drawer, v3: bool):
    """(x, scale, offset, mean, variance, attrs) for a float32 batch norm (the only dtype
    of TF's CPU kernels for x and the statistics together); 5-D only for V3 (TF's other
    kernels take NHWC and NCHW only)."""
    five = v3 and d.int(0, 4) == 0
    layout = d.choice(["NDHWC", "NCDHW"] if five else ["NHWC", "NCHW"])
    channels = d.size(1, 5)
    spatial = [d.size(1, 4) for _ in range(len(layout) - 2)]
    batch = d.size(1, 4)
    shape = ([batch, channels] + spatial if layout[1] == "C" else [batch] + spatial + [channels])
    training = d.bool()
    attrs = {"data_format": layout, "is_training": training,
             "epsilon": d.choice([0.001, 0.1, 1e-5])}
    if training and d.bool():
        attrs["exponential_avg_factor"] = d.choice([0.5, 0.1])
    # Training without running statistics passes them empty.
    empty = training and attrs.get("exponential_avg_factor", 1.0) == 1.0 and d.bool()
    stats = (0,) if empty else (channels,)
    x = d.array(shape, tf.float32, -2, 2)
    scale = d.array((channels,), tf.float32, 0.5, 2)
    offset = d.array((channels,), tf.float32)
    mean = d.array(stats, tf.float32, -1, 1)
    variance = d.array(stats, tf.float32, 0.5, 2)
    return x, scale, offset, mean, variance, attrs


for _name in _BATCH_NORMS:
    @op(_name)
    def _(d, _name=_name):
        x, scale, offset, mean, variance, attrs = _batch_norm(d, _name.endswith("V3"))
        if _name == "FusedBatchNorm":
            attrs.pop("exponential_avg_factor", None)   # V1 has no such attribute
            if attrs["is_training"] and mean.size == 0:
                mean, variance = (np.zeros(scale.shape, np.float32),
                                  np.ones(scale.shape, np.float32))
        compare = (_BN_INFERENCE_GPU_VALUES if TEST_DEVICE == "GPU" and not attrs["is_training"]
                   else _BN_VALUES)
        return Call([T(x), T(scale), T(offset), T(mean), T(variance)], attrs, tol=1e-4,
                    compare=compare)


for _name, _forward in (("FusedBatchNormGrad", "FusedBatchNorm"),
                        ("FusedBatchNormGradV2", "FusedBatchNormV2"),
                        ("FusedBatchNormGradV3", "FusedBatchNormV3")):
    @op(_name, grad=False)
    def _(d, _forward=_forward):
        x, scale, offset, mean, variance, attrs = _batch_norm(d, _forward.endswith("V3"))
        attrs.pop("exponential_avg_factor", None)
        if attrs["data_format"] == "NCDHW":
            attrs["is_training"] = True   # TF's CPU inference gradient refuses NCDHW
        if mean.size == 0:
            mean, variance = (np.zeros(scale.shape, np.float32), np.ones(scale.shape, np.float32))
        outputs = _BATCH_NORMS[_forward](x=x, scale=scale, offset=offset, mean=mean,
                                         variance=variance, **attrs)
        # As TF's gradient does: the forward's reserve spaces in training, the population
        # statistics in inference.
        if attrs["is_training"]:
            reserve = [outputs.reserve_space_1.numpy(), outputs.reserve_space_2.numpy()]
        else:
            reserve = [mean, variance]
        args = [T(d.array(x.shape, tf.float32)), T(x), T(scale)] + [T(r) for r in reserve]
        if _forward == "FusedBatchNormV3":
            args.append(T(outputs.reserve_space_3.numpy()))
        return Call(args, attrs, tol=1e-4, compare=_BN_GRAD_VALUES)


# ---------------------------------------------------------------------------------------
# N-d gathers and scatters
# ---------------------------------------------------------------------------------------

def _nd_indices(d: Drawer, shape, unique: bool = False, min_batch_rank: int = 1):
    """Indices [..., k] into the first k axes of `shape` (k >= 1); with `unique` no index
    repeats (a batch of at most the number of distinct indices). The scatters want a
    batch axis (TF refuses rank-0 updates), and so does GatherNd's gradient."""
    k = d.int(1, len(shape))
    batch = list(d.shape(min_batch_rank, 2, high=4))
    dtype = d.dtype(INTS)
    if not unique:
        columns = [d.array(batch, dtype, 0, s - 1) for s in shape[:k]]
        return np.stack(columns, axis=-1).astype(dtype.as_numpy_dtype).reshape(batch + [k])
    space = int(np.prod(shape[:k]))
    count = min(int(np.prod(batch)), space)
    flat = np.asarray(d.permutation(space)[:count])
    batch = [count]
    return np.stack(np.unravel_index(flat, shape[:k]), axis=-1).astype(
        dtype.as_numpy_dtype).reshape(batch + [k])


# Empty blocks included: TensorFlow's GatherNd and TensorScatter* kernels refuse an empty
# params / tensor when there are indices, so the rules read an axis whole where a device's
# block would be empty (FactorsWithoutEmptyBlocks).


@op("GatherNd")
def _(d):
    params = d.array(d.shape(1, 4, high=5), d.dtype(NUMBERS))
    indices = _nd_indices(d, params.shape, min_batch_rank=0)
    return Call([T(params), T(indices)], grad=indices.ndim > 1)


def _updates(d: Drawer, indices, shape, dtype):
    k = indices.shape[-1]
    return d.array(tuple(indices.shape[:-1]) + tuple(shape[k:]), dtype)


@op("ScatterNd")
def _(d):
    shape, dtype = d.shape(1, 3, high=5), d.dtype(NUMBERS)
    indices = _nd_indices(d, shape)
    return Call([T(indices), T(_updates(d, indices, shape, dtype)),
                 H(list(shape), indices.dtype)])


for _name in ("TensorScatterAdd", "TensorScatterSub", "TensorScatterMax", "TensorScatterMin",
              "TensorScatterUpdate"):
    # Update with a repeated index keeps one of the updates, which one is undefined: the
    # indices of an update are distinct.
    @op(_name)
    def _(d, _unique=_name == "TensorScatterUpdate"):
        tensor = d.array(d.shape(1, 3, high=5), d.dtype(NUMBERS))
        indices = _nd_indices(d, tensor.shape, unique=_unique)
        # Empty blocks included: a slice axis that would leave a device an empty block is
        # read whole (FactorsWithoutEmptyBlocks).
        return Call([T(tensor), T(indices), T(_updates(d, indices, tensor.shape, tensor.dtype))])


@op("SparseTensorDenseMatMul")
def _(d):
    # a (a_shape, stored transposed with adjoint_a) times b ([n,k] with adjoint_b); the
    # nonzeros are distinct positions in any order, possibly none.
    a_shape = [d.size(1, 6), d.size(1, 6)]
    count = d.int(0, a_shape[0] * a_shape[1])
    flat = np.asarray(d.permutation(a_shape[0] * a_shape[1])[:count], np.int64)
    indices = np.stack(np.unravel_index(flat, a_shape), axis=-1).reshape(count, 2)
    dtype, index_type = d.dtype(FLOATS + (tf.int32, tf.complex64)), d.dtype((tf.int32, tf.int64))
    adjoint_a, adjoint_b = d.bool(), d.bool()
    k, n = a_shape[0] if adjoint_a else a_shape[1], d.size(1, 6)
    b = d.array((n, k) if adjoint_b else (k, n), dtype)
    return Call([T(indices.astype(index_type.as_numpy_dtype)), T(d.array((count,), dtype)),
                 H(a_shape, tf.int64), T(b)], {"adjoint_a": adjoint_a, "adjoint_b": adjoint_b})


def _sparse_operand(d: Drawer, dtype: tf.DType, shape=None):
    """(indices [nnz, R] int64, values [nnz], dense shape) of a SparseTensor of rank 1 to 3
    (or of `shape`): distinct positions in canonical order, possibly none."""
    shape = list(d.shape(1, 3, high=5)) if shape is None else shape
    count = d.int(0, int(np.prod(shape)))
    flat = np.sort(np.asarray(d.permutation(int(np.prod(shape)))[:count], np.int64))
    indices = np.stack(np.unravel_index(flat, shape), axis=-1).reshape(count, len(shape))
    return indices.astype(np.int64), d.array((count,), dtype), shape


for _name in ("SparseDenseCwiseAdd", "SparseDenseCwiseDiv", "SparseDenseCwiseMul"):
    # TensorFlow has no gradient for SparseDenseCwiseAdd.
    @op(_name, grad=_name != "SparseDenseCwiseAdd")
    def _(d, _div=_name == "SparseDenseCwiseDiv"):
        dtype = d.dtype()
        indices, values, shape = _sparse_operand(d, dtype)
        # The dense operand broadcasts to the sparse shape: a suffix of it, axes of 1 too.
        dense_shape = [s if d.bool() else 1 for s in shape[len(shape) - d.int(0, len(shape)):]]
        dense = d.array(dense_shape, dtype, 1, 2) if _div else d.array(dense_shape, dtype)
        return Call([T(indices), T(values), H(shape, tf.int64), T(dense)])


for _name in ("SparseReduceMax", "SparseReduceSum"):
    # TensorFlow has no gradient for SparseReduceMax.
    @op(_name, grad=_name == "SparseReduceSum")
    def _(d):
        indices, values, shape = _sparse_operand(d, d.dtype(FLOATS + (tf.int32,)))
        axes = [a - len(shape) if d.bool() else a
                for a in d.permutation(len(shape))[:d.int(0, len(shape))]]
        return Call([T(indices), T(values), H(shape, tf.int64), H(axes, tf.int32)],
                    {"keep_dims": d.bool()})


@op("SparseAdd")
def _(d):
    dtype = d.dtype()
    a_indices, a_values, shape = _sparse_operand(d, dtype)
    b_indices, b_values, _ = _sparse_operand(d, dtype, shape)
    # Sums below thresh in magnitude are dropped (0: none).
    thresh = np.asarray(d.choice([0.0, 0.5]), dtype.as_numpy_dtype)
    return Call([T(a_indices), T(a_values), H(shape, tf.int64), T(b_indices), T(b_values),
                 H(shape, tf.int64), T(thresh)])


@op("SparseAddGrad", grad=False)
def _(d):
    dtype = d.dtype()
    a_indices, a_values, shape = _sparse_operand(d, dtype)
    b_indices, b_values, _ = _sparse_operand(d, dtype, shape)
    total = tf.sparse.add(tf.SparseTensor(a_indices, a_values, shape),
                          tf.SparseTensor(b_indices, b_values, shape))
    grad = d.array((int(total.indices.shape[0]),), dtype)
    return Call([T(grad), T(a_indices), T(b_indices), T(total.indices.numpy())])


@op("SparseTensorDenseAdd")
def _(d):
    dtype = d.dtype(FLOATS + (tf.int32, tf.complex64))
    indices, values, shape = _sparse_operand(d, dtype)
    return Call([T(indices), T(values), H(shape, tf.int64), T(d.array(shape, dtype))])


@op("SparseToDense")
def _(d):
    shape = d.shape(1, 3, high=5)
    space = int(np.prod(shape))
    count = d.int(0, space)
    # validate_indices (the default) wants sorted, distinct indices.
    flat = np.sort(np.asarray(d.permutation(space)[:count], np.int64))
    dtype, index_type = d.dtype(NUMBERS), d.dtype(INTS)
    indices = np.stack(np.unravel_index(flat, shape), axis=-1).reshape(count, len(shape))
    if len(shape) == 1 and d.bool():
        indices = indices.reshape(count)     # a vector of indices into a vector
    values = d.array((count,), dtype) if d.bool() else d.array((), dtype)
    return Call([T(indices.astype(index_type.as_numpy_dtype)), H(list(shape), index_type),
                 T(values), T(d.array((), dtype))], grad=False)


# ---------------------------------------------------------------------------------------
# Resource ops on a variable (`V`): the engine makes a tf.Variable and a DVariable in a
# drawn layout (uneven ones too), runs the op on each eagerly and inside tf.function, and
# compares the outputs and the variable's value (and layout) afterwards.
# ---------------------------------------------------------------------------------------

def _variable(d: Drawer, dtypes=NUMBERS, min_rank: int = 1, low: float = -2.0,
              high: float = 2.0) -> np.ndarray:
    return d.array(d.shape(min_rank, 3, high=5), d.dtype(dtypes), low, high)


def _row_indices(d: Drawer, rows: int, unique: bool = False) -> np.ndarray:
    """Indices into axis 0 of `rows` rows, of rank 0 to 2; distinct with `unique`."""
    dtype = d.dtype(INTS[:2])
    if unique:
        count = d.int(0, rows)
        return np.asarray(d.permutation(rows)[:count]).astype(dtype.as_numpy_dtype)
    return d.array(d.shape(0, 2, high=4), dtype, 0, rows - 1)


@op("ResourceGather", grad=False)
def _(d):
    value = _variable(d)
    return Call([V(value), T(_row_indices(d, value.shape[0]))], {"dtype": tf.as_dtype(value.dtype)})


@op("ResourceGatherNd", grad=False)
def _(d):
    value = _variable(d)
    return Call([V(value), T(_nd_indices(d, value.shape, min_batch_rank=0))],
                {"dtype": tf.as_dtype(value.dtype)})


# Update with a repeated index keeps one of the updates, which one is undefined: its
# indices are distinct. Mul and Div multiply and divide by updates away from zero.
for _name in ("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
              "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
              "ResourceScatterUpdate"):
    @op(_name, grad=False)
    def _(d, _name=_name):
        scales = _name in ("ResourceScatterMul", "ResourceScatterDiv")
        value = _variable(d, FLOATS if scales else NUMBERS)
        indices = _row_indices(d, value.shape[0], unique=_name == "ResourceScatterUpdate")
        shape = indices.shape + value.shape[1:]
        updates = (d.array(shape, value.dtype, 0.5, 2.0) * np.where(
            d.array(shape, tf.bool), 1, -1).astype(value.dtype)) if scales else d.array(
                shape, value.dtype)
        return Call([V(value), T(indices), T(updates)])


for _name in ("ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdMin",
              "ResourceScatterNdMax", "ResourceScatterNdUpdate"):
    @op(_name, grad=False)
    def _(d, _unique=_name == "ResourceScatterNdUpdate"):
        value = _variable(d)
        indices = _nd_indices(d, value.shape, unique=_unique)
        return Call([V(value), T(indices), T(_updates(d, indices, value.shape, value.dtype))])


@op("ResourceStridedSliceAssign", grad=False)
def _(d):
    value = _variable(d)
    # Bounds anywhere in [-size, size] (negative ones count from the end), strides either
    # way; the slice may be empty. The assigned value has the slice's shape.
    begin = [d.int(-s, s) for s in value.shape]
    end = [d.int(-s, s) for s in value.shape]
    strides = [d.choice([1, 2, -1, -2]) for _ in value.shape]
    shape = tf.raw_ops.StridedSlice(input=value, begin=begin, end=end, strides=strides).shape
    return Call([V(value), H(begin, tf.int32), H(end, tf.int32), H(strides, tf.int32),
                 T(d.array(shape, value.dtype))])


# ---------------------------------------------------------------------------------------
# Data-dependent output shapes
# ---------------------------------------------------------------------------------------

@op("Where", grad=False)
def _(d):
    dtype = d.dtype(NUMBERS + (tf.bool,))
    return Call([T(d.array(d.shape(1, 4), dtype, -1, 1))])


for _name, _v2 in (("Unique", False), ("UniqueV2", True), ("UniqueWithCounts", False),
                   ("UniqueWithCountsV2", True)):
    @op(_name, grad=False)
    def _(d, _v2=_v2):
        # Small integers (or rounded floats) so that values repeat.
        dtype = d.dtype(NUMBERS)
        x = np.round(d.array(d.shape(1, 3 if _v2 else 1, high=5), dtype, -2, 2))
        attrs = {"out_idx": d.dtype(INTS)}
        if not _v2:
            return Call([T(x.astype(dtype.as_numpy_dtype))], attrs)
        axis = d.axis(x.ndim)
        return Call([T(x.astype(dtype.as_numpy_dtype)), H([axis], d.dtype(INTS))], attrs)


# ---------------------------------------------------------------------------------------
# TensorLists: a list is a variant, so each entry runs a few list ops and compares the
# tensors that come out (`Call.composite`), without a layout claim.
# ---------------------------------------------------------------------------------------

_L = tf.raw_ops
_ANY = -1   # an element_shape of unknown rank


def _stack(handle, dtype):
    return _L.TensorListStack(input_handle=handle, element_shape=_ANY, element_dtype=dtype)


def _from_tensor(t):
    return _L.TensorListFromTensor(tensor=t, element_shape=_ANY)


def list_from_tensor(t):
    return [_stack(_from_tensor(t), t.dtype)]


def list_set_item(t, index, item):
    handle = _L.TensorListSetItem(input_handle=_from_tensor(t), index=index, item=item)
    return [_stack(handle, t.dtype)]


def list_get_item(t, index):
    return [_L.TensorListGetItem(input_handle=_from_tensor(t), index=index, element_shape=_ANY,
                                 element_dtype=t.dtype)]


def list_gather(t, indices):
    return [_L.TensorListGather(input_handle=_from_tensor(t), indices=indices,
                                element_shape=_ANY, element_dtype=t.dtype)]


def list_length(t):
    return [_L.TensorListLength(input_handle=_from_tensor(t))]


def list_element_shape(t, element_shape):
    """The element shape the list was declared with: -1 (an unknown rank), or sizes with
    -1 where unknown, whatever its elements' shape."""
    handle = _L.TensorListFromTensor(tensor=t, element_shape=element_shape)
    return [_L.TensorListElementShape(input_handle=handle, shape_type=tf.int32)]


def list_reserve_set_stack(a, b, num):
    """Reserve(num) -> SetItem(0, a), SetItem(num - 1, b) -> Stack (the rest zeros)."""
    handle = _L.TensorListReserve(element_shape=_ANY, num_elements=num, element_dtype=a.dtype)
    handle = _L.TensorListSetItem(input_handle=handle, index=0, item=a)
    handle = _L.TensorListSetItem(input_handle=handle, index=num - 1, item=b)
    return [_stack(handle, a.dtype)]


def list_push_pop(a, b):
    """Empty -> PushBack(a), PushBack(b) -> PopBack -> (the popped b, the stack of [a])."""
    handle = _L.EmptyTensorList(element_shape=_ANY, max_num_elements=-1, element_dtype=a.dtype)
    handle = _L.TensorListPushBack(input_handle=handle, tensor=a)
    handle = _L.TensorListPushBack(input_handle=handle, tensor=b)
    handle, popped = _L.TensorListPopBack(input_handle=handle, element_shape=_ANY,
                                          element_dtype=a.dtype)
    return [popped, _stack(handle, a.dtype)]


def list_resize(t, size):
    handle = _L.TensorListResize(input_handle=_from_tensor(t), size=size)
    return [_stack(handle, t.dtype)]


def list_scatter(t, indices):
    handle = _L.TensorListScatterV2(tensor=t, indices=indices, element_shape=_ANY,
                                    num_elements=-1)
    return [_stack(handle, t.dtype)]


def list_scatter_v1(t, indices):
    handle = _L.TensorListScatter(tensor=t, indices=indices, element_shape=_ANY)
    return [_stack(handle, t.dtype)]


def list_scatter_into(t, indices, updates):
    handle = _L.TensorListScatterIntoExistingList(input_handle=_from_tensor(t), tensor=updates,
                                                  indices=indices)
    return [_stack(handle, t.dtype)]


def list_split_concat(t, lengths):
    handle = _L.TensorListSplit(tensor=t, element_shape=_ANY, lengths=lengths)
    concat, _ = _L.TensorListConcatV2(input_handle=handle, element_shape=_ANY,
                                      leading_dims=tf.zeros([0], tf.int64),
                                      element_dtype=t.dtype)
    return [concat, _stack(_from_tensor(t), t.dtype)]


def _list_tensor(d: Drawer, min_rank: int = 1):
    return d.array(d.shape(min_rank, 3, high=5), d.dtype())


@op("TensorListFromTensor")
def _(d):
    return Call([T(_list_tensor(d))], composite=list_from_tensor)


@op("TensorListStack")
def _(d):
    return OPS["TensorListFromTensor"].draw(d)


@op("TensorListSetItem")
def _(d):
    t = _list_tensor(d)
    return Call([T(t), H(d.int(0, t.shape[0] - 1), tf.int32), T(d.array(t.shape[1:], t.dtype))],
                composite=list_set_item)


@op("TensorListGetItem")
def _(d):
    t = _list_tensor(d)
    return Call([T(t), H(d.int(0, t.shape[0] - 1), tf.int32)], composite=list_get_item)


@op("TensorListGather")
def _(d):
    t = _list_tensor(d)
    # Gathering no elements needs a fully known element shape, which the list lacks.
    indices = d.array((d.int(1, 4),), tf.int32, 0, t.shape[0] - 1)
    return Call([T(t), H(indices, tf.int32)], composite=list_gather)


@op("TensorListLength", grad=False)
def _(d):
    return Call([T(_list_tensor(d))], composite=list_length)


@op("TensorListElementShape", grad=False)
def _(d):
    t = _list_tensor(d)
    # Declared: an unknown rank, or the elements' rank with each size known or not.
    element_shape = (_ANY if d.int(0, 2) == 0 else
                     [s if d.bool() else -1 for s in t.shape[1:]])
    return Call([T(t), H(element_shape, tf.int32)], composite=list_element_shape)


for _name in ("TensorListReserve",):
    @op(_name)
    def _(d):
        shape, dtype = d.shape(0, 2, high=5), d.dtype()
        return Call([T(d.array(shape, dtype)), T(d.array(shape, dtype)),
                     H(d.int(1, 4), tf.int32)], composite=list_reserve_set_stack)


for _name in ("EmptyTensorList", "TensorListPushBack", "TensorListPopBack"):
    @op(_name)
    def _(d):
        shape, dtype = d.shape(0, 2, high=5), d.dtype()
        return Call([T(d.array(shape, dtype)), T(d.array(shape, dtype))],
                    composite=list_push_pop)


@op("TensorListResize")
def _(d):
    t = _list_tensor(d)
    return Call([T(t), H(d.int(1, t.shape[0]), tf.int32)], composite=list_resize)


def _distinct(d: Drawer, n: int, space: int):
    return np.asarray(d.permutation(space)[:n], np.int32)


@op("TensorListScatterV2")
def _(d):
    t = _list_tensor(d)
    return Call([T(t), H(_distinct(d, t.shape[0], t.shape[0] + d.int(0, 2)), tf.int32)],
                composite=list_scatter)


@op("TensorListScatter")
def _(d):
    t = _list_tensor(d)
    return Call([T(t), H(_distinct(d, t.shape[0], t.shape[0]), tf.int32)],
                composite=list_scatter_v1)


@op("TensorListScatterIntoExistingList")
def _(d):
    t = _list_tensor(d)
    n = d.int(0, t.shape[0])
    updates = d.array((n,) + t.shape[1:], t.dtype)
    return Call([T(t), H(_distinct(d, n, t.shape[0]), tf.int32), T(updates)],
                composite=list_scatter_into)


for _name in ("TensorListSplit", "TensorListConcatV2"):
    @op(_name)
    def _(d):
        t = _list_tensor(d)
        lengths, left = [], t.shape[0]
        while left:
            lengths.append(d.int(1, left))
            left -= lengths[-1]
        return Call([T(t), H(lengths, tf.int64)], composite=list_split_concat)


def optional_round_trip(t):
    """An optional of a list of t's rows and one of t itself, read back; whether each holds
    a value (OptionalNone's does not)."""
    of_list = _L.OptionalFromValue(components=[_from_tensor(t)])
    handle, = _L.OptionalGetValue(optional=of_list, output_types=[tf.variant],
                                  output_shapes=[[]])
    of_value = _L.OptionalFromValue(components=[t])
    value, = _L.OptionalGetValue(optional=of_value, output_types=[t.dtype],
                                 output_shapes=[t.shape])
    has = tf.stack([_L.OptionalHasValue(optional=of_list),
                    _L.OptionalHasValue(optional=_L.OptionalNone())])
    return [_stack(handle, t.dtype), value, tf.cast(has, tf.int32)]


for _name in ("OptionalFromValue", "OptionalGetValue", "OptionalHasValue", "OptionalNone"):
    @op(_name)
    def _(d):
        return Call([T(_list_tensor(d))], composite=optional_round_trip)


# ---------------------------------------------------------------------------------------
# Not fuzzed (merged into fuzz_ops.EXCLUDED)
# ---------------------------------------------------------------------------------------

EXCLUDED = {
    "DisableCopyOnRead": "a resource op on a variable's handle with no output; "
                         "tests/python/test_variable.py",
}
