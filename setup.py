"""The one C extension; everything else is in pyproject.toml.

``weightio._speedups`` (weightio/_speedups.c) reads plain safetensors headers and makes
`VarBuilder.get`'s views (with numpy's C API: numpy's headers are a build requirement). It is
optional: where it cannot be compiled (no C compiler, no numpy headers), the install goes on and
weightio does all of it in Python. (Declared here rather than in pyproject.toml, where setuptools
still calls extension modules experimental.)
"""

import os

from setuptools import Extension, setup


def _numpy_headers() -> list[str]:
    try:
        import numpy
    except ImportError:  # (an install without build isolation and without numpy: the extension is skipped)
        return []
    return [numpy.get_include()]


# POSIX: the fill's reads make threads of their own (weightio/_reads.h); -pthread links them where the
# C library keeps them apart (glibc before 2.34)
_THREADS = ["-pthread"] if os.name == "posix" else []

setup(ext_modules=[Extension("weightio._speedups", ["weightio/_speedups.c"], include_dirs=_numpy_headers(),
                             depends=["weightio/_json_scan.h", "weightio/_files.h", "weightio/_reads.h",
                                      "weightio/_copies.h"],
                             extra_compile_args=_THREADS, extra_link_args=_THREADS, optional=True)])
