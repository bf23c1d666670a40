"""The speed table of issue 13: plain TensorFlow, TensorFlow's DTensor and tf_dtensor.

One command for the figures README quotes. Every row runs the three side by side in one
process on 8 virtual CPUs; each round takes one sample of every row and column in turn
(so a load spike hits all columns alike) and the table shows medians over rounds. The
machine is shared and noisy: compare columns, not absolute numbers.

    python bench/run.py [--quick] [--rounds 5] [--mib 1024]
    python bench/run.py --device gpu [--rounds 7] [--variants] [--jit] [--profile DIR]   (bench/gpu.py)

Rows (the code lives in the other bench modules, which also run on their own):
- eager add of a 64x8 f32, chained (eager_dispatch.py), replicated and batch-sharded;
- eager relayout of a 64 MiB f32 (relayout.py): plain column = a one-pass copy of the bytes;
- the MLP training step, tf.function with Adam (train_step.py), per step;
- the first call (trace, expansion, instantiation) of a K = 1000 op chain (train_step.py);
- peak RSS growth of the training step and of a sharded `--mib` variable, each in a fresh
  subprocess (memory.py); `--quick` leaves them out.

A fourth column, "plain TF, by hand", runs the per-device program a sharded row stands for
in plain TensorFlow without any DTensor: every block on its own virtual CPU with its own
ops (eager: one op per device; the training step and the chain: one tf.function whose
ops for each block of the batch are placed on that block's device, the update made once).
That is the floor of sharding on this host, where eight virtual devices share two cores:
eight small-batch kernels and eight times the nodes of one device's program.

Ratio columns are always tf_dtensor's time over the other's (below 1: tf_dtensor faster;
for GB/s rows, the other's rate over ours; for memory, ours over the other's growth).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF DTensor logs every SPMD cache miss.


def _wants_gpu(argv: List[str]) -> bool:
    return any(a in ("--device=gpu",) or (a == "--device" and argv[i + 1:i + 2] == ["gpu"])
               for i, a in enumerate(argv))


if __name__ == "__main__" and _wants_gpu(sys.argv):
    # The GPU table (bench/gpu.py) splits a GPU instead of the CPU: before TF starts.
    import gpu  # noqa: E402
    gpu.main()
    sys.exit(0)

import numpy as np  # noqa: E402

import eager_dispatch as ed  # noqa: E402 -- sets up 8 virtual CPUs first
import memory  # noqa: E402
import relayout as rl  # noqa: E402
import tensorflow as tf  # noqa: E402
import train_step as ts  # noqa: E402

COLUMNS = ("plain", "by_hand", "builtin", "ours")


class Row:
    """One workload: per column a sampler (one measurement per call) and its samples."""

    def __init__(self, name: str, unit: str, target: str,
                 samplers: Dict[str, Optional[Callable[[], float]]]):
        self.name, self.unit, self.target = name, unit, target
        self.samplers = samplers
        self.samples: Dict[str, List[float]] = {c: [] for c in COLUMNS}

    def sample(self) -> None:
        for column, sampler in self.samplers.items():
            if sampler is not None:
                self.samples[column].append(sampler())

    def median(self, column: str) -> Optional[float]:
        samples = self.samples[column]
        return statistics.median(samples) if samples else None

    def cell(self, column: str) -> str:
        value = self.median(column)
        if value is None:
            return "—"
        if self.unit == "GB/s":
            return f"{value:.2f} GB/s"
        if self.unit == "MiB":
            return f"{value:.0f} MiB"
        if value < 1e-3:
            return f"{value * 1e6:.0f} µs"
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"

    def ratio(self, other: str) -> str:
        ours, theirs = self.median("ours"), self.median(other)
        if ours is None or theirs is None or ours == 0 or theirs == 0:
            return "—"
        return f"{theirs / ours:.2f}" if self.unit == "GB/s" else f"{ours / theirs:.2f}"


def eager_add_row(name: str, specs: List[str], target: str, chain: int, repeats: int) -> Row:
    shape = (64, 8)
    op = lambda x, b: x + b  # noqa: E731
    value = np.random.RandomState(1).rand(*shape).astype(np.float32)
    plain_a, plain_b = tf.constant(value), tf.constant(value)
    samplers = {"plain": lambda: ed.per_op_seconds(op, plain_a, plain_b, lambda t: t.numpy(),
                                                   repeats, chain)}
    if "x" in specs:
        # By hand: the same blocks on their own devices, one plain eager op per device.
        blocks_a, blocks_b = ed.hand_blocks(value, ed.N_DEVICES), ed.hand_blocks(value, ed.N_DEVICES)
        samplers["by_hand"] = lambda: ed.per_op_seconds(
            ed.per_device(op), blocks_a, blocks_b, lambda ts: ts[0].numpy(), repeats, chain)
    for column, api in (("builtin", ed.tf_builtin), ("ours", ed.ours)):
        a, _ = ed.make_inputs(api, shape, specs)
        b, _ = ed.make_inputs(api, shape, specs)
        samplers[column] = (lambda a, b, api: lambda: ed.per_op_seconds(
            op, a, b, ed.read_first_component(api), repeats, chain))(a, b, api)
    return Row(name, "s", target, samplers)


def relayout_row(name: str, source, target_specs, target: str, size: int) -> Row:
    def rate(fn):
        return lambda: rl.gb_per_second(size, rl.seconds(fn))
    return Row(name, "GB/s", target, {
        "plain": rate(rl.copy_fn(size)),
        "builtin": rate(rl.relayout_fn(rl.tf_builtin, size, source, target_specs)),
        "ours": rate(rl.relayout_fn(rl.ours, size, source, target_specs))})


def train_row(setups, steps: int, target: str) -> Row:
    samplers = {}
    for setup in setups:
        _, time_round = ts.train_step_runner(setup, steps)  # first call traces
        samplers[setup.label] = time_round
    samplers["by_hand"] = ts.by_hand_train_step_runner(steps)[1]
    return Row("MLP train step (tf.function, Adam)", "s", target, samplers)


def first_call_row(setups, k: int, target: str) -> Row:
    samplers = {s.label: (lambda first_call: lambda: first_call()[0])(ts.chain_runner(s, k))
                for s in setups}
    by_hand = ts.by_hand_chain_runner(k)
    samplers["by_hand"] = lambda: by_hand()[0]
    return Row(f"first call, K = {k} op chain", "s", target, samplers)


def memory_rows(mib: int, steps: int) -> List[Row]:
    rows = []
    for case, name, target in (("train", "peak RSS growth, MLP train step", "≈ plain"),
                               ("variable", f"peak RSS growth, {mib} MiB variable [x,*]",
                                "≈ plain (size once)")):
        row = Row(name, "MiB", target, {})
        for column in ("plain", "builtin", "ours"):
            base, peak = memory.measure(column, case, mib, steps)
            row.samples[column].append(peak - base)
        rows.append(row)
    return rows


def print_table(rows: List[Row]) -> None:
    print("| workload | plain TF | plain TF, by hand | TF DTensor | tf_dtensor | ours/plain "
          "| ours/by hand | ours/TF-DT | target |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row.name} | {row.cell('plain')} | {row.cell('by_hand')} | "
              f"{row.cell('builtin')} | {row.cell('ours')} | {row.ratio('plain')} | "
              f"{row.ratio('by_hand')} | {row.ratio('builtin')} | {row.target} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: the GPU table of bench/gpu.py instead")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, shorter samples, no memory rows")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 3 quick)")
    parser.add_argument("--size", type=int, default=4096, help="relayout tensor side (64 MiB)")
    parser.add_argument("--chain", type=int, default=1000, help="K of the first-call row")
    parser.add_argument("--mib", type=int, default=1024, help="size of the variable, MiB")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    repeats, steps = (10, 5) if args.quick else (30, 10)

    setups = [ts.Setup("plain"), ts.Setup("builtin", ts.tf_builtin), ts.Setup("ours", ts.ours)]
    # TF's one-time costs (gradient registry, first kernels) are nobody's first call.
    ts.bench_train_step(setups[0], steps=1, rounds=1)
    ts.bench_chain(setups[0], k=10, rounds=1)
    rows = [
        eager_add_row("eager add 64×8 f32, replicated, chained", ["unsharded", "unsharded"],
                      "≤ 1.25× plain", chain=20, repeats=repeats),
        eager_add_row("same, batch-sharded over 8", ["x", "unsharded"], "≤ 2× plain",
                      chain=20, repeats=repeats),
        relayout_row(f"relayout {args.size ** 2 * 4 >> 20} MiB [x,*] → [*,x] (all-to-all)",
                     ["x", "unsharded"], ["unsharded", "x"], "≥ 6 GB/s, ≥ TF DTensor",
                     args.size),
        relayout_row(f"relayout {args.size ** 2 * 4 >> 20} MiB [x,*] → [*,*]",
                     ["x", "unsharded"], ["unsharded", "unsharded"], "keep", args.size),
        train_row(setups, steps, "≤ 1.15× plain"),
        first_call_row(setups, args.chain, "≤ 1.3× plain"),
    ]
    for r in range(rounds):
        for row in rows:
            row.sample()
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    if not args.quick:
        rows += memory_rows(args.mib, steps)
    print_table(rows)
    print("\nrelayout rows: plain TF = one numpy copy of the same bytes (the bound here). "
          "By hand: the same per-device program written in plain TF without DTensor (each "
          "block's ops on its own virtual CPU): the floor of sharding on this host. "
          "Ratios: tf_dtensor's time (or memory) over the other column's; below 1 is better.")


if __name__ == "__main__":
    main()
