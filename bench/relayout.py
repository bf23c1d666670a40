"""Eager relayout throughput: tf_dtensor vs TensorFlow's built-in DTensor.

A float32 tensor (default 4096x4096, 64 MiB) on an ("x", 8) mesh of virtual CPUs, relaid
out eagerly from `[x,*]` to `[*,x]` (an all-to-all) and to replicated (an all-gather),
reported as GB/s of the global tensor. The plain column is a one-pass copy of the same
bytes (numpy), the bound on a shared-memory host. Both libraries run side by side in one
process, rounds interleaved; the machine is shared and noisy, so compare the columns, not
the absolute numbers.

    python bench/relayout.py [--size 4096] [--rounds 5]

Every timing ends with a read of one component (`.numpy()`), because TF's DTensor
returns before its per-device executors have finished.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict

from _setup import DEVICES, N_DEVICES  # noqa: E402,F401  (first: splits the CPU)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.experimental import dtensor as tf_builtin  # noqa: E402

from tf_dtensor import dtensor as ours  # noqa: E402

# (name, source specs, target specs) of the relayouts timed.
CASES = [
    ("[x,*] -> [*,x] (all-to-all)", ["x", "unsharded"], ["unsharded", "x"]),
    ("[x,*] -> [*,*] (all-gather)", ["x", "unsharded"], ["unsharded", "unsharded"]),
]


def relayout_fn(api, size: int, source_specs, target_specs) -> Callable[[], object]:
    """A call that relays out a `[size, size]` f32 tensor held in `source_specs` to
    `target_specs` and waits for it (reads one component)."""
    mesh = api.create_mesh([("x", N_DEVICES)], devices=DEVICES)
    value = np.random.RandomState(0).rand(size, size).astype(np.float32)
    source = api.relayout(api.copy_to_mesh(tf.constant(value), api.Layout.replicated(mesh, 2)),
                          api.Layout(source_specs, mesh))
    target = api.Layout(target_specs, mesh)

    def run():
        return api.unpack(api.relayout(source, target))[0].numpy()
    run()  # warm up: kernel lookup, caches
    return run


def copy_fn(size: int) -> Callable[[], object]:
    """One copy of the same bytes (the memory-bandwidth bound here)."""
    src = np.random.RandomState(0).rand(size, size).astype(np.float32)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gb_per_second(size: int, secs: float) -> float:
    return size * size * 4 / secs / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="rows (= columns) of the tensor")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fns: Dict[str, Dict[str, Callable]] = {
        name: {"copy": copy_fn(args.size),
               "builtin": relayout_fn(tf_builtin, args.size, src, dst),
               "ours": relayout_fn(ours, args.size, src, dst)}
        for name, src, dst in CASES}
    times = {name: {label: [] for label in columns} for name, columns in fns.items()}
    for _ in range(args.rounds):
        for name, columns in fns.items():
            for label, fn in columns.items():
                times[name][label].append(seconds(fn))
    print(f"{'relayout, GB/s':32s} {'copy':>8s} {'TF DTensor':>11s} {'tf_dtensor':>11s} "
          f"{'ours/TF-DT':>10s}")
    for name, columns in times.items():
        rate = {label: gb_per_second(args.size, statistics.median(t))
                for label, t in columns.items()}
        print(f"{name:32s} {rate['copy']:8.2f} {rate['builtin']:11.2f} {rate['ours']:11.2f} "
              f"{rate['ours'] / rate['builtin']:10.2f}")


if __name__ == "__main__":
    main()
