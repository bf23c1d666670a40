"""Programs of many ops for the differential fuzzer: where one op meets the next.

The op fuzzer (fuzz_engine.py) checks each rule alone. A program chains 3 to 10 ops
(elementwise with broadcasting, matmuls and einsums, reductions, transposes, reshapes,
concats, slices, gathers, scatters, softmax, cumulative sums, pads, tiles, normalisations,
convolutions, poolings, fused batch norm, resizes, stateless dropout and relayouts in the
middle of the program) over inputs laid out at random (sharded, uneven,
replicated, now and then partial), so the layout one op hands on is whatever the rule
before it produced, and inside `tf.function` the whole program's layouts are chosen
together (requests run back from the ops that read a value). Every output and the
gradient of a loss of them with respect to every input must match one plain device, in
value, dtype and global shape, eagerly and inside `tf.function`.

A program is drawn from a seed (`draw(seed)`), printed as readable Python by `describe`,
and run by `run` on plain tensors or DTensors alike.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from fuzz_engine import MESHES
from tf_dtensor import dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

SIZES = (1, 2, 3, 4, 4, 5, 6, 8, 8)
# Meshes that leave out the host's CPU:0, as a GPU mesh leaves out the host: the programs
# compiled with XLA (every fourth seed) run on them, under the lowerings that keep the
# host apart (on a mesh holding the host, tf_dtensor ignores jit_compile).
JIT_MESHES = [
    dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4, 8)]),
    dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4, 8)]),
    dtensor.create_mesh([("x", 2)], devices=["CPU:6", "CPU:7"]),
]


def compiled(seed: int) -> bool:
    """Whether the program of `seed` runs its tf.function with XLA: jit_compile=True, or
    (every other such seed, `auto_clustered`) tf.config.optimizer.set_jit."""
    return seed % 4 == 2


def auto_clustered(seed: int) -> bool:
    """Whether a compiled program asks for XLA by `tf.config.optimizer.set_jit
    ("autoclustering")` rather than `jit_compile`. CPUs cluster only under
    TF_XLA_FLAGS=--tf_xla_cpu_global_jit (tests/python/test_xla_clustering.py sets it in a
    process of its own), but TensorFlow's passes before the clustering run all the same:
    they pruned the unread devices' parts of a collective, and the program hung."""
    return seed % 16 in (10, 14)   # under the `ops` lowering and the `copies` (see the test)


@dataclasses.dataclass
class Step:
    """One value of a program: an input (`op == "input"`) or an op of earlier values."""
    op: str
    args: Tuple[int, ...] = ()
    params: dict = dataclasses.field(default_factory=dict)
    shape: Tuple[int, ...] = ()


@dataclasses.dataclass
class Program:
    seed: int
    dtype: tf.DType
    mesh: object
    steps: List[Step]
    outputs: List[int]
    layouts: List[Layout]            # one per input, in input order
    variables: List[bool]            # per input: a (D)Variable, updated after the gradient
    relayouts: dict                  # step index -> Layout of a "relayout" step

    @property
    def inputs(self) -> List[int]:
        return [i for i, s in enumerate(self.steps) if s.op == "input"]


# ---------------------------------------------------------------------------------------
# Running a program
# ---------------------------------------------------------------------------------------

_UNARY = {
    "tanh": tf.tanh, "relu": tf.nn.relu, "square": tf.square, "neg": tf.negative,
    "sigmoid": tf.sigmoid, "abs": tf.abs, "softplus": tf.nn.softplus, "sin": tf.sin,
    "gelu": tf.nn.gelu,
}
_BINARY = {"add": tf.add, "sub": tf.subtract, "mul": tf.multiply, "maximum": tf.maximum}
_REDUCE = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max,
           "min": tf.reduce_min}


