"""Tests of tf_dtensor/debug.py: visualize, block_table and explain."""

from __future__ import annotations

import re
import struct
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from dtensor_testing import MESH_1D, MESH_2X2, cpus, layout_of, to_dtensor
from tf_dtensor import _core, dtensor
from tf_dtensor.dtensor import UNSHARDED, Layout

MESH_4 = dtensor.create_mesh([("x", 4)], devices=cpus(4))
U = UNSHARDED


def _devices_in(text):
    return re.findall(r"CPU:\d+", text)


def test_visualize_row_sharded(mesh_2x2, capsys):
    t = to_dtensor(np.zeros((4, 8), np.float32), layout_of("[x,*]", mesh_2x2))
    text = tf_dtensor.debug.visualize(t)
    assert capsys.readouterr().out.strip() == text.strip()
    assert sorted(_devices_in(text)) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    assert text.splitlines()[0] == "[x,*] @ mesh(x=2,y=2)  shape=[4, 8]  placements=[S(0), R]"
    # x=0 (devices 0 and 1) holds rows 0:2, x=1 (devices 2 and 3) rows 2:4.
    lines = text.splitlines()
    top = next(i for i, l in enumerate(lines) if "[0:2, 0:8]" in l)
    bottom = next(i for i, l in enumerate(lines) if "[2:4, 0:8]" in l)
    assert _devices_in(lines[top + 1]) == ["CPU:0", "CPU:1"]
    assert _devices_in(lines[bottom + 1]) == ["CPU:2", "CPU:3"]


@pytest.mark.parametrize("value", [np.zeros((4, 2)), 3.0], ids=["numpy", "python"])
def test_visualize_of_a_regular_value_names_visualize(value):
    """The error named fetch_layout (for a Python value: AttributeError on the None it
    returned)."""
    with pytest.raises(tf_dtensor.LayoutError, match=r"visualize takes a DTensor or a DVariable; "
                                                     r"got a regular"):
        tf_dtensor.debug.visualize(tf.constant(value) if isinstance(value, np.ndarray) else value)


def test_visualize_fully_sharded(mesh_2x2):
    t = to_dtensor(np.zeros((4, 8), np.float32), layout_of("[x,y]", mesh_2x2))
    text = tf_dtensor.debug.visualize(t)
    assert sorted(_devices_in(text)) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    lines = text.splitlines()
    cells = {}
    for i, line in enumerate(lines):
        for block in re.findall(r"\[\d+:\d+, \d+:\d+\]", line):
            column = line.index(block) + len(block) // 2
            holder = [d for d in _devices_in(lines[i + 1])
                      if abs(lines[i + 1].index(d) + 2 - column) < 8]
            cells[block] = holder
    assert cells == {"[0:2, 0:4]": ["CPU:0"], "[0:2, 4:8]": ["CPU:1"],
                     "[2:4, 0:4]": ["CPU:2"], "[2:4, 4:8]": ["CPU:3"]}


def test_visualize_eight_devices(mesh_8):
    t = to_dtensor(np.zeros((8,), np.float32), Layout(["x"], mesh_8))
    text = tf_dtensor.debug.visualize(t)
    assert sorted(_devices_in(text)) == [f"CPU:{i}" for i in range(8)]
    assert all(f"[{i}:{i + 1}]" in text for i in range(8))


def test_block_table_uneven_shape(mesh_2x2):
    # 5 rows over x=2: blocks of 3 and 2 rows (the shard geometry), each on its devices.
    text = tf_dtensor.debug.block_table(layout_of("[x,*]", mesh_2x2), [5, 8])
    assert "[0:3, 0:8]" in text and "[3:5, 0:8]" in text, text


def _cells(text):
    """{block range text: holders text} read from a block table, and the notes under it."""
    lines = text.splitlines()
    rows = [l for l in lines if l.startswith("|")]
    cells = {}
    for ranges, holders in zip(rows[0::2], rows[1::2]):
        for r, h in zip(ranges.strip("|").split("|"), holders.strip("|").split("|")):
            cells[r.strip()] = h.strip()
    notes = [l for l in lines[1:] if not l.startswith(("|", "+"))]
    return cells, notes


def _partial(layout, shape):
    """A DTensor with a partial layout: device i holds the block filled with i."""
    local = layout.without_partial().local_shape(shape)
    return dtensor.pack([tf.fill(local, float(i)) for i in range(layout.mesh.size)], layout)


