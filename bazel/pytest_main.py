"""Runs one pytest file as a Bazel py_test (the `main` of every py_test in tests/).

Usage: pytest_main.py <test file> [pytest arguments]. With Bazel's test sharding
(TEST_TOTAL_SHARDS, TEST_SHARD_INDEX) shard i runs the collected tests i, i + n, ...:
round-robin, so each shard gets its share of every parametrised family. The report goes to
XML_OUTPUT_FILE, where Bazel looks for it; pytest's cache is off (runfiles are read-only).
"""

from __future__ import annotations

import os
import sys

import pytest


class _Shard:
    """Keeps this shard's tests out of the collected ones."""

    def __init__(self, index: int, total: int):
        self.index, self.total = index, total

    def pytest_collection_modifyitems(self, config, items):
        kept = [item for i, item in enumerate(items) if i % self.total == self.index]
        dropped = [item for i, item in enumerate(items) if i % self.total != self.index]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def main() -> int:
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    index = int(os.environ.get("TEST_SHARD_INDEX", "0"))
    status_file = os.environ.get("TEST_SHARD_STATUS_FILE")
    if status_file:  # Tells Bazel this runner shards.
        open(status_file, "a").close()
    args = ["-q", "-p", "no:cacheprovider", *sys.argv[1:]]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    plugins = [_Shard(index, total)] if total > 1 else []
    code = pytest.main(args, plugins=plugins)
    if code == pytest.ExitCode.NO_TESTS_COLLECTED and total > 1:
        return 0  # More shards than tests in this file.
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
