"""Tests of tf_dtensor/debug.py: visualize, block_table and explain."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tf_dtensor
from dtensor_testing import layout_of, to_dtensor
from tf_dtensor.dtensor import Layout


def _devices_in(text):
    return re.findall(r"CPU:\d+", text)


def test_visualize_row_sharded(mesh_2x2, capsys):
    t = to_dtensor(np.zeros((4, 8), np.float32), layout_of("[x,*]", mesh_2x2))
    text = tf_dtensor.debug.visualize(t)
    assert capsys.readouterr().out.strip() == text.strip()
    assert sorted(_devices_in(text)) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    assert text.splitlines()[0] == "[x,*] @ mesh(x=2,y=2)  shape=[4, 8]"
    # x=0 (devices 0 and 1) holds rows 0:2, x=1 (devices 2 and 3) rows 2:4.
    lines = text.splitlines()
    top = next(i for i, l in enumerate(lines) if "[0:2, 0:8]" in l)
    bottom = next(i for i, l in enumerate(lines) if "[2:4, 0:8]" in l)
    assert _devices_in(lines[top + 1]) == ["CPU:0", "CPU:1"]
    assert _devices_in(lines[bottom + 1]) == ["CPU:2", "CPU:3"]


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


def test_explain_reports_collectives(mesh_2x2):
    plan = tf_dtensor.debug.explain("MatMul", [layout_of("[*,x]", mesh_2x2),
                                               layout_of("[x,*]", mesh_2x2)], [[4, 8], [8, 4]])
    assert plan["inputs"] == [layout_of("[*,x]", mesh_2x2), layout_of("[x,*]", mesh_2x2)]
    assert plan["outputs"] == [layout_of("[*,*]", mesh_2x2)]
    assert plan["collectives"] == ["all-reduce(sum) of output 0 over x"]


def test_explain_without_communication(mesh_2x2):
    plan = tf_dtensor.debug.explain("AddV2", [layout_of("[x,y]", mesh_2x2)] * 2, [[4, 8]] * 2)
    assert plan["outputs"] == [layout_of("[x,y]", mesh_2x2)]
    assert plan["collectives"] == []


def test_explain_needs_a_layout():
    with pytest.raises(ValueError, match="at least one input layout"):
        tf_dtensor.debug.explain("AddV2", [None, None], [[4], [4]])
