"""What ``sandboxd doctor`` prints for the container backend before probing it (registered as
its entry's ``doctor_rows`` and ``leftovers``): the Docker socket's ownership, and this
daemon's containers and runner directory that its start-up sweep removes."""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.container.dockerapi import address
from sandboxd.models import ProbeCheck

if TYPE_CHECKING:
    from sandboxd.config import Settings


def host_checks(settings: Settings) -> list[ProbeCheck]:
    """Who owns the Docker socket (a rootful engine's is root-equivalent)."""
    try:
        where = address(settings.docker_url)
    except (ValueError, OSError) as exc:  # OSError: DOCKER_CERT_PATH's files
        return [ProbeCheck(name="docker_socket", ok=False, detail=str(exc))]
    if where.unix_path is None:
        return [ProbeCheck(name="docker_socket", ok=True,
                           detail=f"{where.url} (not a unix socket)")]
    path = Path(where.unix_path)
    try:
        st = path.stat()
    except OSError as exc:
        return [ProbeCheck(name="docker_socket", ok=False, detail=f"{path}: {exc.strerror}")]
    detail = f"{path} owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}"
    if st.st_uid == 0:
        detail += " - rootful engine: access to it is root-equivalent (prefer rootless Docker)"
    return [ProbeCheck(name="docker_socket", ok=True, detail=detail)]


def leftovers(settings: Settings) -> list[str]:
    """This daemon's labelled containers (read from the engine) and its runner directory."""
    things: list[str] = []
    with contextlib.suppress(Exception):  # no engine: no containers to speak of
        from sandboxd.backends.container import engine
        from sandboxd.backends.container.config import ContainerConfig

        client = engine.connect(ContainerConfig.from_settings(settings), timeout=10)
        try:
            count = len(engine.ours(client, settings.instance_name))
        finally:
            client.close()
        if count:
            things.append(f"{count} container(s) labelled "
                          f"{engine.LABEL_DAEMON}={settings.instance_name}")
    run = Path(settings.state_dir) / "run"
    if run.exists():
        things.append(f"{run}/")
    return things
