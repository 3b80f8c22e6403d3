"""No 500 from a client's mistake: fuzzing the doors a client's mistakes come through, against the
daemon's app in process (tests/support/inprocess.py: the real routes, policy, workspaces and MCP
door; file tools only, a tokens file; the doors fuzzed run no sandbox):

* the file routes (``GET``/``PUT /v1/sessions/{id}/files/{path}``) with schemathesis (v4,
  its Python API) over the daemon's own OpenAPI document, in a real session whose workspace
  holds a directory, a file, a symlink, a symlink loop and a FIFO, with paths both from the
  schema and built from those names: never a 5xx, every answer as documented, no OS error
  text nor host path in a problem;
* ``POST /mcp`` (JSON-RPC, which OpenAPI cannot describe) with hypothesis: bad ids, wrong
  types, unknown methods, huge and deeply nested params, wrong protocol versions, raw bytes:
  never a 5xx, always one valid JSON-RPC result or error (or a 202 for a notification or a
  response), the request's ``id`` echoed.

Deterministic (``derandomize``, no example database) and modest, so CI is not flaky and
the module runs in 10-30 s on two cores (the per-client rate limit is off: the fuzz is
to reach the routes).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import ignored_auth

from sandboxd.access.tokens import add_token
from tests.support.inprocess import InProcessDaemon, inprocess_daemon, requests_session
from tests.support.mcp_raw import RawMcp, messages_of

POLICY = """\
version: 1
name: fuzz
clients: ["*"]
tools:
  read_file: {paths: {allow: ["**"], deny: ["**/*.key"]}, max_bytes: 65536}
  write_file: {paths: {allow: ["**"], deny: ["**/*.key"]}, max_bytes: 65536}
  list_files: {paths: {allow: ["**"]}}
"""
FILES = "/v1/sessions/{session_id}/files/{path}"
FUZZ = settings(max_examples=100, derandomize=True, database=None, deadline=None,
                suppress_health_check=list(HealthCheck))
NAMES = ["dir", "sub", "f.txt", "ln", "loop", "fifo", ".", "..", "", "n" * 256, "x.key",
         "é", "e\u0301", " a", "a ", "%2e%2e", "%00", "/workspace", "~", "*", "a\nb"]
PARSE_ERROR = -32700
MAX_DEPTH = 200  # past this, a server's JSON parser may refuse a message (the SDK's does)
VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


class Failures(logging.Handler):
    """The log records that carry a traceback (what a real daemon's log would show)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.seen.append(self.format(record))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "fuzz.yaml").write_text(POLICY)
    token = add_token(tmp / "tokens.yaml", "alice")
    # the per-client rate limit off: the fuzz is to reach the routes, not the limiter
    env = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_TOKENS_FILE": str(tmp / "tokens.yaml"),
           "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0"}
    failures = Failures()
    logging.getLogger().addHandler(failures)
    try:
        with inprocess_daemon(tmp, policies_dir=tmp / "policies", env=env, token=token) as d:
            yield d
    finally:
        logging.getLogger().removeHandler(failures)
    assert not failures.seen, failures.seen[:3]


@pytest.fixture(scope="module")
def session(daemon: InProcessDaemon) -> str:
    """A session with a directory, a file, a symlink, a symlink loop and a FIFO."""
    sid: str = daemon.client.post("/v1/sessions").json()["id"]
    ws = daemon.state_dir / "workspaces" / sid
    (ws / "dir" / "sub").mkdir(parents=True)
    (ws / "f.txt").write_text("f")
    os.symlink("dir", ws / "ln")
    os.symlink("loop", ws / "loop")
    os.mkfifo(ws / "fifo")
    return sid


def no_internals(daemon: InProcessDaemon, status: int, text: str) -> None:
    """An error never shows an OS error text, a traceback or a host path."""
    if status < 300:
        return
    for leak in ("Errno", "Traceback", str(daemon.state_dir), "/workspaces/"):
        assert leak not in text, (leak, status, text[:2000])


# ---------------------------------------------------------------- the file routes

PATHS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map("/".join)


