"""A poll builds nothing per call: a predicate handed to ``wait_until`` never calls a module-level
httpx request function (``httpx.get`` and the like build a client and its TLS context on every
call: ~20 ms of CPU here, ~0.7 s under the VM job's emulation, where it was half of every test
daemon's start). Polls use a client built once."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
WAITS = {"wait_until", "async_wait_until"}
VERBS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}


def _called_name(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def _builds_a_client(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in VERBS and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "httpx")


def offenders(source: str, where: str) -> list[str]:
    """``where:line`` of every wait whose predicate (or a function of the same module it
    calls, at any depth) calls ``httpx.<verb>(...)``."""
    tree = ast.parse(source, where)
    defs: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, []).append(node)

    def costly(root: ast.AST, seen: set[str]) -> bool:
        for node in ast.walk(root):
            if _builds_a_client(node):
                return True
            name = _called_name(node) if isinstance(node, ast.Call) else None
            if name in defs and name not in seen:
                seen.add(name)
                if any(costly(d, seen) for d in defs[name]):
                    return True
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in WAITS and node.args:
            predicate = node.args[0]
            roots: list[ast.AST] = [predicate]
            if isinstance(predicate, ast.Name):
                roots = list(defs.get(predicate.id, []))
            if any(costly(r, set()) for r in roots):
                found.append(f"{where}:{node.lineno}")
    return found


def test_no_poll_builds_an_http_client() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        found += offenders(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, f"polls that build an httpx client on every call: {found}"


def test_the_check_finds_a_costly_poll() -> None:
    direct = "wait_until(lambda: httpx.get(url).status_code == 200, timeout=5, what='up')\n"
    nested = ("def ready(d):\n    return httpx.get(d.url).json()\n"
              "def up():\n    return ready(d)['ok']\n"
              "wait_until(up, timeout=5, what='up')\n")
    cheap = ("def up():\n    return client.get('/healthz').status_code == 200\n"
             "wait_until(up, timeout=5, what='up')\n")
    assert offenders(direct, "t.py") == ["t.py:1"]
    assert offenders(nested, "t.py") == ["t.py:5"]
    assert offenders(cheap, "t.py") == []
