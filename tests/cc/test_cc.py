"""Builds the C++ unit tests in tests/cc with CMake and runs them with ctest.

The C++ tests (Mesh, Layout, relayout plans, rule golden tables) run without a TensorFlow
runtime; this test lets README's test command run them too. It configures a build of the tests
only (no Python extension) against the installed tensorflow wheel, builds it with Ninja
(-j2, unoptimised) and fails with ctest's output when a C++ test fails. Set
TF_DTENSOR_CC_BUILD_DIR to keep the build between runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str | None:
    """The tool from this environment's scripts (the cmake and ninja wheels), else PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def _run(command: list[str], what: str, timeout: int, cwd: Path = ROOT) -> None:
    result = subprocess.run(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(command)}):\n{result.stdout[-20000:]}", pytrace=False)


def test_cc_unit_tests_pass(tmp_path: Path) -> None:
    cmake, ninja = _tool("cmake"), _tool("ninja")
    if cmake is None or ninja is None:
        pytest.skip("the C++ tests need cmake and ninja (pip install '.[test]' installs both)")
    ctest = str(Path(cmake).with_name("ctest"))
    if not Path(ctest).exists():
        ctest = shutil.which("ctest") or "ctest"
    build = Path(os.environ.get("TF_DTENSOR_CC_BUILD_DIR") or tmp_path / "build")
    _run(
        [
            cmake, "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={ninja}",
            # Unoptimised: the tests check behaviour, and compile in 3/4 of Release's time
            # (97 s against 132 s on 2 cores); the extension the Python tests run is Release.
            "-DCMAKE_BUILD_TYPE=None",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DTF_DTENSOR_BUILD_MODULE=OFF",
            "-DTF_DTENSOR_BUILD_TESTS=ON",
        ],
        "Configuring the C++ tests",
        timeout=300,
    )
    _run([cmake, "--build", str(build), "-j2", "--target", "cc_tests"], "Building the C++ tests", timeout=1200)
    _run([ctest, "--output-on-failure"], "The C++ tests", timeout=300, cwd=build)