@pytest.mark.parametrize("method", ["GET", "PUT"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["positive", "negative"])
def test_file_routes_with_schemathesis(daemon: InProcessDaemon, session: str, method: str,
                                       mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(daemon.client.get("/openapi.json").json())
    http = requests_session(daemon)
    operation = schema[FILES][method]
    fixed = {"session_id": session}
    cases = st.one_of(
        operation.as_strategy(mode, path_parameters=fixed),
        PATHS.flatmap(lambda p: operation.as_strategy(
            mode, path_parameters={**fixed, "path": p})))

    @FUZZ
    @given(case=cases)
    def check(case: schemathesis.Case) -> None:
        case.path_parameters["session_id"] = session  # negative mode may mangle it
        response = case.call_and_validate(base_url=daemon.url, session=http,
                                          headers=daemon.headers,
                                          excluded_checks=[ignored_auth], timeout=60)
        no_internals(daemon, response.status_code, response.content.decode(errors="replace"))

    try:
        check()
    finally:
        http.close()


# ---------------------------------------------------------------- MCP (JSON-RPC)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12)
#: mostly valid ids (an integer or a string), often not
VALID_IDS = st.integers(-2**70, 2**70) | st.text(max_size=20)
IDS = st.one_of(VALID_IDS, VALID_IDS, VALID_IDS, st.none(), st.booleans(),
                st.floats(allow_nan=False, allow_infinity=False),
                st.lists(st.integers(), max_size=2),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
METHODS = st.sampled_from(["initialize", "ping", "tools/list", "tools/call", "resources/list",
                           "prompts/get", "logging/setLevel", "completion/complete",
                           "notifications/initialized", "notifications/cancelled",
                           "notifications/progress"]) | st.text(max_size=20)
FILE_ARGS = st.fixed_dictionaries({"path": PATHS | JSON}, optional={
    "content": st.text(max_size=40) | JSON, "encoding": st.sampled_from(["utf-8", "base64"])
    | JSON})
CALL = st.fixed_dictionaries(
    {"name": st.sampled_from(["read_file", "write_file", "list_files", "python"]) | JSON},
    optional={"arguments": FILE_ARGS | JSON,
              "_meta": st.fixed_dictionaries({}, optional={
                  "progressToken": IDS, "sandboxd/limits": JSON | st.fixed_dictionaries(
                      {"timeout_s": JSON})}) | JSON})
PARAMS = CALL | JSON | st.fixed_dictionaries({"protocolVersion": st.sampled_from(VERSIONS) | JSON,
                                              "capabilities": JSON, "clientInfo": JSON})
MESSAGE = st.fixed_dictionaries(
    {"jsonrpc": st.one_of(st.just("2.0"), st.just("2.0"), st.just("2.0"), JSON),
     "method": METHODS},
    optional={"id": IDS, "params": PARAMS})
#: a valid envelope; deep (past any parser's recursion) or huge (a few hundred KiB) params
DEEP = st.integers(1, 3000).map(
    lambda n: f'{{"jsonrpc":"2.0","id":{n},"method":"tools/list","params":{{"x":'
              f'{"[" * n}{"]" * n}}}}}')
HUGE = st.integers(0, 400_000).map(lambda n: json.dumps(
    {"jsonrpc": "2.0", "id": "huge", "method": "tools/call",
     "params": {"name": "write_file", "arguments": {"path": "big.txt", "content": "x" * n}}}))
BODY = st.one_of(*[MESSAGE.map(json.dumps)] * 6, st.lists(MESSAGE, max_size=2).map(json.dumps),
                 JSON.map(json.dumps), DEEP, HUGE, st.text(max_size=40), st.binary(max_size=40))
#: mostly a version the server speaks, sometimes one it does not
PROTOCOL = st.sampled_from(VERSIONS * 3 + ["2026-07-28", "1999-01-01", "", "x"])


def _sent(body: str | bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _depth(body: str | bytes) -> int:
    """How deep the brackets of a JSON text nest (strings skipped), without parsing it: a
    parser's recursion limit depends on the stack it runs on, this does not."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif quoted:
            escaped = char == "\\"
            quoted = char != '"'
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _valid_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def check_answer(daemon: InProcessDaemon, body: str | bytes, status: int, answer: list[Any],
                 text: str) -> None:
    """The daemon's answer to one message is what JSON-RPC 2.0 and MCP promise."""
    assert status < 500, (status, text[:2000])
    no_internals(daemon, status, text)
    sent = _sent(body)
    if status == 202:  # accepted without an answer: only a notification or a response
        assert not answer, text
        assert isinstance(sent, dict) and sent.get("jsonrpc") == "2.0", (body, text)
        assert ("method" in sent and "id" not in sent) or (
            "method" not in sent and ("result" in sent or "error" in sent)), body
        return
    replies = [m for m in answer if isinstance(m, dict) and ("result" in m or "error" in m)]
    assert len(replies) == 1, (status, text[:2000])
    (reply,) = replies
    assert reply.get("jsonrpc") == "2.0" and ("result" in reply) != ("error" in reply), reply
    if "error" in reply:
        error = reply["error"]
        assert isinstance(error.get("code"), int) and not isinstance(error["code"], bool)
        assert isinstance(error.get("message"), str) and error["message"], reply
    ident = sent.get("id") if isinstance(sent, dict) else None
    if reply.get("error", {}).get("code") == PARSE_ERROR:
        assert reply["id"] is None, reply
    elif reply["id"] is None and _depth(body) > MAX_DEPTH:  # unparsed: no id to echo
        assert "error" in reply, reply
    elif _valid_id(ident) and "method" in sent:
        assert reply["id"] == ident, (body[:500], reply)
    else:
        assert reply["id"] is None, (body[:500], reply)


def test_mcp_json_rpc_fuzz(daemon: InProcessDaemon) -> None:
    mcp = RawMcp(daemon.url, daemon.headers, transport=daemon.transport)

    @settings(FUZZ, max_examples=300)
    @given(body=BODY, version=PROTOCOL)
    def check(body: str | bytes, version: str) -> None:
        raw = body.encode() if isinstance(body, str) else body
        r = mcp.post(raw, {"mcp-protocol-version": version})
        answer = messages_of(r) if r.content else []
        check_answer(daemon, body, r.status_code, answer, r.text)

    try:
        check()
    finally:
        mcp.close()
