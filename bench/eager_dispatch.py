"""Per-op eager time: tf_dtensor vs TensorFlow's built-in DTensor vs plain TensorFlow.

Runs all three side by side in one process on 8 virtual CPUs and prints ratios; the
machine is shared and noisy, so compare the columns, not the absolute numbers.

    python bench/eager_dispatch.py [--repeats 200]

Each timed op is followed by a read of one component (`.numpy()`), because TF's DTensor
returns before its per-device executors have finished.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _setup import DEVICES, N_DEVICES  # noqa: E402,F401  (first: splits the CPU)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.experimental import dtensor as tf_builtin  # noqa: E402

from tf_dtensor import dtensor as ours  # noqa: E402



def per_op_seconds(op, a, b, read, repeats: int, chain: int) -> float:
    """Median over `repeats` rounds of `chain` dependent ops (x = op(x, b)) and one read.

    Chaining makes each op wait for the one before, and the single read at the end makes
    the clock stop only when the work is done, without timing the read once per op.
    """
    def round_trip():
        x = a
        for _ in range(chain):
            x = op(x, b)
        read(x)

    round_trip()  # warm up: first-call costs (kernel lookup, caches) are not per-op time
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        round_trip()
        samples.append((time.perf_counter() - start) / chain)
    return statistics.median(samples)


def hand_blocks(value, n: int):
    """`value` cut into n row blocks, block i on virtual CPU i (a sharded value by hand)."""
    blocks = []
    for i, block in enumerate(np.split(value, n)):
        with tf.device(DEVICES[i]):
            blocks.append(tf.constant(block))
    return blocks


def per_device(op):
    """`op` applied by hand to every device's block, each on its own device."""
    def run(xs, bs):
        out = []
        for i, (x, b) in enumerate(zip(xs, bs)):
            with tf.device(DEVICES[i]):
                out.append(op(x, b))
        return out
    return run


def make_inputs(api, shape, specs):
    mesh = api.create_mesh([("x", N_DEVICES)], devices=DEVICES)
    layout = api.Layout(specs, mesh)
    value = np.random.RandomState(0).rand(*shape).astype(np.float32)
    replicated = api.copy_to_mesh(tf.constant(value), api.Layout.replicated(mesh, len(shape)))
    return api.relayout(replicated, layout), layout


def read_first_component(api):
    return lambda t: api.unpack(t)[0].numpy()


def cases():
    """(name, op, shape, input specs, ops chained per read) for each benchmarked case."""
    unsharded = ["unsharded", "unsharded"]
    rows = ["x", "unsharded"]
    return [
        ("add 8x8, replicated", lambda x, b: x + b, (8, 8), unsharded, unsharded, 20),
        ("add 8x8, batch-sharded [x,*]", lambda x, b: x + b, (8, 8), rows, rows, 20),
        ("relu 8x8, batch-sharded [x,*]", lambda x, b: tf.nn.relu(x), (8, 8), rows, rows, 20),
        ("matmul 1024x1024, replicated", tf.matmul, (1024, 1024), unsharded, unsharded, 1),
        ("matmul 1024x1024, contracted [*,x]@[x,*]", tf.matmul, (1024, 1024),
         ["unsharded", "x"], ["x", "unsharded"], 1),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    print(f"{'case':44s} {'plain TF':>10s} {'TF DTensor':>11s} {'tf_dtensor':>11s} "
          f"{'ours/TF-DT':>10s} {'ours/plain':>10s}")
    for name, op, shape, specs_a, specs_b, chain in cases():
        repeats = args.repeats if chain > 1 else max(5, args.repeats // 20)
        value = np.random.RandomState(1).rand(*shape).astype(np.float32)
        plain_a, plain_b = tf.constant(value), tf.constant(value)
        plain = per_op_seconds(op, plain_a, plain_b, lambda t: t.numpy(), repeats, chain)
        times = {}
        for label, api in (("builtin", tf_builtin), ("ours", ours)):
            a, _ = make_inputs(api, shape, specs_a)
            b, _ = make_inputs(api, shape, specs_b)
            times[label] = per_op_seconds(op, a, b, read_first_component(api), repeats, chain)
        print(f"{name:44s} {plain * 1e6:8.0f}us {times['builtin'] * 1e6:9.0f}us "
              f"{times['ours'] * 1e6:9.0f}us {times['ours'] / times['builtin']:10.2f} "
              f"{times['ours'] / plain:10.2f}")


if __name__ == "__main__":
    main()
