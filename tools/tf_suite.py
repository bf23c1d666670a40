"""Run TensorFlow's own DTensor test files on tf_dtensor and on TensorFlow's DTensor.

TensorFlow's DTensor tests (`tensorflow/dtensor/python/tests/*_test.py`) are not shipped in
its wheel; bring them from TensorFlow's sources (the same release as the installed
TensorFlow) into a folder and point this tool at it. They are TensorFlow's code: keep them
out of this repository.

    python tools/tf_suite.py --tests /path/to/dtensor/python/tests [--files a_test,b_test]
        [--backend both|ours|tf] [--jobs 2] [--timeout 1800] [--out results.json]
        [--reuse-tf earlier-results.json]

TensorFlow helpers the tests import that its wheel lacks (`d_random.py`) go in
`<tests>/_support/`. Each file runs in its own process, once per backend, as TensorFlow runs it (absltest, its
`tf.test.main()`), with a JUnit XML report. Under `--backend ours` every
`tensorflow.dtensor.python` module the tests reach (api, config, layout, accelerator_util,
mesh_util, d_variable, d_checkpoint, input_util, save_restore, and `dtensor_device.DTensorDevice`,
which returns tf_dtensor's one device) is tf_dtensor's; TensorFlow's
own helpers built on them (`numpy_util`, `tests/test_util`) are re-imported so they call
tf_dtensor. Nothing falls back to TensorFlow's DTensor: a name tf_dtensor lacks is an
AttributeError in the test that reaches for it.

The summary counts the tests that pass on TensorFlow's DTensor and, of those, the ones that
pass on tf_dtensor; `--out` keeps every test's outcome on both. Multi-client files
(`multi_client_*`) and TPU-only ones are left out unless named with `--files`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import types
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_BY_DEFAULT = ("multi_client_test", "multi_client_input_util_test",
                   "tpu_device_assignment_test")

# tensorflow.dtensor.python.<name> -> the tf_dtensor modules whose names make it up, first
# match wins.
_MODULES = {
    "api": ("tf_dtensor.api",),
    "config": ("tf_dtensor.config",),
    "layout": ("tf_dtensor.layout", "tf_dtensor.mesh"),
    "accelerator_util": ("tf_dtensor.config",),
    "mesh_util": ("tf_dtensor.config", "tf_dtensor.api"),
    "d_variable": ("tf_dtensor.variable",),
    "d_checkpoint": ("tf_dtensor.checkpoint",),
    "input_util": ("tf_dtensor._dataset",),
    "save_restore": ("tf_dtensor._save_restore",),
}
# TensorFlow's helpers written on top of the modules above: re-imported after the swap.
_REIMPORT = ("tensorflow.dtensor.python.numpy_util",
             "tensorflow.dtensor.python.tests.test_util",
             "tensorflow.dtensor.python.tests.test_util_ops")


def _device_module() -> types.ModuleType:
    """`dtensor_device.DTensorDevice(meshes, is_async)`, which some tests build themselves:
    tf_dtensor has one device per eager context, so this returns that device's view
    (`api._dtensor_device()`) after `reset_dtensor_device(is_async)`."""
    from tf_dtensor import api
    from tf_dtensor.mesh import Mesh

    module = types.ModuleType("tensorflow.dtensor.python.dtensor_device",
                              "tf_dtensor standing in for TensorFlow's dtensor_device")

    def DTensorDevice(meshes=(), is_async=True, in_flight_nodes_limit=8):  # pylint: disable=invalid-name
        del in_flight_nodes_limit
        if any(not isinstance(mesh, Mesh) for mesh in meshes):
            raise TypeError(f"Expected a flat list of Mesh objects, got {meshes}")
        api.reset_dtensor_device(is_async=is_async)
        return api._dtensor_device()  # pylint: disable=protected-access

    module.DTensorDevice = DTensorDevice
    return module


def _install_ours() -> None:
    """Point every `tensorflow.dtensor.python.<module>` at tf_dtensor."""
    import importlib

    import tensorflow.dtensor.python as package

    for name, sources in _MODULES.items():
        alias = types.ModuleType(f"tensorflow.dtensor.python.{name}",
                                 f"tf_dtensor standing in for TensorFlow's {name}")
        for source in reversed(sources):  # first source wins: applied last
            module = importlib.import_module(source)
            for attr in dir(module):
                if not attr.startswith("__"):
                    setattr(alias, attr, getattr(module, attr))
        sys.modules[alias.__name__] = alias
        setattr(package, name, alias)
    sys.modules["tensorflow.dtensor.python.dtensor_device"] = _device_module()
    package.dtensor_device = sys.modules["tensorflow.dtensor.python.dtensor_device"]
    for name in _REIMPORT:
        sys.modules.pop(name, None)
    for name in _REIMPORT:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(sys.modules[parent], leaf, module)


def _install_support(folder: str) -> None:
    """TensorFlow helpers that its wheel lacks (`d_random.py`), kept in `<tests>/_support`,
    become `tensorflow.dtensor.python.<name>`."""
    import importlib.util

    import tensorflow.dtensor.python as package

    if not os.path.isdir(folder):
        return
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".py"):
            continue
        name = f"tensorflow.dtensor.python.{file[:-3]}"
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, file))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(package, file[:-3], module)


def _portpicker() -> None:
    """TensorFlow's multi-client tests pick ports with `portpicker`, which its wheel does
    not require: a stand-in when it is missing."""
    try:
        import portpicker  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        import socket  # pylint: disable=import-outside-toplevel

        def pick_unused_port() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        sys.modules["portpicker"] = types.SimpleNamespace(pick_unused_port=pick_unused_port)


def _run_file(path: str, backend: str, xml: str) -> None:
    """In a child process: run one test file as `tf.test.main()` would."""
    import multiprocessing  # pylint: disable=import-outside-toplevel

    support = os.path.join(os.path.dirname(path), "_support")
    _portpicker()
    if backend == "ours":
        sys.path.insert(0, REPO)
        _install_ours()
    _install_support(support)
    # The multi-client tests fork their clients from multiprocessing's forkserver, a fresh
    # interpreter: it makes the same set-up before it imports the test file.
    # (multiprocessing's forkserver ignores the parent's sys.path: PYTHONPATH carries it.)
    os.environ["TF_SUITE_BACKEND"], os.environ["TF_SUITE_SUPPORT"] = backend, support
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), REPO] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    multiprocessing.set_forkserver_preload(["_tf_suite_child"])
    sys.argv = [path, f"--xml_output_file={xml}"]
    runpy.run_path(path, run_name="__main__")


def _outcomes(xml: str) -> dict:
    tree = ET.parse(xml)
    out = {}
    for case in tree.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out[name] = "fail"
        elif case.find("skipped") is not None or case.get("result") == "suppressed":
            out[name] = "skip"
        else:
            out[name] = "pass"
    return out


def _launch(path: str, backend: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "report.xml")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", path, backend, xml],
                cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                timeout=timeout)
            tail = proc.stdout.decode(errors="replace")[-4000:]
            status = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            tail = (e.stdout or b"").decode(errors="replace")[-4000:]
            status = f"timed out after {timeout:.0f} s"
        seconds = time.monotonic() - start
        try:
            cases = _outcomes(xml) if os.path.exists(xml) else {}
        except ET.ParseError:  # a child killed (time limit, crash) while writing its report
            cases = {}
    return {"status": status, "seconds": round(seconds, 1), "cases": cases,
            "tail": "" if cases else tail}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True,
                        help="folder with TensorFlow's dtensor/python/tests/*_test.py")
    parser.add_argument("--files", default="", help="comma-separated file stems to run")
    parser.add_argument("--backend", choices=("both", "ours", "tf"), default="both")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--reuse-tf", default="",
                        help="a results file from an earlier --out: take TensorFlow's "
                             "outcomes from it and run tf_dtensor only")
    args = parser.parse_args(argv)
    args.tests = os.path.abspath(args.tests)  # each file runs with a temporary folder as cwd
    reused = {}
    if args.reuse_tf:
        with open(args.reuse_tf) as f:
            reused = {stem: runs["tf"] for stem, runs in json.load(f).items() if "tf" in runs}
        args.backend = "both"

    if args.files:
        stems = args.files.split(",")
    else:
        stems = sorted(f[:-3] for f in os.listdir(args.tests)
                       if f.endswith("_test.py") and f[:-3] not in SKIP_BY_DEFAULT)
    backends = ("tf", "ours") if args.backend == "both" else (args.backend,)
    jobs = [(stem, backend) for stem in stems for backend in backends
            if not (backend == "tf" and stem in reused)]
    results: dict = {stem: ({"tf": reused[stem]} if stem in reused else {}) for stem in stems}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(_launch, os.path.join(args.tests, stem + ".py"), backend,
                               args.timeout): (stem, backend) for stem, backend in jobs}
        for future in concurrent.futures.as_completed(futures):
            stem, backend = futures[future]
            results[stem][backend] = result = future.result()
            counts = {k: list(result["cases"].values()).count(k)
                      for k in ("pass", "fail", "skip")}
            print(f"{stem:34s} {backend:4s} {result['status']:22s} {result['seconds']:7.1f} s "
                  f"pass {counts['pass']:4d} fail {counts['fail']:4d} skip {counts['skip']:4d}",
                  flush=True)
            if not result["cases"]:
                print("    " + result["tail"][-1500:].replace("\n", "\n    "), flush=True)

    if args.backend == "both":
        total_tf = total_ours = 0
        print(f"\n{'file':34s} {'pass on TF':>10s} {'also ours':>10s}")
        for stem in stems:
            tf_cases = results[stem]["tf"]["cases"]
            ours_cases = results[stem]["ours"]["cases"]
            passing = [n for n, o in tf_cases.items() if o == "pass"]
            both = [n for n in passing if ours_cases.get(n) == "pass"]
            total_tf += len(passing)
            total_ours += len(both)
            print(f"{stem:34s} {len(passing):10d} {len(both):10d}")
        share = 100.0 * total_ours / max(total_tf, 1)
        print(f"{'total':34s} {total_tf:10d} {total_ours:10d}  ({share:.1f}%)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _run_file(*sys.argv[2:])
    else:
        sys.exit(main())
