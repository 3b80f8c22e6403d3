"""The backend interface as a spec (:mod:`sandboxd.backends.base`,
:mod:`sandboxd.backends.capabilities`): a small core every backend implements, and optional
capabilities that a backend declares by subclassing them. Each registered backend declares
exactly what this table says, implements every member of what it declares (no protocol body is
ever inherited: they are docstrings only), and has no capability it does not declare; the
callers ask the capability's helper, which leaves a backend without it out."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Protocol

import pytest

from sandboxd.backends import registry
from sandboxd.backends.base import Backend
from sandboxd.backends.capabilities import (
    Hibernating,
    ImageBuilder,
    KernelCarrier,
    KernelHost,
    KernelLanguages,
    Pausable,
    SelfHealing,
    SessionKeeper,
    declares,
    hibernating,
    image_builder,
    kernel_backends,
    kernel_carrier,
    kernel_count,
    kernel_host,
    kernel_languages,
    kernel_names,
    live_kernels,
    pausable,
    self_healing,
    session_keeper,
)
from sandboxd.backends.scripted import ScriptedBackend

#: what every backend must do
CORE = {"name", "start", "close", "availability", "run", "close_session", "probe"}
CAPABILITIES: tuple[type, ...] = (KernelHost, KernelLanguages, KernelCarrier, Hibernating,
                                  Pausable, ImageBuilder, SelfHealing, SessionKeeper)
#: what each registered backend declares (a new backend adds its row)
DECLARES: dict[str, set[type]] = {
    "restricted": {KernelHost, KernelCarrier, Hibernating},
    "container": {KernelHost, KernelLanguages, Pausable, ImageBuilder, SelfHealing,
                  SessionKeeper},
    "workspace": set(),
}
#: the in-process backend of the service tests: it emulates kernels, nothing else
SCRIPTED: set[type] = {KernelHost}
#: the helper a caller asks for each capability
HELPERS: dict[type, Any] = {KernelHost: kernel_host, KernelCarrier: kernel_carrier,
                            Hibernating: hibernating, Pausable: pausable,
                            ImageBuilder: image_builder, SelfHealing: self_healing,
                            SessionKeeper: session_keeper}


def own_members(proto: type) -> set[str]:
    """The members a protocol declares in its own body (not its bases')."""
    return {n for n in (*vars(proto), *vars(proto).get("__annotations__", {}))
            if not n.startswith("_")}


def members(proto: type) -> set[str]:
    """The members of a protocol, its protocol bases' included."""
    return set().union(*(own_members(c) for c in proto.__mro__
                         if getattr(c, "_is_protocol", False) and c is not Protocol))


def backend_classes() -> dict[str, type]:
    """Each registered backend's class (its factory is ``Class.from_settings``)."""
    return {e.name: registry.load(e.factory).__self__ for e in registry.entries()}


def declared(cls: type) -> set[type]:
    return {c for c in CAPABILITIES if c in cls.__mro__}


def assigned_on_self(cls: type) -> set[str]:
    """Names that the methods of ``cls`` (and its non-protocol bases) assign on ``self``."""
    names: set[str] = set()
    for base in cls.__mro__:
        if getattr(base, "_is_protocol", False) or base.__module__ == "builtins":
            continue
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(base)))):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names


def implements(cls: type, proto: type) -> bool:
    """Whether ``cls`` itself defines every member of ``proto``: a method or property in a
    class that is not a protocol, or an attribute set on ``self``."""
    on_self = assigned_on_self(cls)

    def own(name: str) -> bool:
        owner = next((c for c in cls.__mro__ if name in vars(c)), None)
        return name in on_self or not getattr(owner, "_is_protocol", True)

    return all(own(name) for name in members(proto))


ALL_CLASSES = {**backend_classes(), "scripted": ScriptedBackend}


def test_the_core_is_small() -> None:
    assert members(Backend) == CORE and len(CORE) <= 9


def test_no_member_is_declared_twice() -> None:
    """The core and each capability declare members of their own (a capability may extend
    another, as KernelLanguages extends KernelHost)."""
    seen: dict[str, str] = {}
    for proto in (Backend, *CAPABILITIES):
        for name in own_members(proto):
            assert name not in seen, (name, proto.__name__, seen.get(name))
            seen[name] = proto.__name__


@pytest.mark.parametrize("proto", [Backend, *CAPABILITIES], ids=lambda p: p.__name__)
def test_no_protocol_gives_a_default(proto: type) -> None:
    """Each method of the core and of the capabilities is a docstring only: a backend never
    inherits a no-op for what it does not do (it leaves the capability out instead)."""
    for name in own_members(proto):
        value = vars(proto).get(name)
        func = value.fget if isinstance(value, property) else value
        if func is None:
            continue  # an attribute
        body = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
        assert isinstance(body, ast.FunctionDef | ast.AsyncFunctionDef)
        assert len(body.body) == 1 and isinstance(body.body[0], ast.Expr), (proto, name)


