"""Seeing layouts: which device holds which block, what an op will do, which
collectives a program issued (`collectives()`, the ledger), what a call will cost before
it runs (`estimate`), and the first op whose sharded result differs from one device
(`check`)."""

from __future__ import annotations

import itertools
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_dtensor import _block_picture, _core
from tf_dtensor._check import CheckedOp, CheckReport, check  # noqa: F401 -- the API
from tf_dtensor._estimate import (DeviceEstimate, Estimate, Spec, compare,  # noqa: F401 -- the API
                                  estimate, spec)
from tf_dtensor._estimate import _short as _short_device  # "CPU:0"
from tf_dtensor._ledger import Collective, Ledger, collectives  # noqa: F401 -- the API
from tf_dtensor import api
from tf_dtensor._errors import LayoutError
from tf_dtensor.layout import UNSHARDED, Layout
from tf_dtensor.layout import format_placements as _format_placements


class _Block:
    """One drawn block: its place in the grid, its index range along each drawn axis and
    the devices holding it, grouped by summand (one group unless the layout is partial)."""

    __slots__ = ("row", "col", "ranges", "summands")

    def __init__(self, row: int, col: int, ranges: List[Tuple[int, int]]):
        self.row, self.col, self.ranges = row, col, ranges
        self.summands: Dict[tuple, List[str]] = {}

    @property
    def empty(self) -> bool:
        return any(stop == start for start, stop in self.ranges)

    def range_text(self) -> str:
        text = "[" + (", ".join(f"{a}:{b}" for a, b in self.ranges) or "scalar") + "]"
        return text + " empty" if self.empty else text

    def holders_text(self, partial: Mapping[str, str]) -> str:
        groups = [" ".join(devices) for _, devices in sorted(self.summands.items())]
        if not partial or len(groups) < 2:
            return " ".join(groups)
        groups = [f"({g})" if " " in g else g for g in groups]
        ops = set(partial.values())
        if ops == {"sum"}:
            return " + ".join(groups)  # a block is the sum of what these devices hold
        return f"{ops.pop() if len(ops) == 1 else 'reduce'}({', '.join(groups)})"


def _blocks(layout: Layout, shape: List[int]) -> Tuple[int, int, List[_Block]]:
    """(rows, columns, blocks) of the grid drawn for the first two axes of `shape`.

    A rank-2 tensor is rows x columns, a rank-1 tensor one row of column blocks, a scalar
    one cell. Every local device joins the block it holds; along a partial mesh dimension
    devices hold different summands of the same block, so they go to different groups.
    """
    mesh = layout.mesh
    rank = layout.rank
    drawn = list(range(min(rank, 2)))
    if layout.is_single_device():  # one device holds the whole tensor (a layout of no rank)
        whole = _Block(0, 0, [(0, size) for size in shape[:2]])
        whole.summands[()] = [_short_device(mesh.single_device)]
        return 1, 1, [whole]
    pieces = [layout.num_shards(a) for a in drawn]
    rows, cols = (pieces + [1, 1])[:2] if rank != 1 else (1, pieces[0])

    def place(shard: Sequence[int]) -> Tuple[int, int]:
        return (0, shard[0]) if rank == 1 else tuple((list(shard) + [0, 0])[:2])

    blocks: Dict[Tuple[int, int], _Block] = {}
    for shard in itertools.product(*[range(p) for p in pieces]):
        index = list(shard) + [0] * (rank - len(shard))
        size, offset = layout.shard_geometry(shape, index)
        ranges = [(offset[a], offset[a] + size[a]) for a in drawn]
        blocks[place(shard)] = _Block(*place(shard), ranges)
    names = mesh.dim_names
    partial_dims = sorted(layout.partial)
    # The layout says which shard each device offset holds (one answer, from C++).
    offsets = {int(i): n for n, i in enumerate(np.ravel(mesh.global_device_ids()))}
    shards = layout.offset_to_shard()
    for index, device in zip(mesh.local_device_ids(), mesh.local_devices()):
        coords = dict(zip(names, mesh._mesh.coords(index)))
        shard = shards[offsets[int(index)]][:len(drawn)]
        summand = tuple(coords[d] for d in partial_dims)
        blocks[place(shard)].summands.setdefault(summand, []).append(_short_device(device))
    return rows, cols, [blocks[key] for key in sorted(blocks)]


