"""The examples run and print what the DTensor overview guide shows."""

from __future__ import annotations

import os
import subprocess
import sys

import tf_dtensor

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run_example(name: str, *args: str) -> str:
    # A fresh process (the example configures its own virtual CPUs) that imports the same
    # tf_dtensor as this one, installed or from the source tree.
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tf_dtensor.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                            capture_output=True, text=True, timeout=600, check=False, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_overview_prints_what_the_guide_shows():
    out = run_example("overview.py")
    cpu = "/job:localhost/replica:0/task:0/device:CPU:"
    expected = [
        "<Mesh object with dims=[('x', 6)], device_type=\"CPU\", num_local_devices=6), size=6>",
        "<Mesh object with dims=[('x', 3), ('y', 2)], device_type=\"CPU\", num_local_devices=6), size=6>",
        "tf.Tensor([0 1], layout=\"sharding_specs:unsharded, mesh:|x=6|0,1,2,3,4,5|0,1,2,3,4,5|"
        f"{cpu}0,",
        "global shape: (2,)",
        "dtype: <dtype: 'int32'>",
        "Layout(sharding_specs=['unsharded'], mesh=<Mesh object with dims=[('x', 6)], "
        "device_type=\"CPU\", num_local_devices=6), size=6>)",
        f"Device: {cpu}5 , tf.Tensor([0 1], shape=(2,), dtype=int32)",
        f"Device: {cpu}3 , tf.Tensor([[3]], shape=(1, 1), dtype=int32)",
        f"Device: {cpu}3 , tf.Tensor([[2 3]], shape=(1, 2), dtype=int32)",
        "got an error as expected for fully_sharded_dtensor",
        "got an error as expected for hybrid_sharded_dtensor",
        "Sharding spec: ['unsharded', 'unsharded']",
        "Sharding spec: ['y', 'unsharded']",
        f"{cpu}1 [[56 41]]",
        "tf.Tensor({\"CPU:0\": [[1 1] [1 1]], \"CPU:1\": [[1 1] [1 1]]",
        "layout=\"sharding_specs:x,y, mesh:|x=3,y=2|",
        # v + a, with v drawn by stateless_normal(seed=[1, 1]): the guide's own numbers.
        "tf.Tensor([[2.66521645 2.36637592 1.77863169 ... -1.18624139 2.26035929 0.664066315]",
        "tf.Tensor([[1 1 1 ... 1 1 1] [1 1 1 ... 1 1 1] [1 1 1 ... 1 1 1] ...",
        "exception raised",
    ]
    for line in expected:
        assert line in out, f"missing from the overview's output: {line}"
    # The contracted-axis matmul: every device holds the full [[20 14] [56 41]].
    assert out.count("[[20 14]\n [56 41]]") == 6


def test_checkpoint_example_restores_into_another_mesh_and_a_plain_variable():
    out = run_example("checkpoint.py")
    assert "('model/kernel/.ATTRIBUTES/VARIABLE_VALUE', [4, 6])" in out
    assert "restored layout: [x,y] @ mesh(x=2,y=3)" in out
    assert "plain bias: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in out


def test_placements_example_walks_every_flow_of_the_seed():
    out = run_example("placements.py")
    assert "Success!!!" in out and "Exist bug" not in out and "FAILED" not in out
    for check in [
        "row-wise: 4 blocks of [222, 12]",
        "column-wise: 4 blocks of [888, 3]",
        "replicated: every device holds the whole [888, 12]",
        "uneven Shard(0) of 5 rows: blocks of 2, 2, 1, 0",
        "mean over uneven blocks is 2.0",
        "[Replicate(), Shard(0)] on 2x2: blocks of [444, 12]",
        "from_local: one [8, 8] block per device makes a [32, 8] tensor",
        "redistribute: Shard(0) -> Shard(1) -> Replicate() keeps the value",
        "gradients flow through from_local and redistribute",
        "distribute_module: fc1/fc2 weights are Shard(0) DVariables",
        "distribute_module: same output as unsharded",
        "Partial -> Replicate: an all-reduce; every device holds 10",
        "Partial -> Shard(0): a reduce-scatter; each device holds one summed row",
        "Partial('mean') -> Replicate: 2.5",
    ]:
        assert f"ok: {check}" in out, f"missing: {check}"
    # The block tables: [R, S(0)] on 2x2, and the Partial term on every device.
    assert "CPU:0 + CPU:1 + CPU:2 + CPU:3" in out
    assert out.rstrip().endswith("all placement flows ran")


def test_keras_fit_example_trains_saves_and_reloads():
    out = run_example("keras_fit.py", "--epochs", "2", "--samples", "512")
    assert "LayoutMap['hidden1/kernel']" in out and "Epoch 2/2" in out
    assert "reloaded hidden1/kernel: [*,model] @ mesh(batch=2,model=4)" in out
    assert "sharded reload predicts the same" in out and "plain reload predicts the same" in out
