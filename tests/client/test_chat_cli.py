"""``sandboxd chat`` run as a real process with piped stdin, a scripted LLM and a real daemon."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.client.conftest import TokenDaemon
from tests.client.scripted_llm import (
    Reply,
    ScriptedLLM,
    last_tool_results,
    text_reply,
    tool_call_reply,
)
from tests.client.test_agent_e2e import multiply_script
from tests.support import cli
from tests.support.audit import audit_records
from tests.support.processes import busy_descendants
from tests.support.signals import default_signals
from tests.support.wait import wait_until


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOXD_", "OPENAI_"))}
    env["HOME"] = str(tmp_path)
    return env


def run_chat(tmp_path: Path, llm: ScriptedLLM, daemon: TokenDaemon, stdin: str,
             *extra: str) -> subprocess.CompletedProcess[str]:
    return cli.run("chat", "--llm", llm.url, "--model", "scripted", "--url", daemon.url,
                   "--token", daemon.token, *extra, input=stdin, timeout=120,
                   env=_env(tmp_path))


def test_chat_multiplies_with_python(tmp_path: Path, token_daemon: TokenDaemon) -> None:
    with ScriptedLLM(multiply_script) as llm:
        out = run_chat(tmp_path, llm, token_daemon, "What is 12345 * 54321?\n",
                       "--tools", "python")
    assert out.returncode == 0, out.stderr
    assert llm.rejections == []
    assert '-> python {"code": "print(12345 * 54321)"}' in out.stdout
    assert f"<- ok: {12345 * 54321}" in out.stdout
    assert f"12345 * 54321 = {12345 * 54321}" in out.stdout


def test_chat_session_keeps_files_across_turns(tmp_path: Path,
                                               token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        results = last_tool_results(body)
        if results:
            return text_reply(f"tool said: {results[0]['content']}")
        question = body["messages"][-1]["content"]
        if question.startswith("save"):
            return tool_call_reply([("write_file", {"path": "memo.txt", "content": "buy milk"})],
                                   ids=[f"w{n}"])
        return tool_call_reply([("read_file", {"path": "memo.txt"})], ids=[f"r{n}"])

    with ScriptedLLM(script) as llm:
        out = run_chat(tmp_path, llm, token_daemon, "save a memo\n/tools\nread it back\n",
                       "--tools", "write_file,read_file")
    assert out.returncode == 0, out.stderr
    assert llm.rejections == []
    assert "write_file, read_file" in out.stdout  # the /tools command
    assert "tool said: buy milk" in out.stdout  # second turn read what the first wrote
    # the second turn's request carried the whole first turn
    roles = [m["role"] for m in llm.requests[-2]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert "session ses_" in out.stderr


def test_chat_rejects_unknown_tool(tmp_path: Path, token_daemon: TokenDaemon) -> None:
    with ScriptedLLM() as llm:
        out = run_chat(tmp_path, llm, token_daemon, "", "--tools", "python,teleport")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("sandboxd chat: unknown tool 'teleport'")
    assert llm.requests == []


def test_chat_unreachable_sandbox_is_one_line(tmp_path: Path) -> None:
    from tests.support.daemon import refused_port

    with refused_port() as llm, refused_port() as sandbox:
        out = cli.run("chat", "--llm", f"http://127.0.0.1:{llm}/v1", "--model", "m",
                      "--url", f"http://127.0.0.1:{sandbox}", input="", timeout=120,
                      env=_env(tmp_path))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert f"cannot use sandboxd at http://127.0.0.1:{sandbox}" in out.stderr


def test_chat_takes_url_like_every_command_and_sandbox_still_works(
        tmp_path: Path, token_daemon: TokenDaemon) -> None:
    """``--url`` as in every other command; the old ``--sandbox`` still works, with a note."""
    with ScriptedLLM(multiply_script) as llm:
        out = cli.run("chat", "--llm", llm.url, "--model", "scripted",
                      "--sandbox", token_daemon.url, "--token", token_daemon.token,
                      "--tools", "python", input="What is 12345 * 54321?\n", timeout=120,
                      env=_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"<- ok: {12345 * 54321}" in out.stdout
    assert "--sandbox is deprecated; use --url" in out.stderr
    assert "--url" in cli.run("chat", "--help", timeout=60, env=_env(tmp_path)).stdout


class _Reader(threading.Thread):
    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.text = ""

    def run(self) -> None:
        for chunk in iter(lambda: self.stream.read1(4096), b""):
            self.text += chunk.decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60) -> None:
        wait_until(lambda: re.search(pattern, self.text), timeout=timeout,
                   what=f"{pattern!r} in the output", detail=lambda: f"\n{self.text}")


def _interactive_chat(tmp_path: Path, llm: ScriptedLLM, daemon: TokenDaemon,
                      *extra: str) -> tuple[subprocess.Popen[bytes], _Reader]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "chat", "--llm", llm.url, "--model", "scripted",
         "--url", daemon.url, "--token", daemon.token, *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=_env(tmp_path), preexec_fn=default_signals)
    reader = _Reader(proc.stdout)
    reader.start()
    return proc, reader


def test_ctrl_c_cancels_the_streaming_turn_only(tmp_path: Path,
                                                token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return Reply(text_reply("tick " * 400, pieces=400).chunks, delay_s=0.05)
        return text_reply(f"second answer after {body['messages'][-2]['content']}")

    with ScriptedLLM(script) as llm:
        proc, reader = _interactive_chat(tmp_path, llm, token_daemon, "--tools", "read_file")
        assert proc.stdin is not None
        proc.stdin.write(b"first question\n")
        proc.stdin.flush()
        reader.wait_for(r"tick tick")
        proc.send_signal(signal.SIGINT)
        reader.wait_for(r"\[cancelled\]")
        proc.stdin.write(b"second question\n")
        proc.stdin.close()
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
        reader.join(10)
    assert llm.rejections == []
    assert llm.disconnects == 1
    assert "second answer after [interrupted by the user]" in reader.text
    assert reader.text.count("tick") < 400


def test_ctrl_c_cancels_a_running_sandbox_call(tmp_path: Path,
                                               own_token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return tool_call_reply([("python", {"code": "while True:\n    pass"})])
        return text_reply("after: " + body["messages"][-2]["content"])

    with ScriptedLLM(script) as llm:
        proc, reader = _interactive_chat(tmp_path, llm, own_token_daemon, "--tools", "python",
                                         "--tool-timeout", "120")
        assert proc.stdin is not None
        proc.stdin.write(b"spin forever\n")
        proc.stdin.flush()
        reader.wait_for(r"-> python")
        wait_until(lambda: busy_descendants(own_token_daemon.daemon.proc.pid), timeout=60,
                   interval=0, what="the call's busy loop running in the sandbox")
        proc.send_signal(signal.SIGINT)
        reader.wait_for(r"\[cancelled\]", timeout=30)
        proc.stdin.write(b"what happened?\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
        reader.join(10)
    assert llm.rejections == []  # the interrupted call still got its tool message
    sent = llm.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[2]["content"].startswith("Cancelled")
    assert "after: Cancelled" in reader.text
    audit = own_token_daemon.daemon.audit_path
    reasons = wait_until(lambda: [r["termination"]["reason"] for r in audit_records(audit, "result")
                                  if r.get("tool") == "python"],
                         timeout=30, interval=0.2, what="the python call's result record")
    assert reasons == ["cancelled"]


def test_chat_llm_error_is_reported_and_chat_goes_on(tmp_path: Path,
                                                     token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return Reply(status=404, json_body={"error": {"message": "model 'scripted' not found"}})
        return text_reply(f"fine now; history has {len(body['messages'])} message(s)")

    with ScriptedLLM(script) as llm:
        out = run_chat(tmp_path, llm, token_daemon, "hello\nhello again\n", "--tools",
                       "read_file")
    assert out.returncode == 1  # scripted run: a failed turn is reported in the exit status
    assert "error: LLM server answered 404" in out.stderr
    assert "model 'scripted' not found" in out.stderr
    assert "fine now; history has 1 message(s)" in out.stdout  # the failed turn was dropped


def test_interactive_terminal_prompts_and_readline_history(tmp_path: Path,
                                                           token_daemon: TokenDaemon) -> None:
    import pty
    import select
    import termios

    hist = tmp_path / "chat_history"

    def script(body: dict[str, Any], n: int) -> Reply:
        return text_reply(f"echo {body['messages'][-1]['content']}")

    with ScriptedLLM(script) as llm:
        pid, fd = pty.fork()
        if pid == 0:  # the child: a chat on a real terminal
            os.execve(sys.executable, [
                sys.executable, "-m", "sandboxd", "chat", "--llm", llm.url, "--model", "m",
                "--url", token_daemon.url, "--token", token_daemon.token,
                "--tools", "read_file", "--history-file", str(hist)], _env(tmp_path))
        out = b""
        status: int | None = None

        def pump_until(pattern: bytes, count: int = 1, timeout: float = 30) -> None:
            nonlocal out
            deadline = time.monotonic() + timeout
            while out.count(pattern) < count:
                assert time.monotonic() < deadline, out.decode(errors="replace")
                ready, _, _ = select.select([fd], [], [], 0.1)
                if ready:
                    try:
                        out += os.read(fd, 4096)
                    except OSError:
                        break

        try:
            pump_until(b"you> ")
            os.write(fd, b"hello there\r")
            pump_until(b"bot> echo hello there")
            pump_until(b"you> ", count=2)
            # readline takes the terminal (non-canonical mode) before the key arrives
            wait_until(lambda: not termios.tcgetattr(fd)[3] & termios.ICANON, timeout=30,
                       what="readline to take the terminal")
            os.write(fd, b"\x04")  # Ctrl-D

            def exited() -> tuple[int] | None:
                done, code = os.waitpid(pid, os.WNOHANG)
                return (code,) if done else None

            (status,) = wait_until(exited, timeout=30, what="the chat to exit on Ctrl-D",
                                   detail=lambda: out.decode(errors="replace"))
        finally:
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(fd)
    assert status is not None, out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0
    assert hist.read_text().splitlines()[-1] == "hello there"
