"""The CUDA on/off switch: `--//bazel:cuda=auto|on|off` (auto: on when the toolkit was detected)."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND")

def _string_setting_impl(ctx):
    allowed = ["auto", "on", "off"]
    if ctx.build_setting_value not in allowed:
        fail("//bazel:cuda must be one of %s, got '%s'" % (allowed, ctx.build_setting_value))
    return []

cuda_switch = rule(
    implementation = _string_setting_impl,
    build_setting = config.string(flag = True),
)

def if_cuda(if_true, if_false = []):
    """Selects `if_true` when the CUDA backend is to be built."""
    return select({
        "//bazel:cuda_on": if_true,
        "//bazel:cuda_off": if_false,
        "//conditions:default": if_true if CUDA_FOUND else if_false,
    })
