"""``sandboxd images build``: build the sandbox image(s) of the container backend.

Two ways, same result (an image with python3, pip, coreutils, grep, sed, git, curl, user
10001 and the runner at /opt/sandboxd/: its entry point runner.py, its package
sandboxd_runner/ and the sandbox contract sandboxd/protocol/):

* normal hosts: ``docker build`` of ``images/python/Dockerfile`` FROM ``python:3.12-slim``;
* ``--offline`` (no registry; chosen automatically when none is reachable and the base image
  is not present): ``images/offline/build-rootfs.sh`` debootstraps a minimal Debian from the
  host's apt mirror and imports it as ``sandboxd/base-offline:latest``, then the same
  Dockerfile is built FROM that.

Profiles (``--profile``, see :data:`PROFILES`): ``python`` (the default) is the image above;
``datascience`` first builds ``images/datascience/Dockerfile`` (numpy, pandas, matplotlib,
scipy, scikit-learn: Debian's packages through the apt mirror offline, wheels online) FROM
the same base, then ``images/python/Dockerfile`` FROM that, so the sandbox set-up has one
definition and a runner edit rebuilds only the thin top layer.

``--if-missing`` does nothing when the image exists and was built from the current runner
(label ``sandboxd.runner.sha256``) and profile (``sandboxd.profile.sha256``), so ``make
test`` can call it every time.
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
from typing import Any

import typer

from sandboxd.config import load_settings
from sandboxd.config.images import DEFAULT_PROFILE, PROFILES, Profile

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

ONLINE_BASE = "python:3.12-slim"
OFFLINE_BASE = "sandboxd/base-offline:latest"
REGISTRY = ("registry-1.docker.io", 443)
PROFILE_LABEL = "sandboxd.profile"
PROFILE_DIGEST_LABEL = "sandboxd.profile.sha256"
#: what starts each line the build prints for a build step (``  step: Step 3/15 : RUN ...``)
STEP_PREFIX = "  step: "




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


def protocol_package() -> Path:
    """``sandboxd/protocol/``: the sandbox contract (frames, rules, display items, limits),
    shared by the daemon and the runner (the build puts it next to the runner as
    ``runner/sandboxd/protocol/``, the Dockerfile copies it to
    ``/opt/sandboxd/sandboxd/protocol/``: the runner imports it as ``sandboxd.protocol``)."""
    from sandboxd import protocol

    return Path(protocol.__file__).resolve().parent


def shared_modules() -> dict[str, Path]:
    """Every sandboxd module the runner imports from beside itself, by its path there
    (``sandboxd/protocol/wire.py``, ...)."""
    package = protocol_package()
    return {f"sandboxd/protocol/{path.name}": path for path in sorted(package.glob("*.py"))}


def runner_files(context: Path) -> dict[str, Path]:
    """The runner's own files in ``images/``, by their path there: its entry point and every
    file of its package ``runner/sandboxd_runner/`` (compiled files left out)."""
    runner = context / "runner"
    files = {"runner/runner.py": runner / "runner.py"}
    for path in sorted((runner / "sandboxd_runner").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[path.relative_to(context).as_posix()] = path
    return files


def runner_digest(context: Path) -> str:
    """SHA-256 of the runner (entry point and package), its shared modules (the protocol
    package) and the Dockerfile, each under its name: an image built from them carries it."""
    h = hashlib.sha256()
    files = {**runner_files(context), "python/Dockerfile": context / "python" / "Dockerfile",
             **shared_modules()}
    for name, path in files.items():
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def deps_digest(context: Path, profile: Profile, base_id: str) -> str:
    """SHA-256 of a profile's package Dockerfile and the id of the base it is built FROM."""
    h = hashlib.sha256(base_id.encode())
    h.update((context / (profile.deps or "")).read_bytes())
    return h.hexdigest()


def profile_digest(context: Path, profile: Profile) -> str:
    """SHA-256 of what a profile's image is made of besides the base (its package
    Dockerfile); empty for a profile without one."""
    if profile.deps is None:
        return ""
    return hashlib.sha256((context / profile.deps).read_bytes()).hexdigest()


