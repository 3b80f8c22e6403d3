"""A command's stdin in the container runner, run on the host through the runner's own loop
(tests/support/runner_host.py): a plan that asks for it reads what the daemon's ``i`` frames
carry, past a full pipe, until ``c`` (EOF), on both ways a command starts (posix_spawn, the
forked plan executor); any other reads /dev/null and the frames reach nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.runner_host import run_request

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
#: more than a pipe holds (64 KiB): the runner keeps the rest until the command reads it
BIG = b"".join(b"%07d\n" % n for n in range(16_000))


def plan(*commands: list[str]) -> dict[str, Any]:
    """A plan of one pipeline of ``commands``."""
    return {"pipelines": [{"commands": [{"argv": argv} for argv in commands],
                           "run_if": "always"}]}


def chunks(data: bytes, size: int = 65536) -> list[tuple[bytes, bytes]]:
    return [(b"i", data[at:at + size]) for at in range(0, len(data), size)]


@pytest.mark.parametrize("commands", [(["cat"],), (["cat"], ["cat"])],
                         ids=["posix_spawn", "pipeline"])
def test_a_plan_with_stdin_reads_the_frames_until_their_end(
        tmp_path: Path, commands: tuple[list[str], ...]) -> None:
    reply = run_request({"kind": "plan", "env": ENV, "plan": plan(*commands), "stdin": True},
                        tmp_path, frames=[(b"i", b"first\n"), *chunks(BIG), (b"c", b"")])
    assert reply.started and reply.record.error is None, reply.record
    assert reply.stdout == b"first\n" + BIG
    assert reply.record.exit_code == 0  # EOF at ``c``: cat ended by itself


def test_a_plan_without_stdin_reads_dev_null_and_ignores_the_frames(tmp_path: Path) -> None:
    reply = run_request({"kind": "plan", "env": ENV, "plan": plan(["cat"])}, tmp_path,
                        frames=[(b"i", b"never read\n"), (b"c", b"")])
    assert reply.stdout == b"" and reply.record.exit_code == 0, reply


def test_input_a_command_does_not_read_never_holds_up_the_loop(tmp_path: Path) -> None:
    # the command ends without reading: what the pipe did not take is dropped, and the call
    # ends as usual (the loop never blocks on a pipe nobody reads)
    reply = run_request({"kind": "plan", "env": ENV, "plan": plan(["true"]), "stdin": True},
                        tmp_path, frames=chunks(BIG), timeout_s=10)
    assert reply.record.exit_code == 0 and reply.record.error is None, reply