def _apply(step: Step, a: List[tf.Tensor], relayout: Optional[Callable]):
    op, p = step.op, step.params
    if op in _UNARY:
        return _UNARY[op](a[0])
    if op in _BINARY:
        return _BINARY[op](a[0], a[1])
    if op == "matmul":
        return tf.matmul(a[0], a[1], transpose_a=p["ta"], transpose_b=p["tb"])
    if op == "einsum":
        return tf.einsum(p["equation"], a[0], a[1])
    if op in _REDUCE:
        return _REDUCE[op](a[0], axis=p["axis"], keepdims=p["keepdims"])
    if op == "transpose":
        return tf.transpose(a[0], p["perm"])
    if op == "reshape":
        return tf.reshape(a[0], p["to"])
    if op == "concat":
        return tf.concat([a[0], a[1]], axis=p["axis"])
    if op == "slice":
        index = [slice(None)] * len(a[0].shape)
        index[p["axis"]] = slice(p["begin"], p["end"], p["stride"])
        return a[0][tuple(index)]
    if op == "softmax":
        return tf.nn.softmax(a[0], axis=p["axis"])
    if op == "log_softmax":
        return tf.nn.log_softmax(a[0], axis=p["axis"])
    if op == "gather":
        return tf.gather(a[0], p["indices"], axis=p["axis"])
    if op == "expand_dims":
        return tf.expand_dims(a[0], p["axis"])
    if op == "squeeze":
        return tf.squeeze(a[0], p["axes"])
    if op == "cumsum":
        return tf.cumsum(a[0], axis=p["axis"], exclusive=p["exclusive"], reverse=p["reverse"])
    if op == "reverse":
        return tf.reverse(a[0], [p["axis"]])
    if op == "tile":
        return tf.tile(a[0], p["multiples"])
    if op == "pad":
        return tf.pad(a[0], p["paddings"])
    if op == "where":
        return tf.where(a[0] > a[1], a[0], a[1] * 0.5)
    if op == "normalize":   # layer norm over one axis, as models write it
        mean = tf.reduce_mean(a[0], axis=p["axis"], keepdims=True)
        centred = a[0] - mean
        variance = tf.reduce_mean(tf.square(centred), axis=p["axis"], keepdims=True)
        return centred * tf.math.rsqrt(variance + 0.5)
    if op == "broadcast_to":
        return tf.broadcast_to(a[0], p["shape"])
    if op == "relayout":
        return relayout(a[0]) if relayout is not None else tf.identity(a[0])
    if op == "split":
        return tf.split(a[0], p["pieces"], axis=p["axis"])[p["keep"]]
    if op == "unstack_stack":
        return tf.stack(tf.unstack(a[0], axis=p["axis"])[::-1], axis=p["to"])
    if op == "clip":
        return tf.clip_by_value(a[0], -0.5, 0.7)
    if op == "cast":   # through the other float type and back
        other = tf.float32 if a[0].dtype == tf.float64 else tf.float64
        return tf.cast(tf.cast(a[0], other), a[0].dtype)
    if op == "one_hot_argmax":   # x where it is largest along the axis, 0 elsewhere
        hot = tf.one_hot(tf.argmax(a[0], axis=p["axis"]), depth=a[0].shape[p["axis"]],
                         axis=p["axis"], dtype=a[0].dtype)
        return hot * a[0]
    if op == "top_k":
        return tf.math.top_k(a[0], k=p["k"]).values
    if op == "sort":
        return tf.sort(a[0], axis=p["axis"], direction=p["direction"])
    if op == "segment_sum":
        return tf.math.unsorted_segment_sum(a[0], p["ids"], p["segments"])
    if op == "cond":
        # max, not sum: a sum near 0 (of a normalised value) rounds to either side
        return tf.cond(tf.reduce_max(a[0]) > 0.3, lambda: tf.tanh(a[0]) * 2.0,
                       lambda: tf.square(a[0]) - 1.0)
    if op == "loop":   # the condition reads the value too: on a mesh, an all-reduce
        return tf.while_loop(lambda i, v: tf.logical_and(i < p["times"],
                                                         tf.reduce_max(tf.abs(v)) < 1e6),
                             lambda i, v: (i + 1, tf.tanh(v) * 0.9 + 0.1),
                             (tf.constant(0), a[0]))[1]
    if op == "conv2d":
        return tf.nn.conv2d(a[0], a[1], strides=p["strides"], padding=p["padding"])
    if op == "pool":
        pool = tf.nn.max_pool2d if p["kind"] == "max" else tf.nn.avg_pool2d
        return pool(a[0], p["window"], strides=p["strides"], padding=p["padding"])
    if op == "depthwise_conv2d":
        return tf.nn.depthwise_conv2d(a[0], a[1], [1, p["strides"], p["strides"], 1],
                                      p["padding"])
    if op == "batch_norm":   # fused, training
        return tf.compat.v1.nn.fused_batch_norm(*a, epsilon=0.5, is_training=True)[0]
    if op == "resize":
        return tf.cast(tf.image.resize(a[0], p["size"], method=p["method"]), a[0].dtype)
    if op == "embedding":
        return tf.nn.embedding_lookup(a[1], p["ids"])
    if op == "scatter_add":
        return tf.tensor_scatter_nd_add(a[0], [[r] for r in p["rows"]], a[1])
    if op == "dropout":   # a stateless mask of the value's global shape
        keep = tf.random.stateless_uniform(tf.shape(a[0]), [p["seed"], 7], dtype=a[0].dtype)
        return tf.where(keep > 0.3, a[0] / 0.7, tf.zeros_like(a[0]))
    if op == "nested_function":
        return _NESTED(a[0], a[1])
    raise ValueError(f"unknown program op {op!r}")


