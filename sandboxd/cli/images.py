"""``sandboxd images build``: build the sandbox image(s) of the container backend.

Two ways, same result (an image with python3, coreutils, grep, sed, git, user 10001 and the
runner at /opt/sandboxd/runner.py):

* normal hosts: ``docker build`` of ``images/python/Dockerfile`` FROM ``python:3.12-slim``;
* ``--offline`` (no registry; chosen automatically when none is reachable and the base image
  is not present): ``images/offline/build-rootfs.sh`` debootstraps a minimal Debian from the
  host's apt mirror and imports it as ``sandboxd/base-offline:latest``, then the same
  Dockerfile is built FROM that.

``--if-missing`` does nothing when the image exists and was built from the current runner
(label ``sandboxd.runner.sha256``), so ``make test`` can call it every time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import typer

from sandboxd.config import load_settings

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

ONLINE_BASE = "python:3.12-slim"
OFFLINE_BASE = "sandboxd/base-offline:latest"
REGISTRY = ("registry-1.docker.io", 443)


def images_dir() -> Path:
    """The ``images/`` directory (source checkout, or ``SANDBOXD_IMAGES_DIR``)."""
    env = os.environ.get("SANDBOXD_IMAGES_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parents[2] / "images", here.parents[1] / "_data" / "images"]
    for path in candidates:
        if (path / "python" / "Dockerfile").is_file():
            return path
    raise FileNotFoundError(
        "the images/ directory (Dockerfiles, runner) was not found; run from a source "
        "checkout or set SANDBOXD_IMAGES_DIR"
    )


def wire_module() -> Path:
    """``sandboxd/wire.py``: the frame protocol, shared by the daemon and the runner (the
    build puts it next to the runner as ``runner/wire.py``)."""
    from sandboxd import wire

    return Path(wire.__file__).resolve()


def rules_module() -> Path:
    """``sandboxd/rules.py``: the import, path and output rules, shared by the daemon and the
    runner (the build puts it next to the runner as ``runner/rules.py``)."""
    from sandboxd import rules

    return Path(rules.__file__).resolve()


def runner_digest(context: Path) -> str:
    """SHA-256 of the runner, its shared modules (wire, rules) and the Dockerfile: an image
    built from them carries it."""
    h = hashlib.sha256()
    for rel in ("runner/sandboxd-runner.py", "python/Dockerfile"):
        h.update((context / rel).read_bytes())
    h.update(wire_module().read_bytes())
    h.update(rules_module().read_bytes())
    return h.hexdigest()


def build_context(context: Path, into: Path) -> Path:
    """A copy of ``images/`` with ``runner/wire.py`` and ``runner/rules.py`` added (what the
    Dockerfile copies)."""
    target = into / "images"
    shutil.copytree(context, target, symlinks=False)
    shutil.copy2(wire_module(), target / "runner" / "wire.py")
    shutil.copy2(rules_module(), target / "runner" / "rules.py")
    return target


def registry_reachable(timeout: float = 3.0) -> bool:
    """Whether the Docker Hub registry answers on TCP (a cheap 'are we online' test)."""
    try:
        with socket.create_connection(REGISTRY, timeout=timeout):
            return True
    except OSError:
        return False


def _fail(message: str) -> None:
    typer.echo(f"sandboxd images build: {message}", err=True)
    raise typer.Exit(1)


def _has_image(client, name: str) -> dict | None:  # type: ignore[no-untyped-def]
    from docker.errors import NotFound

    try:
        return client.api.inspect_image(name)
    except NotFound:
        return None


@app.command("build")
def build(
    offline: bool | None = typer.Option(
        None, "--offline/--online",
        help="Build from a debootstrap rootfs (no registry) / from python:3.12-slim. "
             "Default: online when the base image is present or a registry is reachable."),
    if_missing: bool = typer.Option(
        False, "--if-missing",
        help="Do nothing when the image exists and matches the current runner."),
    rebuild_base: bool = typer.Option(
        False, "--rebuild-base", help="Offline: debootstrap the base again even if present."),
    tag: str | None = typer.Option(
        None, "--tag", help="Image name (default: the python_image setting)."),
) -> None:
    """Build the sandbox image used by the container backend."""
    import docker

    settings = load_settings()
    name = tag or settings.python_image
    try:
        context = images_dir()
    except FileNotFoundError as exc:
        _fail(str(exc))
    digest = runner_digest(context)
    try:
        client = (docker.DockerClient(base_url=settings.docker_url, timeout=600)
                  if settings.docker_url else docker.from_env(timeout=600))
        client.ping()
    except Exception as exc:
        _fail(f"the Docker engine is unreachable: {exc}")

    existing = _has_image(client, name)
    labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
    if if_missing and existing and labels.get("sandboxd.runner.sha256") == digest:
        typer.echo(f"{name} is up to date")
        return

    if offline is None:
        offline = not (_has_image(client, ONLINE_BASE) or registry_reachable())
        if offline:
            typer.echo("no container registry reachable: building offline (debootstrap)")
    start = time.monotonic()
    base = ONLINE_BASE
    if offline:
        base = OFFLINE_BASE
        if rebuild_base or not _has_image(client, OFFLINE_BASE):
            script = context / "offline" / "build-rootfs.sh"
            typer.echo(f"building the base rootfs {OFFLINE_BASE} with debootstrap ...")
            env = dict(os.environ)
            env.setdefault("DOCKER", "/usr/bin/docker" if Path("/usr/bin/docker").exists()
                           else "docker")
            proc = subprocess.run([str(script), OFFLINE_BASE], env=env, check=False)
            if proc.returncode != 0:
                _fail(f"{script} failed (exit {proc.returncode})")

    typer.echo(f"building {name} FROM {base} ...")
    tmp = Path(tempfile.mkdtemp(prefix="sandboxd-build-"))
    try:
        _image, _logs = client.images.build(
            path=str(build_context(context, tmp)), dockerfile="python/Dockerfile", tag=name,
            rm=True,
            forcerm=True, pull=False,
            buildargs={"BASE": base, "RUNNER_SHA256": digest,
                       "SANDBOX_UID": str(settings.sandbox_uid),
                       "SANDBOX_GID": str(settings.sandbox_gid)},
        )
    except docker.errors.BuildError as exc:
        tail = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)[-2000:]
        _fail(f"docker build failed: {exc.msg}\n{tail}")
    except docker.errors.APIError as exc:
        _fail(f"docker build failed: {exc.explanation or exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for other in {settings.shell_image} - {name}:
        if tag is None:
            repo, _, version = other.rpartition(":")
            if not repo or "/" in version:
                repo, version = other, "latest"
            client.api.tag(name, repo, version)
            typer.echo(f"tagged {other}")
    typer.echo(f"built {name} in {time.monotonic() - start:.1f} s")
