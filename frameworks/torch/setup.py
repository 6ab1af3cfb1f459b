"""Builds kizuna.torch._C against an installed kizuna (./kz install): KIZUNA_PREFIX names it.

    KIZUNA_PREFIX=/opt/kizuna python setup.py build_ext --build-lib OUT --build-temp TMP
"""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

prefix = os.environ.get("KIZUNA_PREFIX")
if not prefix:
    raise SystemExit("setup.py: set KIZUNA_PREFIX to an install of kizuna (./kz install --prefix DIR)")

setup(
    name="kizuna",
    version="1.1.0",
    packages=["kizuna", "kizuna.torch"],
    ext_modules=[
        CppExtension(
            "kizuna.torch._C",
            ["csrc/backend.cc", "csrc/module.cc"],
            include_dirs=[os.path.join(prefix, "include")],
            library_dirs=[os.path.join(prefix, "lib")],
            libraries=["kizuna"],
            # kizuna's C++ API is C++20 (torch's default is C++17; its headers build either way).
            extra_compile_args=["-std=c++20", "-O2"],
            extra_link_args=["-Wl,-rpath," + os.path.join(prefix, "lib")],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
