"""One definition of the set of backends (a new backend needs no core edit): the registry. The core
modules that build, configure, validate and diagnose backends name none of them; each backend's
name, settings and hooks live in its own package's registry entry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sandboxd

ROOT = Path(sandboxd.__file__).parent
#: the modules that would otherwise list backends (a new backend must touch none of them)
CORE = ["backends/factory.py", "backends/base.py", "config/__init__.py", "config/files.py",
        "health/readiness.py",
        "service.py", "api/app.py", "cli/doctor.py",
        *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "policy").glob("*.py")))]
NAMES = ("restricted", "container", "workspace", "scripted")
#: a backend named in a string: the whole string, or "backend: x" / "backend=x" in a message
IN_TEXT = re.compile(rf"backend\s*[:=]\s*['\"]?({'|'.join(NAMES)})\b")
#: one of its settings read by name (``settings.container_enabled``, ``.restricted_x``)
SETTING = re.compile(rf"^({'|'.join(NAMES)})_enabled$|^({'|'.join(set(NAMES) - {'workspace'})})_")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def backend_names_in(source: str, where: str) -> list[str]:
    tree = ast.parse(source, where)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs \
                and (node.value in NAMES or IN_TEXT.search(node.value)):
            found.append(f"{where}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.Attribute) and SETTING.match(node.attr):
            found.append(f"{where}:{node.lineno} .{node.attr}")
    return found


@pytest.mark.parametrize("module", CORE)
def test_core_modules_name_no_backend(module: str) -> None:
    path = ROOT / module
    assert backend_names_in(path.read_text(), module) == []


def test_the_check_sees_a_backend_name() -> None:
    """The check above can fail: each way the core used to name a backend is caught."""
    before = '''
DEFAULT_BACKEND = "restricted"
def f(tool, settings):
    """Mentions the restricted backend in prose: fine."""
    if settings.container_enabled:
        pass
    return f"use backend: container for {tool}"
'''
    assert [f.split(" ", 1)[1] for f in backend_names_in(before, "x.py")] == [
        "'restricted'", ".container_enabled", "'use backend: container for '"]


def test_every_backend_package_registers_itself() -> None:
    from sandboxd.backends import registry

    for entry in registry.entries():
        package = registry.load(entry.factory.partition(":")[0].rpartition(".")[0])
        assert package.ENTRY is entry, entry.name


def test_every_setting_an_entry_names_exists() -> None:
    """An entry's enabled flag and the settings it says it reads are real settings (the doctor
    and the factory read the flag by name)."""
    from sandboxd.backends import registry
    from sandboxd.config import Settings

    for entry in registry.entries():
        named = {*entry.reads(), *([entry.enabled_setting] if entry.enabled_setting else [])}
        assert named <= set(Settings.model_fields), (entry.name, named - set(Settings.model_fields))
        if entry.enabled_setting:
            assert Settings.model_fields[entry.enabled_setting].annotation is bool
