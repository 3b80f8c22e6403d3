"""``sandboxd clean``: remove a stopped daemon's state directory, with what its stop kept for
the next start (``sessions_survive_restart``): the sessions' tmpfs workspaces, still mounted,
and their containers, still running. A plain ``rm -rf`` fails on those mounts ("Device or
resource busy") and leaves the containers behind; ``make clean`` calls this.

Only when no daemon serves that directory: the command takes the directory's lock
(:mod:`sandboxd.host.statelock`) for as long as it works, so a live daemon makes it refuse in one
line and a daemon started meanwhile refuses to start. Unmounting is the daemon's own way
(:func:`sandboxd.workspaces.mount_helper.unmount`: a detached unmount when the mount is busy); the
containers are those the engine labels with the directory's instance name, removed as the
daemon's start-up sweep removes them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sandboxd.cli.common import CONFIG_OPTION, STATE_DIR_OPTION, fail, settings_for

if TYPE_CHECKING:
    from sandboxd.config import Settings


def _containers(settings: Settings) -> str | None:
    """Remove the containers labelled with this state directory's instance; None when done,
    else why not (no engine: nothing of ours can run there either)."""
    from sandboxd.backends.container import engine
    from sandboxd.backends.container.config import ContainerConfig

    config = ContainerConfig.from_settings(settings)
    try:
        client = engine.connect(config, timeout=30)
    except Exception as exc:
        return f"the Docker engine is unreachable: {exc}"
    try:
        removed = engine.sweep(client, config.instance_name)
    except Exception as exc:
        return f"the Docker engine is unreachable: {exc}"
    finally:
        client.close()
    if removed:
        typer.echo(f"removed {len(removed)} container(s) of {config.instance_name}")
    return None


def clean(config: Path | None = CONFIG_OPTION, state_dir: Path | None = STATE_DIR_OPTION,
          keep_containers: bool = typer.Option(
              False, "--keep-containers",
              help="Leave the daemon's containers alone (remove only the directory)")) -> None:
    """Remove a stopped daemon's state directory: unmount its workspaces, remove the
    containers its stop kept, then the directory."""
    from sandboxd.workspaces import fstree

    settings = settings_for(config, state_dir)
    state = Path(settings.state_dir)
    if not state.is_dir():
        return
    lock = _lock(state)
    try:
        if settings.container_enabled and not keep_containers:
            why = _containers(settings)
            if why is not None:
                typer.echo(f"sandboxd clean: containers left alone: {why}", err=True)
        _unmount_below(state)
        try:
            fstree.remove_tree(state)
        except OSError as exc:
            fail(f"clean: {state} not removed entirely: {exc.strerror or exc}", 1)
    finally:
        os.close(lock)
    typer.echo(f"removed {state}")


def _lock(state: Path) -> int:
    """The state directory's lock, or exit 1 naming the daemon that holds it."""
    from sandboxd.host import statelock

    try:
        return statelock.acquire(state)
    except statelock.StateDirLocked as exc:
        who = f"pid {exc.pid}" if exc.pid else "another process"
        fail(f"clean refused: a daemon ({who}) serves {state}; stop it first", 1)
        raise AssertionError("unreachable") from None


def _unmount_below(state: Path) -> None:
    """Unmount every mount below ``state``, deepest first, or exit 1 at the first failure."""
    from sandboxd.workspaces.mount_helper import unmount
    from sandboxd.workspaces.quota import mounts_below

    for point in mounts_below(state):  # deepest first
        try:
            unmount(point)
        except OSError as exc:
            fail(f"clean: cannot unmount {point}: {exc.strerror or exc}; nothing removed "
                 "below it", 1)


def register(app: typer.Typer) -> None:
    """Add ``clean`` to the top-level commands."""
    app.command("clean")(clean)