def test_block_table_partial_joins_summands_with_plus(mesh_2x2, capsys):
    t = _partial(Layout(["x", U], mesh_2x2, partial={"y": "sum"}), [4, 4])
    cells, notes = _cells(tf_dtensor.debug.visualize(t))
    # Along y devices hold summands of one block; along x different blocks.
    assert cells == {"[0:2, 0:4]": "CPU:0 + CPU:1", "[2:4, 0:4]": "CPU:2 + CPU:3"}
    assert notes == ["partial: pending sum over y; a block's value combines what its devices "
                     "hold (summands joined by +)"]
    assert capsys.readouterr().out.splitlines()[0] == (
        "[x,*] +partial(y:sum) @ mesh(x=2,y=2)  shape=[4, 4]  placements=[S(0), P(sum)]")


def test_block_table_partial_with_replicas(mesh_2x2):
    # Partial over x, replicated over y: two summands, each held by two replicas.
    cells, _ = _cells(tf_dtensor.debug.block_table(
        Layout([U], mesh_2x2, partial={"x": "sum"}), [6]))
    assert cells == {"[0:6]": "(CPU:0 CPU:1) + (CPU:2 CPU:3)"}


def test_block_table_partial_max_on_1d_mesh(mesh_1d):
    cells, notes = _cells(tf_dtensor.debug.block_table(
        Layout([U, U], mesh_1d, partial={"x": "max"}), [2, 3]))
    assert cells == {"[0:2, 0:3]": "max(CPU:0, CPU:1)"}
    assert notes[0].startswith("partial: pending max over x")
    # The note named "summands joined by +" for a max, which the table does not draw so.
    assert notes[0].endswith("(terms in max(...))") and "+" not in notes[0], notes


def test_block_table_uneven_with_empty_block():
    # 5 rows over x=4 are cut like torch.chunk: 2, 2, 1 and an empty block on CPU:3.
    t = to_dtensor(np.zeros((5, 6), np.float32), Layout(["x", U], MESH_4))
    cells, notes = _cells(tf_dtensor.debug.visualize(t))
    assert cells == {"[0:2, 0:6]": "CPU:0", "[2:4, 0:6]": "CPU:1", "[4:5, 0:6]": "CPU:2",
                     "[5:5, 0:6] empty": "CPU:3"}
    assert notes == ["uneven: axis 0 (5) over x=4 -> blocks of 2, 2, 1, 0"]


def test_block_table_uneven_both_axes(mesh_2x2):
    cells, notes = _cells(tf_dtensor.debug.block_table(layout_of("[x,y]", mesh_2x2), [5, 3]))
    assert cells == {"[0:3, 0:2]": "CPU:0", "[0:3, 2:3]": "CPU:1",
                     "[3:5, 0:2]": "CPU:2", "[3:5, 2:3]": "CPU:3"}
    assert notes == ["uneven: axis 0 (5) over x=2 -> blocks of 3, 2",
                     "uneven: axis 1 (3) over y=2 -> blocks of 2, 1"]


def test_block_table_rank_1_is_one_row(mesh_2x2):
    text = tf_dtensor.debug.block_table(layout_of("[y]", mesh_2x2), [4])
    rows = [l for l in text.splitlines() if l.startswith("|")]
    assert len(rows) == 2 and rows[0].index("[0:2]") < rows[0].index("[2:4]")
    assert _cells(text)[0] == {"[0:2]": "CPU:0 CPU:2", "[2:4]": "CPU:1 CPU:3"}


def test_block_table_scalar(mesh_1d):
    cells, notes = _cells(tf_dtensor.debug.block_table(Layout([], mesh_1d), []))
    assert cells == {"[scalar]": "CPU:0 CPU:1"} and notes == []


def test_block_table_rank_3_notes_the_axes_not_drawn(mesh_2x2):
    cells, notes = _cells(tf_dtensor.debug.block_table(layout_of("[*,x,y]", mesh_2x2),
                                                       [4, 6, 2]))
    assert cells == {"[0:4, 0:3]": "CPU:0 CPU:1", "[0:4, 3:6]": "CPU:2 CPU:3"}
    assert notes == ["axis 2 not drawn (y); a cell's devices hold different slices: "
                     "along y they split axis 2"]
    _, notes = _cells(tf_dtensor.debug.block_table(layout_of("[x,*,*,*]", mesh_2x2),
                                                   [2, 2, 2, 2]))
    assert notes == ["axes 2..3 not drawn (*, *)"]


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("value,layout", [
    (np.zeros((4, 8), np.float32), layout_of("[x,y]", MESH_2X2)),
    (np.zeros((5, 6), np.float32), Layout(["x", U], MESH_4)),
    (np.zeros((5,), np.float32), Layout(["x"], MESH_2X2)),
    (np.float32(1), Layout([], MESH_1D)),
    (np.zeros((3, 4, 2, 2), np.float32), layout_of("[*,x,y,*]", MESH_2X2)),
], ids=lambda x: x.short() if isinstance(x, Layout) else "")
def test_visualize_writes_png(tmp_path, value, layout):
    pytest.importorskip("matplotlib")
    path = tmp_path / "blocks.png"
    text = tf_dtensor.debug.visualize(to_dtensor(value, layout), path=str(path))
    assert text.startswith(layout.short())
    width, height = _png_size(path)
    assert width == 800 and 150 <= height <= 3000, (width, height)


