"""An offline stand-in for @rules_java, for Bazel 4 (Debian's bazel-bootstrap).

Bazel 4 loads @bazel_tools//tools/jdk while it resolves toolchains, and that
package loads its rules from @rules_java//java:defs.bzl, which Bazel would
download; jax_llar builds no Java, and in Bazel 4 these rules are native, so
this file forwards to them.
"""

def java_binary(**kwargs):
    native.java_binary(**kwargs)

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_library(**kwargs):
    native.java_library(**kwargs)

def java_plugin(**kwargs):
    native.java_plugin(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_test(**kwargs):
    native.java_test(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
