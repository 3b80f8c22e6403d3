"""The backend registry: which backends exist, and what the core needs to know of each.

Like jupyter_client's kernel provisioners: each backend package registers one frozen
:class:`BackendEntry` in its ``__init__`` (which stays light: stdlib only), naming its code
by dotted path (``"package.module:attr"``) that is imported only when used. The factory,
the policy validation (the ``backend:`` names a policy may use), readiness and ``sandboxd
doctor`` read the entries, so a new backend is a new package under ``sandboxd/backends/``
and no edit of a core file. Importing this module imports no backend; the first question
asked of the registry imports each backend package's ``__init__`` (never Docker nor the
restricted worker: tests/unit/test_backend_registry.py checks it).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from sandboxd.backends.base import Backend
    from sandboxd.config import Settings
    from sandboxd.host.uids import UidPool
    from sandboxd.models import ProbeCheck

#: what a policy may ask a backend to run: ``tools.python``, ``tools.shell``, ``custom_tools``
#: and the file tools (``tools.read_file``, ``write_file``, ``list_files``)
ToolGroup = Literal["python", "shell", "custom", "files"]


@dataclass(frozen=True)
class BackendEntry:
    """One backend, as the core sees it. Hooks are ``"module:attr"`` paths, loaded on use."""

    name: str  # as policies and results spell it
    factory: str  # (settings, uids) -> Backend: the backend as the daemon builds it
    serves: frozenset[ToolGroup]  # the policy tools it can run
    defaults: frozenset[ToolGroup] = frozenset()  # ...and runs when a policy names no backend
    enabled_setting: str | None = None  # the bool setting that turns it on (None: always on,
    #                                     or its section's ``enabled`` when it has one)
    #: ``"module:Config"``: the dataclass of the settings it reads, each field naming its
    #: daemon setting (:mod:`sandboxd.backends.settings`): its one declaration of them
    config: str | None = None
    settings: tuple[str, ...] = ()  # ...or, without a config class, the settings it reads
    #: ``"module:Model"``: a pydantic model of the backend's own settings, read from the
    #: ``backends.<name>`` section of the settings (config file: ``backends: {name: {...}}``;
    #: environment: ``SANDBOXD_BACKENDS`` as JSON) and checked when the settings load, so that
    #: a backend with settings of its own needs no edit of ``sandboxd/config``
    section: str | None = None
    executes: bool = True  # runs code: built only when enabled, probed by the doctor
    startup_probe: bool = False  # the default backend: start-up refuses to serve unless its
    #                               probe passes (the others are probed by /readyz)
    network: bool = False  # can grant a policy's network to the code it runs
    imports: str | None = None  # -> collection of the modules its python offers (None: any)
    doctor_rows: str | None = None  # (settings) -> list[ProbeCheck]: host rows the doctor prints
    leftovers: str | None = None  # (settings) -> list[str]: what its start-up sweep removes

    def enabled(self, settings: Settings) -> bool:
        """Whether the settings turn this backend on: its flat flag, else its section's
        ``enabled`` (when its model has one), else always."""
        if self.enabled_setting is not None:
            return bool(getattr(settings, self.enabled_setting))
        if self.section is not None:
            return bool(getattr(self.settings_of(settings), "enabled", True))
        return True

    def reads(self) -> tuple[str, ...]:
        """The daemon settings it reads besides its enabled flag: its config class's (which
        imports only that module), else its ``settings``."""
        if self.config is None:
            return self.settings
        from sandboxd.backends.settings import settings_read

        return tuple(n for n in settings_read(load(self.config)) if n != self.enabled_setting)

    def settings_of(self, settings: Settings) -> Any:
        """The backend's own settings (its ``section`` model, validated from
        ``settings.backends[name]``; pydantic's ``ValidationError`` when they are wrong).
        ``LookupError`` for a backend without a section."""
        if self.section is None:
            raise LookupError(f"the {self.name} backend has no settings section")
        return load(self.section).model_validate(settings.backends.get(self.name, {}))

    def build(self, settings: Settings, uids: UidPool | None) -> Backend:
        """The backend built from the settings (ImportError when its dependencies are not
        installed)."""
        backend: Backend = load(self.factory)(settings, uids)
        return backend

    def host_checks(self, settings: Settings) -> list[ProbeCheck]:
        """The doctor's host rows for this backend (none without a hook)."""
        return list(load(self.doctor_rows)(settings)) if self.doctor_rows else []

    def left_behind(self, settings: Settings) -> list[str]:
        """What its start-up sweep would remove (read only; none without a hook)."""
        return list(load(self.leftovers)(settings)) if self.leftovers else []

    def offered_modules(self) -> frozenset[str] | None:
        """Top-level modules its python can import (None: whatever the image has)."""
        if self.imports is None:
            return None
        return frozenset(name.split(".")[0] for name in load(self.imports))


