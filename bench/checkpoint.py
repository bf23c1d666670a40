"""Checkpoint save and restore time: tf_dtensor vs TensorFlow's built-in DTensor.

A float32 variable (default 4096x4096, 64 MiB) sharded 8 ways on virtual CPUs, saved with
`tf.train.Checkpoint.write` and restored with `read` (into the same layout, and into
another layout), plus `name_based_save`/`name_based_restore`. Both libraries write one
slice per distinct shard. Both run side by side in one process, on the same values; the
machine is shared and noisy, so compare the columns, not the absolute numbers.

    python bench/checkpoint.py [--size 4096] [--rounds 5]

Every restore timing ends with a read of one component (`.numpy()`), because TF's DTensor
returns before its per-device executors have finished.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable

from _setup import DEVICES, N_DEVICES  # noqa: E402,F401  (first: splits the CPU)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.experimental import dtensor as tf_builtin  # noqa: E402

from tf_dtensor import dtensor as ours  # noqa: E402

CPUS = DEVICES


def median_seconds(fn: Callable[[], object], rounds: int) -> float:
    fn()  # Warm-up: traces and SPMD expansion.
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases(lib, value: np.ndarray, directory: str, rounds: int) -> dict:
    mesh = lib.create_mesh([("x", 2), ("y", 4)], devices=CPUS)
    save_layout = lib.Layout(["x", "y"], mesh)
    other_layout = lib.Layout(["y", lib.UNSHARDED], mesh)
    v = lib.DVariable(lib.copy_to_mesh(tf.constant(value), save_layout))
    same = lib.DVariable(lib.copy_to_mesh(tf.zeros(value.shape), save_layout))
    other = lib.DVariable(lib.copy_to_mesh(tf.zeros(value.shape), other_layout))
    prefix = os.path.join(directory, "ckpt")
    named = os.path.join(directory, "named")

    def restore(target):
        tf.train.Checkpoint(v=target).read(prefix).assert_consumed()
        return lib.unpack(target.read_value())[0].numpy()

    def named_restore():
        out = lib.name_based_restore(mesh, named, {"v": other.read_value()})
        return lib.unpack(out["v"])[0].numpy()

    results = {
        "Checkpoint.write": median_seconds(lambda: tf.train.Checkpoint(v=v).write(prefix), rounds),
        "read, same layout": median_seconds(lambda: restore(same), rounds),
        "read, other layout": median_seconds(lambda: restore(other), rounds),
        "name_based_save": median_seconds(
            lambda: lib.name_based_save(mesh, named, {"v": v.read_value()}), rounds),
        "name_based_restore": median_seconds(named_restore, rounds),
    }
    for target in (same, other):
        got = lib.unpack(lib.relayout(target.read_value(), lib.Layout.replicated(mesh, 2)))[0]
        assert got.numpy().tobytes() == value.tobytes(), "restored values differ"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    value = np.random.default_rng(0).standard_normal((args.size, args.size)).astype(np.float32)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        theirs = cases(tf_builtin, value, a, args.rounds)
        mine = cases(ours, value, b, args.rounds)
    print(f"{args.size}x{args.size} float32 ({value.nbytes / 2**20:.0f} MiB), [x,y] on "
          f"mesh(x=2,y=4) of 8 virtual CPUs; median of {args.rounds}, seconds")
    print(f"{'':22}{'tf_dtensor':>12}{'TF DTensor':>12}{'ratio':>8}")
    for name, mine_s in mine.items():
        print(f"{name:22}{mine_s:12.3f}{theirs[name]:12.3f}{theirs[name] / mine_s:7.2f}x")
    print("ratio = TF DTensor time / tf_dtensor time (above 1: tf_dtensor is faster)")


if __name__ == "__main__":
    main()
