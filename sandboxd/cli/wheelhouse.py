"""``sandboxd wheelhouse add PKG...`` / ``list``: fill and read the directory of wheels that
container sessions install from with ``install_packages`` (the ``wheelhouse`` setting).

``add`` runs on a host that can reach a package index (or with ``--find-links`` and
``--no-index``, from a local directory): ``pip download --only-binary=:all:`` of the packages
and everything they need, for the Python version and platform of the sandbox image (asked of
the image itself unless ``--python-version`` / ``--platform`` say them), into the wheelhouse.
It writes only there; the daemon only ever reads it. ``install_packages`` runs pip from a
wheel of pip in the wheelhouse: add ``pip`` once (``list`` says when it is missing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from sandboxd.cli.common import CONFIG_OPTION, fail, settings_for

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

_DIR_OPTION = typer.Option(None, "--dir", help="The wheelhouse (default: the wheelhouse "
                           "setting)")
#: what ``add`` asks the sandbox image: its Python version, machine and glibc version
_ASK_IMAGE = ("import platform, sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}', "
              "platform.machine(), platform.libc_ver()[1] or '2.17')")
DOWNLOAD_TIMEOUT_S = 1800.0


def _wheelhouse(directory: Path | None, config: Path | None, *, create: bool = False) -> Path:
    """The wheelhouse directory, or exit 2 with one line."""
    path = directory or settings_for(config, None).wheelhouse
    if path is None:
        fail("no wheelhouse: set the `wheelhouse` setting (or SANDBOXD_WHEELHOUSE), or pass "
             "--dir")
        raise AssertionError("unreachable")
    if create and not path.exists():
        try:
            path.mkdir(parents=True, mode=0o755)
        except OSError as exc:
            fail(f"cannot create the wheelhouse {path}: {exc.strerror}")
    if not path.is_dir():
        fail(f"the wheelhouse {path} is not a directory")
    return path


def _wheels(path: Path) -> list[tuple[str, str, str]]:
    """(name, version, file name) of every wheel of the wheelhouse, sorted."""
    from sandboxd.policy.models import normalise_package

    found = []
    for wheel in sorted(path.glob("*.whl")):
        parts = wheel.name[:-4].split("-")
        if len(parts) >= 5:
            found.append((normalise_package(parts[0]), parts[1], wheel.name))
    return sorted(found)


@app.command("list")
def list_wheels(directory: Path | None = _DIR_OPTION,
                config: Path | None = CONFIG_OPTION) -> None:
    """List the wheels of the wheelhouse (name, version, file)."""
    path = _wheelhouse(directory, config)
    try:
        wheels = _wheels(path)
    except OSError as exc:
        fail(f"cannot read the wheelhouse {path}: {exc.strerror}")
        return
    for name, version, filename in wheels:
        typer.echo(f"{name}\t{version}\t{filename}")
    if not any(name == "pip" for name, _, _ in wheels):
        typer.echo("sandboxd: the wheelhouse holds no wheel of pip, which install_packages "
                   "runs: add it with `sandboxd wheelhouse add pip`", err=True)


def _image_target(image: str) -> tuple[str, str]:
    """(python version, platform tag) of the sandbox image, asked of the image itself (a
    throw-away container without network), or exit 2 with one line."""
    try:
        import docker

        client = docker.from_env(timeout=60)
        out = client.containers.run(image, ["-I", "-S", "-c", _ASK_IMAGE],
                                    entrypoint="python3", remove=True, network_mode="none",
                                    read_only=True, user="65534:65534")
        version, machine, libc = out.decode().split()
    except Exception as exc:
        fail(f"cannot ask the sandbox image {image} for its Python version ({exc}); pass "
             "--python-version and --platform")
        raise AssertionError("unreachable") from None
    major, minor = [*libc.split("."), "0"][:2]
    return version, f"manylinux_{major}_{minor}_{machine}"


@app.command("add")
def add(packages: list[str] = typer.Argument(..., help="Packages: name or name==version"),
        directory: Path | None = _DIR_OPTION,
        python_version: str | None = typer.Option(
            None, "--python-version", help="Python X.Y of the sandbox image (default: asked "
            "of the python_image)"),
        platform: str | None = typer.Option(
            None, "--platform", help="Platform tag such as manylinux_2_36_x86_64 (default: "
            "the python_image's)"),
        find_links: Path | None = typer.Option(
            None, "--find-links", help="Also look for wheels in this local directory"),
        no_index: bool = typer.Option(False, "--no-index",
                                      help="Use no package index (only --find-links)"),
        config: Path | None = CONFIG_OPTION) -> None:
    """Download wheels of packages and their dependencies into the wheelhouse."""
    _check_specs(packages)
    path = _wheelhouse(directory, config, create=True)
    python_version, platform = _target(python_version, platform, config)
    argv: list[Any] = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
                       "--dest", str(path), "--python-version", python_version,
                       "--platform", platform, "--disable-pip-version-check", "--no-input",
                       "--progress-bar", "off", *_source_options(find_links, no_index)]
    done = _pip_download([*argv, "--", *packages])
    for wheel in path.glob("*.whl"):  # the sandbox user reads them through a read-only mount
        wheel.chmod(0o644)
    added = _saved_wheels(done.stdout)
    typer.echo(f"{len(added)} wheel(s) saved in {path}" + (
        ": " + ", ".join(added) if added else " (they were there already)"))


def _check_specs(packages: list[str]) -> None:
    """Exit 2 with one line unless every package is a name or ``name==version``."""
    from sandboxd.policy.models import PACKAGE_SPEC

    bad = [p for p in packages if not PACKAGE_SPEC.match(p)]
    if bad:
        fail(f"{bad[0]!r} is not a package name, or a name and an exact version such as "
             "'name==1.2'")


def _target(python_version: str | None, platform: str | None,
            config: Path | None) -> tuple[str, str]:
    """(python version, platform tag): the options', the image asked for any not given."""
    if python_version is not None and platform is not None:
        return python_version, platform
    asked = _image_target(settings_for(config, None).python_image)
    return python_version or asked[0], platform or asked[1]


def _source_options(find_links: Path | None, no_index: bool) -> list[str]:
    """pip's ``--find-links``/``--no-index`` options, as given."""
    return [*(["--find-links", str(find_links)] if find_links is not None else []),
            *(["--no-index"] if no_index else [])]


def _saved_wheels(output: str) -> list[str]:
    """The file names of the wheels pip's output says it saved, sorted."""
    return sorted({ln.split("Saved ", 1)[1].strip().rsplit("/", 1)[-1]
                   for ln in output.splitlines() if "Saved " in ln})


def _pip_download(argv: list[Any]) -> subprocess.CompletedProcess[str]:
    """``pip download``'s run, or exit naming its last error (2: it did not run, 1: it
    failed)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        fail(f"pip download did not run: {exc}")
        raise AssertionError("unreachable") from None
    if done.returncode != 0:
        fail(f"pip download failed: {_pip_error(done)}", 1)
    return done


def _pip_error(done: subprocess.CompletedProcess[str]) -> str:
    """Why pip failed: its last ``ERROR`` line, else its last line, else its exit status."""
    lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:]
    why = errors[-1] if errors else f"exit status {done.returncode}"
    if "No module named pip" in why:
        return f"pip is not installed for {sys.executable}"
    return why