def _notes(layout: Layout, shape: List[int]) -> List[str]:
    """The lines under the picture: pending reductions, uneven axes, axes not drawn."""
    notes = []
    if layout.is_partial:
        pending = ", ".join(f"{op} over {dim}" for dim, op in sorted(layout.partial.items()))
        ops = set(layout.partial.values())
        shown = ("summands joined by +" if ops == {"sum"} else
                 f"terms in {ops.pop()}(...)" if len(ops) == 1 else "terms in reduce(...)")
        notes.append(f"partial: pending {pending}; a block's value combines what its devices "
                     f"hold ({shown})")
    specs = ["*" if s == UNSHARDED else s for s in layout.sharding_specs]
    for axis, spec in enumerate(specs):
        pieces = layout.num_shards(axis)
        if pieces > 1 and shape[axis] % pieces:
            sizes = []
            for piece in range(pieces):
                index = [0] * layout.rank
                index[axis] = piece
                sizes.append(str(layout.shard_geometry(shape, index)[0][axis]))
            notes.append(f"uneven: axis {axis} ({shape[axis]}) over {spec}={pieces} -> "
                         f"blocks of {', '.join(sizes)}")
    if layout.rank > 2:
        axes = "axis 2" if layout.rank == 3 else f"axes 2..{layout.rank - 1}"
        line = f"{axes} not drawn ({', '.join(specs[2:])})"
        split = [f"along {s} they split axis {a}" for a, s in enumerate(specs)
                 if a >= 2 and s != "*"]
        if split:
            line += f"; a cell's devices hold different slices: {'; '.join(split)}"
        notes.append(line)
    return notes


def _title(layout: Layout, shape: List[int]) -> str:
    """`[x,*] @ mesh(x=2,y=2)  shape=[4, 8]  placements=[S(0), R]` (placements when the
    layout has them)."""
    title = f"{layout.short()}  shape={shape}"
    try:
        return f"{title}  placements={_format_placements(layout.placements)}"
    except LayoutError:  # e.g. an axis over two mesh dims, minor first: no placements
        return title


def block_table(layout: Layout, shape: Sequence[int]) -> str:
    """The block map of a tensor of `shape` laid out as `layout`, as text.

    Rows and columns follow the first two axes (a rank-1 tensor is one row); each cell
    names the block's index range (`[3:5, 0:8]`, `[4:4] empty` for an empty uneven block)
    and the devices that hold it. Along a partial mesh dimension the devices hold summands
    of the block, joined by `+`; notes under the table name the pending reductions,
    uneven axes and axes not drawn.

    Args:
      layout: the layout.
      shape: the tensor's global shape (every size known).

    Returns:
      The table, as text.

    Raises:
      LayoutError: an unknown size, or a shape of another rank than `layout`'s.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(4)])
      >>> print(block_table(Layout(["x"], mesh, partial={"y": "sum"}), [5]))
      [x] +partial(y:sum) @ mesh(x=2,y=2)  shape=[5]  placements=[S(0), P(sum)]
      +-----------------+-----------------+
      |      [0:3]      |      [3:5]      |
      |  CPU:0 + CPU:1  |  CPU:2 + CPU:3  |
      +-----------------+-----------------+
      partial: pending sum over y; ...
      uneven: axis 0 (5) over x=2 -> blocks of 3, 2
    """
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise LayoutError(f"block_table draws blocks of known sizes; got shape {shape} "
                          f"(-1: unknown) for {layout.short()}. Give the global shape.")
    layout.local_shape(shape)  # raises for a rank other than the layout's
    rows, cols, blocks = _blocks(layout, shape)
    partial = layout.partial
    cells = [(b.range_text(), b.holders_text(partial)) for b in blocks]
    width = max(len(text) for cell in cells for text in cell) + 4
    border = "+" + "+".join(["-" * width] * cols) + "+"
    lines = [_title(layout, shape), border]
    for r in range(rows):
        row = [cell for b, cell in zip(blocks, cells) if b.row == r]
        lines.append("|" + "|".join(c[0].center(width) for c in row) + "|")
        lines.append("|" + "|".join(c[1].center(width) for c in row) + "|")
        lines.append(border)
    return "\n".join(lines + _notes(layout, shape))


