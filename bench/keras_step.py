"""Keras `fit` step time: plain Keras on one device vs tf_dtensor data- and model-parallel.

The same Keras model (an MLP 784-1024-1024-10, Adam, accuracy metric, global batch 128)
trained with `model.fit` three ways in one process: plain Keras on CPU:0, under
`keras.distribution.DataParallel` over 8 virtual CPUs, and under `ModelParallel` on a
("batch", 2) x ("model", 4) mesh with the hidden kernels split column- then row-wise.
Rounds alternate the columns so a load spike hits all alike; the table shows medians of the
per-step time of one epoch, then each column's range over rounds and its median process CPU
time per step (all threads), which moves less than wall time on a shared machine. When JAX is installed, the same two distributions run on
Keras' JAX backend with 8 host devices, in a subprocess (a Keras process has one backend):
what a Keras user would pick instead.

"State per device" is the bytes of weights and optimizer slots the busiest device holds,
from the variables' layouts (`tf_dtensor.keras.explain`): sharded weights are sharded.
TensorFlow's DTensor has no column: Keras 3 cannot run on it.

    python bench/keras_step.py [--rounds 5] [--steps 16] [--no-jax]

The machine is shared and noisy: compare the columns, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH = 128
SIZES = (784, 1024, 1024, 10)
RULES = {"h1/kernel": (None, "model"), "h1/bias": ("model",), "h2/kernel": ("model", None)}


def _setup_devices(backend: str) -> None:
    if backend == "jax":
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        return
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)


def _model(keras):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SIZES[0],))
    h = keras.layers.Dense(SIZES[1], activation="relu", name="h1")(inputs)
    h = keras.layers.Dense(SIZES[2], activation="relu", name="h2")(h)
    model = keras.Model(inputs, keras.layers.Dense(SIZES[3], name="out")(h))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"])
    return model


def _distribution(keras, kind: str):
    devices = keras.distribution.list_devices("cpu")
    if kind == "data":
        return keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in RULES.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


class Column:
    def __init__(self, keras, kind: str, steps: int):
        import numpy as np
        self.kind, self.steps = kind, steps
        self.distribution = None if kind == "plain" else _distribution(keras, kind)
        rng = np.random.RandomState(0)
        self.x = rng.randn(BATCH * steps, SIZES[0]).astype("float32")
        self.y = rng.randint(0, SIZES[3], BATCH * steps).astype("int32")
        with self._scope():
            self.model = _model(keras)
            self.model.fit(self.x, self.y, batch_size=BATCH, epochs=1, verbose=0)  # warm up

    def _scope(self):
        import contextlib
        return self.distribution.scope() if self.distribution else contextlib.nullcontext()

    def step_ms(self) -> float:
        return self.step_wall_and_cpu_ms()[0]

    def step_wall_and_cpu_ms(self) -> tuple:
        """Wall-clock and process CPU time (every thread's) per step of one epoch."""
        with self._scope():
            start, start_cpu = time.perf_counter(), time.process_time()
            self.model.fit(self.x, self.y, batch_size=BATCH, epochs=1, verbose=0,
                           shuffle=False)
            return ((time.perf_counter() - start) * 1e3 / self.steps,
                    (time.process_time() - start_cpu) * 1e3 / self.steps)


def measure(backend: str, kinds, rounds: int, steps: int) -> dict:
    """Median ms per step for each kind, all in this process."""
    import keras
    columns = [Column(keras, kind, steps) for kind in kinds]
    samples = {c.kind: [] for c in columns}
    for _ in range(rounds):
        for column in columns:
            samples[column.kind].append(column.step_wall_and_cpu_ms())
    result = {kind: statistics.median(wall for wall, _ in values)
              for kind, values in samples.items()}
    for kind, values in samples.items():
        # CPU time moves less than wall time when other processes share the cores.
        result[f"{kind}_cpu"] = statistics.median(cpu for _, cpu in values)
        result[f"{kind}_spread"] = (min(wall for wall, _ in values),
                                    max(wall for wall, _ in values))
    if backend == "tensorflow":
        import tf_dtensor.keras
        for column in columns:
            plans = tf_dtensor.keras.explain(column.model, print_fn=None)
            result[f"{column.kind}_state_bytes"] = sum(p.bytes_per_device for p in plans)
    return result


def _jax(rounds: int, steps: int):
    env = dict(os.environ, KERAS_BACKEND="jax")
    out = subprocess.run([sys.executable, __file__, "--child-jax", "--rounds", str(rounds),
                          "--steps", str(steps)], env=env, capture_output=True, text=True,
                         timeout=1800, check=False)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1:] or ["failed"]
    return json.loads(out.stdout.strip().splitlines()[-1]), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--child-jax", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_jax:
        _setup_devices("jax")
        print(json.dumps(measure("jax", ("data", "model"), args.rounds, args.steps)))
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _setup_devices("tensorflow")
    import tf_dtensor  # noqa: F401  (keras.distribution on tf_dtensor)
    ours = measure("tensorflow", ("plain", "data", "model"), args.rounds, args.steps)
    jax, why = (None, ["--no-jax"]) if args.no_jax else _jax(args.rounds, args.steps)
    if jax is None and not args.no_jax:
        try:
            import importlib.util
            why = why if importlib.util.find_spec("jax") else ["JAX is not installed"]
        except ImportError:
            why = ["JAX is not installed"]
    print(f"Keras fit step, MLP {'-'.join(map(str, SIZES))}, Adam, batch {BATCH}, "
          f"8 virtual CPUs, median of {args.rounds} rounds of {args.steps} steps")
    print(f"{'distribution':<16}{'plain Keras':>14}{'tf_dtensor':>14}{'ratio':>8}"
          f"{'Keras on JAX':>15}{'ratio':>8}{'state/device':>15}")
    plain = ours["plain"]
    print(f"{'none (1 device)':<16}{plain:>12.2f}ms{'':>14}{'':>8}{'':>15}{'':>8}"
          f"{ours['plain_state_bytes'] / 2**20:>11.2f} MiB")
    for kind, label in (("data", "DataParallel"), ("model", "ModelParallel")):
        j = jax[kind] if jax else None
        jax_cells = f"{j:>13.2f}ms{ours[kind] / j:>8.2f}" if j else f"{'-':>15}{'-':>8}"
        print(f"{label:<16}{plain:>12.2f}ms{ours[kind]:>12.2f}ms{ours[kind] / plain:>8.2f}"
              f"{jax_cells}{ours[f'{kind}_state_bytes'] / 2**20:>11.2f} MiB")
    print("ratio: tf_dtensor's time over the other column's (below 1: tf_dtensor faster)")
    print(f"{'':<16}{'wall min-max':>18}{'CPU ms/step':>14}{'CPU ratio':>11}")
    for kind, label in (("plain", "none (1 device)"), ("data", "DataParallel"),
                        ("model", "ModelParallel")):
        low, high = ours[f"{kind}_spread"]
        print(f"{label:<16}{low:>8.1f}-{high:.1f}ms{ours[f'{kind}_cpu']:>12.2f}ms"
              f"{ours[f'{kind}_cpu'] / ours['plain_cpu']:>11.2f}")
    if jax is None:
        print(f"Keras on JAX: not run ({why[0]})")


if __name__ == "__main__":
    main()
