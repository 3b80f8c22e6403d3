"""Sandbox uid ranges are claimed host-wide: two live daemons never share a sandbox uid
(sandboxd.host.uidclaim). Real daemons, the real host-wide claim file."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.cli.daemon import EXIT_UID_RANGE
from sandboxd.host import uidclaim
from tests.support.ci import require
from tests.support.daemon import (
    UID_SETTINGS,
    RunningDaemon,
    daemon_env,
    daemon_list,
    free_port,
    running_daemon,
    start_daemon,
)

pytestmark = pytest.mark.same_on_every_host(
    "a claim is a byte-range record lock on one file (fcntl), the kernel's locks and the "
    "daemon's own arithmetic on any Linux host; the VM's service job proves a shell daemon "
    "refused the unit's range and serving on the free one it was named, beside the unit")

COUNT = 100


@pytest.fixture(autouse=True)
def _root() -> None:
    require(os.geteuid() == 0, "root: only a root daemon hands out (and claims) sandbox uids")


def _free(span: int) -> int:
    """The first uid of ``span`` uids no live daemon claims (tests/support picks from 20000;
    these tests from 40000 up, so that their ranges' neighbours are free too)."""
    start = 40000 + random.randrange(100) * span
    first = uidclaim.free_range(span, start) or uidclaim.free_range(span, 40000)
    assert first is not None
    return first


def _env(first: int, count: int = COUNT) -> dict[str, str]:
    return {UID_SETTINGS[0]: str(first), UID_SETTINGS[1]: str(count)}


@dataclass
class Holder:
    """A live daemon claiming ``2 * COUNT`` uids from ``first``; the ``COUNT`` uids below and
    above its claim were free when it started."""

    daemon: RunningDaemon
    first: int


@pytest.fixture(scope="module")
def holder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Holder]:
    """One holder for the refusals and the adjacent range below (a daemon start costs 20-60 s
    under the VM job's emulation); they leave it as they found it."""
    require(os.geteuid() == 0, "root: only a root daemon hands out (and claims) sandbox uids")
    first = _free(4 * COUNT) + COUNT
    with running_daemon(tmp_path_factory.mktemp("holder"), env=_env(first, 2 * COUNT)) as d:
        assert uidclaim.holder(first, 2 * COUNT) == uidclaim.Holder(d.proc.pid, first, 2 * COUNT)
        yield Holder(d, first)
    assert uidclaim.holder(first, 2 * COUNT) is None  # a stopped daemon's claim goes with it


@pytest.fixture
def daemons() -> Iterator[list[RunningDaemon]]:
    with daemon_list() as started:
        yield started


