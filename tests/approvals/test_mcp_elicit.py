"""Approvals over MCP with the official SDK's client: where the rule lets the host's user
answer (``approve: {elicit: true}``), a host that declared elicitation is asked with a form
naming what will run, where and under which rule; its yes runs the call, its no refuses it
(nothing written), each audited as decided by that client's host."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from sandboxd.access.tokens import add_token
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import async_wait_until

POLICY = """\
version: 1
name: asks-the-host
clients: [alice, lead]
tools:
  python:
    backend: restricted
    approve: {by: [lead], elicit: true, approval_timeout_s: 120}
"""
#: bob's calls wait for the lead alone: his host is never asked, though it could answer
APPROVER_ONLY = """\
version: 1
name: approver-only
clients: [bob]
tools:
  python:
    backend: restricted
    approve: {by: [lead], approval_timeout_s: 120}
"""
WRITE = "open('proof.txt', 'w').write('ran')\nprint('wrote')"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("elicit")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "asks.yaml").write_text(POLICY)
    (tmp / "policies" / "approver-only.yaml").write_text(APPROVER_ONLY)
    tokens = tmp / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in ("alice", "bob", "lead")}
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0"}
    with running_daemon(tmp, policies_dir=tmp / "policies", env=env,
                        token=keys["alice"]) as d:
        yield d, keys


async def _call_with_answer(d: RunningDaemon, token: str, approve: bool | None,
                            lead: str | None = None
                            ) -> tuple[Any, list[types.ElicitRequestParams], bool]:
    """One python call from a host whose user answers ``approve`` (None: dismisses); also
    whether the file the call writes is in its session's workspace (looked at on disk while
    the MCP session, and so its workspace, lives)."""
    asked: list[types.ElicitRequestParams] = []

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        if approve is None:
            return types.ElicitResult(action="cancel")
        return types.ElicitResult(action="accept" if approve else "decline",
                                  content={"approve": True} if approve else None)

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (http, streamable_http_client(f"{d.url}/mcp", http_client=http) as (r, w),
                ClientSession(r, w, elicitation_callback=answer) as session):
        await session.initialize()
        call = asyncio.create_task(session.call_tool("python", {"code": WRITE}))
        if lead is not None:  # the approver answers over HTTP meanwhile
            await _approve_over_http(d, lead)
        result = await call
        written = (_workspace(d, result.structured_content["session"]) / "proof.txt").exists()
    return result, asked, written


async def _approve_over_http(d: RunningDaemon, lead: str) -> None:
    headers = {"Authorization": f"Bearer {lead}"}
    async with httpx.AsyncClient(base_url=d.url, headers=headers, timeout=60) as http:
        async def pending() -> list[dict[str, Any]]:
            return (await http.get("/v1/approvals")).json()  # type: ignore[no-any-return]

        [waiting] = await async_wait_until(pending, timeout=60, what="the pending approval")
        r = await http.post(f"/v1/approvals/{waiting['id']}", json={"decision": "approve"})
        assert r.status_code == 200, r.text


def _workspace(d: RunningDaemon, session: str | None) -> Path:
    assert session is not None
    return d.state_dir / "workspaces" / session


async def test_the_hosts_yes_runs_the_call(daemon: tuple[RunningDaemon, dict[str, str]]) -> None:
    d, keys = daemon
    result, asked, written = await _call_with_answer(d, keys["alice"], True)
    assert written
    [question] = asked
    assert "open('proof.txt'" in question.message and "tools.python.approve" in question.message
    out = result.structured_content
    assert out["status"] == "ok", out
    assert out["approval"]["state"] == "approved"
    assert out["approval"]["by"] == "alice (elicitation)"
    [decided] = [r for r in audit_records(d.audit_path, "approval_decided")
                 if r["approval"] == out["approval"]["id"]]
    assert (decided["by"], decided["decision"]) == ("alice (elicitation)", "approved")


@pytest.mark.parametrize("answer", [False, None], ids=["declined", "dismissed"])
async def test_the_hosts_no_refuses_it(daemon: tuple[RunningDaemon, dict[str, str]],
                                       answer: bool | None) -> None:
    d, keys = daemon
    result, asked, written = await _call_with_answer(d, keys["alice"], answer)
    assert len(asked) == 1
    out = result.structured_content
    assert result.is_error and out["status"] == "denied", out
    assert out["approval"]["state"] == "denied"
    assert "did not run" in out["message"]
    assert not written  # nothing ran
    [decided] = [r for r in audit_records(d.audit_path, "approval_decided")
                 if r["approval"] == out["approval"]["id"]]
    assert decided["decision"] == "denied" and decided["by"] == "alice (elicitation)"


async def test_without_elicit_the_host_is_not_asked(
        daemon: tuple[RunningDaemon, dict[str, str]]) -> None:
    d, keys = daemon
    # bob's host would say no at once; the rule does not let it answer: the lead approves
    result, asked, written = await _call_with_answer(d, keys["bob"], False, lead=keys["lead"])
    assert asked == []
    out = result.structured_content
    assert out["status"] == "ok" and out["approval"]["by"] == "lead", out
    assert written
