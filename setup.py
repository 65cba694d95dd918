"""Build the compiled core. Metadata lives in pyproject.toml.

SEGSTORE_CYTHON_DEBUG=1 turns bounds, wraparound and initialization checks on, so an
out-of-bounds bug raises IndexError in tests instead of corrupting memory.

SEGSTORE_ASAN=1 compiles the optimized build's C (the same Cython directives, no bounds checks)
with AddressSanitizer, so a read past a buffer that the Cython checks cannot see (raw pointers,
memcpy, the nogil kernels) stops the process with a report. The interpreter is not instrumented:
run it with LD_PRELOAD=$(gcc -print-file-name=libasan.so) (see `make test-asan`).
"""
import os
import subprocess

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# GCC's default inlining budget leaves the varint readers and record parser as calls inside the
# per-record loops (a sixth of decode time under perf); a larger budget inlines them.
GCC_INLINE_PARAMS = ["--param", "max-inline-insns-single=1000", "--param",
                     "max-inline-insns-auto=200", "--param", "large-function-growth=1000",
                     "--param", "inline-unit-growth=200"]

DEBUG = os.environ.get("SEGSTORE_CYTHON_DEBUG", "") not in ("", "0")
ASAN = os.environ.get("SEGSTORE_ASAN", "") not in ("", "0")
if DEBUG and ASAN:
    raise SystemExit("setup.py: SEGSTORE_CYTHON_DEBUG and SEGSTORE_ASAN are separate builds")
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-O1", "-g"]

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
        extra_compile_args=ASAN_FLAGS if ASAN else ["-O0", "-g"] if DEBUG else ["-O3"],
        extra_link_args=["-fsanitize=address"] if ASAN else [],
        define_macros=([("SEGSTORE_DEBUG", "1")] if DEBUG else
                       [("SEGSTORE_ASAN", "1")] if ASAN else []),
    )
]



class BuildExt(build_ext):
    """Adds GCC_INLINE_PARAMS to optimized builds when the compiler is GCC (others skip them)."""

    def build_extensions(self):
        if not DEBUG and not ASAN and _is_gcc(self.compiler.compiler_so[0]):
            for ext in self.extensions:
                ext.extra_compile_args = ext.extra_compile_args + GCC_INLINE_PARAMS
        super().build_extensions()


def _is_gcc(cc: str) -> bool:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out.stdout and "clang" not in out.stdout.lower()


# The debug build writes its C elsewhere so it never replaces the optimized build's C source
# (the ASan build's C is the optimized build's, but it too stays out of the source tree).
setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        build_dir="build/debug-c" if DEBUG else "build/asan-c" if ASAN else None,
        force=DEBUG or ASAN,
    )
)
