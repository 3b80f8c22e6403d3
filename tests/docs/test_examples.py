"""Every example the catalogue runs (tests/docs/catalogue.py), run against a real daemon: shell
examples as argv lists without a shell (the docs' address and ``$VARIABLES`` substituted),
Python examples as scripts, JSON samples against a real result of the same call. Where the doc
shows output, the real output must match it (tests/docs/compare.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client.scripted_llm import ScriptedLLM, text_reply, tool_call_reply
from tests.docs.blocks import (
    Block,
    Command,
    all_blocks,
    console_commands,
    layout_missing,
    pipeline,
    script_commands,
    substitute,
)
from tests.docs.catalogue import CATALOGUE, Entry
from tests.docs.compare import output_problems, shape_problems, text_problems
from tests.docs.conftest import TokenDaemon
from tests.support.daemon import RunningDaemon, uid_range_env
from tests.support.mcp_raw import RawMcp

TIMEOUT = 300.0  # catches a hang; every example ends in seconds
#: the programs shell examples may name, and what runs for each (never a shell)
PROGRAMS = {"curl": ["curl"], "jq": ["jq"], "sandboxd": [sys.executable, "-m", "sandboxd"],
            ".venv/bin/sandboxd": [sys.executable, "-m", "sandboxd"]}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")} | {
    "SANDBOXD_CONFIG": os.devnull}


def block_of(entry: Entry, marker: str | None = None) -> Block:
    (block,) = [b for b in all_blocks() if b.file == entry.file and (marker or entry.marker)
                in b.text]
    return block


def run_pipeline(stages: list[list[str]], cwd: Path, env: dict[str, str]) -> str:
    """Run ``a | b | ...`` (argv lists, no shell); every stage must exit 0; stdout of the
    last."""
    procs: list[tuple[list[str], subprocess.Popen[bytes], Path]] = []
    previous = None
    try:
        for i, argv in enumerate(stages):
            program = PROGRAMS.get(argv[0])
            assert program is not None, f"no runner knows the program {argv[0]!r} (tests/docs)"
            assert shutil.which(program[0]), f"{program[0]} is not installed (make doc-tools)"
            err = cwd / f".stderr-{i}"
            with open(err, "wb") as err_file:
                proc = subprocess.Popen([*program, *argv[1:]], stdin=previous,
                                        stdout=subprocess.PIPE, stderr=err_file, cwd=cwd,
                                        env=env)
            if previous is not None:
                previous.close()
            previous = proc.stdout
            procs.append((argv, proc, err))
        out, _ = procs[-1][1].communicate(timeout=TIMEOUT)
        for argv, proc, err in procs:
            code = proc.wait(TIMEOUT)
            assert code == 0, f"{argv[0]} exited {code}: {err.read_text(errors='replace')}"
    finally:
        for _, proc, _ in procs:  # nothing outlives a failed example
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
    return out.decode()


def run_commands(commands: list[Command], url: str, cwd: Path, entry: Entry,
                 variables: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
    """Each command against the daemon at ``url``; its output compared with the doc's."""
    env = ENV | {"SANDBOXD_URL": url} | (env or {})
    for command in commands:
        stages = [substitute(argv, url, variables or {}) for argv in pipeline(command.line)]
        if stages[0][0] == "sudo":  # the tests run as root; sudo is the doc's reminder
            stages[0] = stages[0][1:]
        out = run_pipeline(stages, cwd, env)
        if command.output.strip():
            problems = output_problems(command.output, out, entry.volatile, entry.patterns)
            assert problems == [], f"{command.line}\n" + "\n".join(problems) + f"\n---\n{out}"


