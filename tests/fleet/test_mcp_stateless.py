"""MCP's sessionless revision (2026-07-28) behind a fleet: a call names its sandboxd session
only in its JSON body (the tool's ``session`` argument, or ``_meta``'s ``sandboxd/session``),
and HAProxy reads it there to send the call to that session's node.

Three real daemons behind a real HAProxy started with the generated configuration, and the
official MCP SDK's ``Client`` in its default mode (it negotiates 2026-07-28), a new one (a new
connection) for every call, as a host that keeps nothing but the handle the model passes back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from sandboxd.fleet import BODY_BUFFER_BYTES
from tests.support.fleet import Fleet, running_fleet

#: calls after the first: leastconn spreads so many unrouted calls over 2+ of 3 nodes
CALLS = 8


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as f:
        # each node loads the MCP SDK on its first /mcp request: done here, so that the SDK
        # client's server/discover probe (10 s) does not time out and fall back to the
        # handshake, which these tests are not about
        for daemon in f.nodes.values():
            assert daemon.client.get("/mcp").status_code < 500
        yield f


@contextlib.asynccontextmanager
async def stateless(fleet: Fleet) -> AsyncIterator[Client]:
    """The SDK's client through the proxy, on a connection of its own, at 2026-07-28."""
    async with (create_mcp_http_client() as http,
                Client(streamable_http_client(f"{fleet.url}/mcp", http_client=http)) as client):
        assert client.session.discover_result is not None, "not the stateless revision"
        assert client.session.initialize_result is None
        yield client


def turn_the_pool(fleet: Fleet, times: int) -> None:
    """``times`` requests to the pool: each client makes the same requests in the same order,
    so on a quiet fleet its call would reach the pool at the same point of its rotation, and
    so the same node, every time; other clients' requests move it on in a real fleet."""
    for _ in range(times):
        assert fleet.client.get("/healthz").status_code == 200


async def call(fleet: Fleet, code: str, arguments: dict[str, Any] | None = None,
               meta: dict[str, Any] | None = None, turn: int = 0) -> dict[str, Any]:
    """The sandboxd result (``structuredContent``) of one ``python`` call on a new client,
    after ``turn`` requests that move the pool on."""
    turn_the_pool(fleet, turn)
    async with stateless(fleet) as client:
        result = await client.call_tool("python", {"code": code, **(arguments or {})},
                                        meta=meta)
    assert result.structured_content is not None, result
    return result.structured_content


async def test_a_session_passed_back_reaches_its_node(fleet: Fleet) -> None:
    first = await call(fleet, "x = 41")
    sid, node = first["session"], first["node"]
    assert first["status"] == "ok" and sid.startswith(f"ses_{node}_"), first
    for turn in range(CALLS):
        kept = await call(fleet, "print(x + 1)", {"session": sid}, turn=turn)
        assert (kept["node"], kept["session"], kept["stdout"]) == (node, sid, "42\n"), kept
    # the same calls without the session (one-shot here: each mints a session of its own) go
    # to any ready node: what the ones above would have done unrouted
    unrouted = {(await call(fleet, "print(1)", turn=turn))["node"] for turn in range(CALLS)}
    assert len(unrouted) >= 2, unrouted


async def test_a_session_named_in_meta_reaches_its_node(fleet: Fleet) -> None:
    """A session the client made itself (``POST /v1/sessions``) named in ``_meta``."""
    view = fleet.client.post("/v1/sessions", json={}).json()
    sid, node = view["id"], view["node"]
    named = {"sandboxd/session": sid}
    try:
        await call(fleet, "y = 6", meta=named)
        for turn in range(CALLS):
            kept = await call(fleet, "print(y * 7)", meta=named, turn=turn)
            assert (kept["node"], kept["session"], kept["stdout"]) == (node, sid, "42\n"), kept
    finally:
        fleet.client.delete(f"/v1/sessions/{sid}")


async def test_a_forged_session_routes_nowhere_special(fleet: Fleet) -> None:
    """An id that names no node of the fleet, or is not an id at all, goes to a ready node,
    which refuses a session it does not hold: nothing runs."""
    for forged in ("ses_n9_abc", "ses_n1_abc def", "ses_n1_../x", "ses_n1_abc_n2"):
        async with stateless(fleet) as client:
            result = await client.call_tool("python", {"code": "print(1)", "session": forged})
        assert result.is_error is True and result.structured_content is None, (forged, result)


async def test_a_body_past_the_buffer_goes_unread(fleet: Fleet) -> None:
    """The bound: a call whose body is longer than the proxy's buffer, with the session last,
    is routed as one without a session; on the session's node it still runs in it."""
    first = await call(fleet, "z = 5")
    sid, node = first["session"], first["node"]
    padding = "#" + "p" * BODY_BUFFER_BYTES + "\nprint(z)"
    seen = set()
    for turn in range(CALLS):
        turn_the_pool(fleet, turn)
        async with stateless(fleet) as client:
            result = await client.call_tool("python", {"code": padding, "session": sid})
        if result.structured_content is None:  # another node: refused, nothing ran
            assert result.is_error is True, result
        else:
            assert result.structured_content["stdout"] == "5\n", result
        seen.add(node if result.structured_content is not None else "another")
    assert "another" in seen, seen  # not every such call reached the session's node
