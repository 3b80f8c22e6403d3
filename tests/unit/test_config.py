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


def test_a_bad_config_file_reports_every_problem_at_its_line(tmp_path: Path) -> None:
    """A regression: a bad daemon config reported its first problem only, with no file or line;
    now every problem, one line each at file:line:column, as `policy check` does (a value
    from the environment is named as the setting)."""
    import os

    from tests.support import cli

    config = tmp_path / "sandboxd.yaml"
    config.write_text("port: lots\nstate_dir: /tmp/x\nmax_concurrency: 0\nnot_a_setting: 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    r = cli.run("serve", "--config", str(config), env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines == [
        f"sandboxd: bad setting: {config}:1:1: port: Input should be a valid integer, unable "
        "to parse string as an integer (got 'lots')",
        f"sandboxd: bad setting: {config}:3:1: max_concurrency: Input should be greater than or "
        "equal to 1 (got 0)",
        f"sandboxd: bad setting: {config}:4:1: not_a_setting: unknown setting (got 1)",
    ], r.stderr
    r = cli.run("serve", "--config", str(config), env={**env, "SANDBOXD_PORT": "nope"})
    assert "sandboxd: bad setting: port: " in r.stderr and "(got 'nope')" in r.stderr, r.stderr


def test_serve_refuses_a_backends_section_no_backend_has(tmp_path: Path) -> None:
    """The settings sit below the backends, so a ``backends.<name>`` section is checked by
    the backend registry where the CLI loads the settings: one line, exit 2, before anything
    starts."""
    import os

    from tests.support import cli

    config = tmp_path / "sandboxd.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nbackends:\n  bogus: {{}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    r = cli.run("serve", "--config", str(config), env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "sandboxd: bad setting: backends.bogus: no backend of that name has a settings section "
        "(none has)"], r.stderr
    assert not (tmp_path / "state").exists()  # nothing was started, nothing made
