"""The backend registry (a new backend needs no core edit): a backend registered by its own package
- here one this test defines - is built by the factory, accepted by policy validation and probed by
``sandboxd doctor`` with no edit of a core file; the registry itself imports no backend."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from sandboxd.backends import registry
from sandboxd.backends.capabilities import SelfHealing, self_healing
from sandboxd.backends.factory import build_backend, build_backends, enabled_backends
from sandboxd.backends.scripted import ScriptedBackend
from sandboxd.config import Settings, load_settings
from sandboxd.host.uids import UidPool
from sandboxd.models import ProbeCheck
from sandboxd.policy import load_file
from tests.policy.helpers import store_for, write

NAME = "throwaway"


class Throwaway(ScriptedBackend):
    """A backend that exists only in this test."""

    @classmethod
    def from_settings(cls, settings: Settings, uids: UidPool | None) -> Throwaway:
        return cls(NAME)


def rows(settings: Settings) -> list[ProbeCheck]:
    return [ProbeCheck(name="throwaway_fact", ok=True, detail=f"reads {settings.state_dir}")]


ENTRY = registry.BackendEntry(
    name=NAME, factory=f"{__name__}:Throwaway.from_settings",
    serves=frozenset({"python", "shell"}), doctor_rows=f"{__name__}:rows")
ONLY_IT = {"restricted_enabled": False, "container_enabled": False}


@pytest.fixture
def throwaway() -> Iterator[registry.BackendEntry]:
    # after the package's own backends, as one that a package of its own registers when
    # the registry imports it: the expected messages list the names in that order (a
    # registration before the first question to the registry would come first)
    registry.entries()
    registry.register(ENTRY)
    try:
        yield ENTRY
    finally:
        registry.unregister(NAME)


def test_the_factory_builds_a_registered_backend(
        throwaway: registry.BackendEntry, tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, **ONLY_IT)
    assert enabled_backends(settings) == [NAME]
    built = build_backends(settings, None)
    assert set(built) == {NAME, "workspace"} and isinstance(built[NAME], Throwaway)
    assert self_healing(built[NAME]) is None  # it need not say what it cannot do
    assert isinstance(build_backend(NAME, settings, None), Throwaway)


def test_policies_may_name_a_registered_backend(
        throwaway: registry.BackendEntry, tmp_path: Path) -> None:
    store = store_for(tmp_path, "tools:\n  python: {backend: throwaway}\n")
    decision = store.decide("local", "python", {"code": "1"}, None)
    assert decision.allowed and decision.backend == NAME, decision
    p = write(tmp_path / "bad", "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"]
        tools:
          python: {backend: bogus}
          shell: {backend: throwaway, network: bridge}
        """)
    policy, problems = load_file(p, str(p))
    assert policy is None
    assert problems == [
        f"{p}:5:21: tools.python.backend: Input should be 'restricted', 'container' or "
        "'throwaway'",
        # its entry says it has no network (the default)
        f"{p}:6:40: tools.shell.network: the throwaway backend has no network; 'shell' needs "
        "backend: container to be granted network 'bridge'",
    ]


def test_an_unregistered_backend_is_a_policy_error(tmp_path: Path) -> None:
    """Without the fixture the same name is refused, and the error lists the known ones."""
    p = write(tmp_path, "p.yaml", """\
        version: 1
        name: p
        clients: ["*"]
        tools:
          python: {backend: throwaway}
        """)
    assert load_file(p, str(p))[1] == [
        f"{p}:5:21: tools.python.backend: Input should be 'restricted' or 'container'"]


def test_doctor_probes_a_registered_backend(
        throwaway: registry.BackendEntry, tmp_path: Path) -> None:
    from sandboxd.cli import app

    env = {"SANDBOXD_CONFIG": "/dev/null", "SANDBOXD_RESTRICTED_ENABLED": "false",
           "SANDBOXD_CONTAINER_ENABLED": "false"}
    state = ["--state-dir", str(tmp_path / "state")]
    out = CliRunner().invoke(app, ["doctor", *state, "--json"], env=env)
    data = json.loads(out.stdout)
    assert [b["backend"] for b in data["backends"]] == [NAME], data
    assert data["backends"][0]["available"] and data["backends"][0]["ok"]
    assert "throwaway_fact" in {c["name"] for c in data["host"]}
    # the default backend is still the registry's, and it is disabled here
    assert data["default_backend"] == "restricted" and out.exit_code == 1
    table = CliRunner().invoke(app, ["doctor", *state, "--backend", NAME], env=env).stdout
    assert f"ok: backend '{NAME}': confinement holds" in table
    bad = CliRunner().invoke(app, ["doctor", *state, "--backend", "bogus"], env=env)
    assert bad.exit_code == 2 and "choose restricted or container or throwaway" in bad.stderr


def broken_rows(settings: Settings) -> list[ProbeCheck]:
    raise OSError("no such thing")


def test_a_backend_whose_rows_crash_is_one_failed_row(tmp_path: Path) -> None:
    from sandboxd.cli.doctor import host_checks

    entry = registry.BackendEntry("broken", f"{__name__}:Throwaway.from_settings",
                                  frozenset({"python"}), doctor_rows=f"{__name__}:broken_rows")
    registry.register(entry)
    try:
        checks = host_checks(Settings(state_dir=tmp_path, **ONLY_IT))
    finally:
        registry.unregister("broken")
    assert [(c.name, c.ok, c.detail) for c in checks if c.name.startswith("broken")] == [
        ("broken_rows", False, "could not be read: no such thing")]
    assert "workspace_quota" in {c.name for c in checks}


def test_a_name_is_registered_once(throwaway: registry.BackendEntry) -> None:
    registry.register(ENTRY)  # the same entry again (a package imported twice) is fine
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.BackendEntry(NAME, "x:y", frozenset({"python"})))


