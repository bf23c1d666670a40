"""Macros shared by the BUILD files: CMakeLists.txt's compile settings, and pytest files as py_test."""

load("@rules_cc//cc:defs.bzl", "cc_library")

# CMakeLists.txt's tfd_configure/tfd_object_library: warnings, and hidden symbols like the
# module the code goes into. C++17 comes from .bazelrc (it applies to every C++ action).
TFD_COPTS = [
    "-Wall",
    "-Wno-sign-compare",
    "-Wno-unused-function",
    "-fvisibility=hidden",
]

# For the files built against TF's C++ runtime headers (cc/eager/kernel_cache.cc,
# cc/tf/op_registry.cc), which mark much of what they use deprecated.
TF_RUNTIME_HEADER_COPTS = [
    "-Wno-deprecated-declarations",
    "-Wno-comment",
    "-Wno-interference-size",
    "-Wno-pessimizing-move",
]

def tfd_cc_library(name, **kwargs):
    """A cc_library of tf_dtensor's own sources, compiled as CMake compiles them.

    alwayslink: CMake links object libraries, every object file. The rule families register
    themselves from static initialisers (`const bool kRegistered = RegisterRules(...)`) that
    nothing references, so an archive would let the linker drop them.
    """
    cc_library(
        name = name,
        copts = TFD_COPTS + kwargs.pop("copts", []),
        alwayslink = True,
        **kwargs
    )

def tfd_py_tests(srcs, deps, data = [], shard_count = {}, size = "medium", tags = [], default = None):
    """One py_test per pytest file in srcs, named after it, run by //bazel:pytest_main.py.

    shard_count: {file: shards} for the long files; their tests are split round-robin
    (pytest_main.py). Every test sees 8 virtual CPUs (the conftest.py files in data).
    default: the files a plain `bazel test //...` runs; the others are tagged "full", which
    .bazelrc filters out unless `--config=full` is given (the pip path runs every file; Bazel's
    default run checks its own build of the extension and package with a cross-section).
    None: every file runs by default.
    """
    for src in srcs:
        extra_tags = [] if default == None or src in default else ["full"]
        native.py_test(
            name = src[:-len(".py")],
            srcs = ["//bazel:pytest_main.py", src],
            main = "//bazel:pytest_main.py",
            args = ["$(location %s)" % src],
            data = data + ["//:pyproject.toml"],
            deps = deps,
            python_version = "PY3",
            shard_count = shard_count.get(src, 1),
            size = size,
            tags = tags + extra_tags,
        )
