"""sandboxd.host.uidclaim on a scratch claim file: overlap is exact, suggestions skip every live
claim, a claim file others could open is refused (the daemon-level tests are in
tests/service/test_uid_claim.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.host import uidclaim

HOLD = ("import sys; from pathlib import Path; from sandboxd.host import uidclaim\n"
        "uidclaim.claim(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[1]))\n"
        "print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes that each hold one claim in ``tmp_path/ranges.lock`` until their stdin
    closes."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(30)


def _hold(procs: list[subprocess.Popen[str]], path: Path, first: int, count: int) -> int:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(first), str(count)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p.pid


def test_overlap_is_exact_and_suggestions_skip_every_claim(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "ranges.lock"
    a = _hold(holders, path, 10100, 900)
    b = _hold(holders, path, 11000, 100)
    assert uidclaim.holder(10500, 100, path) == uidclaim.Holder(a, 10100, 900)
    assert uidclaim.holder(10999, 2, path) == uidclaim.Holder(a, 10100, 900)
    assert uidclaim.holder(11099, 1, path) == uidclaim.Holder(b, 11000, 100)
    assert uidclaim.holder(11100, 900, path) is None  # touching is not overlapping
    assert uidclaim.holder(10000, 100, path) is None
    assert uidclaim.free_range(900, 10100, path) == 11100
    assert uidclaim.free_range(100, 9000, path) == 9000
    with pytest.raises(uidclaim.UidRangeTaken) as err:
        uidclaim.claim(10950, 100, path)
    message = str(err.value)
    assert "\n" not in message and f"(pid {a})" in message, message
    assert "sandbox_uid_first=10950, sandbox_uid_count=100" in message, message
    assert "SANDBOXD_SANDBOX_UID_FIRST=11100" in message, message


def test_a_claim_file_others_could_open_is_refused(tmp_path: Path) -> None:
    """Whoever can open the file can hold a read lock on a range and keep daemons out."""
    path = tmp_path / "ranges.lock"
    path.touch(mode=0o644)
    path.chmod(0o644)
    with pytest.raises(uidclaim.UidClaimError, match="owner-only"):
        uidclaim.claim(10100, 900, path)
    path.chmod(0o600)
    uidclaim.claim(10100, 900, path).release()


def test_doctor_probes_with_uids_no_live_daemon_hands_out(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """``sandboxd doctor`` beside a live daemon: its probes get a free range of the same size,
    claimed while they run; with no daemon, the configured range itself."""
    from sandboxd.config import Settings

    path = tmp_path / "ranges.lock"
    settings = Settings(state_dir=tmp_path / "state", sandbox_uid_first=10100,
                        sandbox_uid_count=900)
    mine, held = uidclaim.claim_for_probes(settings, path)
    assert (mine.sandbox_uid_first, held is not None) == (10100, True)
    assert held is not None
    held.release()
    daemon = _hold(holders, path, 10100, 900)
    probing, held = uidclaim.claim_for_probes(settings, path)
    try:
        assert held is not None
        first, count = probing.sandbox_uid_first, probing.sandbox_uid_count
        assert count == 900 and (first >= 11000 or first + count <= 10100), first
        assert uidclaim.holder(first, count, path) is None  # ours: a lock does not block us
        assert uidclaim.holder(10100, 900, path) == uidclaim.Holder(daemon, 10100, 900)
    finally:
        if held is not None:
            held.release()
