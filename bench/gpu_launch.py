"""What one kernel costs the host on logical GPUs of one physical GPU, for matmuls and for
elementwise ops, on one device and on 8 at once. This is the floor under every sharded
training step of bench/gpu.py: each logical GPU runs its own copy of each op, and what the
host spends per op decides the step when the kernels themselves are short.

    python bench/gpu_launch.py [--rounds 7] [--chain 32]

Rows (medians; microseconds of wall time per op, so lower is better):
- "1 GPU": one tf.function, a chain of `--chain` ops on GPU:0;
- "8 GPUs, one function": one tf.function holding such a chain on each of 8 logical GPUs
  (TensorFlow runs the 8 per-device parts on 8 threads, as it runs a tf_dtensor step);
  the time is divided by 8 x chain, so it is 1/8 of the "1 GPU" figure where the devices'
  launches overlap fully and equals it where they run one at a time.
Ops: a [16, 784] @ [784, 784] matmul (the MLP step's per-device shape) and a multiply of the
same [16, 784]. No DTensor library is involved: this measures TensorFlow on this GPU.
`TF_DTENSOR_BENCH_GPU_DRY=1` runs it on 8 virtual CPUs instead, to try the script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gpu import split_gpu  # noqa: E402

N = 8


def chain_fn(kind: str, devices, chain: int):
    def one(h, w):
        for _ in range(chain):
            h = tf.matmul(h, w) if kind == "matmul" else h * w[0]
        return h

    @tf.function
    def fn(hs, w):
        outs = []
        for d, h in zip(devices, hs):
            with tf.device(d):
                outs.append(one(h, w[d]))
        return outs

    return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chain", type=int, default=32)
    args = parser.parse_args()
    devices = split_gpu(N, 2000)
    rng = np.random.RandomState(0)
    x = rng.rand(16, 784).astype(np.float32)
    w = (np.eye(784) + rng.uniform(-1e-4, 1e-4, (784, 784))).astype(np.float32)
    cases = {}
    for kind in ("matmul", "multiply"):
        for label, devs in (("1 GPU", devices[:1]), ("8 GPUs, one function", devices)):
            hs, ws = [], {}
            for d in devs:
                with tf.device(d):
                    hs.append(tf.constant(x))
                    ws[d] = tf.constant(w)
            fn = chain_fn(kind, devs, args.chain)
            fn(hs, ws)[0].numpy()
            cases[(kind, label)] = (fn, hs, ws, len(devs))
    samples = {key: [] for key in cases}
    for _ in range(args.rounds):
        for key, (fn, hs, ws, n) in cases.items():
            fn(hs, ws)[-1].numpy()
            start = time.perf_counter()
            for _ in range(4):
                out = fn(hs, ws)
            [o.numpy()[0, 0] for o in out]
            samples[key].append((time.perf_counter() - start) / 4 / (n * args.chain))
    print(f"device: {devices[0]} ... ({N} logical); TF_USE_CUBLASLT="
          f"{os.environ.get('TF_USE_CUBLASLT', '(unset)')}")
    print(f"{'op':10s}{'1 GPU':>14s}{'8 GPUs, one function':>24s}{'8 GPUs / 1 GPU':>16s}")
    for kind in ("matmul", "multiply"):
        one = statistics.median(samples[(kind, "1 GPU")])
        eight = statistics.median(samples[(kind, "8 GPUs, one function")])
        print(f"{kind:10s}{one * 1e6:11.1f} us{eight * 1e6:21.1f} us{eight / one:16.2f}")
    print("(per op; 8 GPUs / 1 GPU near 1/8: the devices' launches overlap fully; near 1: "
          "they run one at a time, as if one device ran all 8 chains)")


if __name__ == "__main__":
    main()
