"""Every runtime dependency of pyproject.toml is one the daemon's distribution uses: imported
somewhere in the packages its wheel carries (sandboxd/, and the client it ships beside it,
client/sandboxd_client/), or named in :data:`INDIRECT` with where it is used. What only tests
or benchmarks import belongs in the ``dev`` extra."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: dependencies no module of sandboxd imports by name, and why they are needed all the same
INDIRECT = {"httptools": "uvicorn's AutoHTTPProtocol (sandboxd.api.connections) runs on it"}


def _imported() -> set[str]:
    found: set[str] = set()
    wheel = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = wheel["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for path in (p for package in packages for p in (REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_runtime_dependency_is_used_by_the_daemon() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_norm(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0])
                for dep in project["dependencies"]}
    modules: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            modules.setdefault(_norm(dist), set()).add(module)
    imported = _imported()
    unused = sorted(dep for dep in declared
                    if dep not in INDIRECT and not modules.get(dep, set()) & imported)
    assert unused == [], (f"runtime dependencies nothing in the wheel's packages imports: {unused} "
                          "(a test's or a benchmark's belongs in the dev extra)")
