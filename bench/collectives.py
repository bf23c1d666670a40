"""Collectives across client processes: tf_dtensor vs TensorFlow's DTensor, multi-client.

Each library runs as 2 and as 4 local clients (`tf_dtensor.launch`, loopback ports; each
client 2 virtual CPUs), one after the other, the same program under each: inside
`tf.function`, an all-reduce (a sum over the axis sharded across every device), an
all-gather (`[x,*]` -> `[*,*]`) and an all-to-all (`[x,*]` -> `[*,x]`) of a float32
tensor, reported as GB/s of the global tensor, and the training guide's MLP step
(data-parallel, batch 128) per step. The last rows are the same step in one process
holding all the devices, for what the processes cost. Medians over rounds; client 0
reports. The machine is shared and noisy: compare the columns, not the numbers.

    python bench/collectives.py [--rounds 5] [--mib 8] [--clients 2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOCAL = 2


def _client(lib: str, rounds: int, mib: int) -> None:
    import numpy as np
    import tensorflow as tf

    from _mlp import sgd_step

    if lib == "tf":
        from tensorflow.experimental import dtensor as api
    else:
        from tf_dtensor import dtensor as api
    api.initialize_accelerator_system("CPU", num_logical_cpu_devices=LOCAL)
    n = api.num_global_devices("CPU")
    if api.num_clients() > 1:
        mesh = api.create_distributed_mesh([("x", n)], device_type="CPU")
    else:
        mesh = api.create_mesh([("x", n)], devices=[f"CPU:{i}" for i in range(n)])
    ids = list(mesh.local_device_ids())
    cols = max(n, (mib << 20) // 4 // (n * 8) // n * n)
    full = np.random.RandomState(0).rand(n * 8, cols).astype(np.float32)
    rows = full.shape[0] // n
    x = api.pack([full[rows * i:rows * (i + 1)] for i in ids],
                 api.Layout(["x", api.UNSHARDED], mesh))
    nbytes = full.nbytes
    results = {}

    def timed(fn, *args):
        out = fn(*args)
        api.unpack(out)[0].numpy()  # warm up, and wait
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            out = fn(*args)
            api.unpack(out)[0].numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    if n > 1:
        reduce_fn = tf.function(lambda t: tf.reduce_sum(t, axis=0))
        t = timed(reduce_fn, x)
        results["all-reduce"] = (nbytes / n) / t / 1e9  # each device reduces its block
        gather_to = api.Layout([api.UNSHARDED, api.UNSHARDED], mesh)
        gather_fn = tf.function(lambda t: api.relayout(t, gather_to))
        results["all-gather"] = nbytes / timed(gather_fn, x) / 1e9
        a2a_to = api.Layout([api.UNSHARDED, "x"], mesh)
        a2a_fn = tf.function(lambda t: api.relayout(t, a2a_to))
        results["all-to-all"] = nbytes / timed(a2a_fn, x) / 1e9

    # The guide's MLP step, data-parallel.
    rng = np.random.RandomState(1)
    sizes = [784, 700, 500, 10]
    variables = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        for v in (rng.uniform(-0.05, 0.05, (i, o)).astype(np.float32), np.zeros([o], np.float32)):
            variables.append(api.DVariable(api.copy_to_mesh(
                tf.constant(v), api.Layout.replicated(mesh, v.ndim))))
    xb = rng.rand(128, 784).astype(np.float32)
    yb = rng.randint(0, 10, 128).astype(np.int64)
    per = 128 // n
    xs = api.pack([xb[per * i:per * (i + 1)] for i in ids], api.Layout.batch_sharded(mesh, "x", 2))
    ys = api.pack([yb[per * i:per * (i + 1)] for i in ids], api.Layout.batch_sharded(mesh, "x", 1))

    step = sgd_step(variables)

    results["MLP step"] = timed(step, xs, ys)
    if hasattr(api, "barrier"):
        api.barrier(mesh)
    if api.client_id() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def _run(lib: str, clients: int, rounds: int, mib: int) -> dict:
    from tf_dtensor import launch
    command = [sys.executable, os.path.abspath(__file__), "--client", lib,
               "--rounds", str(rounds), "--mib", str(mib)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if clients == 1:
        # One process holding every device of a 2-client run: no cluster.
        proc = subprocess.run(command + ["--local", str(2 * LOCAL)], env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        out = proc.stdout + proc.stderr
    else:
        import io
        buffer = io.StringIO()
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            launch.run(clients, command, timeout=900, out=buffer)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        out = buffer.getvalue()
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    print(f"[{lib}, {clients} clients] no result:\n" + "\n".join(out.splitlines()[-15:]),
          flush=True)
    return {}


def main() -> None:
    global LOCAL
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=8, help="global tensor size, MiB")
    parser.add_argument("--clients", default="2,4")
    parser.add_argument("--client", default="", help=argparse.SUPPRESS)
    parser.add_argument("--local", type=int, default=LOCAL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    LOCAL = args.local
    if args.client:
        _client(args.client, args.rounds, args.mib)
        return
    counts = [int(c) for c in args.clients.split(",")]
    table = {}
    for clients in counts:
        for lib in ("tf", "ours"):
            table[(lib, clients)] = _run(lib, clients, args.rounds, args.mib)
    single = {lib: _run(lib, 1, args.rounds, args.mib) for lib in ("tf", "ours")}
    print(f"\n{'workload':<34}{'TF DTensor':>14}{'tf_dtensor':>14}{'ours/TF':>10}")
    for clients in counts:
        for name in ("all-reduce", "all-gather", "all-to-all"):
            tf_v = table[("tf", clients)].get(name)
            ours_v = table[("ours", clients)].get(name)
            cell = lambda v: f"{v:.2f} GB/s" if v else "—"  # noqa: E731
            ratio = f"{tf_v / ours_v:.2f}" if tf_v and ours_v else "—"
            print(f"{name + f', {clients} clients':<34}{cell(tf_v):>14}{cell(ours_v):>14}{ratio:>10}")
        tf_s, ours_s = table[("tf", clients)].get("MLP step"), table[("ours", clients)].get("MLP step")
        ratio = f"{ours_s / tf_s:.2f}" if tf_s and ours_s else "—"
        cell = lambda v: f"{v * 1e3:.2f} ms" if v else "—"  # noqa: E731
        print(f"{f'MLP step, {clients} clients x {LOCAL}':<34}{cell(tf_s):>14}{cell(ours_s):>14}{ratio:>10}")
    tf_s, ours_s = single["tf"].get("MLP step"), single["ours"].get("MLP step")
    cell = lambda v: f"{v * 1e3:.2f} ms" if v else "—"  # noqa: E731
    ratio = f"{ours_s / tf_s:.2f}" if tf_s and ours_s else "—"
    print(f"{f'MLP step, 1 process x {2 * LOCAL}':<34}{cell(tf_s):>14}{cell(ours_s):>14}{ratio:>10}")
    print("(GB/s rows: TF DTensor's rate over ours, below 1 is tf_dtensor ahead; "
          "step rows: ours over TF's)")


if __name__ == "__main__":
    main()