def visualize(tensor, path: Optional[str] = None) -> str:
    """Prints (and returns) which device holds which block of a DTensor.

    With `path`, also draws the map as a PNG: block sizes in proportion (an empty uneven
    block as a thin dashed cell), each holder set in its own colour, partial blocks hatched
    and labelled with their pending reduction. Drawing needs matplotlib
    (`pip install "tf_dtensor[viz]"`).

    Args:
      tensor: a DTensor or DVariable.
      path: where to write the PNG; None draws nothing.

    Returns:
      The text table (see `block_table`).

    Raises:
      ImportError: `path` is given and matplotlib is not installed.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> t = dtensor.call_with_layout(tf.zeros, Layout(["x", UNSHARDED], mesh), [4, 2])
      >>> _ = visualize(t)
      [x,*] @ mesh(x=2)  shape=[4, 2]  placements=[S(0)]
      +--------------+
      |  [0:2, 0:2]  |
      |    CPU:0     |
      +--------------+
      |  [2:4, 0:2]  |
      |    CPU:1     |
      +--------------+
    """
    if not api.is_dtensor(tensor):
        # fetch_layout's own error named fetch_layout (and a Python value got None back).
        raise LayoutError(f"visualize takes a DTensor or a DVariable; got a regular "
                          f"{type(tensor).__name__}, which one device holds whole. Lay it out "
                          f"first (`copy_to_mesh(value, layout)`), or visualize a layout "
                          f"without a value with `block_table(layout, shape)`.")
    layout = api.fetch_layout(tensor)
    shape = [int(d) for d in tensor.shape]
    text = block_table(layout, shape)
    print(text)
    if path is not None:
        _block_picture.draw(layout, shape, _title(layout, shape), _blocks(layout, shape),
                            _notes(layout, shape), str(path))
    return text


def explain(op_name: str, layouts: Sequence[Optional[Layout]], shapes: Sequence[Sequence[int]],
            int_values: Optional[Dict[int, Sequence[int]]] = None,
            attrs: Optional[Dict[str, object]] = None,
            requested: Optional[Layout] = None,
            output_layouts: Optional[Sequence[Optional[Layout]]] = None) -> Dict[str, object]:
    """What tf_dtensor will do for `op_name` on inputs with these layouts and shapes.

    Returns a dict with the input layouts the op runs with, its output layouts and the
    collectives it emits (e.g. `all-reduce(sum) of output 0 over x`). Runs nothing.

    With `output_layouts` (one per output, None: nothing asked) the dict also holds
    `backward`: per input, the layout the op's rule asks of it so that the outputs come
    out in those layouts without a relayout (None: no preference). This is the request
    that tf.function expansion sends back to the op producing that input.

    Args:
      op_name: the TensorFlow op type, e.g. `"MatMul"`.
      layouts: per input, its layout, or None for a host tensor (a shape, the axes).
      shapes: per input, its global shape.
      int_values: input index -> the values of a host integer input (a Sum's axes).
      attrs: the op's attributes, e.g. `{"transpose_a": True}`; its type attribute gives
        the inputs' dtype (`{"T": tf.int32}`: an integer `Div` of a partial sum reduces
        it first), and without one the plan is a float's.
      requested: the layout asked of the output, as `call_with_layout` asks it.
      output_layouts: per output, the layout wanted of it (None: no wish).

    Returns:
      A dict: `inputs` (layouts the op runs with), `outputs` (its output layouts),
      `collectives` (descriptions), and with `output_layouts` also `backward`.

    Raises:
      TypeError: a layout that is not a `Layout`.
      LayoutError: a layout whose rank is not its shape's.
      UnsupportedOpError: `op_name` has no rule.

    Example:
      >>> mesh = dtensor.Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
      >>> want = dtensor.Layout([dtensor.UNSHARDED, "x"], mesh)
      >>> plan = explain("MatMul", [None, None], [[8, 4], [4, 6]], output_layouts=[want])
      >>> [l.short() for l in plan["backward"]]
      ['[*,*] @ mesh(x=2)', '[*,x] @ mesh(x=2)']
    """
    def bound(given, what: str):
        if given is not None and not isinstance(given, Layout):
            raise TypeError(f"`{what}` is {given!r}: explain takes a `Layout` (or None, a "
                            f"host tensor); `Layout.from_string` reads the full form.")
        return given._layout if given is not None else None

    wanted = [bound(l, f"output_layouts[{i}]") for i, l in enumerate(output_layouts or [])]
    plan = _core.explain(op_name, [bound(l, f"layouts[{i}]") for i, l in enumerate(layouts)],
                         [list(s) for s in shapes],
                         {int(k): list(v) for k, v in (int_values or {}).items()},
                         dict(attrs or {}),
                         requested._layout if requested is not None else None,
                         output_layouts=wanted)
    result = {
        "inputs": [Layout._wrap(l) if l is not None else None for l in plan["inputs"]],
        "outputs": [Layout._wrap(l) for l in plan["outputs"]],
        "collectives": list(plan["collectives"]),
    }
    if output_layouts is not None:
        result["backward"] = [Layout._wrap(l) if l is not None else None
                              for l in plan["backward"]]
    return result
