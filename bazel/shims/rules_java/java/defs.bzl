"""A local stand-in for `@rules_java//java:defs.bzl`: the native Java rules under their rules_java names.

Bazel 4 registers its Java toolchains (`@bazel_tools//tools/jdk:all`) for every build, and
parsing that package loads `@rules_java//java:defs.bzl`, which its default WORKSPACE would
download. tf_dtensor has no Java; this only lets the package parse offline.
"""

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_test(**attrs):
    native.java_test(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)
