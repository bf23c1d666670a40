"""Training-step time: tf_dtensor vs TensorFlow's built-in DTensor vs plain TensorFlow.

The MLP of examples/train_mlp.py (784-700-500-10, Adam, global batch 128) as one
`tf.function` train step, data-parallel on a ("batch", 8) mesh of virtual CPUs with
replicated weights and the batch packed as `[batch,*]`, next to the same step on one
plain device. Also the first call (trace, plus SPMD expansion for the DTensors) of that
step and of tf.functions chaining K = 10, 100, 1000 ops, alternately matmul and relu, on
a batch-sharded input. All three run side by side in one process; the machine is shared
and noisy, so compare the columns, not the absolute numbers.

    python bench/train_step.py [--steps 20] [--rounds 5] [--chains 10,100,1000]

Every timing ends with a read of one component (`.numpy()`), because TF's DTensor
returns before its per-device executors have finished.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable, List, Optional

from _setup import DEVICES, N_DEVICES  # noqa: E402,F401  (first: splits the CPU)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH_SIZE = 128
SIZES = (784, 700, 500, 10)
CHAIN_WIDTH = 64

from tensorflow.experimental import dtensor as tf_builtin  # noqa: E402

import tf_dtensor  # noqa: E402
from tf_dtensor import dtensor as ours  # noqa: E402

tf.get_logger().setLevel("ERROR")  # Retracing notices: every model traces its initializer.


class Setup:
    """How one of the three makes variables and batches: an api module and its mesh, or
    plain TensorFlow on CPU:0 (api None)."""

    def __init__(self, label: str, api=None):
        self.label, self.api = label, api
        self.mesh = api.create_mesh([("batch", N_DEVICES)], devices=DEVICES) if api else None

    def variable(self, initializer: Callable[..., tf.Tensor], rank: int, **kwargs):
        """A replicated DVariable of `initializer(**kwargs)`, or a tf.Variable on CPU:0."""
        if self.api is None:
            with tf.device("CPU:0"):
                return tf.Variable(initializer(**kwargs))
        layout = self.api.Layout.replicated(self.mesh, rank=rank)
        return self.api.DVariable(self.api.call_with_layout(initializer, layout, **kwargs))

    def replicated(self, value: np.ndarray):
        """`value` copied to every device of the mesh (or placed on CPU:0)."""
        if self.api is None:
            with tf.device("CPU:0"):
                return tf.constant(value)
        layout = self.api.Layout.replicated(self.mesh, rank=value.ndim)
        return self.api.copy_to_mesh(tf.constant(value), layout)

    def batch_sharded(self, value: np.ndarray):
        """`value` packed as `[batch,*...]`: one block of the batch per device."""
        if self.api is None:
            with tf.device("CPU:0"):
                return tf.constant(value)
        layout = self.api.Layout.batch_sharded(self.mesh, "batch", rank=value.ndim)
        return self.api.pack(np.split(value, N_DEVICES), layout)

    def read(self, tensor) -> np.ndarray:
        """Waits for `tensor` (one component of a DTensor) and returns it."""
        if self.api is None:
            return tensor.numpy()
        return self.api.unpack(tensor)[0].numpy()


class Model(tf.Module):
    """The example's MLP and hand-written Adam (step counter as a variable), in one."""

    def __init__(self, setup: Setup, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, ep=1e-7):
        super().__init__()
        uniform = tf.function(tf.random.stateless_uniform)
        self.weights: List[tf.Variable] = []
        for in_dim, out_dim in zip(SIZES[:-1], SIZES[1:]):
            limit = float(np.sqrt(6.0 / (in_dim + out_dim)))
            self.weights.append(setup.variable(uniform, 2, shape=(in_dim, out_dim),
                                               seed=(22, 23), minval=-limit, maxval=limit))
            self.weights.append(setup.variable(tf.zeros, 1, shape=[out_dim]))
        self.v = [setup.variable(tf.zeros, len(w.shape), shape=w.shape) for w in self.weights]
        self.s = [setup.variable(tf.zeros, len(w.shape), shape=w.shape) for w in self.weights]
        self.t = setup.variable(tf.ones, 0, shape=[])
        self.hyper = (learning_rate, beta_1, beta_2, ep)

    def __call__(self, x):
        for i in range(0, len(self.weights), 2):
            x = tf.add(tf.matmul(x, self.weights[i]), self.weights[i + 1])
            if i + 2 < len(self.weights):
                x = tf.nn.relu(x)
        return x

    def apply_gradients(self, grads):
        learning_rate, beta_1, beta_2, ep = self.hyper
        for grad, var, v, s in zip(grads, self.weights, self.v, self.s):
            v.assign(beta_1 * v + (1 - beta_1) * grad)
            s.assign(beta_2 * s + (1 - beta_2) * tf.square(grad))
            v_bc = v / (1 - beta_1 ** self.t)
            s_bc = s / (1 - beta_2 ** self.t)
            var.assign_sub(learning_rate * (v_bc / (tf.sqrt(s_bc) + ep)))
        self.t.assign_add(1.)


