"""Golden-table helpers: plans from the C++ rules, with no TF runtime involved."""

from __future__ import annotations

import numpy as np

from tf_dtensor import debug
from tf_dtensor import dtensor

# Meshes name devices but never run on them: the planner needs only the grid.
MESH_2 = dtensor.Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
MESH_2X2 = dtensor.Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3],
                        [f"CPU:{i}" for i in range(4)])


def layout(spec: str, mesh=MESH_2X2) -> dtensor.Layout:
    """'[x,*]' -> Layout(['x', UNSHARDED], mesh)."""
    names = [s.strip() for s in spec.strip("[]").split(",") if s.strip()]
    return dtensor.Layout([dtensor.UNSHARDED if n == "*" else n for n in names], mesh)


def spec(l: dtensor.Layout) -> str:
    return l.short().split(" @ ")[0]


def plan(op, specs, shapes, mesh=MESH_2X2, **kwargs):
    """(input specs, output specs, collectives) of `op` on inputs laid out as `specs`."""
    result = debug.explain(op, [layout(s, mesh) for s in specs], shapes, **kwargs)
    return ([spec(l) if l is not None else None for l in result["inputs"]],
            [spec(l) for l in result["outputs"]], result["collectives"])


def backward(op, shapes, wanted, mesh=MESH_2X2, specs=None, **kwargs):
    """Per input, the spec the rule's Backward asks for when its outputs are asked to be
    laid out as `wanted` (one spec or None per output); None: no preference."""
    inputs = [layout(s, mesh) for s in specs] if specs else [None] * len(shapes)
    result = debug.explain(op, inputs, shapes,
                           output_layouts=[layout(w, mesh) if w else None for w in wanted],
                           **kwargs)
    return [spec(l) if l is not None else None for l in result["backward"]]
