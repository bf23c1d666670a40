"""A local stand-in for `@rules_cc//cc:defs.bzl`: the native C++ rules under their rules_cc names.

Bazel 4's own C++ toolchain (`@bazel_tools//tools/cpp`) loads `@rules_cc//cc:defs.bzl`, and
its default WORKSPACE would download rules_cc for it; the build is offline, so WORKSPACE
points `@rules_cc` here instead. Each symbol forwards to the native rule, which is what
rules_cc 0.0.x does too. Our BUILD files load from here so that a newer Bazel can use the
real rules_cc (from Bzlmod or WORKSPACE) without edits.
"""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)

def fdo_profile(**attrs):
    native.fdo_profile(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