def make_train_step():
    """A fresh tf.function, so that its first call traces (and expands) again."""
    @tf.function
    def train_step(model, x_batch, y_batch):
        with tf.GradientTape() as tape:
            logits = model(x_batch)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_batch, logits=logits))
        model.apply_gradients(tape.gradient(loss, model.weights))
        return loss
    return train_step


def make_chain(k: int):
    """A fresh tf.function of k ops, alternately `x @ w` and `relu(x)`."""
    @tf.function
    def chain(x, w):
        for i in range(k):
            x = tf.matmul(x, w) if i % 2 == 0 else tf.nn.relu(x)
        return x
    return chain


def timed(fn: Callable[[], object], read: Callable[[object], object]) -> float:
    start = time.perf_counter()
    read(fn())
    return time.perf_counter() - start


def train_step_runner(setup: Setup, steps: int):
    """(first call in seconds, a function timing one round of `steps` steps and returning
    the seconds per step) of the training step."""
    rng = np.random.RandomState(0)
    x = setup.batch_sharded(rng.rand(BATCH_SIZE, SIZES[0]).astype(np.float32))
    y = setup.batch_sharded(rng.randint(0, SIZES[-1], BATCH_SIZE).astype(np.int64))
    model = Model(setup)
    train_step = make_train_step()
    first = timed(lambda: train_step(model, x, y), setup.read)

    def round_trip():
        # Steps depend on each other through the variables; reading the last loss waits
        # for all of them.
        for _ in range(steps - 1):
            train_step(model, x, y)
        return train_step(model, x, y)

    return first, lambda: timed(round_trip, setup.read) / steps


def by_hand_train_step_runner(steps: int):
    """The same training step written by hand per device in plain TensorFlow, no DTensor:
    the batch cut into N_DEVICES blocks, each block's forward and backward on its own
    virtual CPU, the losses summed and the update made once on CPU:0. This is the SPMD
    program a data-parallel step is, so its time is the floor of sharding the step on
    this host (eight small-batch kernels where one device runs one large one).
    Returns (first call in seconds, a function timing one round: seconds per step)."""
    rng = np.random.RandomState(0)
    x_value = rng.rand(BATCH_SIZE, SIZES[0]).astype(np.float32)
    y_value = rng.randint(0, SIZES[-1], BATCH_SIZE).astype(np.int64)
    block = BATCH_SIZE // N_DEVICES
    xs, ys = [], []
    for i, device in enumerate(DEVICES):
        with tf.device(device):
            xs.append(tf.constant(x_value[i * block:(i + 1) * block]))
            ys.append(tf.constant(y_value[i * block:(i + 1) * block]))
    model = Model(Setup("plain"))

    @tf.function
    def train_step(xs, ys):
        with tf.GradientTape() as tape:
            losses = []
            for i, device in enumerate(DEVICES):
                with tf.device(device):
                    losses.append(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                        labels=ys[i], logits=model(xs[i]))))
            with tf.device(DEVICES[0]):
                loss = tf.add_n(losses) / BATCH_SIZE
        with tf.device(DEVICES[0]):
            model.apply_gradients(tape.gradient(loss, model.weights))
        return loss

    read = lambda t: t.numpy()  # noqa: E731
    first = timed(lambda: train_step(xs, ys), read)

    def round_trip():
        for _ in range(steps - 1):
            train_step(xs, ys)
        return train_step(xs, ys)

    return first, lambda: timed(round_trip, read) / steps


def by_hand_chain_runner(k: int):
    """The k-op chain written by hand per device in plain TensorFlow: each device's block
    of the batch through its own chain on its own virtual CPU (the SPMD program of a
    batch-sharded chain, N_DEVICES times the nodes of one device's). Returns a function
    that traces a fresh one and gives (first call, chain, inputs)."""
    rng = np.random.RandomState(1)
    value = rng.rand(BATCH_SIZE, CHAIN_WIDTH).astype(np.float32)
    block = BATCH_SIZE // N_DEVICES
    xs, ws = [], []
    for i, device in enumerate(DEVICES):
        with tf.device(device):
            xs.append(tf.constant(value[i * block:(i + 1) * block]))
            ws.append(tf.constant(np.eye(CHAIN_WIDTH, dtype=np.float32)))

    def first_call():
        @tf.function
        def chain(xs, ws):
            outs = []
            for i, device in enumerate(DEVICES):
                with tf.device(device):
                    x = xs[i]
                    for j in range(k):
                        x = tf.matmul(x, ws[i]) if j % 2 == 0 else tf.nn.relu(x)
                    outs.append(x)
            return outs
        return timed(lambda: chain(xs, ws), lambda outs: outs[0].numpy()), chain, (xs, ws)
    return first_call