def load(path: str) -> Any:
    """The object a ``"package.module:attr.attr"`` path names (imported now)."""
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in attrs.split(".") if attrs else ():
        obj = getattr(obj, attr)
    return obj


_ENTRIES: dict[str, BackendEntry] = {}
_discovered = False


def register(entry: BackendEntry) -> BackendEntry:
    """Add a backend (once: a second, different entry of the same name is an error)."""
    known = _ENTRIES.get(entry.name)
    if known is not None and known != entry:
        raise ValueError(f"backend {entry.name!r} is registered twice")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Forget a backend (tests that register one of their own)."""
    _ENTRIES.pop(name, None)


def _discover() -> None:
    """Import every package under ``sandboxd.backends``: each registers its entry."""
    global _discovered
    if _discovered:
        return
    import sandboxd.backends as package

    for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        if info.ispkg:
            importlib.import_module(info.name)
    _discovered = True


def entries() -> list[BackendEntry]:
    """Every registered backend, the default one first, then in registration order."""
    _discover()
    return sorted(_ENTRIES.values(), key=lambda e: not e.startup_probe)


def get(name: str) -> BackendEntry | None:
    """The entry of that name, if any."""
    _discover()
    return _ENTRIES.get(name)


def names(group: ToolGroup | None = None, *, executes: bool | None = None) -> list[str]:
    """Names of the backends (that serve ``group``; that execute code or not), default first."""
    return [e.name for e in entries()
            if (group is None or group in e.serves)
            and (executes is None or e.executes == executes)]


def default_backend() -> str:
    """The backend whose probe gates start-up (the first such, if several say so)."""
    for entry in entries():
        if entry.startup_probe:
            return entry.name
    raise LookupError("no registered backend gates start-up (startup_probe)")


def default_for(group: ToolGroup) -> str:
    """The backend that runs ``group`` when a policy names none."""
    for entry in entries():
        if group in entry.defaults:
            return entry.name
    for entry in entries():
        if group in entry.serves:
            return entry.name
    raise LookupError(f"no registered backend serves {group}")


def enabled(settings: Settings) -> list[BackendEntry]:
    """The backends the settings turn on, the default one first."""
    return [e for e in entries() if e.enabled(settings)]


def check_sections(settings: Settings) -> None:
    """Each ``backends.<name>`` section of the settings names a backend with a settings
    section of its own and is valid for its model; ``ValueError`` saying which is not. Run
    where the settings are loaded to serve (the CLI) and wherever backends are built: the
    settings cannot ask the registry themselves (they sit a floor below it)."""
    for name in settings.backends:
        _check_section(settings, name)


def _check_section(settings: Settings, name: str) -> None:
    """``ValueError`` unless ``backends.<name>`` is the settings section of a registered
    backend and validates against its model."""
    from pydantic import ValidationError

    entry = get(name)
    if entry is None or entry.section is None:
        have = [e.name for e in entries() if e.section is not None]
        raise ValueError(f"backends.{name}: no backend of that name has a settings "
                         f"section ({quoted(have) if have else 'none has'})")
    try:
        entry.settings_of(settings)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"backends.{name}: {why}") from None


def quoted(choices: list[str]) -> str:
    """``'a', 'b' or 'c'`` (as pydantic lists a Literal's values)."""
    shown = [f"'{c}'" for c in choices]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


__all__ = ["BackendEntry", "ToolGroup", "check_sections", "default_backend", "default_for",
           "enabled",
           "entries", "get", "load", "names", "quoted", "register", "unregister"]
