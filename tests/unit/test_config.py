"""Settings: defaults < YAML config file < environment < explicit overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.config import ConfigFileError, load_settings


def test_layering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "sandboxd.yaml"
    config.write_text("port: 9001\nmax_concurrency: 3\nqueue_size: 5\n")
    monkeypatch.setenv("SANDBOXD_QUEUE_SIZE", "7")
    settings = load_settings(config, max_concurrency=2, state_dir=None)
    assert settings.port == 9001  # from the file
    assert settings.queue_size == 7  # the environment beats the file
    assert settings.max_concurrency == 2  # an explicit override beats both
    assert settings.host == "127.0.0.1"  # default: loopback only


def test_bad_config_files_are_reported(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigFileError, match="no such config file"):
        load_settings(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("port: [1\n")
    with pytest.raises(ConfigFileError, match=str(broken)):
        load_settings(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigFileError, match="mapping"):
        load_settings(listy)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("no_such_setting: 1\n")
    with pytest.raises(ValueError, match="no_such_setting"):
        load_settings(unknown)
