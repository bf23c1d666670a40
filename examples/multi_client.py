"""The training guide's MLP, data-parallel across several client processes.

The model, optimizer and training loop are `train_mlp.py`'s (TensorFlow's "Distributed
training with Core APIs and DTensor"); what changes for several clients is how the mesh
is made: `initialize_accelerator_system` joins the cluster named by the `DTENSOR_*`
variables, and `create_distributed_mesh` spans every client's devices. Each client reads
the whole global batch and packs its own devices' rows (`repack_batch`); the gradients'
all-reduce runs across the clients on TensorFlow's collective ops.

    python examples/multi_client.py --nproc 2          # 2 local clients via tf_dtensor.launch
    python -m tf_dtensor.launch --nproc 4 examples/multi_client.py --local-devices 2

Started with `DTENSOR_JOBS` (and `DTENSOR_CLIENT_ID`) already set, as on a real cluster,
it joins that cluster instead of launching clients.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2,
                        help="clients to launch when DTENSOR_JOBS is unset (default 2)")
    parser.add_argument("--local-devices", type=int, default=2,
                        help="virtual CPUs per client (default 2)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    return parser.parse_args(argv)


def client(args) -> None:
    import tensorflow as tf  # noqa: F401  (imported after the launcher decision)

    import train_mlp as guide
    from tf_dtensor import dtensor

    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=args.local_devices)
    me, devices = dtensor.client_id(), dtensor.num_global_devices("CPU")
    if guide.BATCH_SIZE % devices:
        raise SystemExit(f"{devices} devices in all must divide the global batch of "
                         f"{guide.BATCH_SIZE}")
    mesh = dtensor.create_distributed_mesh([("batch", devices)], device_type="CPU")
    weight_layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
    if me == 0:
        print(f"{dtensor.num_clients()} clients, {mesh.num_local_devices()} devices each: "
              f"{mesh}", flush=True)
    data = guide.load_digits_28x28()
    model = guide.build_model(weight_layout)
    optimizer = guide.Adam(model.trainable_variables)
    history = guide.fit(model, optimizer, data, mesh, args.epochs, args.steps_per_epoch,
                        log=(lambda line: print(line, flush=True)) if me == 0 else (lambda _: None))
    # Every client holds the same replicated weights and saw the same losses.
    print(f"client {me} step losses: " + " ".join(f"{l:.6f}" for l in history.step_loss),
          flush=True)
    dtensor.barrier(mesh, "multi_client example done", 120_000)


def main() -> None:
    args = parse()
    if "DTENSOR_JOBS" in os.environ:
        client(args)
        return
    from tf_dtensor import launch
    rest = [a for a in sys.argv[1:]]
    sys.exit(launch.run(args.nproc, [sys.executable, os.path.abspath(__file__)] + rest))


if __name__ == "__main__":
    main()
