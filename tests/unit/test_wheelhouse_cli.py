"""``sandboxd wheelhouse add`` / ``list`` as real subprocesses, without a network:
``add`` from a local directory (``--find-links --no-index``) with the target Python and
platform given, and its one-line errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import cli
from tests.support.wheels import make_wheel

TARGET = ["--python-version", "3.11", "--platform", "manylinux_2_36_x86_64"]


def sandboxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, timeout=300,
                   env={**os.environ, "SANDBOXD_CONFIG": os.devnull, **(env or {})})


def test_add_from_a_local_directory_then_list(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    make_wheel(source, "tiny-pkg", "1.0", {"tinypkg/__init__.py": ""}, requires=("tinydep",))
    make_wheel(source, "tinydep", "2.0", {"tinydep/__init__.py": ""})
    make_wheel(source, "unrelated", "1.0", {"unrelated/__init__.py": ""})
    wheelhouse = tmp_path / "wheelhouse"
    done = sandboxd("wheelhouse", "add", "--dir", str(wheelhouse), "--find-links",
                    str(source), "--no-index", *TARGET, "Tiny_Pkg")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"2 wheel(s) saved in {wheelhouse}: "
                                   "tiny_pkg-1.0-py3-none-any.whl, tinydep-2.0-py3-none-any.whl")
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in wheelhouse.iterdir())
    # the wheelhouse setting is the default directory
    done = sandboxd("wheelhouse", "list", env={"SANDBOXD_WHEELHOUSE": str(wheelhouse)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tiny-pkg\t1.0\ttiny_pkg-1.0-py3-none-any.whl",
                                        "tinydep\t2.0\ttinydep-2.0-py3-none-any.whl"]
    assert done.stderr.strip() == ("sandboxd: the wheelhouse holds no wheel of pip, which "
                                   "install_packages runs: add it with `sandboxd wheelhouse "
                                   "add pip`")


def test_errors_are_one_line(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    wheelhouse = tmp_path / "wheelhouse"
    done = sandboxd("wheelhouse", "add", "--dir", str(wheelhouse), "--find-links",
                    str(source), "--no-index", *TARGET, "nothere")
    assert done.returncode == 1
    assert done.stderr.strip() == ("sandboxd: pip download failed: ERROR: No matching "
                                   "distribution found for nothere")
    done = sandboxd("wheelhouse", "add", "--dir", str(wheelhouse), *TARGET, "--",
                    "--index-url=http://attacker.example/simple")
    assert done.returncode == 2
    assert done.stderr.strip() == ("sandboxd: '--index-url=http://attacker.example/simple' is "
                                   "not a package name, or a name and an exact version such "
                                   "as 'name==1.2'")
    done = sandboxd("wheelhouse", "list")
    assert done.returncode == 2
    assert done.stderr.strip() == ("sandboxd: no wheelhouse: set the `wheelhouse` setting (or "
                                   "SANDBOXD_WHEELHOUSE), or pass --dir")
    done = sandboxd("wheelhouse", "list", "--dir", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"sandboxd: the wheelhouse {tmp_path / 'missing'} is not a " \
                                  "directory"
