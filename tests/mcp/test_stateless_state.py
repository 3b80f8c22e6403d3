"""State across calls at the stateless revision (2026-07-28, SEP-2567), with the official SDK's
``Client`` in its default mode (it negotiates 2026-07-28), over Streamable HTTP and through the
stdio bridge: a call's result names the sandboxd session it ran in (``structuredContent`` and
a last text block), and the model passes it back as the tools' ``session`` argument to keep
its variables and files, as an MCP session keeps them in the handshake era. The handle is its
caller's: another client's, or a forged one, is refused and nothing runs. Minted sessions are
bounded: the session TTL, and a per-client cap that ends the least recently used one.

State needs a real kernel: those run on the real daemon; the bounds (a protocol matter) on the
daemon's app in process with small settings."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.api.mcp.handles import note
from sandboxd.backends.scripted import NOTHING_TO_CLEAN
from sandboxd.models import Invocation, Limits, Reason, Result
from tests.mcp.conftest import McpDaemon, _mcp_setup, sdk_client, text_of
from tests.support.inprocess import inprocess_daemon
from tests.support.wait import async_wait_until

TRANSPORTS = ["http", "stdio"]


@pytest.fixture(scope="module", autouse=True)
def warm_door(mcp_daemon: McpDaemon) -> None:
    """The daemon loads the MCP SDK on its first ``/mcp`` request: done here, so that on a
    loaded machine the SDK client's ``server/discover`` probe (10 s) through a starting bridge
    does not time out and fall back to the handshake, which these tests are not about."""
    assert mcp_daemon.daemon.client.get("/mcp").status_code < 500


def handle_of(result: Any) -> str:
    """The session a stateless result names, in both places a model or a host reads."""
    sid = result.structured_content["session"]
    assert isinstance(sid, str) and sid.startswith("ses_"), result
    assert result.content[-1].text == note(sid), result
    return sid


def output_of(result: Any) -> str:
    """What the call printed (the blocks before the session's)."""
    return "".join(c.text for c in result.content[:-1] if c.type == "text")


def refused(result: Any) -> bool:
    """Nothing ran: the session named is none of the caller's (as a native session id)."""
    text = text_of(result)
    return (result.is_error is True and result.structured_content is None
            and "nothing ran" in text and "does not exist" in text)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_model_keeps_its_state_by_passing_the_session_back(mcp_daemon: McpDaemon,
                                                                   transport: str) -> None:
    async with sdk_client(transport, mcp_daemon) as client:
        assert client.session.discover_result is not None, "not the stateless revision"
        assert client.session.initialize_result is None
        schema = {t.name: t for t in (await client.list_tools()).tools}["python"].input_schema
        assert schema["properties"]["session"]["type"] == "string", schema
        assert "session" not in schema.get("required", []), schema
        wrote = await client.call_tool(
            "python", {"code": "x = 41\nopen('kept.txt', 'w').write('kept')"})
        assert wrote.is_error is False, wrote
        sid = handle_of(wrote)
        kept = await client.call_tool("python", {"code": "print(x + 1)", "session": sid})
        assert output_of(kept).strip() == "42" and handle_of(kept) == sid, kept
        read = await client.call_tool("read_file", {"path": "kept.txt", "session": sid})
        assert read.is_error is False and "kept" in output_of(read), read
        fresh = await client.call_tool("python", {"code": "print(x)"})  # a new session
        assert fresh.is_error is True and "NameError" in text_of(fresh), fresh
        assert handle_of(fresh) != sid
    # the handle outlives the connection (a bridge is a process: over HTTP, cheaper)
    async with sdk_client("http", mcp_daemon) as later:
        assert later.session.discover_result is not None
        again = await later.call_tool("python", {"code": "print(x)", "session": sid})
        assert output_of(again).strip() == "41", again
    async with sdk_client(transport, mcp_daemon, name="bob") as bob:
        for forged in (sid, sid[:-1] + ("y" if sid[-1] != "y" else "z"), "ses_forged"):
            theirs = await bob.call_tool("python", {"code": "print(x)", "session": forged})
            assert refused(theirs), (forged, theirs)
            assert "session" in text_of(theirs) and "leave out" in text_of(theirs)
    bobs = [r for r in mcp_daemon.records() if r.get("client") == "bob"
            and r["event"] in ("decision", "result", "session_created")]
    assert bobs == [], bobs  # nothing of bob's ran, and no session was made for him


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_client_may_still_name_its_session_in_meta(mcp_daemon: McpDaemon,
                                                           transport: str) -> None:
    """A client that made a session itself (``POST /v1/sessions``) names it in ``_meta``."""
    sid = mcp_daemon.daemon.client.post("/v1/sessions").json()["id"]
    named = {"sandboxd/session": sid}
    async with sdk_client(transport, mcp_daemon) as client:
        await client.call_tool("python", {"code": "y = 6"}, meta=named)
        kept = await client.call_tool("python", {"code": "print(y * 7)"}, meta=named)
        assert output_of(kept).strip() == "42" and handle_of(kept) == sid, kept
    async with sdk_client(transport, mcp_daemon, name="bob") as bob:
        assert refused(await bob.call_tool("python", {"code": "print(y)"}, meta=named))


async def test_the_handshake_era_lists_no_handle(inproc_mcp_daemon: McpDaemon) -> None:
    """An MCP session keeps the state there: its tools take no ``session``, its results
    name none."""
    async with sdk_client("http", inproc_mcp_daemon, mode="legacy") as client:
        assert client.session.initialize_result is not None
        tools = (await client.list_tools()).tools
        assert all("session" not in t.input_schema.get("properties", {}) for t in tools
                   if t.name != "fork_session")  # its own argument: the session it forks
        result = await client.call_tool("python", {"code": "1"})
        assert not any("pass \"session\"" in c.text for c in result.content
                       if c.type == "text"), result


def _capped(tmp_path: Path, ttl_s: int) -> Iterator[McpDaemon]:
    policies, tokens, env = _mcp_setup(tmp_path)
    env |= {"SANDBOXD_MCP_MAX_SESSIONS_PER_CLIENT": "2", "SANDBOXD_SESSION_TTL_S": str(ttl_s)}
    with inprocess_daemon(tmp_path, policies_dir=policies, env=env, token=tokens["alice"]) as d:
        yield McpDaemon(d, tokens, policies, tmp_path)


@pytest.fixture
def small_caps(tmp_path: Path) -> Iterator[McpDaemon]:
    """The daemon's app in process: two minted sessions per client, sessions that outlast a
    loaded host's slowest test (a short TTL would end one under the test's feet)."""
    yield from _capped(tmp_path, 600)


@pytest.fixture
def short_ttl(tmp_path: Path) -> Iterator[McpDaemon]:
    """As :func:`small_caps`, with a 2 s session TTL: for the test of expiry itself."""
    yield from _capped(tmp_path, 2)


async def test_minted_sessions_are_capped_least_recently_used_first(
        small_caps: McpDaemon) -> None:
    d = small_caps
    async with sdk_client("http", d) as client:
        first = handle_of(await client.call_tool("python", {"code": "1"}))
        second = handle_of(await client.call_tool("python", {"code": "2"}))
        used = await client.call_tool("python", {"code": "3", "session": first})
        assert handle_of(used) == first  # now second is the least recently used
        third = handle_of(await client.call_tool("python", {"code": "4"}))
        listed = {s["id"] for s in d.daemon.client.get("/v1/sessions").json()}
        assert listed == {first, third}, listed
        assert refused(await client.call_tool("python", {"code": "5", "session": second}))
    ended = [r for r in d.records() if r["event"] == "session_deleted"]
    assert [r["session"] for r in ended] == [second], ended
    assert "mcp_max_sessions_per_client" in ended[0]["reason"], ended
    assert ended[0]["transport"] == "mcp"


async def test_a_minted_session_expires_after_the_session_ttl(short_ttl: McpDaemon) -> None:
    d = short_ttl
    async with sdk_client("http", d) as client:
        sid = handle_of(await client.call_tool("python", {"code": "1"}))
        await async_wait_until(
            lambda: [r for r in d.records()
                     if r["event"] == "session_expired" and r["session"] == sid],
            timeout=30, interval=0.1, what="the minted session's expiry")
        assert refused(await client.call_tool("python", {"code": "1", "session": sid}))


async def test_a_burst_without_handles_mints_exactly_the_cap(small_caps: McpDaemon) -> None:
    """Eight calls at once that name no session, each held in its backend until the test lets
    it go: two get a minted session (the cap), the six others are refused (no idle minted
    session to end for them), and no more than two sessions are ever made."""
    d = small_caps
    let_go = threading.Event()

    async def held(call: Invocation, limits: Limits) -> Result:
        await asyncio.to_thread(let_go.wait, 120)
        return Result.build(call, None, Reason.exited, exit_code=0, stdout="done\n",
                            limits=limits, cleanup=NOTHING_TO_CLEAN)

    d.daemon.python.script = held
    async with sdk_client("http", d) as client:
        calls = [asyncio.create_task(client.call_tool("python", {"code": "1"}))
                 for _ in range(8)]
        try:
            await async_wait_until(lambda: sum(c.done() for c in calls) >= 6, timeout=120,
                                   interval=0.05, what="the calls past the cap to be refused")
            refusals = [c.result() for c in calls if c.done()]
            assert len(refusals) == 6, [text_of(r) for r in refusals]
            for refusal in refusals:
                assert refusal.is_error and "mcp_max_sessions_per_client" in text_of(refusal), \
                    text_of(refusal)
            assert len(d.daemon.client.get("/v1/sessions").json()) == 2
        finally:
            let_go.set()
        ran = [r for r in await asyncio.gather(*calls) if not r.is_error]
        assert len(ran) == 2 and {handle_of(r) for r in ran} == {
            s["id"] for s in d.daemon.client.get("/v1/sessions").json()}, ran
    created = [r for r in d.records() if r["event"] == "session_created"]
    assert len(created) == 2, created
