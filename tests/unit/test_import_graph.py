"""Layers point one way (so each can be read and changed alone): the import graph of the package has
no cycle.

Every import counts, lazy ones inside functions included, except those under
``TYPE_CHECKING``; an edge is a module naming another (a package's ``__init__``, which a
submodule's import runs first, is not an edge of its own: a package re-exporting its submodules
is no layering cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import sandboxd

ROOT = Path(sandboxd.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imported(module: str, path: Path, mods: dict[str, Path],
              type_only: bool = False) -> set[str]:
    """The modules ``module`` imports; with ``type_only``, those under ``TYPE_CHECKING`` too
    (the layers' test: a type-only import still ties a floor to the one it names)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        if name in mods and name != module:
            found.add(name)

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                    and not type_only):
                visit(node.orelse)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.If
                            | ast.With | ast.AsyncWith | ast.Try | ast.For | ast.While):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                for alias in node.names:
                    add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base)

    visit(ast.parse(path.read_text()).body)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    mods = _modules()
    graph = {name: _imported(name, path, mods) for name, path in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
