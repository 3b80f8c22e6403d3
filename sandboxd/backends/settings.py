"""A backend's settings, declared once: each field of its config dataclass names the daemon
setting it is read from (``field(metadata=reads(...))``). The config's ``from_settings``
(:func:`from_settings`) and the list of settings its registry entry reads
(:meth:`BackendEntry.reads <sandboxd.backends.registry.BackendEntry.reads>`) are derived
from those fields, so that the three cannot drift apart; the settings themselves (names,
defaults, validation, environment variables and config file keys) stay the daemon's
(:class:`sandboxd.config.Settings`), and tests/unit/test_backend_settings.py checks that
every field names one. Standard library only: the registry reads it without importing a
backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sandboxd.config import Settings

#: the metadata key of a config field's reading
KEY = "sandboxd.setting"

Config = TypeVar("Config", bound="DataclassInstance")


def reads(*names: str, derive: Callable[[Settings], Any] | None = None) -> dict[str, Any]:
    """A config field's metadata: it is the setting ``names[0]`` (none: the setting of the
    field's own name) verbatim, or, with ``derive``, what ``derive`` makes of the settings
    (``names``: every setting it reads)."""
    if derive is not None and not names:
        raise ValueError("a derived config field names the settings it reads")
    return {KEY: (names, derive)}


def _reading(field_name: str, metadata: Any) -> tuple[tuple[str, ...], Callable[[Settings],
                                                                                Any]]:
    names, derive = metadata[KEY]
    if derive is not None:
        return names, derive
    name = names[0] if names else field_name
    return (name,), lambda settings: getattr(settings, name)


def from_settings(cls: type[Config], settings: Settings) -> Config:
    """The config ``cls`` filled from the daemon's settings, field by field as each says."""
    values = {f.name: _reading(f.name, f.metadata)[1](settings)
              for f in fields(cls) if KEY in f.metadata}
    return cls(**values)


def settings_read(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """The daemon settings the config ``cls`` is filled from, in field order."""
    found: dict[str, None] = {}
    for f in fields(cls):
        if KEY in f.metadata:
            found.update(dict.fromkeys(_reading(f.name, f.metadata)[0]))
    return tuple(found)


__all__ = ["KEY", "from_settings", "reads", "settings_read"]
