"""The PNG of `debug.visualize(t, path=...)`: which device holds which block, drawn.

matplotlib is an optional extra (`pip install "tf_dtensor[viz]"`); it is imported only
when a picture is asked for, and only its object API is used (no pyplot, so drawing
never changes the caller's backend or figures).
"""

from __future__ import annotations

import textwrap
from typing import List, Sequence, Tuple

from tf_dtensor.layout import Layout

_INSTALL_HINT = ("`tf_dtensor.debug.visualize(t, path=...)` draws with matplotlib, which is "
                 "not installed. Install it with `pip install \"tf_dtensor[viz]\"` (or "
                 "`pip install matplotlib`), or call `visualize(t)` without `path` for the "
                 "text table.")

# An empty block (an uneven axis cut like torch.chunk) has no extent; it is drawn this
# wide, as a share of the axis, so that it stays visible.
_EMPTY_SHARE = 0.06


def _matplotlib():
    try:
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return colormaps, FigureCanvasAgg, Figure, Rectangle


def _extents(sizes: Sequence[int]) -> List[Tuple[float, float]]:
    """(start, length) of each block along one axis, in [0, 1]: lengths in proportion to
    the block sizes, an empty block a thin sliver."""
    total = sum(sizes)
    if total == 0:
        lengths = [1.0] * len(sizes)
    else:
        lengths = [s / total if s else _EMPTY_SHARE for s in sizes]
    scale = 1.0 / sum(lengths)
    out, start = [], 0.0
    for length in lengths:
        out.append((start, length * scale))
        start += length * scale
    return out


def draw(layout: Layout, shape: Sequence[int], title: str, grid, notes: Sequence[str],
         path: str) -> None:
    """Writes the block map of `grid` (debug._blocks' rows, columns, blocks) under `title`
    to `path`."""
    colormaps, FigureCanvasAgg, Figure, Rectangle = _matplotlib()
    rows, cols, blocks = grid
    rank = len(shape)
    # Rows follow axis 0 and columns axis 1; a rank-1 tensor is one row of axis-0 blocks.
    # Which entry of a block's ranges gives a column's (a row's) size; None: one cell.
    col_range, row_range = {0: (None, None), 1: (0, None)}.get(rank, (1, 0))

    def sizes(count: int, which, place) -> List[int]:
        if which is None:
            return [1] * count
        first = {place(b): b for b in blocks}
        return [first[i].ranges[which][1] - first[i].ranges[which][0] for i in range(count)]

    xs = _extents(sizes(cols, col_range, lambda b: b.col))
    ys = _extents(sizes(rows, row_range, lambda b: b.row))
    # The drawn aspect follows the tensor's, within limits a screen can show.
    height = 1.0
    if rank >= 2 and shape[1] and shape[0]:
        height = min(max(shape[0] / shape[1], 0.3), 3.0)
    elif rank < 2:  # one row of blocks (or one cell)
        height = 0.3
    width_in = 8.0
    plot_in, title_in, text_in = width_in * height, 0.5, 0.3 + 0.25 * len(notes)
    total_in = plot_in + title_in + text_in
    figure = Figure(figsize=(width_in, total_in), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_axes([0.03, text_in / total_in, 0.94, plot_in / total_in])
    axes.set_xlim(0, 1)
    axes.set_ylim(height, 0)
    axes.set_axis_off()

    palette = colormaps["tab20"]
    colours = {}
    partial = layout.partial
    pending = ", ".join(f"{op} over {dim}" for dim, op in sorted(partial.items()))
    for block in blocks:
        x, w = xs[block.col]
        y, h = ys[block.row]
        y, h = y * height, h * height
        holders = tuple(sorted(d for group in block.summands.values() for d in group))
        colour = colours.setdefault(holders, palette(len(colours) % 20))
        axes.add_patch(Rectangle(
            (x, y), w, h, facecolor="white" if block.empty else colour, alpha=0.9,
            edgecolor="black", linewidth=1.0, linestyle="--" if block.empty else "-",
            hatch="//" if partial else None, clip_on=False))
        lines = [block.range_text(), *textwrap.wrap(block.holders_text(partial), 24)]
        if partial:
            lines.append(f"pending {pending}")
        # Text sized to the cell: about 1/100 inch per point, bounded to stay legible.
        w_in, h_in = w * width_in * 0.94, h * width_in
        vertical = w_in < 0.6 * h_in and block.empty
        if vertical:
            w_in, h_in = h_in, w_in
        longest = max(len(line) for line in lines)
        size = min(w_in * 72 / (0.62 * longest), h_in * 72 / (1.5 * len(lines)), 12.0)
        axes.text(x + w / 2, y + h / 2, "\n".join(lines), ha="center", va="center",
                  fontsize=max(size, 5.0), rotation=90 if vertical else 0,
                  bbox=dict(facecolor="white", alpha=0.7, linewidth=0) if partial else None)
    figure.text(0.5, 1 - 0.5 * title_in / total_in, title, fontsize=11, ha="center",
                va="center")
    for i, note in enumerate(notes):
        figure.text(0.03, (text_in - 0.25 - 0.25 * i) / total_in, note, fontsize=9,
                    va="center")
    figure.savefig(path, format="png")