def build_context(context: Path, into: Path) -> Path:
    """A copy of ``images/`` with the runner's shared modules added as
    ``runner/sandboxd/protocol/`` (what the Dockerfile copies)."""
    target = into / "images"
    shutil.copytree(context, target, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, path in shared_modules().items():
        (target / "runner" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / "runner" / name)
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


def _has_image(client: Any, name: str) -> dict[str, Any] | None:
    from docker.errors import NotFound

    try:
        found: dict[str, Any] = client.api.inspect_image(name)
    except NotFound:
        return None
    return found


def _labels(image: dict[str, Any] | None) -> dict[str, str]:
    return ((image or {}).get("Config") or {}).get("Labels") or {}


def _docker_build(client: Any, context: Path, dockerfile: str, tag: str,
                  buildargs: dict[str, str], labels: dict[str, str] | None = None,
                  network_mode: str | None = None) -> None:
    """``docker build`` of ``images/<dockerfile>`` (no pull: bases are local or built here),
    one line per build step as the engine starts it (:data:`STEP_PREFIX`): a build of minutes
    is never silent (``make test``, the daemon's own build reads them as its progress)."""
    import docker

    tmp = Path(tempfile.mkdtemp(prefix="sandboxd-build-"))
    try:
        stream = client.api.build(path=str(build_context(context, tmp)), dockerfile=dockerfile,
                                  tag=tag, rm=True, forcerm=True, pull=False,
                                  buildargs=buildargs, labels=labels or None,
                                  network_mode=network_mode, decode=True)
        _follow_build(stream, dockerfile)
    except docker.errors.APIError as exc:
        _fail(f"docker build of {dockerfile} failed: {exc.explanation or exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _follow_build(stream: Any, dockerfile: str) -> None:
    """Read a build's decoded chunks: a line per step as it starts, a heartbeat line during a
    long step; exit with the last output on the first error chunk."""
    tail: list[str] = []
    step, said = "", time.monotonic()
    for chunk in stream:
        if "error" in chunk:
            _fail(f"docker build of {dockerfile} failed: {chunk['error']}\n"
                  + "".join(tail)[-2000:])
        text = str(chunk.get("stream", ""))
        tail = [*tail, text][-200:]
        if text.startswith("Step "):
            step, said = text.split(" :", 1)[0], time.monotonic()
            typer.echo(f"{STEP_PREFIX}{text.strip()[:160]}")
        elif time.monotonic() - said >= HEARTBEAT_S:  # a long step (apt, pip) goes on
            said = time.monotonic()
            typer.echo(f"  {step or 'the build'} still running: {text.strip()[:100]}")


#: how often a step without output of its own (debootstrap: minutes) says it is still going
HEARTBEAT_S = 20.0


def _run_with_heartbeat(argv: list[str], env: dict[str, str], what: str) -> int:
    """Run ``argv`` to its end, saying every :data:`HEARTBEAT_S` that ``what`` is still being
    built (the debootstrap log is only shown when it fails); returns its exit status."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env)
    while True:
        try:
            return proc.wait(timeout=HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            typer.echo(f"  still building {what} ({time.monotonic() - started:.0f} s)")


def _base(client: Any, context: Path, offline: bool | None, rebuild_base: bool) -> str:
    """The base image to build FROM: python:3.12-slim online, else the debootstrap rootfs
    (made here when missing or when ``rebuild_base``)."""
    if offline is None:
        offline = _no_registry(client)
    if not offline:
        return ONLINE_BASE
    if rebuild_base or not _has_image(client, OFFLINE_BASE):
        _debootstrap_base(context)
    return OFFLINE_BASE


def _no_registry(client: Any) -> bool:
    """Whether to build offline when not told: no online base here and no registry reachable
    (said on a line)."""
    offline = not (_has_image(client, ONLINE_BASE) or registry_reachable())
    if offline:
        typer.echo("no container registry reachable: building offline (debootstrap)")
    return offline


def _debootstrap_base(context: Path) -> None:
    """Make the offline base image with the debootstrap script, or exit with its status."""
    script = context / "offline" / "build-rootfs.sh"
    typer.echo(f"building the base rootfs {OFFLINE_BASE} with debootstrap ...")
    env = dict(os.environ)
    env.setdefault("DOCKER", "/usr/bin/docker" if Path("/usr/bin/docker").exists()
                   else "docker")
    code = _run_with_heartbeat([str(script), OFFLINE_BASE], env, OFFLINE_BASE)
    if code != 0:
        _fail(f"{script} failed (exit {code})")


def _deps(client: Any, context: Path, profile: Profile, base: str) -> str:
    """A profile's package layer FROM ``base`` (reused while its Dockerfile and the base are
    unchanged); returns the image to build the sandbox set-up FROM."""
    if profile.deps is None or profile.deps_tag is None:
        return base
    base_id = str((_has_image(client, base) or {}).get("Id", base))
    digest = deps_digest(context, profile, base_id)
    if _labels(_has_image(client, profile.deps_tag)).get("sandboxd.deps.sha256") == digest:
        typer.echo(f"{profile.deps_tag} is up to date")
        return profile.deps_tag
    typer.echo(f"building {profile.deps_tag} ({profile.deps}) FROM {base} ...")
    started = time.monotonic()
    # the host's network, as debootstrap has: the apt mirror (or PyPI) the host reaches
    _docker_build(client, context, profile.deps, profile.deps_tag, {"BASE": base},
                  {"sandboxd.deps.sha256": digest}, network_mode="host")
    typer.echo(f"built {profile.deps_tag} in {time.monotonic() - started:.1f} s")
    return profile.deps_tag


def _is_current(labels: dict[str, str], digest: str, own_digest: str) -> bool:
    """Whether an image's labels say it was built from this runner and this profile."""
    return (labels.get("sandboxd.runner.sha256") == digest
            and labels.get(PROFILE_DIGEST_LABEL, "") == own_digest)


def _profile(name: str) -> Profile:
    profile = PROFILES.get(name)
    if profile is None:
        _fail(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    assert profile is not None
    return profile


def _die_with_daemon() -> None:
    """A build the daemon started (:mod:`sandboxd.backends.container.build`) ends with the
    daemon, even one killed with SIGKILL: ``PR_SET_PDEATHSIG``, then a check that the daemon
    is still its parent (it may have died before the call)."""
    import ctypes
    import signal

    from sandboxd.backends.container.build import DIE_WITH_ENV

    daemon = os.environ.get(DIE_WITH_ENV, "")
    if not daemon.isdigit():
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(daemon):
        _fail("the daemon that started this build is gone")


@app.command("build")
def build(
    offline: bool | None = typer.Option(
        None, "--offline/--online",
        help="Build from a debootstrap rootfs (no registry) / from python:3.12-slim. "
             "Default: online when the base image is present or a registry is reachable."),
    if_missing: bool = typer.Option(
        False, "--if-missing",
        help="Do nothing when the image exists and matches the current runner and profile."),
    rebuild_base: bool = typer.Option(
        False, "--rebuild-base", help="Offline: debootstrap the base again even if present."),
    tag: str | None = typer.Option(
        None, "--tag", help="Image name (default: the python_image setting for the python "
                            "profile, sandboxd/<profile>:latest for the others)."),
    profile_name: str = typer.Option(
        DEFAULT_PROFILE, "--profile",
        help="What to build: " + "; ".join(f"{p.name}: {p.summary}"
                                            for p in PROFILES.values()) + "."),
) -> None:
    """Build the sandbox image used by the container backend."""
    _die_with_daemon()

    profile = _profile(profile_name)
    settings = load_settings()
    name = tag or profile.image(settings)
    try:
        context = images_dir()
    except FileNotFoundError as exc:
        _fail(str(exc))
    digest = runner_digest(context)
    own_digest = profile_digest(context, profile)
    client = _docker_client(settings)
    labels = _labels(_has_image(client, name))
    if if_missing and _is_current(labels, digest, own_digest):
        typer.echo(f"{name} is up to date")
        return

    start = time.monotonic()
    base = _deps(client, context, profile, _base(client, context, offline, rebuild_base))
    typer.echo(f"building {name} FROM {base} ...")
    extra = ({PROFILE_LABEL: profile.name, PROFILE_DIGEST_LABEL: own_digest}
             if profile.deps else None)
    _docker_build(client, context, "python/Dockerfile", name,
                  {"BASE": base, "RUNNER_SHA256": digest,
                   "SANDBOX_UID": str(settings.sandbox_uid),
                   "SANDBOX_GID": str(settings.sandbox_gid)}, extra,
                  network_mode="host")  # apt, when the base lacks git, curl or pip
    if profile.name == DEFAULT_PROFILE and tag is None:
        _tag_as_shell_image(client, name, settings.shell_image)
    typer.echo(f"built {name} in {time.monotonic() - start:.1f} s")


def _docker_client(settings: Any) -> Any:
    """A client of the settings' Docker engine, proven to answer (exit 2 when it does not)."""
    import docker

    try:
        client = (docker.DockerClient(base_url=settings.docker_url, timeout=3600)
                  if settings.docker_url else docker.from_env(timeout=3600))
        client.ping()
    except Exception as exc:
        _fail(f"the Docker engine is unreachable: {exc}")
    return client


def _tag_as_shell_image(client: Any, name: str, shell_image: str) -> None:
    """The python image built under its default name serves the shell tool too: tag it as
    the ``shell_image`` setting names (``:latest`` when that has no tag)."""
    if shell_image == name:
        return
    repo, _, version = shell_image.rpartition(":")
    if not repo or "/" in version:
        repo, version = shell_image, "latest"
    client.api.tag(name, repo, version)
    typer.echo(f"tagged {shell_image}")
