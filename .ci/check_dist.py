"""Check the built distributions in DIST (``python .ci/check_dist.py dist``) beyond `twine check`.

The wheel holds every package pyproject.toml lists (the click app as ``weightio.cli``, no
top-level ``cli``), ``py.typed``, ``__main__``, the compiled C fast path (``weightio._speedups``:
the wheel is built for this platform), the ``weightio`` console script, the version of
weightio/__init__.py, and no runtime dependency that only the tests use; the sdist holds what the
test suite needs to run from it (tests, fixtures, docs) and the C source. Prints one line per file
checked.
"""

from __future__ import annotations

import ast
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def source_version() -> str:
    tree = ast.parse((ROOT / "weightio" / "__init__.py").read_text())
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"])


def check_wheel(path: Path, version: str) -> list[str]:
    problems = []
    names = set(zipfile.ZipFile(path).namelist())
    info = f"weightio-{version}.dist-info"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    required = {f"{p.replace('.', '/')}/__init__.py" for p in packages}
    required |= {"weightio/py.typed", "weightio/__main__.py", "weightio/cli/__main__.py", f"{info}/METADATA"}
    problems += [f"missing {name}" for name in sorted(required - names)]
    if not any(name.startswith("weightio/_speedups.") and name.endswith((".so", ".pyd")) for name in names):
        problems.append("no compiled weightio/_speedups module (was the C extension built?)")
    tops = {name.split("/")[0] for name in names}
    problems += [f"unexpected top-level entry {top}" for top in sorted(tops - {"weightio", info})]
    with zipfile.ZipFile(path) as wheel:
        entry_points = wheel.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in names else ""
        meta = Parser().parsestr(wheel.read(f"{info}/METADATA").decode()) if f"{info}/METADATA" in names else {}
    if "weightio = weightio.cli:main" not in entry_points:
        problems.append("no `weightio = weightio.cli:main` console script")
    if meta and meta["Version"] != version:
        problems.append(f"metadata version {meta['Version']} is not weightio.__version__ {version}")
    runtime = [r for r in (meta.get_all("Requires-Dist") or []) if "extra ==" not in r] if meta else []
    test_only = ("safetensors", "gguf")
    problems += [f"test-only runtime dependency: {r}" for r in runtime if r.split(">")[0].strip() in test_only]
    print(f"{path.name}: {len(names)} files, packages {', '.join(packages)}; runtime dependencies: "
          f"{', '.join(runtime)}")
    return problems


def check_sdist(path: Path, version: str) -> list[str]:
    prefix = f"weightio-{version}/"
    with tarfile.open(path) as sdist:
        names = {name.removeprefix(prefix) for name in sdist.getnames()}
    required = {"pyproject.toml", "README.md", "CHANGELOG.md", "weightio/__init__.py", "cli/__init__.py",
                "tests/conftest.py", "fixtures/manifest.json", "docs/index.md", "mkdocs.yml", "weightio/_speedups.c",
                "weightio/_json_scan.h", "weightio/_files.h", "weightio/_reads.h", "weightio/_copies.h", "setup.py"}
    print(f"{path.name}: {len(names)} files")
    return [f"sdist is missing {name}" for name in sorted(required - names)]


def main(dist: Path) -> int:
    version = source_version()
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or not wheels[0].name.startswith(f"weightio-{version}-cp") or len(sdists) != 1:
        found = sorted(p.name for p in dist.iterdir())
        print(f"expected one weightio {version} wheel and one sdist in {dist}, found {found}")
        return 1
    problems = check_wheel(wheels[0], version) + check_sdist(sdists[0], version)
    for problem in problems:
        print("PROBLEM:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
