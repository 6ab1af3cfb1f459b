"""The project's GoogleTest wiring, in one place."""

def kz_cc_test(name, srcs = None, deps = [], size = "small", main = True, linkopts = [], **kwargs):
    """A GoogleTest binary.

    Args:
      name: the test's name; its source is `name + ".cc"` unless `srcs` says otherwise.
      srcs: the test's sources (default: [name + ".cc"]).
      deps: what it tests and uses; GoogleTest is added.
      size: Bazel's test size (default "small").
      main: link GoogleTest's main (default True); False for a test that has its own.
      linkopts: further link options.
      **kwargs: any other cc_test attribute (shard_count, linkstatic, data, env, tags, ...).
    """
    native.cc_test(
        name = name,
        srcs = srcs if srcs != None else [name + ".cc"],
        size = size,
        linkopts = (["-lgtest_main"] if main else []) + linkopts,
        deps = [d for d in deps if d != "@system//:gtest"] + ["@system//:gtest"],
        **kwargs
    )
