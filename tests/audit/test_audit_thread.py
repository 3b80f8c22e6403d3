"""The audit writer thread (cheaper per record than an executor): records written through it are
durable before they are answered, in order, on a valid chain; a batch shares one fdatasync; an
allowed decision that its result commits is answered once appended (before that sync); a failed sync
is the answer of every durable record of its batch, and the recorder turns it into the truthful
refusal."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxd.audit import AuditError, AuditLog, verify
from sandboxd.audit.thread import AuditThread
from sandboxd.errors import AuditFailure
from sandboxd.models import Reason, Result, Status, Termination
from sandboxd.receipts.recorder import AuditRecorder
from tests.audit.test_group_commit import Syncs, allowed_decision, durable_seqs
from tests.support.wait import async_wait_until, wait_until


def hold_first_sync(entered: threading.Event, thread: AuditThread) -> Callable[[], None]:
    """A hook: the first batch's sync says it began, then waits until two more records are
    queued (so that they make the next batch)."""
    def hook() -> None:
        entered.set()
        wait_until(lambda: thread.queued() >= 2, timeout=60, what="two more records queued")
    return hook


async def first_batch_syncing(thread: AuditThread, entered: threading.Event,
                              write: Callable[..., object], **fields: object
                              ) -> asyncio.Task[object]:
    """Write one record and return once its batch is in its sync."""
    task = asyncio.create_task(thread.run(write, **fields))
    await async_wait_until(entered.is_set, timeout=60, what="the first batch's sync")
    return task


def a_result(rid: str) -> Result:
    return Result(id=rid, tool="python", status=Status.ok, backend="restricted",
                  termination=Termination(reason=Reason.exited, exit_code=0))


async def test_records_are_durable_when_answered_in_order_on_a_valid_chain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    late: list[str] = []
    with AuditLog(log_path) as log:
        thread = AuditThread(log)

        async def writer(n: int) -> None:
            for i in range(30):
                record = await thread.run(log.write, event="test", writer=n, i=i)
                if record["seq"] not in durable_seqs(log_path, syncs.durable):
                    late.append(f"{n}/{i}")

        before = len(syncs.sizes)
        await asyncio.gather(*(writer(n) for n in range(6)))
        thread.close()
        syncs_used = len(syncs.sizes) - before
    assert late == []
    assert syncs_used < 180  # concurrent writers shared syncs
    report = verify(log_path)
    assert report.ok and report.records == 180
    records = [json.loads(line) for line in log_path.read_bytes().splitlines()]
    for n in range(6):  # each writer's records in the order it wrote them
        assert [r["i"] for r in records if r["writer"] == n] == list(range(30))


async def test_a_batch_shares_one_sync_and_a_decision_is_answered_once_appended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    decided, resulted = threading.Event(), threading.Event()
    seen_in_sync: list[bool] = []
    with AuditLog(log_path) as log:
        thread = AuditThread(log)

        def second_sync() -> None:  # the batch of the decision and the result
            wait_until(decided.is_set, timeout=60, what="the decision answered before the sync")
            seen_in_sync.append(resulted.is_set())

        # the first record's sync waits until the decision and the result are queued
        entered = threading.Event()
        syncs.hooks = [hold_first_sync(entered, thread), second_sync]
        before = len(syncs.sizes)

        async def decision_then_flag() -> None:
            await thread.run(log.decision, request_id="inv_1", client="alice", tool="python",
                             session=None, arguments={"code": "1"},
                             decision=allowed_decision(), commit_with_result=True)
            decided.set()

        async def result_then_flag() -> None:
            await thread.run(log.result, request_id="inv_1", client="alice",
                             result=a_result("inv_1"))
            resulted.set()

        first = await first_batch_syncing(thread, entered, log.write, event="first")
        await asyncio.gather(first, decision_then_flag(), result_then_flag())
        thread.close()
        # two syncs for three records; the result was not answered before its sync
        assert len(syncs.sizes) - before == 2
        assert seen_in_sync == [False]
        assert syncs.durable == log_path.stat().st_size
    events = [json.loads(line)["event"] for line in log_path.read_bytes().splitlines()]
    assert events[-3:] == ["first", "decision", "result"]
    assert verify(log_path).ok


async def test_a_failed_sync_is_every_waiting_writers_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "audit.jsonl"
    syncs = Syncs(monkeypatch)
    with AuditLog(log_path) as log:
        recorder = AuditRecorder(log)

        def failing() -> None:
            raise OSError(5, "Input/output error")

        entered = threading.Event()
        syncs.hooks = [hold_first_sync(entered, recorder.writer), failing]
        first = asyncio.create_task(recorder.record(log.write, event="first"))
        await async_wait_until(entered.is_set, timeout=60, what="the first batch's sync")
        answers = await asyncio.gather(
            first, recorder.record(log.write, event="second"),
            recorder.record(log.result, request_id="inv_1", client="alice",
                            result=a_result("inv_1")),
            return_exceptions=True)
        assert answers[0]["event"] == "first"  # written: the record is the answer
        for answer in answers[1:]:  # the truthful answer: refused, the audit log says why
            assert isinstance(answer, AuditFailure), answer
            assert isinstance(answer.__cause__, AuditError)
            assert "Input/output error" in str(answer)
        assert recorder.failed is not None
        # what the kernel kept of them is unknown: nothing later claims a durable chain
        with pytest.raises(AuditFailure, match="unusable"):
            await recorder.record(log.write, event="after")
        recorder.close()