@tf.function
def _NESTED(a, b):   # a tf.function called inside the program (and inside its function)
    return tf.tanh(a) * b + a


def run(program: Program, inputs: Sequence[tf.Tensor], on_mesh: bool) -> List[tf.Tensor]:
    """The program's outputs for `inputs` (plain tensors, or DTensors when `on_mesh`)."""
    values: List[tf.Tensor] = []
    supplied = iter(inputs)
    for index, step in enumerate(program.steps):
        if step.op == "input":
            values.append(next(supplied))
            continue
        layout = program.relayouts.get(index)
        relayout = (lambda t, layout=layout: dtensor.relayout(t, layout)) if on_mesh else None
        values.append(_apply(step, [values[i] for i in step.args], relayout))
    return [values[i] for i in program.outputs]


def loss_of(outputs: Sequence[tf.Tensor]) -> tf.Tensor:
    """A scalar whose gradient reaches every output with values of its own (cos, not 1)."""
    return tf.add_n([tf.reduce_sum(tf.sin(o)) for o in outputs])


def describe(program: Program) -> str:
    """The program as Python a reader can run by hand."""
    lines = [f"seed {program.seed}, {program.dtype.name}, mesh "
             f"{dict(zip(program.mesh.dim_names, program.mesh.shape()))}"]
    layouts = iter(zip(program.layouts, program.variables))
    for i, s in enumerate(program.steps):
        shape = list(s.shape)
        if s.op == "input":
            layout, variable = next(layouts)
            kind = "variable" if variable else "input"
            lines.append(f"  v{i} = {kind} {shape} laid out {layout.short()}")
        elif s.op == "relayout":
            lines.append(f"  v{i} = relayout(v{s.args[0]}, {program.relayouts[i].short()})"
                         f"  # {shape}")
        else:
            args = ", ".join(f"v{a}" for a in s.args)
            params = ", ".join(f"{k}={v}" for k, v in s.params.items())
            lines.append(f"  v{i} = {s.op}({args}{', ' if params else ''}{params})  # {shape}")
    lines.append(f"  return {', '.join(f'v{o}' for o in program.outputs)}")
    if any(program.variables):
        lines.append("  then each variable -= 0.1 * its gradient")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Drawing a program
# ---------------------------------------------------------------------------------------

