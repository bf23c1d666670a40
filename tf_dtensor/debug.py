"""Seeing layouts: which device holds which block, and what an op will do."""

from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Sequence

from tf_dtensor import _core
from tf_dtensor import api
from tf_dtensor.layout import Layout


def _short_device(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


def block_table(layout: Layout, shape: Sequence[int]) -> str:
    """The block map of a tensor of `shape` laid out as `layout`, as text.

    Rows and columns follow the first two axes (a rank-1 tensor is one row); each cell
    names the block's index range and the devices that hold it.
    """
    shape = [int(d) for d in shape]
    layout.local_shape(shape)  # raises for a rank other than the layout's
    mesh = layout.mesh
    rank = layout.rank
    grid_axes = list(range(min(rank, 2)))
    pieces = [layout.num_shards(a) for a in grid_axes]
    holders: Dict[tuple, List[str]] = {}
    for index, device in zip(mesh.local_device_ids(), mesh.local_devices()):
        coords = mesh._mesh.coords(index)
        block = []
        for a in grid_axes:
            spec = layout.sharding_specs[a]
            block.append(coords[mesh.dim_names.index(spec)] if spec in mesh.dim_names else 0)
        holders.setdefault(tuple(block), []).append(_short_device(device))

    def label(axis: int, piece: int) -> str:
        # The shard geometry of the layout (uneven blocks included): [4:5], [5:5] if empty.
        index = [0] * rank
        index[axis] = piece
        size, offset = layout.shard_geometry(shape, index)
        return f"{offset[axis]}:{offset[axis] + size[axis]}"

    rows = pieces[0] if grid_axes else 1
    cols = pieces[1] if len(grid_axes) > 1 else 1
    cells = []
    for r, c in itertools.product(range(rows), range(cols)):
        key = tuple([r, c][: len(grid_axes)])
        ranges = ", ".join(label(a, p) for a, p in zip(grid_axes, key)) or "scalar"
        cells.append((r, c, f"[{ranges}]", " ".join(holders.get(key, []))))
    width = max(max(len(x[2]), len(x[3])) for x in cells) + 2
    border = "+" + "+".join(["-" * width] * cols) + "+"
    lines = [f"{layout.short()}  shape={shape}", border]
    for r in range(rows):
        row = [x for x in cells if x[0] == r]
        lines.append("|" + "|".join(x[2].center(width) for x in row) + "|")
        lines.append("|" + "|".join(x[3].center(width) for x in row) + "|")
        lines.append(border)
    if rank > 2:
        lines.append(f"(axes 2..{rank - 1}: {layout.sharding_specs[2:]})")
    return "\n".join(lines)


def visualize(tensor) -> str:
    """Prints (and returns) which device holds which block of a DTensor.

    Example:
      >>> t = call_with_layout(tf.zeros, Layout(["x", UNSHARDED], mesh), [4, 2])
      >>> _ = visualize(t)
    """
    text = block_table(api.fetch_layout(tensor), tensor.shape)
    print(text)
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

    Example:
      >>> mesh = dtensor.Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
      >>> want = dtensor.Layout([dtensor.UNSHARDED, "x"], mesh)
      >>> plan = explain("MatMul", [None, None], [[8, 4], [4, 6]], output_layouts=[want])
      >>> [l.short() for l in plan["backward"]]
      ['[*,*] @ mesh(x=2)', '[*,x] @ mesh(x=2)']
    """
    wanted = [l._layout if l is not None else None for l in (output_layouts or [])]
    plan = _core.explain(op_name, [l._layout if l is not None else None for l in layouts],
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