def test_asking_the_registry_imports_no_backend() -> None:
    """Start-up time: the entries are known without Docker or any backend's code."""
    code = ("import sys\nfrom sandboxd.backends import registry\n"
            "print(registry.names(), registry.default_backend(), sorted(m for m in sys.modules if "
            "m.split('.')[0] == 'docker' or m.endswith(('.backend', '.engine', '.zygote_client',"
            " '.worker', '.lang'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split("\n")[0] == "['restricted', 'container', 'workspace'] restricted []", out


def test_a_backend_package_still_exports_its_backend() -> None:
    """``from sandboxd.backends.<package> import XBackend`` loads it on first use."""
    from sandboxd.backends.container import ContainerBackend
    from sandboxd.backends.restricted import RestrictedBackend
    from sandboxd.backends.workspace import RefusedPath, WorkspaceBackend

    assert {c.__module__ for c in (ContainerBackend, RestrictedBackend, WorkspaceBackend)} == {
        "sandboxd.backends.container.backend", "sandboxd.backends.restricted.backend",
        "sandboxd.backends.workspace.backend"}
    assert RefusedPath.__name__ == "RefusedPath"
    import sandboxd.backends.workspace as package

    with pytest.raises(AttributeError, match=r"'sandboxd\.backends\.workspace' has no attribute"):
        package.nope  # noqa: B018


class Healing(ScriptedBackend, SelfHealing):
    """A backend that rebuilds state of its own (as the container backend does)."""

    healing: str | None = None


def test_healing_is_a_capability() -> None:
    """An optional backend that is unavailable is fine for readiness unless it is healing:
    one without the capability never is."""
    import asyncio

    from sandboxd.backends.base import Backend
    from sandboxd.health.readiness import BackendProbes

    plain = ScriptedBackend("container", available=False)
    assert self_healing(plain) is None
    probes = BackendProbes({"restricted": ScriptedBackend("restricted"), "container": plain})
    assert asyncio.run(probes.reports(fresh=True))[0] is True
    optional = Healing("container", available=False)
    assert isinstance(optional, Backend) and self_healing(optional) is optional
    probes = BackendProbes({"restricted": ScriptedBackend("restricted"), "container": optional})
    assert asyncio.run(probes.reports(fresh=True))[0] is True
    optional.healing = "its runner directory vanished"
    ready, reports = asyncio.run(probes.reports(fresh=True))
    assert ready is False and reports["container"]["ok"] is False


class SectionSettings(BaseModel):
    """The settings of a backend that has its own (``backends.sectioned`` in the config)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    greeting: str = "hello"


class Sectioned(ScriptedBackend):
    @classmethod
    def from_settings(cls, settings: Settings, uids: UidPool | None) -> Sectioned:
        backend = cls("sectioned")
        backend.greeting = SECTIONED.settings_of(settings).greeting
        return backend


SECTIONED = registry.BackendEntry(
    name="sectioned", factory=f"{__name__}:Sectioned.from_settings",
    serves=frozenset({"python"}), section=f"{__name__}:SectionSettings")


@pytest.fixture
def sectioned() -> Iterator[registry.BackendEntry]:
    registry.register(SECTIONED)
    try:
        yield SECTIONED
    finally:
        registry.unregister("sectioned")


def test_a_backend_s_own_settings_need_no_core_edit(
        sectioned: registry.BackendEntry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its settings section is read from the config file (or SANDBOXD_BACKENDS), checked
    against its model, and turns it on: config.py knows nothing of it."""
    assert "sectioned" not in enabled_backends(Settings(state_dir=tmp_path, **ONLY_IT))
    config = tmp_path / "sandboxd.yaml"
    config.write_text("backends:\n  sectioned: {enabled: true, greeting: hi}\n")
    settings = load_settings(config, state_dir=tmp_path, **ONLY_IT)
    assert enabled_backends(settings) == ["sectioned"]
    built = build_backends(settings, None)["sectioned"]
    assert isinstance(built, Sectioned) and built.greeting == "hi"
    monkeypatch.setenv("SANDBOXD_BACKENDS", '{"sectioned": {"enabled": true}}')
    assert SECTIONED.settings_of(Settings(state_dir=tmp_path)).greeting == "hello"


@pytest.mark.parametrize(("section", "says"), [
    ({"sectioned": {"greeting": 5}}, "backends.sectioned: greeting: Input should be a valid "
                                     "string"),
    ({"sectioned": {"colour": "red"}}, "backends.sectioned: colour: Extra inputs are not "
                                       "permitted"),
    ({"bogus": {}}, "backends.bogus: no backend of that name has a settings section "
                    "('sectioned')"),
    ({"restricted": {}}, "backends.restricted: no backend of that name has a settings "
                         "section ('sectioned')"),
])
def test_a_wrong_section_is_a_settings_error(sectioned: registry.BackendEntry, tmp_path: Path,
                                            section: dict[str, Any], says: str) -> None:
    settings = Settings(state_dir=tmp_path, backends=section)
    with pytest.raises(ValueError) as caught:
        registry.check_sections(settings)
    assert str(caught.value) == says
    with pytest.raises(ValueError) as built:  # nothing builds backends past a wrong section
        build_backends(settings, None)
    assert str(built.value) == says


def test_every_setting_an_entry_names_exists() -> None:
    """The flags and settings the built-in entries name are fields of the settings."""
    for entry in registry.entries():
        for name in (entry.enabled_setting, *entry.reads()):
            assert name is None or name in Settings.model_fields, (entry.name, name)
        if entry.enabled_setting is not None:
            assert Settings.model_fields[entry.enabled_setting].annotation is bool