class _Drawer:
    def __init__(self, seed: int):
        self.rng = np.random.RandomState(seed)
        meshes = JIT_MESHES if compiled(seed) else MESHES
        self.mesh = meshes[self.rng.randint(len(meshes))]
        self.steps: List[Step] = []
        self.layouts: List[Layout] = []
        self.variables: List[bool] = []
        self.relayouts: dict = {}
        self.dtype = self.pick([tf.float32, tf.float64])

    def pick(self, options):
        return options[self.rng.randint(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.rand() < p

    def layout(self, shape: Sequence[int], partial_ok: bool) -> Layout:
        """Each axis sharded by an unused mesh dimension (even or not) or not at all."""
        free = list(self.mesh.dim_names)
        specs = []
        for _ in shape:
            spec = self.pick([UNSHARDED, UNSHARDED] + free) if free else UNSHARDED
            if spec != UNSHARDED:
                free.remove(spec)
            specs.append(spec)
        if partial_ok and free and self.chance(0.15):
            return Layout(specs, self.mesh, partial={self.pick(free): "sum"})
        return Layout(specs, self.mesh)

    def add(self, step: Step) -> int:
        self.steps.append(step)
        return len(self.steps) - 1

    def input(self, shape: Sequence[int], partial_ok: bool = True) -> int:
        variable = self.chance(0.3)
        self.layouts.append(self.layout(shape, partial_ok and not variable))
        self.variables.append(variable)
        return self.add(Step("input", shape=tuple(shape)))

    def operand(self, shape: Sequence[int]) -> int:
        """An earlier value of exactly `shape`, or a new input."""
        same = [i for i, s in enumerate(self.steps) if s.shape == tuple(shape)]
        if same and self.chance(0.5):
            return self.pick(same)
        return self.input(shape)

    def size(self) -> int:
        return int(self.pick(SIZES))


def _candidates(d: _Drawer, x: int) -> List[Tuple[str, Callable[[], Optional[int]]]]:
    """The ops that can take value `x`, each as a function that adds it (or None)."""
    shape = d.steps[x].shape
    rank = len(shape)
    out: List[Tuple[str, Callable[[], Optional[int]]]] = []

    def unary():
        return d.add(Step(d.pick(sorted(_UNARY)), (x,), shape=shape))
    out.append(("unary", unary))

    def binary():
        other = list(shape)
        for axis in range(rank):        # broadcast some axes of the second operand
            if d.chance(0.3):
                other[axis] = 1
        if rank and d.chance(0.2):
            other = other[d.rng.randint(rank + 1):]   # fewer leading axes
        y = d.operand(other)
        if d.chance(0.5):
            x_, y_ = x, y
        else:
            x_, y_ = y, x
        return d.add(Step(d.pick(sorted(_BINARY)), (x_, y_), shape=shape))
    out.append(("binary", binary))

    if rank == 2:
        def matmul():
            ta, tb = d.chance(0.25), d.chance(0.25)
            m, k = (shape[1], shape[0]) if ta else shape
            n = d.size()
            y = d.operand((n, k) if tb else (k, n))
            return d.add(Step("matmul", (x, y), {"ta": ta, "tb": tb}, shape=(m, n)))
        out.append(("matmul", matmul))
    if rank == 3:
        def batch_matmul():
            b, m, k = shape
            n = d.size()
            if d.chance(0.5):
                y = d.operand((b, k, n))
                return d.add(Step("einsum", (x, y), {"equation": "bmk,bkn->bmn"},
                                  shape=(b, m, n)))
            y = d.operand((k, n))
            return d.add(Step("einsum", (x, y), {"equation": "bmk,kn->bmn"}, shape=(b, m, n)))
        out.append(("matmul", batch_matmul))
    if rank >= 1:
        def reduce():
            axes = [a for a in range(rank) if d.chance(0.5)] or [d.rng.randint(rank)]
            keepdims = d.chance(0.5)
            new = tuple(1 if a in axes else s for a, s in enumerate(shape)) if keepdims else \
                tuple(s for a, s in enumerate(shape) if a not in axes)
            op = d.pick(sorted(_REDUCE))
            if 0 in shape and op in ("max", "min"):
                op = "sum"
            return d.add(Step(op, (x,), {"axis": axes, "keepdims": keepdims}, shape=new))
        out.append(("reduce", reduce))

        def concat():
            axis = d.rng.randint(rank)
            other = list(shape)
            other[axis] = d.size()
            y = d.operand(other)
            new = list(shape)
            new[axis] += other[axis]
            return d.add(Step("concat", (x, y), {"axis": axis}, shape=tuple(new)))
        out.append(("concat", concat))

        def slice_():
            axis = d.rng.randint(rank)
            size = shape[axis]
            begin = d.rng.randint(size) if size else 0
            end = d.rng.randint(begin, size + 1) if size else 0
            stride = d.pick([1, 1, 2])
            new = list(shape)
            new[axis] = len(range(begin, end, stride))
            return d.add(Step("slice", (x,), {"axis": axis, "begin": begin, "end": end,
                                              "stride": stride}, shape=tuple(new)))
        out.append(("slice", slice_))

        def softmax():
            return d.add(Step(d.pick(["softmax", "log_softmax"]), (x,),
                              {"axis": d.rng.randint(rank)}, shape=shape))
        if all(shape):
            out.append(("softmax", softmax))

        def gather():
            axis = d.rng.randint(rank)
            if not shape[axis]:
                return None
            indices = [int(i) for i in d.rng.randint(shape[axis], size=d.rng.randint(1, 6))]
            new = list(shape)
            new[axis] = len(indices)
            return d.add(Step("gather", (x,), {"indices": indices, "axis": axis},
                              shape=tuple(new)))
        out.append(("gather", gather))

        def cumsum():
            return d.add(Step("cumsum", (x,), {"axis": d.rng.randint(rank),
                                               "exclusive": d.chance(0.3),
                                               "reverse": d.chance(0.3)}, shape=shape))
        out.append(("cumsum", cumsum))

        def reverse():
            return d.add(Step("reverse", (x,), {"axis": d.rng.randint(rank)}, shape=shape))
        out.append(("reverse", reverse))

        def pad():
            paddings = [[int(d.rng.randint(3)), int(d.rng.randint(3))] if d.chance(0.5)
                        else [0, 0] for _ in range(rank)]
            new = tuple(s + p[0] + p[1] for s, p in zip(shape, paddings))
            return d.add(Step("pad", (x,), {"paddings": paddings}, shape=new))
        out.append(("pad", pad))

        def tile():
            multiples = [int(d.pick([1, 1, 2, 3])) for _ in range(rank)]
            new = tuple(s * m for s, m in zip(shape, multiples))
            return d.add(Step("tile", (x,), {"multiples": multiples}, shape=new))
        out.append(("tile", tile))

        def where():
            return d.add(Step("where", (x, d.operand(shape)), shape=shape))
        out.append(("where", where))

        def normalize():
            return d.add(Step("normalize", (x,), {"axis": d.rng.randint(rank)}, shape=shape))
        out.append(("normalize", normalize))

        def relayout():
            index = d.add(Step("relayout", (x,), shape=shape))
            d.relayouts[index] = d.layout(shape, partial_ok=False)
            return index
        out.append(("relayout", relayout))

        def split():
            axis = d.rng.randint(rank)
            divisors = [p for p in range(2, shape[axis] + 1) if shape[axis] % p == 0]
            if not divisors:
                return None
            pieces = d.pick(divisors)
            new = list(shape)
            new[axis] //= pieces
            return d.add(Step("split", (x,), {"pieces": pieces, "axis": axis,
                                              "keep": d.rng.randint(pieces)}, shape=tuple(new)))
        out.append(("split", split))

        def unstack_stack():
            axis, to = d.rng.randint(rank), d.rng.randint(rank)
            if not shape[axis]:
                return None
            rest = [s for a, s in enumerate(shape) if a != axis]
            new = tuple(rest[:to] + [shape[axis]] + rest[to:])
            return d.add(Step("unstack_stack", (x,), {"axis": axis, "to": to}, shape=new))
        out.append(("unstack_stack", unstack_stack))

        def simple():
            return d.add(Step(d.pick(["clip", "cast", "cond", "loop"]), (x,),
                              {"times": d.rng.randint(1, 4)}, shape=shape))
        out.append(("simple", simple))

        def one_hot_argmax():
            axis = d.rng.randint(rank)
            if not all(shape):
                return None
            return d.add(Step("one_hot_argmax", (x,), {"axis": axis}, shape=shape))
        out.append(("one_hot_argmax", one_hot_argmax))

        def top_k():
            if not all(shape):   # TopK's gradient fails on empty tensors (TF: Range delta 0)
                return None
            k = d.rng.randint(1, shape[-1] + 1)
            return d.add(Step("top_k", (x,), {"k": k}, shape=shape[:-1] + (k,)))
        out.append(("top_k", top_k))

        def sort():
            if not all(shape):   # sorts through TopK: as top_k
                return None
            return d.add(Step("sort", (x,), {"axis": d.rng.randint(rank),
                                             "direction": d.pick(["ASCENDING", "DESCENDING"])},
                              shape=shape))
        out.append(("sort", sort))

        def segment_sum():
            segments = d.rng.randint(1, 5)
            ids = np.asarray(d.rng.randint(segments, size=shape[0]), np.int32)
            return d.add(Step("segment_sum", (x,), {"ids": ids, "segments": segments},
                              shape=(segments,) + shape[1:]))
        out.append(("segment_sum", segment_sum))

        def nested():
            return d.add(Step("nested_function", (x, d.operand(shape)), shape=shape))
        out.append(("nested_function", nested))

        def embedding():   # x's last axis is the table's width; ids of another value's shape
            if not shape or rank != 2 or not shape[0]:
                return None
            ids_shape = tuple(d.size() for _ in range(d.rng.randint(1, 3)))
            ids = np.asarray(d.rng.randint(shape[0], size=ids_shape), np.int32)
            return d.add(Step("embedding", (x, x), {"ids": ids}, shape=ids_shape + shape[1:]))
        out.append(("embedding", embedding))

        def scatter_add():   # rows added at drawn indices (repeated ones add up)
            if not all(shape):   # TF refuses a scatter into an empty tensor
                return None
            rows = [int(i) for i in d.rng.randint(shape[0], size=d.rng.randint(1, 5))]
            y = d.operand((len(rows),) + shape[1:])
            return d.add(Step("scatter_add", (x, y), {"rows": rows}, shape=shape))
        out.append(("scatter_add", scatter_add))

        def dropout():
            return d.add(Step("dropout", (x,), {"seed": int(d.rng.randint(1000))}, shape=shape))
        out.append(("dropout", dropout))

    if rank == 4 and all(shape):
        def conv2d():
            kh, kw = d.rng.randint(1, 4), d.rng.randint(1, 4)
            strides, padding = int(d.pick([1, 1, 2])), d.pick(["SAME", "VALID"])
            if padding == "VALID" and (kh > shape[1] or kw > shape[2]):
                return None
            out_channels = d.size()
            w = d.operand((kh, kw, shape[3], out_channels))
            size = [(s + strides - 1) // strides if padding == "SAME" else
                    (s - k) // strides + 1 for s, k in ((shape[1], kh), (shape[2], kw))]
            return d.add(Step("conv2d", (x, w), {"strides": strides, "padding": padding},
                              shape=(shape[0], size[0], size[1], out_channels)))
        out.append(("conv2d", conv2d))

        def pool():
            window = int(d.rng.randint(1, 3))
            strides, padding = int(d.pick([1, 2])), d.pick(["SAME", "VALID"])
            if padding == "VALID" and window > min(shape[1], shape[2]):
                return None
            size = [(s + strides - 1) // strides if padding == "SAME" else
                    (s - window) // strides + 1 for s in shape[1:3]]
            return d.add(Step("pool", (x,), {"kind": d.pick(["max", "avg"]), "window": window,
                                             "strides": strides, "padding": padding},
                              shape=(shape[0], size[0], size[1], shape[3])))
        out.append(("pool", pool))

        def depthwise():
            kh, kw, mult = d.rng.randint(1, 4), d.rng.randint(1, 4), int(d.pick([1, 2]))
            strides, padding = int(d.pick([1, 1, 2])), d.pick(["SAME", "VALID"])
            if padding == "VALID" and (kh > shape[1] or kw > shape[2]):
                return None
            w = d.operand((kh, kw, shape[3], mult))
            size = [(s + strides - 1) // strides if padding == "SAME" else
                    (s - k) // strides + 1 for s, k in ((shape[1], kh), (shape[2], kw))]
            return d.add(Step("depthwise_conv2d", (x, w), {"strides": strides,
                                                           "padding": padding},
                              shape=(shape[0], size[0], size[1], shape[3] * mult)))
        out.append(("depthwise_conv2d", depthwise))

        def batch_norm():   # float32 kernels only: rounds as float32
            if d.dtype != tf.float32:
                return None
            scale, offset = d.operand(shape[3:]), d.operand(shape[3:])
            return d.add(Step("batch_norm", (x, scale, offset), shape=shape))
        out.append(("batch_norm", batch_norm))

        def resize():
            size = [d.size(), d.size()]
            # bilinear computes in float32
            methods = ["bilinear", "nearest"] if d.dtype == tf.float32 else ["nearest"]
            return d.add(Step("resize", (x,), {"size": size, "method": d.pick(methods)},
                              shape=(shape[0], size[0], size[1], shape[3])))
        out.append(("resize", resize))

    if rank >= 2:
        def transpose():
            perm = [int(a) for a in d.rng.permutation(rank)]
            return d.add(Step("transpose", (x,), {"perm": perm},
                              shape=tuple(shape[a] for a in perm)))
        out.append(("transpose", transpose))

        def merge():
            axis = d.rng.randint(rank - 1)
            new = shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:]
            return d.add(Step("reshape", (x,), {"to": list(new)}, shape=new))
        out.append(("reshape", merge))
    if 1 <= rank <= 3:
        def split():
            axis = d.rng.randint(rank)
            divisors = [p for p in range(2, shape[axis]) if shape[axis] % p == 0]
            if not divisors:
                return None
            p = d.pick(divisors)
            new = shape[:axis] + (p, shape[axis] // p) + shape[axis + 1:]
            return d.add(Step("reshape", (x,), {"to": list(new)}, shape=new))
        out.append(("reshape", split))

        def expand():
            axis = d.rng.randint(rank + 1)
            new = shape[:axis] + (1,) + shape[axis:]
            if d.chance(0.5):   # broadcast the new axis
                size = d.size()
                new = new[:axis] + (size,) + new[axis + 1:]
                inner = d.add(Step("expand_dims", (x,), {"axis": axis},
                                   shape=shape[:axis] + (1,) + shape[axis:]))
                return d.add(Step("broadcast_to", (inner,), {"shape": list(new)}, shape=new))
            return d.add(Step("expand_dims", (x,), {"axis": axis}, shape=new))
        out.append(("expand", expand))
    ones = [a for a, s in enumerate(shape) if s == 1]
    if ones and rank >= 2:
        def squeeze():
            axes = [a for a in ones if d.chance(0.7)] or ones[:1]
            if len(axes) == rank:
                axes = axes[:-1]
            return d.add(Step("squeeze", (x,), {"axes": axes},
                              shape=tuple(s for a, s in enumerate(shape) if a not in axes)))
        out.append(("squeeze", squeeze))
    return out


def draw(seed: int) -> Program:
    """A program of 3 to 10 ops over 1 to 3 inputs (more join as operands)."""
    d = _Drawer(seed)
    dtype = d.dtype
    for _ in range(d.rng.randint(1, 4)):
        rank = int(d.pick([1, 2, 3, 1, 2, 3, 4]))   # rank 4: images, for the conv ops
        d.input(tuple(d.size() for _ in range(rank)))
    ops = d.rng.randint(3, 11)
    made = 0
    while made < ops:
        # Usually extend the newest value, so ops chain; sometimes reach back.
        x = len(d.steps) - 1 if d.chance(0.7) else d.rng.randint(len(d.steps))
        if len(d.steps[x].shape) > 4 or np.prod(d.steps[x].shape) > 4096:
            x = d.rng.randint(len(d.steps))
            if len(d.steps[x].shape) > 4 or np.prod(d.steps[x].shape) > 4096:
                continue
        before = (len(d.steps), len(d.layouts), dict(d.relayouts))
        _, add = d.pick(_candidates(d, x))
        if add() is None:
            del d.steps[before[0]:]
            del d.layouts[before[1]:]
            del d.variables[before[1]:]
            d.relayouts = before[2]
            continue
        made += 1
    last = len(d.steps) - 1
    produced = [i for i, s in enumerate(d.steps[:-1]) if s.op != "input"]
    outputs = [last] + ([d.pick(produced)] if produced and d.chance(0.4) else [])
    return Program(seed, dtype, d.mesh, d.steps, outputs, d.layouts, d.variables, d.relayouts)


def update_variables(inputs: Sequence, gradients: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Each variable among `inputs` minus 0.1 times its gradient, read back after."""
    updated = []
    for x, g in zip(inputs, gradients):
        if isinstance(x, tf.Variable):
            x.assign_sub(0.1 * g)
            updated.append(x.read_value())
    return updated


def input_values(program: Program) -> List[np.ndarray]:
    rng = np.random.RandomState(program.seed + 1)
    return [rng.uniform(-2, 2, program.steps[i].shape).astype(program.dtype.as_numpy_dtype)
            for i in program.inputs]