def test_every_registered_backend_is_in_the_table() -> None:
    assert set(backend_classes()) == set(DECLARES)


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_a_backend_declares_what_the_table_says(name: str) -> None:
    cls = ALL_CLASSES[name]
    assert Backend in cls.__mro__ and implements(cls, Backend)
    assert declared(cls) == DECLARES.get(name, SCRIPTED)


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_a_backend_implements_exactly_what_it_declares(name: str) -> None:
    """Every member of each capability it declares is its own (none falls back on the
    protocol's body), and it has no capability it does not declare."""
    cls = ALL_CLASSES[name]
    assert {c for c in CAPABILITIES if implements(cls, c)} == declared(cls)


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_a_helper_answers_the_backend_or_none(name: str) -> None:
    cls = ALL_CLASSES[name]
    backend = object.__new__(cls)  # (isinstance asks only what it declares)
    assert {c for c, helper in HELPERS.items() if helper(backend) is backend} == (
        declared(cls) & set(HELPERS))
    assert all(helper(backend) is None for c, helper in HELPERS.items() if c not in declared(cls))


def test_kernels_are_listed_only_where_they_are_kept() -> None:
    """A kernel host without languages keeps python kernels; a backend that is no kernel
    host has none (and is never asked)."""
    from sandboxd.backends.workspace import WorkspaceBackend

    scripted = ScriptedBackend("restricted")
    scripted.kernels = {"s1": 2}
    files = WorkspaceBackend(quota_bytes=1 << 20, quota_entries=100)
    backends = {"restricted": scripted, "workspace": files}
    assert live_kernels(scripted) == {("s1", "python")} and live_kernels(files) == set()
    assert kernel_names(backends, "s1") == ["restricted"] == kernel_backends(backends, "s1")
    assert kernel_names(backends, "s2") == [] == kernel_backends(backends, "s2")


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_declares_answers_what_isinstance_answers(name: str) -> None:
    """The helpers ask :func:`declares` (the class's declaration, looked up once): for every
    backend and capability it agrees with ``isinstance`` and the runtime-checkable protocol,
    which checks the members one by one."""
    backend = object.__new__(ALL_CLASSES[name])
    for capability in CAPABILITIES:
        assert declares(backend, capability) == isinstance(backend, capability), capability


class _Host(ScriptedBackend, Hibernating):
    """A kernel host some of whose kernels sleep (as the restricted backend's do)."""

    def __init__(self, live: set[str], asleep: set[str]) -> None:
        super().__init__("restricted")
        self.kernels = {sid: 1 for sid in live | asleep}
        self.asleep = asleep

    def hibernated_sessions(self) -> set[str]:
        return self.asleep


class _Languages(ScriptedBackend, KernelLanguages):
    """A kernel host with a kernel per language (as the container backend)."""

    def __init__(self, kernels: set[tuple[str, str]]) -> None:
        super().__init__("container")
        self.pairs = kernels

    def session_kernels(self) -> set[tuple[str, str]]:
        return set(self.pairs)

    def kernel_sessions(self) -> set[str]:
        return {sid for sid, _ in self.pairs}


@pytest.mark.parametrize("seed", range(40))
def test_one_sessions_look_agrees_with_the_scan_of_every_kernel(seed: int) -> None:
    """The per-session and counting helpers a kernel call asks (kernel_languages,
    kernel_names, kernel_count, KernelCap.admit) answer exactly what the scan of every live
    kernel (live_kernels) answers, sleepers and languages included."""
    import random

    from sandboxd.backends.base import kernel_name
    from sandboxd.errors import KernelLimitReached
    from sandboxd.sessions.kernels import KernelCap

    rnd = random.Random(seed)
    sids = [f"s{i}" for i in range(12)]
    live = {s for s in sids if rnd.random() < 0.5}
    asleep = {s for s in sids if s not in live and rnd.random() < 0.5}
    pairs = {(s, lang) for s in sids for lang in ("python", "bash") if rnd.random() < 0.3}
    backends: dict[str, Any] = {"restricted": _Host(live, asleep),
                                "container": _Languages(pairs)}
    for resident in (False, True):
        for b in backends.values():
            scanned = live_kernels(b, resident=resident)
            assert kernel_count(b, resident=resident) == len(scanned)
            for sid in [*sids, "unknown"]:
                assert kernel_languages(b, sid, resident=resident) == sorted(
                    lang for s, lang in scanned if s == sid)
        for sid in sids:
            assert kernel_names(backends, sid, resident=resident) == sorted(
                kernel_name(n, lang) for n, b in backends.items()
                for s, lang in live_kernels(b, resident=resident) if s == sid)
    # the cap: each admission counts as the full scan would, reservations included
    cap = KernelCap(rnd.randint(1, 30), backends)
    held = []
    for _ in range(20):
        sid, kernel = rnd.choice(sids), rnd.choice(["restricted", "container",
                                                     "container:bash"])
        before = cap.live()
        shared = (kernel, sid) in before
        try:
            held.append(cap.admit(sid, kernel, python=True))
        except KernelLimitReached:
            assert not shared and len(before) >= cap.limit
        else:
            assert shared or len(before) < cap.limit
        assert cap.count() == len(cap.live())
    for r in held:
        r.release()
