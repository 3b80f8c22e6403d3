"""The ``javascript`` and ``typescript`` tools through the front doors of a real daemon
(container backend, real Docker engine): the Python client (``Session.invoke("javascript",
...)`` and its stream), and MCP (listed with title, annotations and output schema; a call's
structured content valid against it; a denied module an error result naming its rule)."""

from __future__ import annotations

import jsonschema

from sandboxd_client import SandboxClient
from sandboxd_client.events import ToolOutput
from sandboxd_client.models import Result
from tests.support.mcp_raw import RawMcp, messages_of

from .conftest import Daemon


def test_the_client_runs_javascript_in_a_session(daemon: Daemon) -> None:
    with SandboxClient(daemon.d.url) as client, client.session() as session:
        first = session.invoke("javascript", {"code": "let v = await Promise.resolve(7)"})
        assert first.status == "ok" and first.kernel is not None, first
        res = session.invoke("typescript", {"code": "const w: number = v * 6; w"})
        assert res.status == "ok" and res.value == 42, res
        items = list(session.invoke_stream(
            "javascript", {"code": "console.log('a'); console.error('b'); v"}))
    texts = [(i.kind, i.text) for i in items if isinstance(i, ToolOutput)]
    assert ("stdout", "a\n") in texts and ("stderr", "b\n") in texts, texts
    assert isinstance(items[-1], Result) and items[-1].value == 7, items


def test_mcp_lists_javascript_with_title_annotations_and_output_schema(daemon: Daemon) -> None:
    mcp = RawMcp(daemon.d.url, daemon.d.headers)
    try:
        r = mcp.post_json({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        (listing,) = messages_of(r)
        tools = {t["name"]: t for t in listing["result"]["tools"]}
        assert tools["typescript"]["title"] == "Run TypeScript code", tools["typescript"]
        js = tools["javascript"]
        assert js["title"] == "Run JavaScript code", js
        assert js["annotations"]["readOnlyHint"] is False, js
        assert js["annotations"]["openWorldHint"] is False, js
        assert js["inputSchema"]["required"] == ["code"], js
        answer = mcp.call("javascript", {"code": "6 * 7"})
        result = answer["result"]
        assert result["isError"] is False, result
        jsonschema.validate(result["structuredContent"], js["outputSchema"])
        assert result["structuredContent"]["value"] == 42, result
        denied = mcp.call("javascript", {"code": "1\nrequire('net')"}, ident=3)["result"]
        assert denied["isError"] is True, denied
        assert denied["structuredContent"]["policy"]["rule"] == "tools.javascript.modules"
        assert "line 2, column 10" in denied["structuredContent"]["message"], denied
    finally:
        mcp.close()