def bench_train_step(setup: Setup, steps: int, rounds: int):
    """(first call, median seconds per step) of the training step."""
    first, time_round = train_step_runner(setup, steps)
    return first, statistics.median(time_round() for _ in range(rounds))


def chain_runner(setup: Setup, k: int):
    """A function that traces a fresh k-op chain on `[batch,*]` input and returns (first
    call, the chain and its inputs)."""
    rng = np.random.RandomState(1)
    x = setup.batch_sharded(rng.rand(BATCH_SIZE, CHAIN_WIDTH).astype(np.float32))
    w = setup.replicated(np.eye(CHAIN_WIDTH, dtype=np.float32))

    def first_call():
        chain = make_chain(k)
        return timed(lambda: chain(x, w), setup.read), chain, (x, w)
    return first_call


def bench_chain(setup: Setup, k: int, rounds: int):
    """(first call, median seconds per later call) of a k-op chain on `[batch,*]` input."""
    first, chain, (x, w) = chain_runner(setup, k)()
    later = statistics.median(timed(lambda: chain(x, w), setup.read) for _ in range(rounds))
    return first, later


def run_case(setup: Setup, fn) -> Optional[tuple]:
    """Runs one measurement; a failure is printed (first line) and gives None, and so
    does tf_dtensor running a function replicated for want of a rule."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tf_dtensor.UnsupportedOpWarning)
        try:
            return fn(setup)
        except Exception as error:  # noqa: BLE001 -- report and go on with the other columns
            print(f"  {setup.label} failed: {type(error).__name__}: "
                  f"{str(error).strip().splitlines()[0][:300]}")
            return None
        finally:
            names = sorted({str(w.message).split("'")[1] for w in caught
                            if issubclass(w.category, tf_dtensor.UnsupportedOpWarning)})
            if names:
                print(f"  {setup.label}: ran replicated, no rule for {', '.join(names)}")


def fmt(seconds: Optional[float]) -> str:
    if seconds is None:
        return "failed"
    return f"{seconds * 1e3:.1f}ms" if seconds < 1 else f"{seconds:.2f}s"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}" if a is not None and b is not None else "-"


def print_row(name: str, times: dict) -> None:
    plain, builtin, ours_ = times["plain"], times["builtin"], times["ours"]
    print(f"{name:34s} {fmt(plain):>10s} {fmt(builtin):>11s} {fmt(ours_):>11s} "
          f"{ratio(ours_, builtin):>10s} {ratio(ours_, plain):>10s}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--chains", default="10,100,1000", help="chain lengths K")
    args = parser.parse_args()

    setups = [Setup("plain"), Setup("builtin", tf_builtin), Setup("ours", ours)]
    # Warm up: TF's one-time costs (gradient registry, first kernels) would otherwise be
    # charged to the first column's first call.
    bench_train_step(setups[0], steps=1, rounds=1)
    bench_chain(setups[0], k=10, rounds=1)
    print(f"{'case':34s} {'plain TF':>10s} {'TF DTensor':>11s} {'tf_dtensor':>11s} "
          f"{'ours/TF-DT':>10s} {'ours/plain':>10s}")

    results = {s.label: run_case(s, lambda s: bench_train_step(s, args.steps, args.rounds))
               for s in setups}
    print_row("train step, first call",
              {label: r[0] if r else None for label, r in results.items()})
    print_row("train step, per step",
              {label: r[1] if r else None for label, r in results.items()})
    steps_per_second = {label: f"{1 / r[1]:.1f}" if r else "failed"
                        for label, r in results.items()}
    print(f"{'  (steps/second)':34s} {steps_per_second['plain']:>10s} "
          f"{steps_per_second['builtin']:>11s} {steps_per_second['ours']:>11s}")

    for k in (int(k) for k in args.chains.split(",")):
        results = {s.label: run_case(s, lambda s: bench_chain(s, k, args.rounds))
                   for s in setups}
        print_row(f"chain K={k}, first call",
                  {label: r[0] if r else None for label, r in results.items()})
        print_row(f"chain K={k}, later call",
                  {label: r[1] if r else None for label, r in results.items()})


if __name__ == "__main__":
    main()
