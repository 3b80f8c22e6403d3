"""The settings' YAML config file: read as the source under the environment and the options,
and pointed at (file:line:column) when one of its settings is wrong."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sandboxd.errors import SandboxdError

DEFAULT_CONFIG_FILE = Path("/etc/sandboxd/sandboxd.yaml")


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
    problems = []
    for err in exc.errors():
        loc = err.get("loc", ())
        name = ".".join(str(p) for p in loc) or "settings"
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        why = "unknown setting" if err.get("type") == "extra_forbidden" else err.get(
            "msg", "invalid")
        key = str(loc[0]) if loc else ""
        if key in where and f"SANDBOXD_{key.upper()}" not in os.environ:
            line, column = where[key]
            problems.append(f"{path}:{line}:{column}: {name}: {why}{shown}")
        else:
            problems.append(f"{name}: {why}{shown}")
    return problems


def _key_positions(path: Path) -> dict[str, tuple[int, int]]:
    """1-based (line, column) of each top-level key of a YAML mapping file ({} if none)."""
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {str(k.value): (k.start_mark.line + 1, k.start_mark.column + 1)
            for k, _ in root.value if isinstance(k, yaml.ScalarNode)}