def test_visualize_png_partial(tmp_path, mesh_2x2):
    pytest.importorskip("matplotlib")
    path = tmp_path / "partial.png"
    tf_dtensor.debug.visualize(_partial(Layout(["x", U], mesh_2x2, partial={"y": "sum"}),
                                        [4, 4]), path=path)
    assert _png_size(path)[0] == 800


def test_visualize_png_block_widths_follow_sizes(tmp_path, mesh_1d):
    # 9 columns over x=2: blocks of 5 and 4 columns, drawn 5:4 wide.
    image = pytest.importorskip("matplotlib.image")
    path = tmp_path / "uneven.png"
    tf_dtensor.debug.visualize(to_dtensor(np.zeros((2, 9), np.float32),
                                          layout_of("[*,x]", mesh_1d)), path=str(path))
    pixels = image.imread(str(path))[..., :3]
    for row in pixels[len(pixels) // 6: len(pixels) // 2]:
        dark = np.flatnonzero(row.sum(axis=-1) < 0.5)
        edges = [int(x) for i, x in enumerate(dark) if i == 0 or dark[i - 1] != x - 1]
        if len(edges) == 3:  # a row through both blocks, above the labels
            left, middle, right = edges
            assert abs((middle - left) / (right - middle) - 5 / 4) < 0.03, edges
            return
    pytest.fail("found no row crossing the two blocks")


def test_visualize_png_without_matplotlib_says_how_to_install(tmp_path, mesh_1d, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    t = to_dtensor(np.zeros((2,), np.float32), layout_of("[x]", mesh_1d))
    with pytest.raises(ImportError, match=r"tf_dtensor\[viz\]"):
        tf_dtensor.debug.visualize(t, path=str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()
    assert "[0:1]" in tf_dtensor.debug.visualize(t)  # the text table needs nothing


def test_explain_reports_collectives(mesh_2x2):
    plan = tf_dtensor.debug.explain("MatMul", [layout_of("[*,x]", mesh_2x2),
                                               layout_of("[x,*]", mesh_2x2)], [[4, 8], [8, 4]])
    assert plan["inputs"] == [layout_of("[*,x]", mesh_2x2), layout_of("[x,*]", mesh_2x2)]
    assert plan["outputs"] == [layout_of("[*,*]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 0 over x"]


def test_explain_lists_the_planned_relayout_steps(mesh_2x2):
    # The steps come from the relayout planner that execution runs (cc/spmd/relayout.h).
    plan = tf_dtensor.debug.explain("MatMul", [layout_of("[y,x]", mesh_2x2),
                                               layout_of("[*,y]", mesh_2x2)], [[4, 8], [8, 4]])
    assert plan["inputs"] == [layout_of("[y,x]", mesh_2x2), layout_of("[x,*]", mesh_2x2)]
    # Sliced over x first, so the all-gather over y moves half of what it moved whole.
    assert plan["collectives"] == ["input 1: slice axis 0 over x [*,y] -> [x,y]",
                                   "input 1: all-gather axis 1 [x,y] -> [x,*]",
                                   "all-reduce(sum) of output 0 over x"]


def test_explain_keeps_its_forward_plan_with_a_backward_one(mesh_2x2):
    plan = tf_dtensor.debug.explain("MatMul", [layout_of("[*,x]", mesh_2x2),
                                               layout_of("[x,*]", mesh_2x2)], [[8, 8], [8, 8]],
                                    output_layouts=[layout_of("[x,y]", mesh_2x2)])
    assert plan["outputs"] == [layout_of("[*,*]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 0 over x"]
    assert plan["backward"] == [layout_of("[x,*]", mesh_2x2), layout_of("[*,y]", mesh_2x2)]
    assert "backward" not in tf_dtensor.debug.explain(
        "MatMul", [layout_of("[*,x]", mesh_2x2), layout_of("[x,*]", mesh_2x2)], [[8, 8], [8, 8]])


def test_explain_raises_the_errors_planning_raises(mesh_2x2):
    with pytest.raises(tf_dtensor.UnsupportedOpError, match="'NoSuchOp' has no tf_dtensor rule"):
        tf_dtensor.debug.explain("NoSuchOp", [layout_of("[x,*]", mesh_2x2)], [[8, 8]])
    with pytest.raises(ValueError, match="Incompatible shapes for 'Mul'"):
        tf_dtensor.debug.explain("Mul", [layout_of("[*,*]", mesh_2x2)] * 2, [[8, 8], [4, 8]])


def test_explain_without_communication(mesh_2x2):
    plan = tf_dtensor.debug.explain("AddV2", [layout_of("[x,y]", mesh_2x2)] * 2, [[4, 8]] * 2)
    assert plan["outputs"] == [layout_of("[x,y]", mesh_2x2)]
    assert plan["collectives"] == []


def test_explain_plans_every_output_the_op_defines(mesh_2x2):
    # FusedBatchNormV3 has six outputs (reserve_space_3 last); explain planned five, so its
    # plan did not match the op the device runs.
    x = np.arange(8 * 2 * 2 * 3, dtype=np.float32).reshape(8, 2, 2, 3) / 10.0
    x_layout, c_layout = layout_of("[x,*,*,*]", mesh_2x2), layout_of("[*]", mesh_2x2)
    plan = tf_dtensor.debug.explain("FusedBatchNormV3", [x_layout] + [c_layout] * 4,
                                    [[8, 2, 2, 3], [3], [3], [0], [0]],
                                    attrs={"is_training": True})
    run = tf.raw_ops.FusedBatchNormV3(
        x=dtensor.relayout(dtensor.copy_to_mesh(x, layout_of("[*,*,*,*]", mesh_2x2)), x_layout),
        scale=dtensor.copy_to_mesh(tf.ones([3]), c_layout),
        offset=dtensor.copy_to_mesh(tf.zeros([3]), c_layout),
        mean=dtensor.copy_to_mesh(tf.zeros([0]), c_layout),
        variance=dtensor.copy_to_mesh(tf.zeros([0]), c_layout), is_training=True)
    assert len(plan["outputs"]) == len(run) == 6
    assert plan["outputs"] == [dtensor.fetch_layout(t) for t in run]
    assert plan["collectives"] == ["all-reduce(sum) of the batch mean over x",
                                   "all-reduce(sum) of the batch variance over x"]


@pytest.mark.parametrize("dtype", [tf.int32, tf.float32])
def test_explain_plans_an_integer_division_as_the_device_runs_it(mesh_2x2, dtype):
    # (a + b) // c is not a // c + b // c: the device reduces an integer numerator's partial
    # sum before it divides, and keeps a float one pending. explain gave the rule no dtype
    # and claimed the float plan for integers (the op fuzzer, seed 1202: int32 Div).
    partial = Layout([U], mesh_2x2, partial={"x": "sum"})
    plan = tf_dtensor.debug.explain("Div", [partial, layout_of("[*]", mesh_2x2)], [[4], [4]],
                                    attrs={"T": dtype})
    x = dtensor.pack([tf.constant([5, 7, 9, 11], dtype)] * 4, partial)
    y = dtensor.copy_to_mesh(tf.constant([2, 3, 4, 5], dtype), layout_of("[*]", mesh_2x2))
    out = tf.raw_ops.Div(x=x, y=y)
    assert plan["outputs"] == [dtensor.fetch_layout(out)]
    assert plan["outputs"][0].is_partial == (dtype == tf.float32)
    want = tf.constant([10, 14, 18, 22], dtype) / tf.constant([2, 3, 4, 5], dtype) \
        if dtype.is_floating else tf.constant([5, 4, 4, 4], dtype)
    got = dtensor.relayout(out, layout_of("[*]", mesh_2x2))
    np.testing.assert_allclose(dtensor.unpack(got)[0].numpy(), want.numpy())


def test_explain_needs_a_layout():
    with pytest.raises(ValueError, match="at least one input layout"):
        tf_dtensor.debug.explain("AddV2", [None, None], [[4], [4]])


def test_explain_plans_the_context_dispatch_makes(mesh_2x2):
    # An input without a layout is a host tensor: as data it joins the mesh replicated,
    # as dispatch does, so AddV2's sharded input sets the plan.
    plan = tf_dtensor.debug.explain("AddV2", [layout_of("[x,y]", mesh_2x2), None],
                                    [[4, 8], [4, 8]])
    assert plan["outputs"] == [layout_of("[x,y]", mesh_2x2)]
    assert plan["inputs"][1] == layout_of("[x,y]", mesh_2x2)
    # Values are for the host arguments the op's traits declare, and only those.
    with pytest.raises(tf_dtensor.LayoutError,
                       match=r"value for input 1 of 'AddV2'.*not one of its host arguments"):
        tf_dtensor.debug.explain("AddV2", [layout_of("[x,y]", mesh_2x2)] * 2, [[4, 8]] * 2,
                                 int_values={1: [1]})
    plan = tf_dtensor.debug.explain("Transpose", [layout_of("[x,y]", mesh_2x2), None],
                                    [[4, 8], [2]], int_values={1: [1, 0]})
    assert plan["outputs"] == [layout_of("[y,x]", mesh_2x2)]


def test_host_inputs_are_the_ones_the_traits_declare():
    """The fuzzer gives explain values for these inputs only (PadV2's constant_values is a
    host tensor, but data: it joins the mesh replicated)."""
    assert _core.host_inputs("Transpose", 2) == [1]
    assert _core.host_inputs("PadV2", 3) == [1]
    assert _core.host_inputs("ConcatV2", 4) == [3]
    assert _core.host_inputs("AddV2", 2) == []
    assert _core.host_inputs("NoSuchOp", 2) == []


@pytest.mark.parametrize("layouts,shapes,message", [
    (["[*,x]"], [[4, 8]], "explain got 1 inputs for 'MatMul', which takes 2"),
    (["[*,x]", "[x,*]"], [[4, 8]], "explain got 2 layouts and 1 shapes for 'MatMul'"),
    (["[*,x]", "[x,*]", "[x,*]"], [[4, 8], [8, 4], [8, 4]], "got 3 inputs for 'MatMul'"),
    (["[*,x]", "[x,*]"], [[4, 8], [8]], "explain got input 1 of 'MatMul' with layout "
                                        "[x,*] @ mesh(x=2,y=2) of rank 2 and shape [8] of "
                                        "rank 1"),
])
def test_explain_refuses_inputs_that_do_not_fit_the_op(mesh_2x2, layouts, shapes, message):
    # A missing input crashed the process (the rule read past the inputs given); extra
    # inputs were planned as if the op took them.
    with pytest.raises(tf_dtensor.LayoutError, match=re.escape(message)):
        tf_dtensor.debug.explain("MatMul", [layout_of(l, mesh_2x2) for l in layouts], shapes)
    with pytest.raises(TypeError, match=re.escape("`layouts[0]` is '[*,x]': explain takes a "
                                                  "`Layout`")):
        tf_dtensor.debug.explain("MatMul", ["[*,x]", layout_of("[x,*]", mesh_2x2)],
                                 [[4, 8], [8, 4]])
    with pytest.raises(tf_dtensor.LayoutError, match=re.escape(
            "explain got 2 output layouts for 'MatMul', which has 1 outputs")):
        tf_dtensor.debug.explain("MatMul", [layout_of("[*,x]", mesh_2x2)] * 2, [[4, 8], [8, 4]],
                                 output_layouts=[layout_of("[*,*]", mesh_2x2)] * 2)
    # Ops with lists take any number of them past their single inputs.
    plan = tf_dtensor.debug.explain("AddN", [layout_of("[x,*]", mesh_2x2)] * 3, [[4, 8]] * 3)
    assert plan["outputs"] == [layout_of("[x,*]", mesh_2x2)]


def test_block_table_refuses_an_unknown_size(mesh_2x2):
    # It drew "[0:-1, 0:3]" twice and an "uneven" note for a -1 (unknown) size.
    with pytest.raises(tf_dtensor.LayoutError, match=re.escape(
            "block_table draws blocks of known sizes; got shape [-1, 3]")):
        tf_dtensor.debug.block_table(layout_of("[x,*]", mesh_2x2), [-1, 3])


def test_block_table_of_a_single_device_layout_is_one_block_on_that_device():
    # It raised MeshError ("... has no global device ids"), so visualize of a value on one
    # device failed too.
    layout = Layout.from_device("/job:localhost/replica:0/task:0/device:CPU:1")
    table = tf_dtensor.debug.block_table(layout, [4, 2])
    cells, notes = _cells(table)
    assert cells == {"[0:4, 0:2]": "CPU:1"} and notes == [], table
