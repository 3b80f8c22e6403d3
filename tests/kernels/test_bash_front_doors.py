"""The ``bash`` tool through every front door of a real daemon (container backend, real Docker
engine): the Python client (``Session.invoke("bash", ...)`` and its stream), and MCP (listed
with its title, annotations and output schema; a call's structured content valid against it;
a denied call an error result naming its rule)."""

from __future__ import annotations

import jsonschema

from sandboxd_client import SandboxClient
from sandboxd_client.events import ToolOutput
from sandboxd_client.models import Result
from tests.support.mcp_raw import RawMcp, messages_of

from .conftest import Daemon


def test_the_client_runs_bash_in_a_session(daemon: Daemon) -> None:
    with SandboxClient(daemon.d.url) as client, client.session() as session:
        first = session.invoke("bash", {"code": "cd /tmp; v=7"})
        assert first.status == "ok" and first.kernel is not None, first
        res = session.invoke("bash", {"code": "echo $v $PWD; (exit 4)"})
        assert res.stdout == "7 /tmp\n" and res.termination.exit_code == 4, res
        items = list(session.invoke_stream("bash", {"code": "echo a; echo b >&2; echo $v"}))
    texts = [(i.kind, i.text) for i in items if isinstance(i, ToolOutput)]
    assert "".join(t for k, t in texts if k == "stdout") == "a\n7\n", texts
    assert ("stderr", "b\n") in texts, texts
    assert isinstance(items[-1], Result) and items[-1].status == "ok", items


def test_mcp_lists_bash_with_title_annotations_and_output_schema(daemon: Daemon) -> None:
    mcp = RawMcp(daemon.d.url, daemon.d.headers)
    try:
        r = mcp.post_json({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        (listing,) = messages_of(r)
        tools = {t["name"]: t for t in listing["result"]["tools"]}
        bash = tools["bash"]
        assert bash["title"] == "Run Bash code", bash
        assert bash["annotations"]["readOnlyHint"] is False, bash
        assert bash["annotations"]["openWorldHint"] is False, bash
        assert bash["inputSchema"]["required"] == ["code"], bash
        assert "Programs it may run: ls, cat" in bash["description"], bash
        answer = mcp.call("bash", {"code": "echo $((6 * 7))"})
        result = answer["result"]
        assert result["isError"] is False, result
        jsonschema.validate(result["structuredContent"], bash["outputSchema"])
        assert result["structuredContent"]["stdout"] == "42\n", result
        denied = mcp.call("bash", {"code": "echo ok; curl x"}, ident=3)["result"]
        assert denied["isError"] is True, denied
        assert denied["structuredContent"]["policy"]["rule"] == "tools.shell.commands.deny[0]"
        assert "line 1, column 10" in denied["structuredContent"]["message"], denied
    finally:
        mcp.close()
