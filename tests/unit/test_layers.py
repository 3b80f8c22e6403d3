"""The floors of the house: every package of ``sandboxd/`` sits on one floor of :data:`LAYERS`,
and a module imports from its own floor and the floors below it, never from a floor above (so
a floor can be read, tested and changed with only what is under it in mind), and the packages
import each other in no cycle.

Every import counts: lazy ones inside functions, and type-only ones under ``TYPE_CHECKING`` (a
type names what its floor must know). An import that still goes up a floor is in
:data:`UPWARD`, with why; the test fails when one of them is gone too, so the list only
shrinks."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_import_graph import _cycles, _imported, _modules

#: the floors, bottom first (a package is a directory of ``sandboxd/`` or one of its loose
#: modules; ``__init__`` is the package's own, ``client`` the thin client's name inside it,
#: ``__main__`` its entry point). Where this differs from the first sketch of the redesign, the
#: code decided: the built-in tools' table is low (the policy and the backends read it); the
#: policy is above the backends (it checks a rule's backend against their registry; they read only
#: its path rules, which are the protocol's); results/ is low (its items, outputs and stream
#: events import only the protocol); the recorder of a call's audit record and signed receipt
#: lives in receipts/; health is above sessions (it reports on them); the fleet is a client of the
#: API, under the CLI that drives it. The egress proxy is low (the container backend starts a
#: sandbox's side of it; its policy checks live in the policy); the invoke path's parts sit under
#: the service that composes them, a fork over it (it forks through it), and the E2B door is a
#: door of the API (api/e2b/), as MCP's.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "client"),
    ("util", "protocol", "languages"),
    ("errors",),
    ("workspaces", "results", "egress"),
    ("config",),
    ("host",),
    ("models",),
    ("tools", "audit"),
    ("receipts",),
    ("backends",),
    ("policy",),
    ("access", "scheduler", "sessions"),
    ("health", "capacity"),
    ("invoke",),
    ("service",),
    ("fork",),
    ("api",),
    ("fleet",),
    ("cli",),
    ("__main__",),
)

#: imports that still go up a floor: (importing module, package it imports) -> why (none
#: now: a new one needs its reason here)
UPWARD: dict[tuple[str, str], str] = {}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _package_imports() -> set[tuple[str, str]]:
    """(importing module, imported package) for every import between two packages."""
    mods = _modules()
    return {(name, _package(target))
            for name, path in mods.items()
            for target in _imported(name, path, mods, type_only=True)
            if _package(target) != _package(name)}


FLOOR = {package: i for i, floor in enumerate(LAYERS) for package in floor}


def test_every_package_is_on_one_floor() -> None:
    placed = [package for floor in LAYERS for package in floor]
    assert len(placed) == len(set(placed))
    assert {_package(name) for name in _modules()} == set(placed)


def test_no_import_goes_up_a_floor_but_those_listed() -> None:
    upward = {(module, package) for module, package in _package_imports()
              if FLOOR[package] > FLOOR[_package(module)]}
    assert sorted(upward - UPWARD.keys()) == [], "an import goes up a floor"
    assert sorted(UPWARD.keys() - upward) == [], "a listed upward import is gone: unlist it"


def test_the_packages_import_each_other_in_no_cycle() -> None:
    graph: dict[str, set[str]] = {package: set() for package in FLOOR}
    for module, package in _package_imports() - UPWARD.keys():
        graph[_package(module)].add(package)
    assert _cycles(graph) == []


def test_type_only_and_lazy_imports_are_edges(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    import a\n"
                      "def f():\n    import b\n")
    mods = {"m": source, "a": source, "b": source}
    assert _imported("m", source, mods, type_only=True) == {"a", "b"}
    assert _imported("m", source, mods) == {"b"}