def console(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    daemon: RunningDaemon = request.getfixturevalue("doc_daemon")
    run_commands(console_commands(block_of(entry).text), daemon.url, tmp_path, entry)


def doctor(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`sandboxd doctor` on this host (a state directory of its own; no daemon needed)."""
    if os.geteuid() != 0:
        pytest.fail("the doctor example runs as root (sudo)")
    commands = [Command(f"{c.line} --state-dir {tmp_path / 'state'}", c.output)
                for c in console_commands(block_of(entry).text)]
    run_commands(commands, "http://127.0.0.1:9", tmp_path, entry, env=uid_range_env())


def result_shape(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The result format: a real result of the call it shows (``print(6*7)``) has the same
    keys at every level."""
    daemon: RunningDaemon = request.getfixturevalue("doc_daemon")
    shown = json.loads(block_of(entry).text)
    r = daemon.invoke("python", {"code": "print(6*7)"})
    assert r.status_code == 200, r.text
    assert shown["stdout"] == r.json()["stdout"]
    assert shape_problems(shown, r.json()) == []


def transfer(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Upload a photo, download a result: in a session ($SID) whose code wrote
    out/result.png, from a directory holding photo.jpg."""
    daemon: RunningDaemon = request.getfixturevalue("doc_daemon")
    sid = daemon.client.post("/v1/sessions").json()["id"]
    try:
        photo, png = os.urandom(50_000), b"\x89PNG\r\n\x1a\n" + os.urandom(1000)
        (tmp_path / "photo.jpg").write_bytes(photo)
        r = daemon.client.put(f"/v1/sessions/{sid}/files/out/result.png", content=png)
        assert r.status_code == 200, r.text
        run_commands(script_commands(block_of(entry).text), daemon.url, tmp_path, entry,
                     {"SID": sid})
        assert (tmp_path / "result.png").read_bytes() == png
        assert daemon.client.get(f"/v1/sessions/{sid}/files/in/photo.jpg").content == photo
    finally:
        daemon.client.delete(f"/v1/sessions/{sid}")


def run_python(code: str, cwd: Path) -> str:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT, cwd=cwd, env=ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def client(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The client example, its LLM a scripted OpenAI-compatible server that asks for one
    python call and then answers."""
    daemon: RunningDaemon = request.getfixturevalue("doc_daemon")

    def script(body: dict[str, Any], n: int) -> Any:
        if n == 0:
            return tool_call_reply([("python", {"code": "print(12345 * 54321)"})])
        assert "670592745" in json.dumps(body["messages"][-1])
        return text_reply("12345 * 54321 = 670592745")

    code = block_of(entry).text.replace("http://127.0.0.1:8765", daemon.url)
    with ScriptedLLM(script) as llm:
        code = code.replace("http://localhost:1234/v1", llm.url)
        out = run_python(code, tmp_path)
    assert out.startswith("42\n"), out
    assert out.rstrip().endswith("12345 * 54321 = 670592745"), out
    assert len(llm.requests) == 2


def datascience(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    daemon: RunningDaemon = request.getfixturevalue("doc_datascience_daemon")
    code = block_of(entry).text.replace("http://127.0.0.1:8765", daemon.url)
    out = run_python(code, tmp_path)
    assert entry.output is not None
    problems = text_problems(block_of(entry, entry.output).text, out, entry.patterns)
    assert problems == [], "\n".join(problems) + f"\n---\n{out}"


def _server(entry: Entry, token: TokenDaemon) -> dict[str, Any]:
    text = block_of(entry).text.replace("/home/me/.config/sandboxd/token", str(token.token_file))
    text = text.replace("sbx_...", token.token)
    text = substitute([text], token.daemon.url, {})[0]
    return json.loads(text)["mcpServers"]["sandboxd"]


def mcp_stdio(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The host's configuration for the stdio bridge: its command (the console script,
    here this checkout's) started with its args speaks MCP and lists the tools."""
    token: TokenDaemon = request.getfixturevalue("doc_token_daemon")
    server = _server(entry, token)
    assert Path(server["command"]).name == "sandboxd"
    proc = subprocess.Popen([*PROGRAMS["sandboxd"], *server["args"]], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        def ask(message: dict[str, Any]) -> dict[str, Any]:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()
            while True:
                answer = json.loads(proc.stdout.readline())
                if answer.get("id") == message["id"]:
                    return answer

        init = ask({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "docs", "version": "0"}}})
        assert "result" in init, init
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        tools = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert "python" in {t["name"] for t in tools["result"]["tools"]}, tools
        proc.stdin.close()
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def mcp_http(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The host's configuration for Streamable HTTP: its url and headers open a session."""
    token: TokenDaemon = request.getfixturevalue("doc_token_daemon")
    server = _server(entry, token)
    assert server["url"] == f"{token.daemon.url}/mcp"
    mcp = RawMcp(server["url"].removesuffix("/mcp"), headers=server["headers"])
    try:
        answer = mcp.call("python", {"code": "print(6*7)"})
        assert answer["result"]["structuredContent"]["stdout"] == "42\n", answer
    finally:
        mcp.close()


def layout(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The layout names files that exist."""
    assert layout_missing(block_of(entry).text) == []


RUNNERS: dict[str, Callable[[Entry, pytest.FixtureRequest, Path], None]] = {
    "console": console, "result_shape": result_shape, "transfer": transfer, "client": client,
    "datascience": datascience, "mcp_stdio": mcp_stdio, "mcp_http": mcp_http,
    "layout": layout, "doctor": doctor}


#: runners that use the Docker engine (the datascience image; doctor's container probes)
DOCKER = {"datascience", "doctor"}


@pytest.mark.parametrize("entry", [
    pytest.param(e, marks=[pytest.mark.docker] if e.run in DOCKER else [], id=e.id)
    for e in CATALOGUE if e.run])
def test_doc_example(entry: Entry, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    assert entry.run is not None
    RUNNERS[entry.run](entry, request, tmp_path)
