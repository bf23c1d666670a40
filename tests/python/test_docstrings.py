"""The examples in tf_dtensor's docstrings and README.md's python blocks run as written and
show what they claim.

Each module's `>>>` examples run with doctest under conftest.py's 8 virtual CPUs, with the
names a reader has at hand: the module's own, `tf`, `np`, `dtensor` and `tf_dtensor`.
ELLIPSIS covers what legitimately varies (a traced function's number); NORMALIZE_WHITESPACE
lets tables wrap. README.md's python blocks run in order, one namespace per section; an
expression ending in a comment that shows a value (`placements_of(t)  # (Shard(dim=0),
Replicate())`) must print or return that value.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import importlib
import io
import os
import pkgutil
import sys
import tempfile
import tokenize
from typing import Dict, List, Tuple

import numpy as np
import pytest
import tensorflow as tf

import tf_dtensor
from tf_dtensor import config, dtensor

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every module of the package: the public names are defined in private modules too
# (`distribute_tensor` in `_placement_api`), and their docstrings are what `help()` shows.
MODULES = ["tf_dtensor"] + sorted(
    info.name for info in pkgutil.walk_packages(tf_dtensor.__path__, "tf_dtensor.")
    if info.name != "tf_dtensor._core")

_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.fixture
def clean_state(monkeypatch, tmp_path):
    """What the examples may touch, as a fresh process has it and restored afterwards:
    the DTENSOR_* variables unset (a single-client run), files under `tmp_path`
    (`tempfile.mkdtemp()`), the default collective lowering ("auto"), no Keras
    distribution and the accelerator system shut down."""
    for name in ("DTENSOR_JOBS", "DTENSOR_CLIENT_ID", "DTENSOR_JOB_NAME", "DTENSOR_NUM_CLIENTS",
                 "DTENSOR_ENABLE_HEARTBEAT", "DTENSOR_GPU_USE_NCCL_COMMUNICATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # A shutdown then an initialize asking for other logical CPUs would reset TensorFlow's
    # context (see tests/python/test_config.py); the examples ask for the same 8.
    monkeypatch.setattr(config, "_reset_owed", False)
    lowering = config.collective_lowering()
    config.set_collective_lowering("auto")
    try:
        yield
    finally:
        config.set_collective_lowering(lowering)
        with contextlib.suppress(ValueError):
            config.shutdown_accelerator_system()
        keras = sys.modules.get("keras")
        if keras is not None:
            keras.distribution.set_distribution(None)


def run_doctests(module) -> Tuple[int, int, str]:
    """(examples, failures, doctest's report) for the docstrings defined in `module`."""
    globs = {**vars(module), "tf": tf, "np": np, "dtensor": dtensor, "tf_dtensor": tf_dtensor}
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report: List[str] = []
    for test in doctest.DocTestFinder().find(module, module.__name__, globs=globs):
        runner.run(test, out=report.append)
    return runner.tries, runner.failures, "".join(report)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, clean_state):
    attempted, failed, report = run_doctests(importlib.import_module(name))
    assert not failed, f"{failed} of {attempted} docstring examples of {name} fail:\n{report}"


def test_a_broken_example_fails(clean_state):
    """The check is real: an example whose shown output is wrong is reported."""
    module = type(tf_dtensor)("docstring_probe")
    module.__doc__ = """
    >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
    >>> mesh.shape()
    [3]
    """
    attempted, failed, report = run_doctests(module)
    assert (attempted, failed) == (2, 1)
    assert "Expected:\n    [3]\nGot:\n    [2]" in report


# ---------------------------------------------------------------------------------------
# README.md
# ---------------------------------------------------------------------------------------

# Sections whose python block is an excerpt that cannot run in one test process.
_README_NOT_RUN = {
    "Many processes": "needs several client processes (examples/multi_client.py runs it; "
                      "tests/python/test_multi_client.py)",
}


def _readme_blocks() -> Dict[str, List[Tuple[int, str]]]:
    """Section title -> [(line of the block's first line, code)], in README order."""
    with open(os.path.join(_ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    sections: Dict[str, List[Tuple[int, str]]] = {}
    title, i = "", 0
    while i < len(lines):
        if lines[i].startswith("#"):
            title = lines[i].lstrip("#").strip()
        elif lines[i].strip() == "```python":
            end = lines.index("```", i + 1)
            sections.setdefault(title, []).append((i + 2, "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return sections


_README = _readme_blocks()


def _shows_value(comment: str) -> bool:
    """Whether a trailing comment shows a value (`['y', 'unsharded']`) rather than prose."""
    return comment[:1] in "([{'\"0123456789-" or comment.split(" ")[0] in ("True", "False",
                                                                            "None")


def _run_block(code: str, first_line: int, namespace: dict) -> None:
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(code).readline)
                if token.type == tokenize.COMMENT}
    for statement in ast.parse(code).body:
        where = f"README.md:{first_line + statement.lineno - 1}"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            if isinstance(statement, ast.Expr):
                value = eval(compile(ast.Expression(statement.value), where, "eval"), namespace)
            else:
                exec(compile(ast.Module([statement], []), where, "exec"), namespace)
                value = None
        comment = comments.get(statement.end_lineno, "")
        if isinstance(statement, ast.Expr) and comment and _shows_value(comment):
            shown = printed.getvalue().strip() or repr(value)
            assert shown == comment, f"{where} shows `{comment}`, but gives `{shown}`"


@pytest.mark.parametrize("section", sorted(_README))
def test_readme_python_blocks(section, clean_state):
    if section in _README_NOT_RUN:
        pytest.skip(_README_NOT_RUN[section])
    namespace = {"__name__": "__readme__"}
    for first_line, code in _README[section]:
        _run_block(code, first_line, namespace)


def test_readme_sections_not_run_exist():
    assert set(_README_NOT_RUN) <= set(_README)
