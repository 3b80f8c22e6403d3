"""Group commit (the fdatasync of every record was the daemon's largest per-call cost): concurrent
writers share one fdatasync, every record is durable before its write returns, in order, on a valid
chain; an allowed decision of a call whose client gets nothing before its result is made durable by
that result's commit."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxd.audit import AuditLog, verify
from sandboxd.audit import writer as writer_module
from sandboxd.models import (
    Decision,
    ExecutionPlan,
    Limits,
    Reason,
    Result,
    Status,
    Termination,
    ToolKind,
)
from tests.support.wait import wait_until


class Syncs:
    """``os.fdatasync`` as the writer sees it: the size each finished sync covers; hooks run
    (in order, one per sync) before the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            size = os.fstat(fd).st_size
            if self.hooks:
                self.hooks.pop(0)()
            real(fd)
            with self._lock:
                self.sizes.append(size)

        monkeypatch.setattr(writer_module.os, "fdatasync", fdatasync)

    @property
    def durable(self) -> int:
        with self._lock:
            return max(self.sizes, default=0)


def durable_seqs(path: Path, size: int) -> set[int]:
    """The seqs of the complete records within the first ``size`` bytes of the file."""
    data = path.read_bytes()[:size]
    return {json.loads(line)["seq"] for line in data.splitlines(keepends=True)
            if line.endswith(b"\n")}


def test_concurrent_writers_are_durable_in_order_on_a_valid_chain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    late: list[str] = []
    with AuditLog(log_path) as log:
        def writer(n: int) -> None:
            for i in range(40):
                record = log.write("test", writer=n, i=i)
                # durable before write returned: within what a finished sync covered
                if record["seq"] not in durable_seqs(log_path, syncs.durable):
                    late.append(f"{n}/{i}")

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert late == []
    report = verify(log_path)
    assert report.ok and report.records == 240
    records = [json.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [r["seq"] for r in records] == list(range(240))
    for n in range(6):  # each writer's records in the order it wrote them
        assert [r["i"] for r in records if r["writer"] == n] == list(range(40))


def test_writers_waiting_on_a_sync_share_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    with AuditLog(log_path) as log:
        first_line = len(log_path.read_bytes().splitlines())
        threads = [threading.Thread(target=log.write, args=("test",), kwargs={"i": i})
                   for i in range(3)]

        def hook() -> None:
            """The first writer's sync has begun (it covers its own record only): two more
            writers start and append meanwhile, and the sync waits until both have."""
            for t in threads[1:]:
                t.start()
            wait_until(lambda: len(log_path.read_bytes().splitlines()) >= first_line + 3,
                       timeout=60, what="two more writers to append")

        syncs.hooks = [hook]
        before = len(syncs.sizes)
        threads[0].start()  # the others start from its sync (started together, the first
        # writer could reach its sync after both others appended: one sync for all three)
        for t in threads:
            t.join()
        # three records, two syncs: the first writer's, then one for both that waited
        assert len(syncs.sizes) - before == 2
        assert syncs.durable == log_path.stat().st_size
    assert verify(log_path).ok


def allowed_decision() -> Decision:
    return Decision(allowed=True, source="policies/default.yaml", rule="tools.python",
                    policy_name="default", backend="restricted",
                    plan=ExecutionPlan(kind=ToolKind.python, limits=Limits(timeout_s=5)))


def test_an_allowed_decision_is_committed_with_its_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    with AuditLog(log_path) as log:
        before = len(syncs.sizes)
        log.decision(request_id="inv_1", client="alice", tool="python", session=None,
                     arguments={"code": "1"}, decision=allowed_decision(),
                     commit_with_result=True)
        # appended (a crash of the daemon keeps it), not yet synced
        assert len(syncs.sizes) == before
        assert json.loads(log_path.read_bytes().splitlines()[-1])["event"] == "decision"
        log.result(request_id="inv_1", client="alice", result=Result(
            id="inv_1", tool="python", status=Status.ok, backend="restricted",
            termination=Termination(reason=Reason.exited, exit_code=0)))
        # one sync for both records
        assert len(syncs.sizes) == before + 1
        assert syncs.durable == log_path.stat().st_size
        # a denial is durable at once (its client gets its answer next), and so is every
        # decision written without commit_with_result
        denied = Decision(allowed=False, source="policies/default.yaml", rule="tools.shell",
                          message="no", policy_name="default", backend="container")
        log.decision(request_id="inv_2", client="alice", tool="shell", session=None,
                     arguments={}, decision=denied, commit_with_result=True)
        log.decision(request_id="inv_3", client="alice", tool="python", session=None,
                     arguments={}, decision=allowed_decision())
        assert len(syncs.sizes) == before + 3
        assert syncs.durable == log_path.stat().st_size
    assert verify(log_path).ok


def test_close_syncs_what_was_appended(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    log = AuditLog(log_path)
    log.decision(request_id="inv_1", client="alice", tool="python", session=None,
                 arguments={}, decision=allowed_decision(), commit_with_result=True)
    log.close()
    assert syncs.durable == log_path.stat().st_size


def test_a_failed_sync_makes_the_log_unusable(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path) as log:
        log.write("before")

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(writer_module.os, "fdatasync", failing)
        with pytest.raises(writer_module.AuditError, match="Input/output error"):
            log.write("lost")
        monkeypatch.undo()
        # what the kernel kept of it is unknown: no later record claims a durable chain
        with pytest.raises(writer_module.AuditError, match="unusable"):
            log.write("after")
