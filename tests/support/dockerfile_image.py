"""The daemon's Dockerfile image for tests/service/test_dockerfile.py: its build context, the
digest of the sources in it, and a prebuilt image the modern-host VM may ship.

``make test`` builds the image from scratch in the test itself (proving the offline build).
Under software emulation that build (``pip wheel`` of the project, ``docker build``) costs
minutes, so tests/vm/ci.sh builds it ONCE on the host from the same tree, the same way
(``python3 tests/support/dockerfile_image.py --tag T --find-links WHEELS``), ships it in the
payload, and the guest names it in ``SANDBOXD_TEST_DOCKERFILE_IMAGE``. The test uses it only
when its label records the digest of the very sources under test; otherwise it builds.

Standard library only: ci.sh runs it with the host's python before any test venv exists."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTEXT_FILES = (
    "pyproject.toml",
    "README.md",
    "sandboxd",
    "client/sandboxd_client",  # the daemon's wheel carries the client's package too
    "policies",
    "images",
    "Dockerfile",
    ".dockerignore",
)
TEST_LABEL = "sandboxd.test.dockerfile"
SOURCE_LABEL = "sandboxd.test.source-digest"
PREBUILT_ENV = "SANDBOXD_TEST_DOCKERFILE_IMAGE"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def _files(repo: Path) -> list[Path]:
    out: list[Path] = []
    for name in CONTEXT_FILES:
        src = repo / name
        if src.is_dir():
            out += sorted(
                p
                for p in src.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        else:
            out.append(src)
    return out


def source_digest(repo: Path = REPO) -> str:
    """sha256 over the path and content of every file the build context copies."""
    h = hashlib.sha256()
    for p in _files(repo):
        h.update(str(p.relative_to(repo)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def make_context(tmp: Path, python: str = sys.executable, find_links: str | None = None) -> Path:
    """A private build context (concurrent runs never share dist/wheels) with wheels built by
    ``python`` (offline from ``find_links`` when given, else as pip is configured)."""
    ctx = tmp / "ctx"
    ctx.mkdir()
    for name in CONTEXT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=_IGNORED)
        else:
            shutil.copy2(src, ctx / name)
    offline = ["--no-index", "--find-links", find_links] if find_links else []
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            *offline,
            "--wheel-dir",
            str(ctx / "dist" / "wheels"),
            str(ctx),
            "pip",
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return ctx


def labels() -> dict[str, str]:
    """The labels every test build carries: the test's own and the source digest."""
    return {TEST_LABEL: "1", SOURCE_LABEL: source_digest()}


def save_without_base(docker: str, tag: str, base: str, out: Path) -> None:
    """``docker save`` of ``tag`` into ``out`` without the layers of ``base`` (its first
    layers): the engine that loads it has ``base`` already, and ``docker load`` reads no
    layer whose chain it holds, so only the image's own layers travel (~100 of 300 MB)."""
    inspect = [docker, "image", "inspect", "-f", "{{json .RootFS.Layers}}"]
    mine = json.loads(
        subprocess.run([*inspect, tag], capture_output=True, text=True, check=True).stdout
    )
    theirs = json.loads(
        subprocess.run([*inspect, base], capture_output=True, text=True, check=True).stdout
    )
    shared = len(theirs) if mine[: len(theirs)] == theirs else 0
    full = out.with_name(out.name + ".full")
    subprocess.run([docker, "save", tag, "-o", str(full)], check=True)
    try:
        with tarfile.open(full) as src, tarfile.open(out, "w") as dst:
            manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
            layers = [Path(p).parent.name for m in manifest for p in m["Layers"]]
            dropped = set(layers[:shared]) - set(layers[shared:])
            for member in src:
                if member.name.split("/", 1)[0] in dropped:
                    continue
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    finally:
        full.unlink()


def main(argv: list[str] | None = None) -> int:
    """Build the image with the docker CLI, as the test's fixture does with the SDK."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--base", default="sandboxd/python:latest")
    ap.add_argument("--find-links", help="a directory of wheels: build offline from it")
    ap.add_argument("--docker", default=shutil.which("docker") or "docker")
    ap.add_argument("--workdir", required=True, help="an empty directory for the context")
    ap.add_argument("--save", type=Path, help="then save it here, without the base's layers")
    a = ap.parse_args(argv)
    ctx = make_context(Path(a.workdir), find_links=a.find_links)
    label_args = [x for k, v in labels().items() for x in ("--label", f"{k}={v}")]
    cmd = [
        a.docker,
        "build",
        "--quiet",
        "--force-rm",
        "--build-arg",
        f"BASE={a.base}",
        *label_args,
        "-t",
        a.tag,
        str(ctx),
    ]
    built = subprocess.run(cmd, env={**os.environ, "DOCKER_BUILDKIT": "0"}).returncode
    if built == 0 and a.save:
        save_without_base(a.docker, a.tag, a.base, a.save)
    return built


if __name__ == "__main__":
    sys.exit(main())
