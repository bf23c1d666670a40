"""Numerical checks of the index-tuple gathers and scatters (cc/rules/gather_rules.cc,
scatter_rules.cc): GatherNd, ScatterNd, TensorScatter{Update,Add,Sub,Max,Min} and
SparseToDense, every layout on 1-D and 2-D meshes (uneven included), eagerly, in
tf.function and through gradients, in strict mode.

    gather_nd(params [V,W,D] [*,*,y], indices [B,2] [x,*]) -> [x,y]
    tensor_scatter_add(t [V,D] [*,y], indices [B,1], updates [B,D]) -> [*,y]
    scatter_nd(indices [B,1] [x,*], updates [B,D] [x,y], shape) -> [*,y] +partial(x)
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout
from dtensor_testing import (MESH_1D, MESH_2X2, MESH_8, assert_dtensor_equal, assert_values_equal,
                             check_op, layout_of, layout_params, layouts_for, random_array,
                             reassemble, run_without_fallback, to_dtensor)

ND_INDICES = np.array([[4, 1], [0, 2], [4, 1], [3, 0]], np.int32)  # [4, 2], a duplicate
ROW_INDICES = np.array([[4], [0], [2], [0]], np.int32)            # [4, 1], a duplicate


def _uneven_params(*shapes, meshes=(MESH_1D, MESH_2X2)):
    import itertools
    params = []
    for mesh in meshes:
        for combo in itertools.product(*(layouts_for(mesh, s, uneven=True) for s in shapes)):
            ident = "-".join(l.short().split(" @ ")[0] for l in combo)
            params.append(pytest.param(combo, id=f"{ident}@{mesh.short()}"))
    return params


@pytest.mark.parametrize("layouts", _uneven_params((5, 3, 2), (4, 2)))
def test_gather_nd_every_layout(layouts):
    check_op(tf.gather_nd, "GatherNd", [random_array((5, 3, 2)), ND_INDICES], layouts)


@pytest.mark.parametrize("layouts", layout_params((5, 3), (2, 4, 1), meshes=[MESH_2X2]))
def test_gather_nd_batched_indices(layouts):
    indices = np.array([[[4], [0], [1], [4]], [[2], [2], [3], [0]]], np.int32)
    check_op(tf.gather_nd, "GatherNd", [random_array((5, 3)), indices], layouts)


TENSOR_SCATTERS = {
    "TensorScatterUpdate": tf.tensor_scatter_nd_update,
    "TensorScatterAdd": tf.tensor_scatter_nd_add,
    "TensorScatterSub": tf.tensor_scatter_nd_sub,
    "TensorScatterMax": tf.tensor_scatter_nd_max,
    "TensorScatterMin": tf.tensor_scatter_nd_min,
}
# Update with distinct rows: duplicates leave the winner undefined.
DISTINCT_ROWS = np.array([[4], [0], [2]], np.int32)


def _check_tensor_scatter(op_name, layouts):
    check_op(TENSOR_SCATTERS[op_name], op_name,
             [random_array((5, 3), seed=1), DISTINCT_ROWS, random_array((3, 3), seed=2)], layouts)


@pytest.mark.parametrize("layouts", _uneven_params((5, 3), (3, 1), (3, 3)))
def test_tensor_scatter_add_every_layout(layouts):
    _check_tensor_scatter("TensorScatterAdd", layouts)


# The other four share TensorScatterAdd's factor rule: every layout on the 1-D mesh.
@pytest.mark.parametrize("op_name", sorted(set(TENSOR_SCATTERS) - {"TensorScatterAdd"}))
@pytest.mark.parametrize("layouts", _uneven_params((5, 3), (3, 1), (3, 3), meshes=[MESH_1D]))
def test_tensor_scatter_every_layout(op_name, layouts):
    _check_tensor_scatter(op_name, layouts)


@pytest.mark.parametrize("op_name", sorted(TENSOR_SCATTERS))
def test_tensor_scatter_with_empty_column_blocks(op_name):
    # 3 columns over 8 devices: five hold no column. TF refuses updates into an empty
    # tensor ("Indices and updates specified for empty input"), so the columns are read
    # whole; they used to stay sharded and the op failed on those devices.
    _check_tensor_scatter(op_name, [layout_of(s, MESH_8) for s in ("[*,x]", "[*,*]", "[*,x]")])


@pytest.mark.parametrize("op_name", ["TensorScatterAdd", "TensorScatterUpdate"])
def test_tensor_scatter_in_function_with_element_indices(op_name, mesh_2x2):
    fn = tf.function(TENSOR_SCATTERS[op_name])
    indices = np.array([[4, 1], [0, 2], [3, 0]], np.int32)  # element indices: updates [3]
    for specs in [("[x,y]", "[*,*]", "[x]"), ("[*,y]", "[y,*]", "[*]")]:
        check_op(fn, op_name, [random_array((5, 3)), indices, random_array((3,))],
                 [layout_of(s, mesh_2x2) for s in specs])


@pytest.mark.parametrize("layouts", _uneven_params((4, 1), (4, 3)))
def test_scatter_nd_every_layout(layouts):
    shape = np.array([5, 3], np.int32)
    check_op(lambda i, u: tf.scatter_nd(i, u, shape), "ScatterNd",
             [ROW_INDICES, random_array((4, 3))], layouts, host_inputs=[((2,), [5, 3])])


def test_scatter_nd_in_function_keeps_the_slice_axis_sharded(mesh_2x2):
    fn = tf.function(lambda i, u: tf.scatter_nd(i, u, [5, 4]))
    out = check_op(fn, "ScatterNd", [ROW_INDICES, random_array((4, 4))],
                   [layout_of("[x,*]", mesh_2x2), layout_of("[x,y]", mesh_2x2)],
                   host_inputs=[((2,), [5, 4])])
    assert out.shape == (5, 4)


@pytest.mark.parametrize("layouts", layout_params((3, 2), (3,)))
def test_sparse_to_dense(layouts):
    # SparseToDense(indices, output_shape, values, default_value): its host inputs sit
    # between the data inputs, which check_op's plan cannot say; explain needs all four.
    indices = np.array([[0, 1], [2, 0], [3, 1]], np.int64)
    values = random_array((3,))
    fn = lambda i, v: tf.sparse.to_dense(tf.SparseTensor(i, v, [4, 2]))  # noqa: E731
    expected = fn(tf.constant(indices), tf.constant(values)).numpy()
    actual = run_without_fallback(fn, to_dtensor(indices, layouts[0]),
                                  to_dtensor(values, layouts[1]))
    plan = tf_dtensor.debug.explain("SparseToDense", [layouts[0], None, layouts[1], None],
                                    [[3, 2], [2], [3], []])
    # The output is replicated (an empty plan: replicated whatever the rank).
    assert plan["outputs"] == []
    assert_dtensor_equal(expected, Layout.replicated(layouts[0].mesh, 2), actual)


@pytest.mark.parametrize("op_name, layouts, shapes, host, want, collectives", [
    ("GatherNd", ["[*,*,y]", "[x,*]"], [[5, 3, 2], [4, 2]], {}, "[x,y]", []),
    ("GatherNd", ["[x,*,y]", "[*,*]"], [[5, 3, 2], [4, 2]], {}, "[*,y]",
     ["input 0: all-gather axis 0 [x,*,y] -> [*,*,y]"]),
    ("ScatterNd", ["[x,*]", "[x,y]", None], [[4, 1], [4, 3], [2]], {2: [5, 4]}, "[*,y]",
     ["all-reduce(sum) of output 0 over x"]),
    ("TensorScatterAdd", ["[*,y]", "[*,*]", "[*,y]"], [[5, 4], [3, 1], [3, 4]], {}, "[*,y]", []),
])
def test_plans(op_name, layouts, shapes, host, want, collectives, mesh_2x2):
    # Slice axes keep their sharding; indexed axes are read whole; ScatterNd's index axes
    # are contracted (partial sums).
    plan = tf_dtensor.debug.explain(op_name, [layout_of(l, mesh_2x2) if l else None
                                              for l in layouts], shapes, int_values=host)
    assert plan["outputs"][0] == layout_of(want, mesh_2x2)
    assert plan["collectives"] == collectives


# ---------------------------------------------------------------------------------------
# Gradients, eagerly and in tf.function
# ---------------------------------------------------------------------------------------

def _grads(fn, *args):
    with tf.GradientTape() as tape:
        tape.watch([a for a in args if a.dtype.is_floating])
        y = tf.reduce_sum(tf.square(fn(*args)))
    return tape.gradient(y, [a for a in args if a.dtype.is_floating])


GRADIENT_CASES = {
    "gather_nd": (lambda p, i: tf.gather_nd(p, i), [random_array((5, 3, 2)), ND_INDICES],
                  [("[x,*,y]", "[*,*]"), ("[*,y,x]", "[x,*]"), ("[y,*,*]", "[y,*]")]),
    "scatter_nd": (lambda i, u: tf.scatter_nd(i, u, [5, 3]),
                   [ROW_INDICES, random_array((4, 3))],
                   [("[x,*]", "[x,y]"), ("[*,*]", "[*,y]"), ("[y,*]", "[*,x]")]),
    "tensor_scatter_add": (lambda t, i, u: tf.tensor_scatter_nd_add(t, i, u),
                           [random_array((5, 3)), DISTINCT_ROWS, random_array((3, 3))],
                           [("[x,y]", "[*,*]", "[*,y]"), ("[*,x]", "[y,*]", "[y,x]")]),
    "tensor_scatter_update": (lambda t, i, u: tf.tensor_scatter_nd_update(t, i, u),
                              [random_array((5, 3)), DISTINCT_ROWS, random_array((3, 3))],
                              [("[x,y]", "[*,*]", "[*,y]"), ("[*,x]", "[y,*]", "[y,x]")]),
    "tensor_scatter_max": (lambda t, i, u: tf.tensor_scatter_nd_max(t, i, u),
                           [random_array((5, 3)), DISTINCT_ROWS, random_array((3, 3), seed=3)],
                           [("[x,y]", "[*,*]", "[*,y]"), ("[*,x]", "[y,*]", "[y,x]")]),
}


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_match_one_device(case, in_function, mesh_2x2):
    fn, arrays, spec_cases = GRADIENT_CASES[case]
    grads = tf.function(lambda *a: _grads(fn, *a)) if in_function else (
        lambda *a: _grads(fn, *a))
    expected = [g.numpy() for g in _grads(fn, *[tf.constant(a) for a in arrays])]
    for specs in spec_cases:
        inputs = [to_dtensor(a, layout_of(s, mesh_2x2)) for a, s in zip(arrays, specs)]
        actual = run_without_fallback(grads, *inputs)
        for e, a in zip(expected, actual):
            assert_values_equal(e, reassemble(tf.convert_to_tensor(a)), f"{case} {specs}")


# Found by the fuzzer: ScatterNd passed a sum pending on the indices to the output as if
# it were linear in them (indices [3,1] [*,*] +partial(x:sum) @ mesh(x=4) gave 4x the sum).
# It is linear in the updates only.
@pytest.mark.parametrize("pending", ["indices", "updates"])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_scatter_nd_pending_sums(pending, in_function, mesh_2x2):
    updates = random_array((4, 3))
    partial = Layout([UNSHARDED, UNSHARDED], mesh_2x2, partial={"y": "sum"})
    layouts = {"indices": [partial, layout_of("[x,*]", mesh_2x2)],
               "updates": [layout_of("[x,*]", mesh_2x2), partial]}[pending]
    fn = lambda i, u: tf.scatter_nd(i, u, [5, 3])  # noqa: E731
    if in_function:
        fn = tf.function(fn)
    out = run_without_fallback(fn, to_dtensor(ROW_INDICES, layouts[0]),
                               to_dtensor(updates, layouts[1]))
    assert_values_equal(tf.scatter_nd(ROW_INDICES, updates, [5, 3]).numpy(), reassemble(out))
