"""Build the compiled core. Metadata lives in pyproject.toml.

SEGSTORE_CYTHON_DEBUG=1 turns bounds, wraparound and initialization checks on, so an
out-of-bounds bug raises IndexError in tests instead of corrupting memory.
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("SEGSTORE_CYTHON_DEBUG", "") not in ("", "0")

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "nonecheck": False,
    "cdivision": True,
    "embedsignature": True,
    "profile": False,
}

extensions = [
    Extension(
        "segstore._core",
        ["segstore/_core.pyx"],
        extra_compile_args=["-O3"] if not DEBUG else ["-O0", "-g"],
        define_macros=[("SEGSTORE_DEBUG", "1")] if DEBUG else [],
    )
]

# The debug build writes its C elsewhere so it never replaces the optimized build's C source.
setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        build_dir="build/debug-c" if DEBUG else None,
        force=DEBUG,
    )
)
