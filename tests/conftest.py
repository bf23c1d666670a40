"""What every test directory shares: how README's `pytest -n auto --dist loadfile tests` splits
the files among processes (pytest-xdist). The directories' own conftest.py files set up
their devices (tests/python: 8 virtual CPUs in each process).

Each worker process runs whole files (`--dist loadfile`), so a file's module fixtures and
the conformance files' scenario processes run once, as in one process.
"""

from __future__ import annotations

import os

# The files that take a minute or more on 2 cores (measured 2026-11-30: 165, 150, 140, 114,
# 89 and 81 s), started first under xdist: handed out last, one of them kept a worker busy
# for minutes after the other had finished.
_LONG_FILES = (
    "tests/python/test_xla_clustering.py",
    "tests/python/test_multi_client.py",
    "tests/cc/test_cc.py",
    "tests/python/test_keras_distribution.py",
    "tests/conformance/test_corners.py",
    "tests/python/test_context_reset.py",
)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most 4 and one per 4 GiB of memory (each worker
    is a TensorFlow process with 8 virtual CPUs: 2.9 GB resident at the end of the whole
    suite in one process)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 8
    return max(1, min(cores, 4, int(memory_gib // 4)))


def pytest_configure(config):
    """Files in collection order, the long ones first (below): xdist's own order, by each
    file's number of tests, put these files of few, long tests last."""
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Under xdist, the long files first (every worker collects, and reorders, alike)."""
    if not hasattr(config, "workerinput"):
        return
    root = str(config.rootpath)

    def rank(item):
        path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return _LONG_FILES.index(path) if path in _LONG_FILES else len(_LONG_FILES)

    items.sort(key=rank)  # stable: each file keeps its own order
