"""The one C extension; everything else is in pyproject.toml.

``weightio._speedups`` (weightio/_speedups.c) reads plain safetensors headers. It is optional:
where it cannot be compiled (no C compiler), the install goes on and weightio reads every header
with its Python paths. (Declared here rather than in pyproject.toml, where setuptools still calls
extension modules experimental.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("weightio._speedups", ["weightio/_speedups.c"],
                             depends=["weightio/_json_scan.h", "weightio/_files.h"], optional=True)])
