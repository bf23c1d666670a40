"""Model step time and per-device memory: tf_dtensor vs TensorFlow's DTensor vs plain TF.

Trains the two model examples side by side in one process on 8 virtual CPUs:

- `examples/transformer.py` on a ("batch", 2) x ("model", 4) mesh: data parallelism and
  Megatron-style tensor parallelism. TensorFlow's DTensor cannot look up rows of a
  row-sharded table ("does not support sharded 0th dimension ... for ResourceGatherOp"),
  so its run shards the embedding by columns instead.
- `examples/cnn.py` on ("batch", 8): data parallelism with synchronised batch norm.
  TensorFlow's DTensor has no rule for FusedBatchNormV3, so the CNN also runs with batch
  norm written from moments (`fused=False`), the form all three can run.

For each it prints the median step time over rounds (each round runs the three in turn,
after a warm-up step that traces), the ratio to plain TensorFlow, whether the losses of
the first steps match the plain run, and the bytes of weights and optimizer state held
by the fullest device (plain: the one device holds everything; a replicated DTensor run
would hold it on every device).

    python bench/models.py [--steps 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

from _setup import DEVICES, N_DEVICES  # noqa: E402,F401  (first: splits the CPU)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.experimental import dtensor as tf_builtin  # noqa: E402

from tf_dtensor import dtensor as ours  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
tf.get_logger().setLevel("ERROR")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


transformer = load_example("transformer")
cnn = load_example("cnn")


class Run:
    """One model in one mode: a step function and its batches, ready to time."""

    def __init__(self, label: str, api, step: Callable, batches: List,
                 variables: List[tf.Variable]):
        self.label, self.api, self.step = label, api, step
        self.batches, self.variables = batches, variables
        self.losses = [float(step(*batch).numpy()) for batch in batches]  # traces, records
        self.times: List[float] = []

    def time_round(self) -> None:
        start = time.perf_counter()
        for batch in self.batches:
            loss = self.step(*batch)
        loss.numpy()  # TF's DTensor returns before its executors finish.
        self.times.append((time.perf_counter() - start) / len(self.batches))

    def bytes_on_fullest_device(self) -> int:
        per_device: Dict[int, int] = {}
        for variable in self.variables:
            value = variable.read_value()
            components = [value] if self.api is None else self.api.unpack(value)
            for i, component in enumerate(components):
                per_device[i] = per_device.get(i, 0) + component.numpy().nbytes
        return max(per_device.values())


def transformer_run(label: str, api, steps: int, weight_specs=None) -> Run:
    config = transformer.Config()
    placement = transformer.make_placement(api, (2, 4))
    model = transformer.Transformer(config, placement, weight_specs=weight_specs)
    variables = list(model.weights.values())
    optimizer = transformer.Adam(variables, placement, config.learning_rate)
    step = transformer.make_train_step(model, optimizer)
    batches = [(placement.tensor(x, ("batch", transformer.U)),
                placement.tensor(y, ("batch", transformer.U)))
               for x, y in transformer.batches(config, steps)]
    return Run(label, api, step, batches, variables + optimizer.m + optimizer.v)


def cnn_run(label: str, api, steps: int, fused: bool, data) -> Run:
    placement = cnn.make_placement(api, (N_DEVICES,))
    model = cnn.CNN(placement, fused=fused)
    step, velocities = cnn.make_train_step(model)
    batches = [(placement.tensor(x, placement.image_specs), placement.tensor(y, ("batch",)))
               for x, y in cnn.batches(*data, batch_size=32, steps=steps)]
    return Run(label, api, step, batches, list(model.weights.values()) + velocities)


def report(title: str, runs: List[Run]) -> None:
    plain = runs[0]
    base = statistics.median(plain.times)
    print(f"\n{title}")
    print(f"  {'':34s} {'step (ms)':>10s} {'vs plain':>9s} {'matches plain':>14s} "
          f"{'state on fullest device':>24s}")
    for run in runs:
        median = statistics.median(run.times)
        match = np.allclose(run.losses, plain.losses, rtol=1e-4, atol=1e-4)
        print(f"  {run.label:34s} {median * 1e3:10.2f} {median / base:8.2f}x "
              f"{'yes' if match else 'NO':>14s} {run.bytes_on_fullest_device() / 1024:21.1f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    column_embedding = {"embedding": (transformer.U, "model")}
    data = cnn.load_digits()
    groups = {
        "transformer, 2x4 mesh (batch x model)": [
            transformer_run("plain TF", None, args.steps),
            transformer_run("tf_dtensor", ours, args.steps),
            transformer_run("tf_dtensor (column embedding)", ours, args.steps, column_embedding),
            transformer_run("TF DTensor (column embedding)", tf_builtin, args.steps,
                            column_embedding),
        ],
        "cnn, batch=8, fused batch norm": [
            cnn_run("plain TF", None, args.steps, True, data),
            cnn_run("tf_dtensor", ours, args.steps, True, data),
        ],
        "cnn, batch=8, batch norm from moments": [
            cnn_run("plain TF", None, args.steps, False, data),
            cnn_run("tf_dtensor", ours, args.steps, False, data),
            cnn_run("TF DTensor", tf_builtin, args.steps, False, data),
        ],
    }
    for _ in range(args.rounds):
        for runs in groups.values():
            for run in runs:
                run.time_round()
    for title, runs in groups.items():
        report(title, runs)
    print("\n'matches plain': the losses of every step agree with plain TF to 1e-4. TF's "
          "DTensor reads a variable's old value after an assign inside a tf.function, so "
          "its optimizers drift from the second step.")


if __name__ == "__main__":
    main()
