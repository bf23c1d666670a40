"""`local_python`: TensorFlow, pybind11, Python's headers and a Python toolchain from one local Python.

The configured Python is `$TF_DTENSOR_PYTHON` when set, else `python3` on PATH (an activated
virtual environment's). Like CMakeLists.txt, it finds the installed TensorFlow without
importing it (an import costs seconds and starts TensorFlow's runtime), and links the two
shared libraries CMake links: libtensorflow_cc.so.2 and libtensorflow_framework.so.2.
Nothing is downloaded: the repository holds symlinks into the Python environment.

Targets of the generated repository:
  :tensorflow_headers  TensorFlow's C API headers (what cc/ includes), with the defines
                       TensorFlow's libraries were built with.
  :tensorflow          the headers and the two shared libraries.
  :pybind11            pybind11's headers and Python's.
  :python_toolchain    a Python toolchain running the configured Python.
"""

# Prints what the build needs, one `key=value` a line; runs in the configured Python.
_PROBE = """
import importlib.util, os, sys, sysconfig
spec = importlib.util.find_spec("tensorflow")
tf = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else ""
try:
    import pybind11
    pybind11_include = pybind11.get_include()
except ImportError:
    pybind11_include = ""
print("executable=" + sys.executable)
print("version=%d.%d" % sys.version_info[:2])
print("python_include=" + sysconfig.get_paths()["include"])
print("pybind11_include=" + pybind11_include)
print("tensorflow=" + tf)
"""

_BUILD = """\
load("@rules_cc//cc:defs.bzl", "cc_import", "cc_library")
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# Python {version} at {executable}

cc_library(
    name = "tensorflow_headers",
    # The C API headers cc/ includes and the few headers they include.
    hdrs = glob([
        "tensorflow/include/tensorflow/c/**/*.h",
        "tensorflow/include/tensorflow/core/platform/*.h",
        "tensorflow/include/tensorflow/core/common_runtime/next_pluggable_device/c/*.h",
        "tensorflow/include/tsl/platform/*.h",
        "tensorflow/include/xla/tsl/c/*.h",
    ]),
    # As CMakeLists.txt: the ABI the wheel's libraries were built with.
    defines = [
        "_GLIBCXX_USE_CXX11_ABI=1",
        "EIGEN_MAX_ALIGN_BYTES=64",
    ],
    includes = ["tensorflow/include"],
)

cc_library(
    name = "tensorflow_runtime_headers",
    # TF's C++ runtime headers, for the two files that use them (cc/eager/kernel_cache.cc,
    # cc/tf/op_registry.cc):
    # the wheel's whole include tree (Eigen's headers have no extension), and farmhash's
    # folder, which TF's headers include bare.
    hdrs = glob(["tensorflow/include/**"]),
    includes = [
        "tensorflow/include",
        "tensorflow/include/external/farmhash_archive/src",
    ],
    deps = [":tensorflow_headers"],
)

cc_import(
    name = "tensorflow_cc",
    shared_library = "tensorflow/libtensorflow_cc.so.2",
)

cc_import(
    name = "tensorflow_framework",
    shared_library = "tensorflow/libtensorflow_framework.so.2",
)

cc_library(
    name = "tensorflow",
    deps = [
        ":tensorflow_cc",
        ":tensorflow_framework",
        ":tensorflow_headers",
    ],
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python/include/**/*.h"]),
    includes = ["python/include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11/include/**/*.h"]),
    includes = ["pybind11/include"],
    deps = [":python_headers"],
)

# The launcher Bazel writes for py_binary/py_test starts with stub_shebang: the configured
# Python, not whichever python3 /usr/bin/env would find.
py_runtime(
    name = "python3",
    interpreter_path = "{executable}",
    python_version = "PY3",
    stub_shebang = "#!{executable}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _local_python_impl(rctx):
    python = rctx.os.environ.get("TF_DTENSOR_PYTHON") or rctx.which("python3")
    if not python:
        fail("local_python: no python3 on PATH; set TF_DTENSOR_PYTHON (e.g. --repo_env=TF_DTENSOR_PYTHON=/path/to/python)")
    result = rctx.execute([str(python), "-c", _PROBE])
    if result.return_code != 0:
        fail("local_python: %s failed:\n%s" % (python, result.stderr))
    found = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        found[key] = value.strip()

    tf = found["tensorflow"]
    if not tf or not rctx.path(tf + "/libtensorflow_cc.so.2").exists:
        fail("local_python: tf_dtensor builds against an installed tensorflow==2.21 wheel; none found for %s." % python)
    if not found["pybind11_include"]:
        fail("local_python: pybind11 is not installed for %s (pip install pybind11)." % python)
    if not rctx.path(found["python_include"] + "/Python.h").exists:
        fail("local_python: no Python.h under %s (install Python's development headers)." % found["python_include"])

    rctx.symlink(tf + "/include", "tensorflow/include")
    rctx.symlink(tf + "/libtensorflow_cc.so.2", "tensorflow/libtensorflow_cc.so.2")
    rctx.symlink(tf + "/libtensorflow_framework.so.2", "tensorflow/libtensorflow_framework.so.2")
    rctx.symlink(found["python_include"], "python/include")
    rctx.symlink(found["pybind11_include"], "pybind11/include")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _BUILD.format(
        # The path as given, not resolved: a virtual environment's python finds its
        # site-packages from where it is started.
        executable = python if rctx.os.environ.get("TF_DTENSOR_PYTHON") else found["executable"],
        version = found["version"],
    ))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["TF_DTENSOR_PYTHON", "PATH", "VIRTUAL_ENV"],
    local = True,
)
