"""The CUDA kernels' build: nvcc -> fatbin -> C++ array (see BUILD, "# Kernels").

`--//devices/cuda:archs=default|all` picks the architecture list. The targets exist only where
@local_cuda found a toolkit (BUILD files cannot hold a top-level `if`, hence a macro), and are
incompatible (skipped by wildcards) with `--//bazel:cuda=off`.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH")

_ARCH_LISTS = ["default", "all"]

def _archs_flag_impl(ctx):
    if ctx.build_setting_value not in _ARCH_LISTS:
        fail("//devices/cuda:archs must be one of %s, got '%s'" % (_ARCH_LISTS, ctx.build_setting_value))
    return []

cuda_archs_flag = rule(
    implementation = _archs_flag_impl,
    build_setting = config.string(flag = True),
)

# default: SASS for sm_80 (A100) and sm_90 (H100) plus compute_90 PTX, which the driver
# JIT-compiles for anything newer. all: adds sm_75, sm_86 and sm_89 SASS (T4, RTX 30xx / A10,
# L4 / RTX 40xx).
_GENCODE_DEFAULT = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

_GENCODE_ALL = [
    "-gencode=arch=compute_75,code=sm_75",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_86,code=sm_86",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# The same lists as the fatbin's entries (kind:arch), for kernels_fatbin_test.
_ENTRIES_DEFAULT = "elf:80,elf:90,ptx:90"

_ENTRIES_ALL = "elf:75,elf:80,elf:86,elf:89,elf:90,ptx:90"

_NVCC_FLAGS = [
    # nvcc 13 accepts g++ 12; named so that nvcc does not pick whatever `gcc` is first on PATH.
    "-ccbin=/usr/bin/g++",
    "-fatbin",
    "-O3",
    "-std=c++17",
    # Bit-exact results (kernel_math.h): no FMA contraction, IEEE subnormals, IEEE division.
    # Never --use_fast_math, which turns all three off.
    "-fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    # Uncompressed: the driver loads the image without inflating it, and kernels_fatbin_test finds
    # every kernel's name in every entry.
    "-no-compress",
    "--Werror=all-warnings",
    # Two architectures compile at a time (CI machines have 2 cores).
    "--threads=2",
    "-I.",
]

def cuda_kernels():
    """kernels_fatbin, kernels_fatbin_source, kernels and kernels_fatbin_test, where CUDA exists."""
    if not CUDA_FOUND:
        return
    # Bazel 4's bundled @platforms has no :incompatible; a constraint value that no platform
    # carries does the same.
    native.constraint_setting(name = "cuda_disabled_setting")
    native.constraint_value(
        name = "cuda_disabled",
        constraint_setting = ":cuda_disabled_setting",
    )
    needs_cuda = select({
        "//bazel:cuda_off": [":cuda_disabled"],
        "//conditions:default": [],
    })

    native.genrule(
        name = "kernels_fatbin",
        srcs = [
            "kernels.cu",
            "kernel_abi.h",
            "kernel_math.h",
        ],
        outs = ["kernels.fatbin"],
        cmd = " ".join([CUDA_PATH + "/bin/nvcc"] + _NVCC_FLAGS) + " " + select({
            ":archs_all": " ".join(_GENCODE_ALL),
            "//conditions:default": " ".join(_GENCODE_DEFAULT),
        }) + " -o $@ $(location kernels.cu)",
        target_compatible_with = needs_cuda,
    )

    # The fatbin as a C++ array (od and awk are on every Debian; xxd may not be).
    native.genrule(
        name = "kernels_fatbin_source",
        srcs = [":kernels_fatbin"],
        outs = ["kernels_fatbin.cc"],
        cmd = "\n".join([
            "{",
            "  echo '// Generated from kernels.fatbin by //devices/cuda:kernels_fatbin_source.';",
            "  echo '#include \"devices/cuda/kernels_fatbin.h\"';",
            "  echo 'namespace kizuna::cuda {';",
            "  echo 'alignas(8) const unsigned char kKizunaCudaFatbin[] = {';",
            "  od -An -v -tx1 $< | awk '{ for (i = 1; i <= NF; i++) printf \"0x%s,\", $$i; printf \"\\n\" }';",
            "  echo '};';",
            "  echo 'const size_t kKizunaCudaFatbinSize = sizeof(kKizunaCudaFatbin);';",
            "  echo '}  // namespace kizuna::cuda';",
            "} > $@",
        ]),
        target_compatible_with = needs_cuda,
    )

    native.cc_library(
        name = "kernels",
        srcs = [":kernels_fatbin_source"],
        hdrs = [
            "kernel_abi.h",
            "kernels_fatbin.h",
        ],
        target_compatible_with = needs_cuda,
        deps = [":kernel_math"],
    )

    native.cc_test(
        name = "kernels_fatbin_test",
        size = "small",
        srcs = ["kernels_fatbin_test.cc"],
        data = [":kernels_fatbin"],
        defines = [
            "KZ_CUOBJDUMP=\\\"" + CUDA_PATH + "/bin/cuobjdump\\\"",
        ] + select({
            ":archs_all": ["KZ_EXPECTED_ENTRIES=\\\"" + _ENTRIES_ALL + "\\\""],
            "//conditions:default": ["KZ_EXPECTED_ENTRIES=\\\"" + _ENTRIES_DEFAULT + "\\\""],
        }),
        linkopts = ["-lgtest_main"],
        target_compatible_with = needs_cuda,
        deps = [
            ":kernels",
            "@system//:gtest",
        ],
    )

def cuda_backend():
    """The backend library `cuda` (//devices/cuda), where CUDA exists and is not switched off."""
    if not CUDA_FOUND:
        return
    native.cc_library(
        name = "cuda",
        srcs = [
            "backend.cc",
            "loader.cc",
            "memory.cc",
            "stream.cc",
        ],
        hdrs = [
            "backend.h",
            "loader.h",
            "stream.h",
        ],
        linkopts = ["-ldl"],
        alwayslink = 1,
        target_compatible_with = select({
            "//bazel:cuda_off": [":cuda_disabled"],
            "//conditions:default": [],
        }),
        deps = [
            ":kernels",
            "//runtime/core",
            "//runtime/device",
            "@local_cuda//:cuda_headers",
            "@system//:fmt",
        ],
    )