def _serve(tmp_path: Path, first: int, count: int) -> subprocess.CompletedProcess[str]:
    """A second `sandboxd serve` in the foreground: it must refuse quickly (the timeout only
    catches a daemon that serves instead; it is then stopped like any other)."""
    cmd = [sys.executable, "-m", "sandboxd", "serve", "--port", str(free_port()),
           "--state-dir", str(tmp_path / "second")]
    proc = subprocess.Popen(cmd, env=daemon_env(_env(first, count)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the second daemon served instead of refusing:\n{out}{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_an_overlapping_range_is_refused_with_a_free_one_named(
    tmp_path: Path, holder: Holder, daemons: list[RunningDaemon]
) -> None:
    """10100+900 vs 10500+100 in miniature: a range that overlaps a live daemon's without being
    identical is refused in one line naming both settings, the holder's pid and a free range;
    nothing is left behind and that free range then serves beside the first daemon."""
    first, pid = holder.first, holder.daemon.proc.pid
    r = _serve(tmp_path, first + COUNT + COUNT // 2, COUNT)  # its tail overlaps, not its head
    assert r.returncode == EXIT_UID_RANGE, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("sandboxd: "), r.stderr
    for word in ("sandbox_uid_first", "sandbox_uid_count", f"pid {pid}"):
        assert word in r.stderr, r.stderr
    m = re.search(r"SANDBOXD_SANDBOX_UID_FIRST=(\d+)", r.stderr)
    assert m is not None, r.stderr
    suggested = int(m.group(1))
    assert suggested >= first + 2 * COUNT, r.stderr  # past the live claim
    assert not (tmp_path / "second" / "audit.jsonl").exists()  # refused before anything
    assert not (tmp_path / "second" / "workspaces").exists()
    assert holder.daemon.client.get("/healthz").status_code == 200
    # the named range serves beside the first daemon
    daemons.append(start_daemon(tmp_path / "b", env=_env(suggested)))
    assert daemons[0].client.get("/healthz").status_code == 200
    assert uidclaim.holder(suggested, COUNT) == uidclaim.Holder(
        daemons[0].proc.pid, suggested, COUNT)


def test_an_identical_range_is_refused(tmp_path: Path, holder: Holder) -> None:
    r = _serve(tmp_path, holder.first, 2 * COUNT)
    assert r.returncode == EXIT_UID_RANGE, r.stdout + r.stderr
    assert f"pid {holder.daemon.proc.pid}" in r.stderr, r.stderr
    assert holder.daemon.client.get("/healthz").status_code == 200


def test_adjacent_ranges_both_serve(tmp_path: Path, holder: Holder,
                                    daemons: list[RunningDaemon]) -> None:
    """Ranges that touch but share no uid: both daemons serve, each claiming its own."""
    below = holder.first - COUNT  # its last uid is the one just below the holder's first
    daemons.append(start_daemon(tmp_path / "a", env=_env(below)))
    assert daemons[0].client.get("/healthz").status_code == 200
    assert uidclaim.holder(below, COUNT) == uidclaim.Holder(daemons[0].proc.pid, below, COUNT)
    assert holder.daemon.client.get("/healthz").status_code == 200
    assert uidclaim.holder(holder.first, 2 * COUNT) == uidclaim.Holder(
        holder.daemon.proc.pid, holder.first, 2 * COUNT)


def test_a_killed_daemons_claim_vanishes_with_it(
    tmp_path: Path, daemons: list[RunningDaemon]
) -> None:
    """SIGKILL: no exit handler runs, yet the next daemon on the same range starts (the kernel
    dropped the lock with the process) and holds the claim itself."""
    first = _free(COUNT)
    daemons.append(start_daemon(tmp_path / "a", env=_env(first)))
    assert uidclaim.holder(first, COUNT) == uidclaim.Holder(daemons[0].proc.pid, first, COUNT)
    assert daemons[0].stop(signal.SIGKILL) == -signal.SIGKILL
    daemons.append(start_daemon(tmp_path / "b", env=_env(first)))
    assert uidclaim.holder(first, COUNT) == uidclaim.Holder(daemons[1].proc.pid, first, COUNT)



def test_test_support_takes_another_range_when_it_loses_the_race(
    tmp_path: Path, daemons: list[RunningDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/support/daemon.py picks a free range, but a parallel run may claim it before the
    daemon does: the daemon refuses (exit 6) and start_daemon starts another one on a new
    range. Here this process itself is the parallel run (its own claim looks free to it)."""
    from tests.support import daemon as support

    first = _free(support.TEST_UID_COUNT)
    mine = uidclaim.claim(first, support.TEST_UID_COUNT)
    picks: list[dict[str, str]] = []
    real = support.uid_range_env

    def racing(env: dict[str, str] | None = None) -> dict[str, str]:
        pick = _env(first, support.TEST_UID_COUNT) if not picks else real(env)
        picks.append(pick)
        return pick

    monkeypatch.setattr(support, "uid_range_env", racing)
    try:
        daemons.append(start_daemon(tmp_path))
    finally:
        mine.release()
    assert len(picks) == 2 and picks[0][UID_SETTINGS[0]] == str(first), picks
    d = daemons[0]
    assert d.uids is not None and d.uids.start != first
    assert uidclaim.holder(d.uids.start, len(d.uids)) == uidclaim.Holder(
        d.proc.pid, d.uids.start, len(d.uids))
