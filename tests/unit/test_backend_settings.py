"""Each built-in backend declares its settings once, in its config dataclass (each field names
the daemon setting it is read from: sandboxd.backends.settings); its registry entry's list of
settings and its ``from_settings`` are derived from those fields. Here: every field names a
real setting, the entry lists exactly what the config reads, a config made from settings read
through the environment and the config file carries each one's value (their names are the
users'), and a config built directly has the daemon's defaults."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends import registry
from sandboxd.backends.settings import KEY, settings_read
from sandboxd.config import Settings, load_settings

#: settings whose default a config built directly cannot share, and why
OWN_DEFAULT = {
    "sandbox_uid_count": "0 in the settings means derived from the host's memory as they load; "
                         "a config built directly (tests, tools) has no such step",
}


def _configs() -> list[tuple[registry.BackendEntry, type[Any]]]:
    found = [(e, registry.load(e.config)) for e in registry.entries() if e.config is not None]
    assert {e.name for e, _ in found} >= {"restricted", "container"}
    return found


def _setting(field: Any) -> str | None:
    """The setting a field is verbatim (None: derived)."""
    names, derive = field.metadata[KEY]
    return None if derive is not None else (names[0] if names else field.name)


def test_every_field_names_a_real_setting() -> None:
    for entry, cls in _configs():
        for field in fields(cls):
            assert KEY in field.metadata, (entry.name, field.name, "reads no setting")
        assert set(settings_read(cls)) <= set(Settings.model_fields), entry.name


def test_the_entry_lists_what_its_config_reads() -> None:
    for entry, cls in _configs():
        assert entry.settings == (), f"{entry.name}: its settings are its config's fields"
        assert set(entry.reads()) | {entry.enabled_setting} >= set(settings_read(cls))
        assert entry.enabled_setting not in entry.reads()


def test_a_config_carries_the_value_of_each_setting(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WARM_POOL_SIZE": "3", "PYTHON_IMAGE": "img:7", "MAX_CONCURRENCY": "5",
                        "RESTRICTED_ENABLED": "false", "KERNEL_INTERRUPT_GRACE_S": "1.5",
                        "ADOPT_TIMEOUT_S": "11"}.items():
        monkeypatch.setenv(f"SANDBOXD_{name}", value)
    config_file = tmp_path / "sandboxd.yaml"
    config_file.write_text("docker_url: unix:///run/other.sock\nsession_pause_after_s: 7\n"
                           "probe_call_timeout_s: 9\negress_resolver: 10.0.0.1:53\n"
                           "build_images: python\ninstance: inst1\n"
                           f"cgroup_root: {tmp_path}\n")
    settings = load_settings(config_file, state_dir=tmp_path)
    made = {entry.name: cls.from_settings(settings) for entry, cls in _configs()}
    for entry, cls in _configs():
        for field in fields(cls):
            name = _setting(field)
            if name is not None:
                assert getattr(made[entry.name], field.name) == getattr(settings, name), (
                    entry.name, field.name)
    restricted, container = made["restricted"], made["container"]
    assert (restricted.enabled, restricted.standby_workers, restricted.cgroup_root) == (
        False, 5, tmp_path)
    assert restricted.kernel_interrupt_grace_s == container.kernel_interrupt_grace_s == 1.5
    assert (container.warm_pool_size, container.python_image, container.docker_url) == (
        3, "img:7", "unix:///run/other.sock")
    assert (container.session_pause_after_s, container.probe_call_timeout_s,
            container.adopt_timeout_s, container.egress_resolver) == (7, 9, 11, "10.0.0.1:53")
    assert container.build_profiles == ("python",)
    assert restricted.instance_name == container.instance_name == "inst1"


def test_a_config_built_directly_has_the_daemons_defaults() -> None:
    for entry, cls in _configs():
        for field in fields(cls):
            name = _setting(field)
            if name is None or field.default is MISSING or name in OWN_DEFAULT:
                continue
            assert field.default == Settings.model_fields[name].default, (entry.name, name)
