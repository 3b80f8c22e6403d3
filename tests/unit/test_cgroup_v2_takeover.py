"""Which cgroup v2 the daemon takes over, and how it moves a container's processes into its
leaf. The real thing runs in the VM (tests/service/test_dockerfile.py, tests/vm); here the
decision logic, over a cgroup directory made of plain files and real processes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.backends.restricted import cgroup_v2


@pytest.fixture
def child() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _cgroup(tmp_path: Path, pids: set[int]) -> Path:
    d = tmp_path / "docker-x.scope"
    d.mkdir()
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in sorted(pids)))
    return d


def test_alone_is_ours(tmp_path: Path) -> None:
    own = _cgroup(tmp_path, {os.getpid()})
    assert cgroup_v2._own_cgroup_is_ours(own, "/x") == cgroup_v2._Takeover(container=False)


def test_own_descendants_beside_it_are_ours(tmp_path: Path, child: int) -> None:
    own = _cgroup(tmp_path, {os.getpid(), child})
    assert cgroup_v2._own_cgroup_is_ours(own, "/x") == cgroup_v2._Takeover(container=False)


def test_a_stranger_makes_it_shared(tmp_path: Path) -> None:
    stranger = os.getppid()  # alive, and not a descendant of this process
    own = _cgroup(tmp_path, {os.getpid(), stranger})
    assert cgroup_v2._own_cgroup_is_ours(own, "/x") is None


def test_a_container_init_makes_it_the_containers(tmp_path: Path) -> None:
    """PID 1 of this PID namespace beside it (docker run --init, or a docker exec health check
    beside a daemon that is PID 1 itself): everything in it is the container's."""
    own = _cgroup(tmp_path, {1, os.getpid(), os.getppid()})
    assert cgroup_v2._own_cgroup_is_ours(own, "/x") == cgroup_v2._Takeover(container=True)


def test_the_root_and_other_cgroups_are_never_ours(tmp_path: Path) -> None:
    assert cgroup_v2._own_cgroup_is_ours(_cgroup(tmp_path, {os.getpid()}), "/") is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "cgroup.procs").write_text("1\n")
    assert cgroup_v2._own_cgroup_is_ours(other, "/other") is None


def test_newcomers_of_a_container_are_moved_until_enabling_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A docker exec process joins between the move and the enable (EBUSY: no internal
    processes); the next round moves it too."""
    me = os.getpid()
    own = _cgroup(tmp_path, {1, me})
    writes: list[tuple[str, str]] = []
    rounds = iter([{1, me, 4242}, {4242}, set()])

    def fake_write(path: Path, value: str) -> None:
        writes.append((Path(path).name, value))

    def fake_enable(d: Path) -> None:
        now = next(rounds)
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in sorted(now)))
        if now:
            raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(cgroup_v2, "_write", fake_write)
    monkeypatch.setattr(cgroup_v2, "_enable", fake_enable)
    monkeypatch.setattr(cgroup_v2.time, "sleep", lambda s: None)
    cgroup_v2._into_leaf(own, cgroup_v2._Takeover(container=True))
    moved = [v for name, v in writes if name == "cgroup.procs"]
    assert moved == ["1", str(me), "1", "4242", "4242"], moved


def test_a_stranger_that_joins_a_non_container_cgroup_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = os.getpid()
    own = _cgroup(tmp_path, {me})

    def fake_enable(d: Path) -> None:
        (d / "cgroup.procs").write_text(f"{me}\n{os.getppid()}\n")
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(cgroup_v2, "_write", lambda path, value: None)
    monkeypatch.setattr(cgroup_v2, "_enable", fake_enable)
    monkeypatch.setattr(cgroup_v2.time, "sleep", lambda s: None)
    with pytest.raises(cgroup_v2.CgroupUnavailable, match="not this daemon's"):
        cgroup_v2._into_leaf(own, cgroup_v2._Takeover(container=False))


def test_enabling_gives_up_after_its_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = _cgroup(tmp_path, {1, os.getpid()})
    calls = []

    def always_busy(d: Path) -> None:
        calls.append(d)
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(cgroup_v2, "_write", lambda path, value: None)
    monkeypatch.setattr(cgroup_v2, "_enable", always_busy)
    monkeypatch.setattr(cgroup_v2.time, "sleep", lambda s: None)
    with pytest.raises(OSError) as info:
        cgroup_v2._into_leaf(own, cgroup_v2._Takeover(container=True))
    assert info.value.errno == errno.EBUSY and len(calls) == cgroup_v2.TAKEOVER_TRIES
