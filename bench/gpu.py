"""The GPU table of issue 27: plain TensorFlow on one GPU, TensorFlow's DTensor and
tf_dtensor, side by side in one process on one physical GPU split into 8 logical GPUs
(float32, TensorFloat-32 off). `python bench/run.py --device gpu` runs it; on its own:

    python bench/gpu.py [--rounds 7] [--variants] [--jit] [--profile DIR]

Rows (medians over rounds; each round samples every column in turn, so a load spike hits
all columns alike):
- the MLP training step of the issue (784-700-500-10, global batch 128 sharded over the
  batch axis, `tf.function`, SGD), on 8 and on 2 logical GPUs;
- an eager add of a 512x8 float32 sharded over 8, chained, per op;
- a 4096x4096 matmul whose contracted axis is sharded over 8 (`tf.function`);
- eager relayouts of a 256 MiB float32 `[x,*]` -> `[*,*]` (all-gather) and -> `[*,x]`
  (all-to-all), as GB/s of the global tensor, and the same relayouts in a `tf.function`
  ("in fn": TF's executors make the copies as Send/Recv, where an eager copy holds its
  thread until done).
`--variants` adds tf_dtensor columns with TensorFlow's collective ops instead of the
device-to-device copies, without combining all-reduces, without per-device dispatch
threads, with each all-reduce form of the copies, and (relayout rows only) with the
all-to-all's SplitV/ConcatV2 form instead of its Transpose/DynamicStitch one, so the
choices the defaults make are measured, not assumed. Every sharded result
is checked against the plain one first. `--profile DIR` writes TensorFlow profiler traces
of a few training steps of both libraries to DIR, and of two rounds of each relayout row.
`--jit` adds plain, TensorFlow's DTensor and tf_dtensor columns with XLA auto-clustering
(`tf.config.optimizer.set_jit("autoclustering")`), which fuses each device's ops of a
`tf.function` into XLA clusters: fewer kernel launches per step, the limit on logical GPUs
of one physical GPU (see README). It touches the `tf.function` rows only.

Every timing ends with TensorFlow's `sync_devices` (every device's stream finished): both
libraries return before the GPUs have finished, and reading one element of one component
would wait for that device alone (the runs of 2026-11-26 and 27 timed that way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from typing import Callable, Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _mlp import sgd_step  # noqa: E402

N = 8
SIZES = (784, 700, 500, 10)
BATCH = 128


def split_gpu(n: int, memory_mb: int) -> List[str]:
    if os.environ.get("TF_DTENSOR_BENCH_GPU_DRY"):  # a dry run of this script on CPUs
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        return [f"CPU:{i}" for i in range(n)]
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("bench/gpu.py: no GPU visible")
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * n)
    tf.config.experimental.enable_tensor_float_32_execution(False)
    return [f"GPU:{i}" for i in range(n)]


class Api:
    """One column: plain TF on GPU:0 (api None) or a DTensor module with its settings."""

    SETTINGS = ("TF_DTENSOR_DISPATCH_THREADS", "TF_DTENSOR_COMBINE_ALL_REDUCE_MIB",
                "TF_DTENSOR_COPIES_ALL_REDUCE", "TF_DTENSOR_COPIES_PIECES")

    def __init__(self, label: str, api=None, lowering: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, jit: bool = False,
                 rows: tuple = ()):
        self.label, self.api, self.lowering, self.env = label, api, lowering, env or {}
        self.jit = jit
        self.rows = rows  # row name prefixes this column is timed on (all if empty)

    def enter(self):
        """Applies this column's XLA clustering, lowering and settings (the last two
        tf_dtensor only; read when an op
        runs or a function is expanded). A change of lowering policy drops every plan and
        expanded function, so each sample makes one untimed call first: otherwise columns
        of different lowerings, sampled in turn, would time a re-expansion in every round
        (the first two GPU runs of issue 27 did, for tf_dtensor's tf.function rows)."""
        if self.lowering is not None:
            import tf_dtensor
            # Only a change of policy drops the plans and expanded functions made so far.
            tf_dtensor.config.set_collective_lowering(self.lowering)
        # TF reads the auto-clustering level when it instantiates a function for a call,
        # and keeps one instantiation per level; set only on a change (a set drops the
        # context's cached call options).
        if bool(tf.config.optimizer.get_jit()) != self.jit:
            tf.config.optimizer.set_jit("autoclustering" if self.jit else False)
        for name in self.SETTINGS:
            if name in self.env:
                os.environ[name] = self.env[name]
            else:
                os.environ.pop(name, None)

    def place(self, value: np.ndarray, specs: List[str], devices: List[str]):
        """`value` on the first device (plain), or on a mesh of `devices` laid out as
        `specs` (mesh dimension "x")."""
        if self.api is None:
            with tf.device(devices[0]):
                return tf.constant(value)
        mesh = mesh_of(self.api, devices)
        whole = self.api.copy_to_mesh(tf.constant(value),
                                      self.api.Layout.replicated(mesh, value.ndim))
        return self.api.relayout(whole, self.api.Layout(specs, mesh))

    def wait(self, t) -> None:
        """Waits until every device has finished the work that made `t` (TensorFlow's
        `sync_devices`: each logical device's stream, then the eager executors). Reading one
        element of one component would wait for that device only, and a relayout's other
        devices may still be copying."""
        del t  # made by the work to wait for; every device is waited on
        tf.test.experimental.sync_devices()

    def read(self, t) -> np.ndarray:
        """Waits for `t` by reading one element of it (of its first component): reading a
        whole large result would time the copy to the host."""
        first = self.api.unpack(t)[0] if self.api else t
        with tf.device(first.device):
            return tf.reshape(first, [-1])[:1].numpy()

    def whole(self, t) -> np.ndarray:
        """The global value (a DTensor's components reassembled along axis 0 if sharded)."""
        if self.api is None:
            return t.numpy()
        layout = self.api.fetch_layout(t)
        parts = [p.numpy() for p in self.api.unpack(t)]
        if layout.sharding_specs and layout.sharding_specs[0] != "unsharded":
            return np.concatenate(parts[:: max(1, len(parts) // layout.num_shards(0))])
        return parts[0]


def mesh_of(api, devices, name="x"):
    return api.create_mesh([(name, len(devices))], devices=devices)


# --- the MLP step -------------------------------------------------------------------------

def mlp_runner(col: Api, devices: List[str], steps: int):
    rng = np.random.RandomState(0)
    x_value = rng.rand(BATCH, SIZES[0]).astype(np.float32)
    y_value = rng.randint(0, SIZES[-1], BATCH).astype(np.int64)
    inits = []
    for i, o in zip(SIZES[:-1], SIZES[1:]):
        inits.append(rng.uniform(-0.05, 0.05, (i, o)).astype(np.float32))
        inits.append(np.zeros([o], np.float32))
    api = col.api
    col.enter()  # values made under the lowering that runs them
    if api is None:
        with tf.device(devices[0]):
            variables = [tf.Variable(v) for v in inits]
            x, y = tf.constant(x_value), tf.constant(y_value)
    else:
        mesh = mesh_of(api, devices, "batch")
        variables = [api.DVariable(api.copy_to_mesh(tf.constant(v),
                                                    api.Layout.replicated(mesh, v.ndim)))
                     for v in inits]
        n = len(devices)
        x = api.pack(np.split(x_value, n), api.Layout.batch_sharded(mesh, "batch", 2))
        y = api.pack(np.split(y_value, n), api.Layout.batch_sharded(mesh, "batch", 1))

    step = sgd_step(variables)

    col.enter()
    losses = [float(col.read(step(x, y))[0]) for _ in range(3)]

    def sample():
        col.enter()
        col.wait(step(x, y))  # untimed: see `Api.enter`
        start = time.perf_counter()
        for _ in range(steps - 1):
            step(x, y)
        col.wait(step(x, y))
        return (time.perf_counter() - start) / steps

    return losses, sample, (step, x, y)


# --- eager add -----------------------------------------------------------------------------

def add_runner(col: Api, devices: List[str], chain: int):
    if col.jit:
        raise LookupError("eager: XLA clustering does not apply")
    value = np.random.RandomState(1).rand(512, 8).astype(np.float32)
    col.enter()
    a = col.place(value, ["x", "unsharded"], devices)
    b = col.place(value, ["x", "unsharded"], devices)
    check = col.whole(a + b)

    def sample():
        col.enter()
        col.wait(a + b)  # untimed: see `Api.enter`
        start = time.perf_counter()
        x = a
        for _ in range(chain):
            x = x + b
        col.wait(x)
        return (time.perf_counter() - start) / chain

    return check, sample


# --- contracted matmul -----------------------------------------------------------------------

def matmul_runner(col: Api, devices: List[str], size: int):
    rng = np.random.RandomState(2)
    av, bv = rng.rand(size, size).astype(np.float32), rng.rand(size, size).astype(np.float32)
    col.enter()
    a = col.place(av, ["unsharded", "x"], devices)
    b = col.place(bv, ["x", "unsharded"], devices)
    fn = tf.function(tf.matmul)
    col.enter()
    check = col.whole(fn(a, b))

    def sample():
        col.enter()
        col.wait(fn(a, b))  # untimed: see `Api.enter`
        start = time.perf_counter()
        col.wait(fn(a, b))
        return time.perf_counter() - start

    return check, sample


# --- probes (--variants): what one call costs without, with one and with six collectives ----

GRAD_SHAPES = [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]


def probe_runner(col: Api, devices: List[str], kind: str):
    """kind "local": x * 2 + 1 on a batch-sharded [128, 784] (no collective); "reduce1": one
    all-reduce of a 784x700 partial sum; "reduce6": six all-reduces of the MLP's gradient
    shapes in one function (each a sum over a sharded leading axis of n blocks); "scatter":
    that 784x700 sum laid out sharded over its rows (a reduce-scatter where the library
    plans one; TensorFlow's DTensor all-reduces, then slices)."""
    col.enter()
    api, n = col.api, len(devices)
    rng = np.random.RandomState(4)
    if kind == "local":
        values = [rng.rand(BATCH, SIZES[0]).astype(np.float32)]
        fn = tf.function(lambda x: x * 2.0 + 1.0)
    else:
        shapes = GRAD_SHAPES[:1] if kind in ("reduce1", "scatter") else GRAD_SHAPES
        values = [rng.rand(n, *shape).astype(np.float32) for shape in shapes]
        fn = tf.function(lambda *xs: [tf.reduce_sum(x, axis=0) for x in xs])
        if kind == "scatter" and api is not None:
            rows = api.Layout(["x", "unsharded"], mesh_of(api, devices))
            fn = tf.function(lambda x: api.relayout(tf.reduce_sum(x, axis=0), rows))
    if api is None:
        with tf.device(devices[0]):
            inputs = [tf.constant(v) for v in values]
    else:
        mesh = mesh_of(api, devices)
        inputs = [api.pack(np.split(v, n), api.Layout(["x"] + ["unsharded"] * (v.ndim - 1), mesh))
                  for v in values]

    def first(out):
        return out[0] if isinstance(out, (list, tuple)) else out
    check = col.whole(first(fn(*inputs)))

    def sample():
        col.enter()
        col.wait(first(fn(*inputs)))  # untimed: see `Api.enter`
        start = time.perf_counter()
        for _ in range(9):
            fn(*inputs)
        col.wait(first(fn(*inputs)))
        return (time.perf_counter() - start) / 10

    return check, sample


# --- relayout ------------------------------------------------------------------------------

def relayout_runner(col: Api, devices: List[str], side: int, target: List[str],
                    traced: bool = False):
    """An eager relayout, or (`traced`) one in a tf.function: there TF's executors make the
    copies as Send/Recv, none holding a thread until its copy is done."""
    col.enter()
    api = col.api
    mesh = mesh_of(api, devices)
    value = np.random.RandomState(3).rand(side, side).astype(np.float32)
    source = api.relayout(api.copy_to_mesh(tf.constant(value), api.Layout.replicated(mesh, 2)),
                          api.Layout(["x", "unsharded"], mesh))
    layout = api.Layout(target, mesh)
    if traced:
        module = api
        relayout = tf.function(lambda v: module.relayout(v, layout))
        api = types.SimpleNamespace(relayout=lambda v, _: relayout(v), unpack=module.unpack)
    col.enter()
    out = api.relayout(source, layout)
    got = np.concatenate([p.numpy() for p in api.unpack(out)], axis=1)[:, :side] \
        if target[1] == "x" else api.unpack(out)[0].numpy()
    ok = bool(np.array_equal(got, value))

    def sample():
        col.enter()
        col.wait(api.relayout(source, layout))  # untimed: see `Api.enter`
        start = time.perf_counter()
        col.wait(api.relayout(source, layout))
        return side * side * 4 / (time.perf_counter() - start) / 1e9

    return ok, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--chain", type=int, default=50)
    parser.add_argument("--side", type=int, default=8192, help="relayout tensor side (256 MiB)")
    parser.add_argument("--memory-mb", type=int, default=8000, help="per logical GPU")
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--jit", action="store_true",
                        help="add columns with XLA auto-clustering (tf.function rows)")
    parser.add_argument("--only", default="",
                        help="comma-separated row name prefixes to run (default: every row)")
    parser.add_argument("--profile", default="")
    parser.add_argument("--device", default="gpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    devices = split_gpu(N, args.memory_mb)

    from tensorflow.experimental import dtensor as builtin
    import tf_dtensor
    from tf_dtensor import dtensor as ours

    columns = [Api("plain"), Api("TF DTensor", builtin), Api("tf_dtensor", ours, "", None)]
    if args.variants:  # what each default of tf_dtensor's on GPUs is worth
        columns += [Api("ours, TF collectives", ours, "ops"),
                    Api("ours, no combining", ours, "", {"TF_DTENSOR_COMBINE_ALL_REDUCE_MIB": "0"}),
                    Api("ours, threads off", ours, "", {"TF_DTENSOR_DISPATCH_THREADS": "off"}),
                    Api("ours, leader all-reduce", ours, "",
                        {"TF_DTENSOR_COPIES_ALL_REDUCE": "leader"}),
                    Api("ours, direct all-reduce", ours, "",
                        {"TF_DTENSOR_COPIES_ALL_REDUCE": "direct"}),
                    Api("ours, split all-to-all", ours, "",
                        {"TF_DTENSOR_COPIES_PIECES": "split"}, rows=("relayout",))]
    if args.jit:
        columns += [Api("plain, XLA", jit=True), Api("TF DTensor, XLA", builtin, jit=True),
                    Api("ours, XLA", ours, "", None, jit=True)]
    print("device:", tf.config.list_physical_devices("GPU"), "lowering policy default:",
          tf_dtensor.config.collective_lowering(), flush=True)

    rows: Dict[str, Dict[str, Callable[[], float]]] = {}
    units: Dict[str, str] = {}
    problems: List[str] = []

    only = [p.strip() for p in args.only.split(",") if p.strip()]

    def add_row(name, unit, make):
        if only and not any(name.startswith(p) for p in only):
            return
        rows[name], units[name] = {}, unit
        reference = None
        for col in columns:
            if col.rows and not any(name.startswith(r) for r in col.rows):
                continue
            try:
                check, sample = make(col)
            except LookupError:  # a column this row has no counterpart in
                continue
            except Exception as e:  # noqa: BLE001 -- a column that fails is reported, not fatal
                problems.append(f"{name} / {col.label}: {type(e).__name__}: {str(e)[:300]}")
                continue
            if check is not None:
                if reference is None:
                    reference = check
                elif not (check is True or (isinstance(check, np.ndarray) and
                                            np.allclose(check, reference, rtol=2e-4, atol=2e-4))):
                    problems.append(f"{name} / {col.label}: result differs from plain")
            rows[name][col.label] = sample
        print(f"set up: {name}", flush=True)

    for n in (8, 2):
        def make_mlp(col, n=n):
            losses, sample, _ = mlp_runner(col, devices[:n], args.steps)
            return np.array(losses), sample
        add_row(f"MLP step, {n} GPUs", "s", make_mlp)
    add_row("eager add 512x8 over 8", "s", lambda col: add_runner(col, devices, args.chain))
    add_row("matmul 4096^2 [*,x]@[x,*]", "s", lambda col: matmul_runner(col, devices, 4096))
    if args.variants:
        for kind, label in (("local", "probe: fn x*2+1, no collective"),
                            ("reduce1", "probe: fn 1 all-reduce 2.2MB"),
                            ("reduce6", "probe: fn 6 all-reduces (MLP)"),
                            ("scatter", "probe: fn sum 2.2MB to [x,*]")):
            add_row(label, "s", lambda col, kind=kind: probe_runner(col, devices, kind))
    for name, target in (("relayout 256MiB [x,*]->[*,*]", ["unsharded", "unsharded"]),
                         ("relayout 256MiB [x,*]->[*,x]", ["unsharded", "x"])):
        for traced in (False, True):
            def make_relayout(col, target=target, traced=traced):
                if col.api is None or col.jit:
                    raise LookupError("no plain column; XLA clustering does not apply")
                return relayout_runner(col, devices, args.side, target, traced)
            add_row(name.replace("256MiB ", "") + " in fn" if traced else name, "GB/s",
                    make_relayout)

    samples: Dict[str, Dict[str, List[float]]] = {r: {c: [] for c in rows[r]} for r in rows}
    labels = [c.label for c in columns]

    def cell(r, c):
        s = samples[r].get(c)
        if not s:
            return "—"
        m = statistics.median(s)
        if units[r] == "GB/s":
            return f"{m:.1f} GB/s"
        return f"{m * 1e6:.0f} us" if m < 1e-3 else f"{m * 1e3:.2f} ms"

    def table(title):
        print(f"\n{title}")
        width = max(22, max(len(l) for l in labels) + 2)
        print(f"{'workload':30s}" + "".join(f"{l:>{width}s}" for l in labels) +
              f"{'ours/TF-DT':>12s}")
        for r in rows:
            line = f"{r:30s}" + "".join(f"{cell(r, c):>{width}s}" for c in labels)
            ours_s, tf_s = samples[r].get("tf_dtensor"), samples[r].get("TF DTensor")
            if ours_s and tf_s:
                ratio = statistics.median(ours_s) / statistics.median(tf_s)
                line += f"{(1 / ratio if units[r] == 'GB/s' else ratio):12.2f}"
            print(line)
        print("(ours/TF-DT: tf_dtensor's time over TensorFlow DTensor's; for GB/s rows, "
              "TF DTensor's rate over ours: below 1 is tf_dtensor ahead)")
        for r in rows:  # with XLA clustering on both sides
            ours_x, tf_x = samples[r].get("ours, XLA"), samples[r].get("TF DTensor, XLA")
            if ours_x and tf_x:
                print(f"{r}: ours, XLA / TF DTensor, XLA = "
                      f"{statistics.median(ours_x) / statistics.median(tf_x):.2f}")
        sys.stdout.flush()

    # The table after every round, so that a run cut short by a lease's time limit still
    # shows the rounds it finished (a GPU lease of 2026-11-30 lost its table so).
    for k in range(args.rounds):
        for r, cols in rows.items():
            for c, sample in cols.items():
                try:
                    samples[r][c].append(sample())
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{r} / {c} (timing): {type(e).__name__}: {str(e)[:300]}")
        table(f"medians after round {k + 1} of {args.rounds}" if k + 1 < args.rounds
              else f"medians over {args.rounds} rounds")
    for p in problems:
        print("PROBLEM:", p)

    if args.profile:
        traced = ("TF DTensor", "tf_dtensor", "TF DTensor, XLA", "ours, XLA")
        for col in [c for c in columns if c.label in traced and
                    any(r.startswith("MLP") for r in rows)]:
            _, _, (step, x, y) = mlp_runner(col, devices, 5)
            col.enter()
            step(x, y)
            col.wait(step(x, y))
            logdir = os.path.join(args.profile, col.label.replace(" ", "_").replace("-", "_"))
            tf.profiler.experimental.start(logdir)
            for _ in range(5):
                out = step(x, y)
            col.wait(out)
            tf.profiler.experimental.stop()
        for r in [r for r in rows if r.startswith("relayout")]:
            for label, sample in rows[r].items():
                tag = "all_gather" if "[*,*]" in r else "all_to_all"
                logdir = os.path.join(args.profile, f"{tag}_" + label.replace(" ", "_").replace(
                    "-", "_").replace(",", ""))
                tf.profiler.experimental.start(logdir)
                for _ in range(2):
                    sample()
                tf.profiler.experimental.stop()
        print("profiles in", args.profile, flush=True)


if __name__ == "__main__":
    main()
