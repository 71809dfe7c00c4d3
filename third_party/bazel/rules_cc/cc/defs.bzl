"""An offline stand-in for @rules_cc, for Bazel 4 (Debian's bazel-bootstrap).

Bazel 4's own tools (@bazel_tools//tools/cpp) load their C++ rules from
@rules_cc//cc:defs.bzl, which Bazel would download from GitHub; in Bazel 4
those rules are the native ones, so this file forwards to them and the build
runs without a network. Newer Bazels with Bzlmod use the real rules_cc
(MODULE.bazel) and ignore this directory.
"""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)
