"""Peak memory: tf_dtensor vs TensorFlow's built-in DTensor vs plain TensorFlow.

Each measurement runs in a fresh subprocess and reports its peak resident set (VmHWM)
above the resident set it had just before the workload (after importing TensorFlow and
making the mesh):

- `train`: the training step of bench/train_step.py (MLP, Adam, batch over 8 CPUs),
  first call and `--steps` more;
- `variable`: a float32 variable of `--mib` MiB, sharded `[x,*]` over 8 CPUs (plain: one
  tf.Variable), created from zeros and updated once (`assign_add`). A sharded variable
  should cost its size once, not once per device.

    python bench/memory.py [--mib 1024] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Dict, Tuple

LIBS = ("plain", "builtin", "ours")
CASES = ("train", "variable")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    """This process's peak resident set. VmHWM, not ru_maxrss: Linux carries ru_maxrss
    over exec, so a subprocess of a large parent would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure_here(lib: str, case: str, mib: int, steps: int) -> Dict[str, float]:
    """Runs one workload in this process and returns its base and peak RSS (MiB)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    import tensorflow as tf
    import train_step as ts  # sets up 8 virtual CPUs

    tf.zeros([1]).numpy()  # the runtime's own start-up is not the workload's
    setup = ts.Setup(lib, {"plain": None, "builtin": ts.tf_builtin, "ours": ts.ours}[lib])
    if case == "train":
        base = rss_mib()
        _, time_round = ts.train_step_runner(setup, steps)
        time_round()
    else:
        rows = mib * 2**20 // (4 * 1024)
        base = rss_mib()
        if setup.api is None:
            with tf.device("CPU:0"):
                v = tf.Variable(tf.zeros([rows, 1024]))
                v.assign_add(tf.ones([rows, 1024]))
                np.asarray(v[0, 0])
        else:
            api = setup.api
            mesh = api.create_mesh([("x", ts.N_DEVICES)], devices=ts.DEVICES)
            layout = api.Layout(["x", api.UNSHARDED], mesh)
            v = api.DVariable(api.call_with_layout(tf.zeros, layout, shape=[rows, 1024]))
            v.assign_add(api.call_with_layout(tf.ones, layout, shape=[rows, 1024]))
            api.unpack(v.read_value())[0].numpy()
    return {"base": base, "peak": peak_mib()}


def measure(lib: str, case: str, mib: int = 1024, steps: int = 20) -> Tuple[float, float]:
    """(base, peak) RSS in MiB of `case` run by `lib` in a fresh subprocess."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", lib, case, "--mib", str(mib),
         "--steps", str(steps)], check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["base"], result["peak"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the variable")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", nargs=2, metavar=("LIB", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_here(*args.child, args.mib, args.steps)))
        return
    print(f"{'peak RSS above base, MiB':32s} {'plain TF':>9s} {'TF DTensor':>11s} "
          f"{'tf_dtensor':>11s}")
    for case in CASES:
        growth = {lib: (lambda bp: bp[1] - bp[0])(measure(lib, case, args.mib, args.steps))
                  for lib in LIBS}
        print(f"{case:32s} {growth['plain']:9.0f} {growth['builtin']:11.0f} "
              f"{growth['ours']:11.0f}")


if __name__ == "__main__":
    main()
