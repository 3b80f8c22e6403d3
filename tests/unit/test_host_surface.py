"""Every object the restricted sandbox hands user code shows only its declared surface
(a walk from one must not reach the daemon's internals): the globals and builtins of a real run,
walked attribute by attribute."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.backends.restricted.lang import make_globals
from sandboxd.backends.restricted.lang.files import WorkspaceOpener
from sandboxd.backends.restricted.lang.guards import (
    HOST_SURFACES,
    guarded_getattr,
    host_surface,
)
from sandboxd.backends.restricted.lang.modules import ImportHook
from sandboxd.backends.restricted.lang.output import Displayer, OutputStream
from sandboxd.backends.restricted.lang.state import SandboxViolation
from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.rules import OutputBudget


def handed_out(tmp_path: Any) -> dict[str, Any]:
    """What user code can name in a run: its globals and its builtins."""
    emitted: list[tuple[bytes, bytes]] = []

    def emit(kind: bytes, data: bytes) -> None:
        emitted.append((kind, data))

    budget = OutputBudget(1000)
    stdout, stderr = OutputStream(b"o", emit, budget), OutputStream(b"e", emit, budget)
    g = make_globals(ImportHook(["json"], []), WorkspaceOpener(str(tmp_path), 100), stdout,
                     Displayer(emit, DisplayCaps(), (stdout, stderr)))
    found = {f"builtins.{k}": v for k, v in g.pop("__builtins__").items()}
    found.update(g)
    with (tmp_path / "f.txt").open("w") as f:
        f.write("x")
    found["open('f.txt')"] = found["builtins.open"]("f.txt")
    found["import json"] = found["builtins.__import__"]("json")
    return found


def host_objects(tmp_path: Any) -> list[tuple[str, Any]]:
    return [(name, obj) for name, obj in handed_out(tmp_path).items()
            if host_surface(obj) is not None]


def test_the_sandbox_hands_out_host_objects_and_each_is_declared(tmp_path: Any) -> None:
    names = {name for name, _ in host_objects(tmp_path)}
    # the ones an attacker reaches first: if these stop being host objects, the walk below
    # proves nothing about them
    assert {"builtins.display", "builtins.open", "open('f.txt')", "builtins.type"} <= names
    for _name, obj in host_objects(tmp_path):
        assert type(obj) in HOST_SURFACES, f"{type(obj).__qualname__} declares no surface"


def test_every_undeclared_attribute_of_a_host_object_is_refused(tmp_path: Any) -> None:
    checked = 0
    for _name, obj in host_objects(tmp_path):
        surface = host_surface(obj)
        assert surface is not None
        for attr in dir(obj):
            if attr.startswith("_"):
                continue  # underscore names have their own rule (refused on host objects)
            if attr in surface:
                guarded_getattr(obj, attr)  # the declared surface works
                continue
            with pytest.raises(SandboxViolation):
                guarded_getattr(obj, attr)
            checked += 1
    assert checked >= 5, "the walk found no undeclared attribute: it tests nothing"


@pytest.mark.parametrize("attr", ["emit", "streams", "caps", "sent"])
def test_display_leads_nowhere(tmp_path: Any, attr: str) -> None:
    display = handed_out(tmp_path)["builtins.display"]
    with pytest.raises(SandboxViolation, match="sandbox's own Displayer"):
        guarded_getattr(display, attr)


def test_an_undeclared_host_class_shows_nothing() -> None:
    """Default deny: a helper class of the daemon's package nobody declared."""
    cls = type("Helper", (), {"__module__": "sandboxd.backends.restricted.lang.new",
                              "secret": 1})
    with pytest.raises(SandboxViolation):
        guarded_getattr(cls(), "secret")
