"""Hot reload: a good file takes effect; a broken one is refused, audited, and the old stays."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from sandboxd.policy import PolicyError, PolicyStore
from tests.policy.helpers import write
from tests.support.wait import async_wait_until

GOOD = """\
version: 1
name: p
clients: ["*"]
tools:
  shell:
    commands: {{allow: [{allowed}]}}
"""


def make(tmp_path: Path) -> tuple[PolicyStore, Path, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    d = tmp_path / "policies"
    write(d, "p.yaml", GOOD.format(allowed="ls"))
    store = PolicyStore(d, on_event=lambda event, fields: events.append((event, fields)))
    store.load()
    return store, d, events


def allowed(store: PolicyStore, program: str) -> bool:
    return store.decide("local", "shell", {"command": program}, None).allowed


def test_reload_good_file(tmp_path: Path) -> None:
    store, d, events = make(tmp_path)
    assert allowed(store, "ls") and not allowed(store, "cat")
    (d / "p.yaml").write_text(GOOD.format(allowed="ls, cat"))
    assert store.reload() is True
    assert allowed(store, "cat")
    assert [e for e, _ in events] == ["policy_loaded", "policy_loaded"]
    files = events[-1][1]["files"]
    assert files[0]["source"] == str(d / "p.yaml") and len(files[0]["sha256"]) == 64


def test_reload_broken_file_keeps_previous_policy(tmp_path: Path) -> None:
    store, d, events = make(tmp_path)
    (d / "p.yaml").write_text(GOOD.format(allowed="ls, cat") + "  oops: [\n")
    assert store.reload() is False
    assert allowed(store, "ls") and not allowed(store, "cat")  # old policy in force
    event, fields = events[-1]
    assert event == "policy_refused"
    assert fields["kept_previous"] is True
    assert fields["files"] == [str(d / "p.yaml")]
    assert fields["errors"][0].startswith(f"{d / 'p.yaml'}:8:")
    assert store.last_error == fields["errors"]


def test_initial_load_of_broken_set_raises_and_is_reported(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    d = tmp_path / "policies"
    write(d, "p.yaml", "version: 2\nname: p\nclients: ['*']\n")
    store = PolicyStore(d, on_event=lambda e, f: events.append((e, f)))
    with pytest.raises(PolicyError) as info:
        store.load()
    assert info.value.problems == [f"{d / 'p.yaml'}:1:10: version: Input should be 1"]
    assert events[0][0] == "policy_refused" and events[0][1]["kept_previous"] is False


def test_failing_event_sink_does_not_break_reload(tmp_path: Path) -> None:
    d = tmp_path / "policies"
    write(d, "p.yaml", GOOD.format(allowed="ls"))

    def sink(event: str, fields: dict[str, Any]) -> None:
        raise OSError("disk full")

    store = PolicyStore(d, on_event=sink)
    store.load()
    assert store.reload() is True


async def test_watch_reloads_on_change_and_refuses_broken(tmp_path: Path) -> None:
    store, d, events = make(tmp_path)
    task = asyncio.create_task(store.watch(interval_s=0.05))
    try:
        await asyncio.sleep(0)  # the watcher takes its first snapshot of the files
        (d / "p.yaml").write_text(GOOD.format(allowed="ls, cat"))
        await async_wait_until(lambda: allowed(store, "cat"), timeout=10,
                               what="the edit that allows cat")
        # a broken edit: refused, the good policy stays
        (d / "p.yaml").write_text("version: 1\nname: p\nclients: ['*']\ntools: {shell: 3}\n")
        await async_wait_until(lambda: events[-1][0] == "policy_refused", timeout=10,
                               what="the broken edit refused")
        assert allowed(store, "cat")
        assert events[-1][1]["errors"][0] == (
            f"{d / 'p.yaml'}:4:16: tools.shell: expected a mapping (key: value pairs)")
        # a new file in the directory is picked up as well
        write(d, "q.yaml", "version: 1\nname: q\nclients: [alice]\ntools: {python: {}}\n")
        (d / "p.yaml").write_text(GOOD.format(allowed="wc"))
        await async_wait_until(lambda: events[-1][0] == "policy_loaded" and allowed(store, "wc"),
                               timeout=10, what="the new file and the wc edit loaded")
        assert store.clients() == {"alice": "q", "*": "p"}
        # removing a file is a change too
        os.unlink(d / "q.yaml")
        await async_wait_until(lambda: "alice" not in store.clients(), timeout=10,
                               what="the removed file's client gone")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
