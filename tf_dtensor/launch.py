"""Runs a script as N local clients: `python -m tf_dtensor.launch --nproc N script.py ...`.

In the spirit of `torchrun --nproc-per-node=N`: picks N free loopback ports, starts N
processes of `script.py` with TensorFlow's DTensor variables set (`DTENSOR_JOBS` of
`127.0.0.1:<port>` entries, `DTENSOR_CLIENT_ID`, `DTENSOR_NUM_CLIENTS`, `DTENSOR_JOB_NAME`),
prefixes each line they print with `[client k]`, and exits with the first non-zero exit
code. When one client fails, the others are stopped after `--grace` seconds (they would
otherwise wait for it in their next collective); `--timeout` stops them all, after each
client still running has printed its Python stacks (faulthandler, on SIGABRT).

The script calls `dtensor.initialize_accelerator_system(...)` and
`dtensor.create_distributed_mesh(...)` as it would on a real cluster. Every client's
TensorFlow server listens on its port on every interface of this host (see
`tf_dtensor/_cluster.py`): run it on a host whose ports others cannot reach.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional


def free_ports(count: int) -> List[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now (held open together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def client_env(client: int, ports: List[int], base: Optional[dict] = None) -> dict:
    """The environment of client `client` of a local cluster on `ports`."""
    env = dict(os.environ if base is None else base)
    env["DTENSOR_JOBS"] = ",".join(f"127.0.0.1:{p}" for p in ports)
    env["DTENSOR_CLIENT_ID"] = str(client)
    env["DTENSOR_NUM_CLIENTS"] = str(len(ports))
    if len(ports) > 1:
        env.setdefault("DTENSOR_JOB_NAME", "worker")
    # One client starts no server: its devices stay `/job:localhost`, the job name that
    # config gives one client when DTENSOR_JOB_NAME is unset.
    return env


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()


def run(nproc: int, command: List[str], timeout: Optional[float] = None,
        grace: float = 30.0, quiet_tf: bool = True, out=None) -> int:
    """Runs `command` as `nproc` clients; returns the first non-zero exit code (or 0).
    124 when `timeout` stopped them."""
    out = out or sys.stdout
    ports = free_ports(nproc)
    procs = []
    pumps = []
    for k in range(nproc):
        env = client_env(k, ports)
        if quiet_tf:
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # A client stopped by `timeout` prints where its threads were (SIGABRT, below).
        env.setdefault("PYTHONFAULTHANDLER", "1")
        p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[client {k}] ", out), daemon=True)
        t.start()
        pumps.append(t)
    start = time.monotonic()
    first_failure: Optional[int] = None
    failed_at: Optional[float] = None
    code = 0
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and first_failure is None:
                first_failure, failed_at, code = procs.index(p), now, rc
        stop = ((timeout is not None and now - start > timeout) or
                (failed_at is not None and now - failed_at > grace))
        if stop:
            if first_failure is None:
                code = 124
                _show_stacks(procs)
            _kill_all(procs)
            break
        time.sleep(0.1)
    for p in procs:
        p.wait()
        if code == 0 and p.returncode != 0:
            code = p.returncode
    for t in pumps:
        t.join(timeout=5)
    if first_failure is not None:
        out.write(f"[launch] client {first_failure} exited with {code}\n")
    elif code == 124:
        out.write(f"[launch] stopped after {timeout} s\n")
    return code


def _show_stacks(procs, wait: float = 3.0) -> None:
    """Asks each client still running for its Python stacks (faulthandler dumps them on
    SIGABRT, even while the client is blocked in a collective) before it is killed."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        try:
            os.kill(p.pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(p.poll() is None for p in running):
        time.sleep(0.1)


def _kill_all(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # a client blocked in a collective ignores TERM
            except ProcessLookupError:
                pass


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tf_dtensor.launch",
        description="Run a script as N local DTensor clients on loopback ports.")
    parser.add_argument("--nproc", "--nproc-per-node", type=int, required=True,
                        help="number of client processes")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds after which every client is stopped (exit code 124)")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the others get after one client fails")
    parser.add_argument("--tf-logs", action="store_true", help="keep TensorFlow's C++ logs")
    parser.add_argument("-m", dest="module", default=None, help="run a module instead of a script")
    parser.add_argument("script", nargs="?", help="the script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error("--nproc must be at least 1")
    if args.module:
        command = [sys.executable, "-m", args.module] + ([args.script] if args.script else []) + args.args
    elif args.script:
        command = [sys.executable, args.script] + args.args
    else:
        parser.error("give a script (or -m module)")
    return run(args.nproc, command, args.timeout, args.grace, quiet_tf=not args.tf_logs)


if __name__ == "__main__":
    sys.exit(main())
