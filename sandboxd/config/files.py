"""The settings' YAML config file: read as the source under the environment and the options,
and pointed at (file:line:column) when one of its settings is wrong."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sandboxd.errors import SandboxdError

DEFAULT_CONFIG_FILE = Path("/etc/sandboxd/sandboxd.yaml")
#: 1-based (line, column) of each top-level key of the config file
Positions = dict[str, tuple[int, int]]


class ConfigFileError(SandboxdError, ValueError):
    """The YAML config file is unreadable or not a mapping."""

    code = "config-invalid"


class YamlFileSource(PydanticBaseSettingsSource):
    """Reads the optional YAML config file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = yaml.safe_load(self.path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigFileError(f"{self.path}: {exc}") from exc
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigFileError(f"{self.path}: the config file must be a mapping of settings")
        return data


@contextmanager
def config_file_named(path: Path) -> Iterator[None]:
    """``SANDBOXD_CONFIG`` names ``path`` for the block (then is as it was): the settings
    sources read the config file it names."""
    old = os.environ.get("SANDBOXD_CONFIG")
    os.environ["SANDBOXD_CONFIG"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SANDBOXD_CONFIG", None)
        else:
            os.environ["SANDBOXD_CONFIG"] = old


def settings_problems(exc: Exception, config_file: Path | None = None) -> list[str]:
    """One line per settings problem: ``file:line:column: name: why (got value)`` for a
    setting of the YAML config file (``config_file``, else ``SANDBOXD_CONFIG``, else the
    default file when it exists), ``name: why (got value)`` for one from the environment
    (``SANDBOXD_<NAME>``) or an option."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return [" ".join(str(exc).split())]
    path = config_file or Path(os.environ.get("SANDBOXD_CONFIG") or DEFAULT_CONFIG_FILE)
    where = _key_positions(path)
    return [_settings_problem(err, path, where) for err in exc.errors()]


def _settings_problem(err: Any, path: Path, where: Positions) -> str:
    """One of pydantic's errors as ``name: why (got value)``, after ``file:line:column:``
    when the config file sets it."""
    loc = err.get("loc", ())
    name = ".".join(map(str, loc)) or "settings"
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    why = "unknown setting" if err.get("type") == "extra_forbidden" else err.get(
        "msg", "invalid")
    position = _file_position(loc, where)
    if position is None:
        return f"{name}: {why}{shown}"
    line, column = position
    return f"{path}:{line}:{column}: {name}: {why}{shown}"


def _file_position(loc: tuple[Any, ...], where: Positions) -> tuple[int, int] | None:
    """Where the config file sets the setting at ``loc`` (None: it does not, or the
    environment's ``SANDBOXD_<NAME>``, which wins over the file, sets it)."""
    key = str(loc[0]) if loc else ""
    if f"SANDBOXD_{key.upper()}" in os.environ:
        return None
    return where.get(key)


def _key_positions(path: Path) -> Positions:
    """1-based (line, column) of each top-level key of a YAML mapping file ({} if none)."""
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {str(k.value): (k.start_mark.line + 1, k.start_mark.column + 1)
            for k, _ in root.value if isinstance(k, yaml.ScalarNode)}
