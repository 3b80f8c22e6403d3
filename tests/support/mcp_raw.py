"""A bare MCP client over Streamable HTTP (httpx, no SDK): messages go out exactly as written,
answers come back as the JSON-RPC messages the daemon sent (JSON or server-sent events)."""

from __future__ import annotations

import json
from typing import Any

import httpx

PROTOCOL = "2025-06-18"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def messages_of(response: httpx.Response) -> list[Any]:
    """The JSON-RPC messages of an answer: its JSON body, or each ``data:`` of its events."""
    if not response.content:
        return []
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        out = []
        for block in response.text.split("\n\n"):
            data = "\n".join(line[len("data:"):].lstrip() for line in block.splitlines()
                             if line.startswith("data:"))
            if data:
                out.append(json.loads(data))
        return out
    return [response.json()]


class RawMcp:
    """One initialized MCP session of ``url`` (``headers``: the bearer token, if any;
    ``transport``: e.g. an in-process daemon's, tests/support/inprocess.py)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None,
                 timeout: float = 60.0, protocol: str = PROTOCOL,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = f"{url}/mcp"
        self.http = httpx.Client(timeout=timeout, transport=transport)
        self.headers = {**ACCEPT, **(headers or {})}
        r = self.post_json({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": protocol, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}})
        assert r.status_code == 200, r.text
        self.headers |= {"mcp-session-id": r.headers["mcp-session-id"],
                         "mcp-protocol-version": protocol}
        r = self.post_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text

    def post(self, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(self.url, content=content, headers={**self.headers,
                                                                  **(headers or {})})

    def post_json(self, message: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.post(json.dumps(message).encode(), headers)

    def call(self, tool: str, arguments: dict[str, Any], ident: int = 1) -> dict[str, Any]:
        """The answer (``result`` or ``error`` message) of one ``tools/call``."""
        r = self.post_json({"jsonrpc": "2.0", "id": ident, "method": "tools/call",
                            "params": {"name": tool, "arguments": arguments}})
        assert r.status_code == 200, r.text
        (answer,) = [m for m in messages_of(r) if "result" in m or "error" in m]
        return answer

    def close(self) -> None:
        self.http.delete(self.url, headers=self.headers)
        self.http.close()
