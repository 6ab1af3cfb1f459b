"""Offline stand-in for @rules_java: Bazel 4's @bazel_tools loads these names; forward them to native."""

def java_library(**kwargs):
    native.java_library(**kwargs)

def java_binary(**kwargs):
    native.java_binary(**kwargs)

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)

def java_proto_library(**kwargs):
    native.java_proto_library(**kwargs)
