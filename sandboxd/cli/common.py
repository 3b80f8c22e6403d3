"""What every admin command shares: ``--config`` and ``--state-dir``, resolved exactly as
``sandboxd serve`` resolves them, so that ``audit``, ``doctor``, ``token`` and ``policy`` look
at the same state, audit log, tokens and policies as the daemon they are pointed at.

Resolution (the same for ``serve``): an explicit flag, else ``SANDBOXD_*`` in the
environment, else the config file (``--config``, else ``SANDBOXD_CONFIG``, else
``/etc/sandboxd/sandboxd.yaml`` when it exists), else the built-in default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.service import Sandboxd

CONFIG_OPTION = typer.Option(
    None, "--config", help="YAML config file (default: $SANDBOXD_CONFIG, else "
    "/etc/sandboxd/sandboxd.yaml if present)")
STATE_DIR_OPTION = typer.Option(
    None, "--state-dir", help="The daemon's state directory (sessions, workspaces, audit log; "
    "default: from the config)")


def fail(message: str, code: int = 2) -> None:
    """Print one ``sandboxd: message`` line on stderr and exit with ``code``."""
    typer.echo(f"sandboxd: {message}", err=True)
    raise typer.Exit(code)


def settings_for(config: Path | None, state_dir: Path | None, **overrides: Any) -> Settings:
    """The daemon's settings as ``serve`` resolves them (the backends' own sections checked
    by their registry too), or exit 2 with every problem, one line each."""
    from pydantic import ValidationError

    from sandboxd.backends import registry
    from sandboxd.config import ConfigFileError, load_settings, settings_problems

    try:
        settings = load_settings(config, state_dir=state_dir, **overrides)
        registry.check_sections(settings)
    except (ConfigFileError, ValidationError, OSError) as exc:
        problems = settings_problems(exc, config)
        for problem in problems[:-1]:  # every problem, one line each, as policy check does
            typer.echo(f"sandboxd: bad setting: {problem}", err=True)
        fail(f"bad setting: {problems[-1]}")
        raise AssertionError("unreachable") from None
    except ValueError as exc:  # a backend's section (pydantic's errors are ValueErrors too)
        fail(f"bad setting: {exc}")
        raise AssertionError("unreachable") from None
    return settings


def settings_policies_dir(config: Path | None) -> Path | None:
    """The policies directory the settings name (None: the embedded default), as serve
    resolves it; a broken config is a warning, not a failure."""
    from sandboxd.config import load_settings

    try:
        return load_settings(config).policies_dir
    except Exception as exc:  # a broken config must not hide the policy answer
        typer.echo(f"sandboxd: warning: settings not loaded ({exc}); using the embedded "
                   "default policy", err=True)
        return None


def offline_service(policies_dir: Path | None) -> Sandboxd:
    """A :class:`~sandboxd.service.Sandboxd` for questions about the policy alone: no
    backends, nothing opened (construction does no I/O; only the policy is loaded)."""
    from sandboxd.config import Settings
    from sandboxd.config.derived import MIN_UID_COUNT
    from sandboxd.service import Sandboxd

    # the settings unvalidated (a question about the policy must not fail on the daemon's
    # environment), so none is derived from the host: the caps that would be are given here,
    # at their smallest (nothing runs)
    settings = Settings.model_construct(policies_dir=policies_dir,
                                        sandbox_uid_count=MIN_UID_COUNT, max_kernels=1)
    return Sandboxd(settings, backends={})


def _or_exit(load: Callable[[], object], exit_code: int) -> None:
    """Run ``load`` (a policy load); a policy that does not load is its problems, one
    ``file:line:column`` line each, then exit ``exit_code``."""
    from sandboxd.policy import PolicyError

    try:
        load()
    except PolicyError as exc:
        for line in exc.problems:
            typer.echo(line, err=True)
        raise typer.Exit(exit_code) from None


def loaded_offline_service(policies_dir: Path | None, exit_code: int) -> Sandboxd:
    """:func:`offline_service` with its policy loaded (:func:`_or_exit`)."""
    service = offline_service(policies_dir)
    _or_exit(service.load_policy, exit_code)
    return service


def loaded_policy_store(policies_dir: Path | None, exit_code: int) -> Any:
    """A :class:`~sandboxd.policy.PolicyStore` of ``policies_dir``, loaded (:func:`_or_exit`)."""
    from sandboxd.policy import PolicyStore

    store = PolicyStore(policies_dir)
    _or_exit(store.load, exit_code)
    return store
