"""Binary files (no base64 bloat for big or binary data) (a real policy, audit log and workspaces):
the raw ``PUT``/``GET /v1/sessions/{id}/files/{path}`` endpoints, ``encoding: "base64"`` on
read_file/write_file, and the client's upload/download. On the daemon's app in process
(tests/support/inprocess.py: the file tools run in the daemon, not in a sandbox), except where
the body's way in matters, through the real daemon (uvicorn on a socket): a body that arrives
in pieces (chunked, or past a cap or the quota while it streams), a connection cut or stalled
mid-upload (the in-process transport hands the app a body whole)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.access.tokens import add_token
from sandboxd_client import AsyncSandboxClient, SandboxClient
from sandboxd_client.errors import ProblemError
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon
from tests.support.wait import wait_until

MAX_FILE = 4 * 1024 * 1024
QUOTA = 8 * 1024 * 1024
UPLOAD_TIMEOUT_S = 10
POLICY = f"""\
version: 1
name: files
clients: ["*"]
limits: {{timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 8Mi, max_output: 8Mi}}
tools:
  read_file:
    paths: {{allow: ["**"], deny: ["**/*.key"]}}
    max_bytes: {MAX_FILE}
  write_file:
    paths: {{allow: ["**"], deny: ["locked/**", "**/*.key"]}}
    max_bytes: {MAX_FILE}
    limits: {{timeout: {UPLOAD_TIMEOUT_S}s}}
  list_files:
    paths: {{allow: ["**"]}}
"""


def payload(size: int, seed: int) -> bytes:
    """Every byte value (twice, and each pair in both orders), then seeded random bytes."""
    rng = random.Random(seed)
    head = bytes(range(256)) + bytes(reversed(range(256)))
    return head + rng.randbytes(size - len(head))


Daemon = RunningDaemon | InProcessDaemon


def _setup(tmp: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The policies directory, tokens (alice, bob) and settings of a daemon of this module."""
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "files.yaml").write_text(POLICY)
    tokens = tmp / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in ("alice", "bob")}
    settings = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_SESSION_QUOTA_BYTES": str(QUOTA),
                "SANDBOXD_MAX_BODY_BYTES": str(16 * 1024 * 1024)}
    return policies, keys, settings


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessDaemon, str]]:
    """The daemon's app in process for the module: clients alice (the daemon's client) and
    bob (the token)."""
    tmp = tmp_path_factory.mktemp("files")
    policies, keys, settings = _setup(tmp)
    with inprocess_daemon(tmp, policies_dir=policies, env=settings, token=keys["alice"]) as d:
        yield d, keys["bob"]


@pytest.fixture(scope="module")
def real_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A real daemon (uvicorn on a socket) for the tests of how a body comes in."""
    tmp = tmp_path_factory.mktemp("files-real")
    policies, keys, settings = _setup(tmp)
    with running_daemon(tmp, policies_dir=policies, env=settings, token=keys["alice"]) as d:
        yield d


@pytest.fixture
def daemon(env: tuple[InProcessDaemon, str]) -> InProcessDaemon:
    return env[0]


@pytest.fixture
def session(request: pytest.FixtureRequest) -> Iterator[str]:
    """A session of the test's daemon: the real one if it takes ``real_daemon``."""
    d: Daemon = request.getfixturevalue(
        "real_daemon" if "real_daemon" in request.fixturenames else "daemon")
    sid = d.client.post("/v1/sessions").json()["id"]
    yield sid
    d.client.delete(f"/v1/sessions/{sid}")


def workspace(daemon: Daemon, sid: str) -> Path:
    return daemon.state_dir / "workspaces" / sid


def leftovers(root: Path) -> list[str]:
    """Temporary files of interrupted writes anywhere in a workspace."""
    return [str(p) for p in root.rglob(".sandboxd-*")]


def audit(daemon: Daemon, request_id: str) -> list[dict]:
    records = audit_records(daemon.audit_path)
    return [r for r in records if r.get("request_id") == request_id]


def test_raw_round_trip_of_every_byte_value(real_daemon: RunningDaemon, session: str) -> None:
    daemon = real_daemon
    data = payload(3 * 1024 * 1024 + 17, seed=1)
    url = f"/v1/sessions/{session}/files/data/blob.bin"
    put = daemon.client.put(url, content=data,
                            headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 200, put.text
    body = put.json()
    assert body["status"] == "ok" and body["tool"] == "write_file"
    assert body["value"] == {"path": "data/blob.bin", "bytes": len(data)}
    on_disk = workspace(daemon, session) / "data" / "blob.bin"
    assert hashlib.sha256(on_disk.read_bytes()).digest() == hashlib.sha256(data).digest()
    got = daemon.client.get(url)
    assert got.status_code == 200, got.text
    assert got.content == data
    assert got.headers["content-length"] == str(len(data))
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''blob.bin"
    # the type is guessed from the name; a page a sandbox wrote is still only an attachment
    html = b"<script>alert(1)</script>"
    assert daemon.client.put(f"/v1/sessions/{session}/files/page.html",
                             content=html).status_code == 200
    page = daemon.client.get(f"/v1/sessions/{session}/files/page.html")
    assert page.content == html and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-disposition"].startswith("attachment")
    # a streamed (chunked) upload of unknown length, replacing the file
    other = payload(1024 * 1024, seed=2)
    chunked = daemon.client.put(url, content=iter([other[:1000], other[1000:]]))
    assert chunked.status_code == 200, chunked.text
    assert daemon.client.get(url).content == other
    assert leftovers(workspace(daemon, session)) == []


def test_base64_round_trip_and_cross_paths(daemon: InProcessDaemon, session: str) -> None:
    data = payload(2 * 1024 * 1024, seed=3)
    text = base64.b64encode(data).decode()
    r = daemon.invoke("write_file", {"path": "b64.bin", "content": text, "encoding": "base64"},
                      session=session).json()
    assert r["status"] == "ok" and r["value"]["bytes"] == len(data), r
    # written as base64, fetched raw; uploaded raw, read as base64
    assert daemon.client.get(f"/v1/sessions/{session}/files/b64.bin").content == data
    r = daemon.invoke("read_file", {"path": "b64.bin", "encoding": "base64"},
                      session=session).json()
    assert r["status"] == "ok" and base64.b64decode(r["stdout"]) == data
    assert r["value"] == {"path": "b64.bin", "bytes": len(data), "encoding": "base64"}
    # base64 over the output limit is refused whole (never cut into corrupt data)
    r = daemon.invoke("read_file", {"path": "b64.bin", "encoding": "base64"}, session=session,
                      limits={"output_bytes": 1024 * 1024}).json()
    assert r["status"] == "error" and r["stdout"] == "", r["message"]
    assert f"GET /v1/sessions/{session}/files/b64.bin" in r["message"]
    # bad base64 is an error a model can act on, and writes nothing
    r = daemon.invoke("write_file", {"path": "bad.bin", "content": "no*base64",
                                     "encoding": "base64"}, session=session).json()
    assert r["status"] == "error" and "not valid base64" in r["message"]
    assert not (workspace(daemon, session) / "bad.bin").exists()
    # the size cap counts decoded bytes: 4 MiB exactly passes the policy, one more does not
    big = base64.b64encode(b"\0" * (MAX_FILE + 1)).decode()
    r = daemon.invoke("write_file", {"path": "big.bin", "content": big, "encoding": "base64"},
                      session=session).json()
    assert r["status"] == "denied" and r["policy"]["rule"] == "tools.write_file.max_bytes", r


def test_binary_read_file_says_how_to_fetch_it(daemon: InProcessDaemon, session: str) -> None:
    daemon.client.put(f"/v1/sessions/{session}/files/img.png", content=b"\x89PNG\r\n\x1a\n\xff")
    r = daemon.invoke("read_file", {"path": "img.png"}, session=session).json()
    assert r["status"] == "error", r
    assert "not UTF-8 text (9 bytes)" in r["message"]
    assert '"encoding": "base64"' in r["message"]
    assert f"GET /v1/sessions/{session}/files/img.png" in r["message"]
    # the tool schemas the model sees offer the argument
    tools = {t["name"]: t for t in daemon.client.get("/v1/tools").json()}
    for name in ("read_file", "write_file"):
        enc = tools[name]["parameters"]["properties"]["encoding"]
        assert enc["enum"] == ["utf-8", "base64"], enc
        assert "base64" in tools[name]["description"]


def _raw(daemon: InProcessDaemon, method: str, target: str, body: bytes | None = None
         ) -> tuple[int, dict]:
    """A request sent exactly as written (no client-side normalisation of ``..``: the
    in-process transport's raw_target, which httpx's URL would normalise)."""
    response = daemon.client.request(method, target, content=body, timeout=30,
                                     extensions={"raw_target": target.encode()})
    return response.status_code, json.loads(response.content or b"{}")


def test_traversal_and_policy_paths_refused(daemon: InProcessDaemon, session: str,
                                            tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"host secret")
    ws = workspace(daemon, session)
    os.symlink(outside, ws / "link")
    os.symlink(tmp_path, ws / "ldir")
    base = f"/v1/sessions/{session}/files/"
    for target in ("../../../etc/passwd", "a/../../x", "%2e%2e/%2e%2e/etc/passwd",
                   "%2E%2E%2Fx", "/etc/passwd", "/workspace/../x", "ldir/outside.txt",
                   "link/x", "locked/x", "id.key"):
        # locked/** is a write_file rule only (read_file may read it)
        for method in ("PUT",) if target == "locked/x" else ("GET", "PUT"):
            status, problem = _raw(daemon, method, base + target, b"pwned")
            assert status == 403, (method, target, status, problem)
            assert problem["type"].endswith("/path-refused"), problem
            assert problem["detail"], problem
    # GET through a symlink is refused; PUT on its name replaces the link, not its target
    assert _raw(daemon, "GET", base + "link")[0] == 403
    assert daemon.client.put(base + "link", content=b"replaced").status_code == 200
    assert outside.read_bytes() == b"host secret"
    assert not (ws / "link").is_symlink() and (ws / "link").read_bytes() == b"replaced"
    assert not (tmp_path / "x").exists() and leftovers(ws) == []
    # the policy's deny rule is named
    status, problem = _raw(daemon, "PUT", base + "locked/x", b"1")
    assert problem["rule"] == "tools.write_file.paths.deny[0]", problem


def test_size_cap_is_413_and_leaves_nothing(real_daemon: RunningDaemon, session: str) -> None:
    daemon = real_daemon
    url = f"/v1/sessions/{session}/files/huge.bin"
    data = b"\1" * (MAX_FILE + 1)
    declared = daemon.client.put(url, content=data)  # refused from its Content-Length
    assert declared.status_code == 413, declared.text
    assert declared.headers["content-type"] == "application/problem+json"
    assert str(MAX_FILE) in declared.json()["detail"]
    streamed = daemon.client.put(url, content=iter([data[:MAX_FILE], data[MAX_FILE:]]))
    assert streamed.status_code == 413, streamed.text
    assert not (workspace(daemon, session) / "huge.bin").exists()
    assert leftovers(workspace(daemon, session)) == []
    exact = daemon.client.put(url, content=data[:MAX_FILE])  # the cap itself is allowed
    assert exact.status_code == 200, exact.text


def test_quota_refused_with_nothing_left(real_daemon: RunningDaemon, session: str) -> None:
    daemon = real_daemon
    base = f"/v1/sessions/{session}/files/"
    chunk = b"\2" * (3 * 1024 * 1024)
    for name in ("a.bin", "b.bin"):
        assert daemon.client.put(base + name, content=chunk).status_code == 200
    for body in (chunk, iter([chunk[:1024], chunk[1024:]])):  # declared, then streamed
        over = daemon.client.put(base + "c.bin", content=body)
        assert over.status_code == 409, over.text
        assert over.json()["type"].endswith("/session-over-quota")
        assert "quota" in over.json()["detail"]
        assert not (workspace(daemon, session) / "c.bin").exists()
        assert leftovers(workspace(daemon, session)) == []
    # replacing a file with something smaller still works
    assert daemon.client.put(base + "a.bin", content=b"small").status_code == 200


def test_an_upload_cut_short_or_stalled_leaves_nothing(real_daemon: RunningDaemon,
                                                       session: str) -> None:
    daemon = real_daemon
    host, port = daemon.url.removeprefix("http://").split(":")
    head = (f"PUT /v1/sessions/{session}/files/cut.bin HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: {daemon.headers['Authorization']}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Content-Length: {2 * 1024 * 1024}\r\n\r\n").encode()
    ws = workspace(daemon, session)
    # the client goes away after half of its body: the call ends as an error, audited
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(head + b"\3" * (1024 * 1024))
    aborted = wait_until(
        lambda: [r for r in audit_records(daemon.audit_path)
                 if r.get("event") == "result" and r["session"] == session
                 and "closed the connection" in (r.get("message") or "")],
        timeout=30, interval=0.1, what="an audit record of the cut upload")
    assert aborted[0]["status"] == "error", aborted
    assert not (ws / "cut.bin").exists() and leftovers(ws) == []
    # the client stalls: under the minimum rate once its grace is over (before the call's
    # time limit), it ends with a 408, and its transfer slot is free again
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(head + b"\3" * 1000)
        conn.settimeout(UPLOAD_TIMEOUT_S + 60)
        reply = _response(conn)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"/upload-timeout" in reply and b"minimum of" in reply, reply
    assert not (ws / "cut.bin").exists() and leftovers(ws) == []
    assert daemon.client.put(f"/v1/sessions/{session}/files/cut.bin",
                             content=b"whole").status_code == 200


def _response(conn: socket.socket) -> bytes:
    """One HTTP response (head and its Content-Length body) read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(data) < len(head) + 4 + length and (chunk := conn.recv(65536)):
        data += chunk
    return data


def test_audit_records_one_call_per_transfer(daemon: InProcessDaemon, session: str) -> None:
    url = f"/v1/sessions/{session}/files/audited.bin"
    put = daemon.client.put(url, content=b"\0\1\2")
    got = daemon.client.get(url)
    upload_id = put.json()["id"]
    download_id = got.headers["x-sandboxd-request-id"]
    for request_id, tool, transfer in ((upload_id, "write_file", "upload"),
                                       (download_id, "read_file", "download")):
        records = audit(daemon, request_id)
        assert [r["event"] for r in records] == ["decision", "result"], records
        decision, result = records
        assert decision["tool"] == tool and decision["decision"] == "allow"
        assert decision["session"] == session and decision["client"] == "alice"
        assert json.loads(decision["args_preview"])["transfer"] == transfer
        assert result["status"] == "ok" and result["tool"] == tool
    denied = daemon.client.put(f"/v1/sessions/{session}/files/x.key", content=b"k")
    records = audit(daemon, denied.json()["request_id"])
    assert [r["decision"] for r in records if r["event"] == "decision"] == ["deny"]


def test_a_downloads_body_and_problem_stay_in_process(daemon: InProcessDaemon,
                                                       session: str) -> None:
    """The result carries a download's bytes and a failure's problem code to the endpoint,
    but neither reaches the audit log (nor the JSON of a result)."""
    marker = b"never-in-the-audit-log"
    url = f"/v1/sessions/{session}/files/in-process.bin"
    assert daemon.client.put(url, content=marker).status_code == 200
    got = daemon.client.get(url)
    assert got.content == marker
    missing = daemon.client.get(f"/v1/sessions/{session}/files/no-such.bin")
    assert missing.status_code == 404 and missing.json()["type"].endswith("/file-not-found")
    for request_id in (got.headers["x-sandboxd-request-id"], missing.json()["request_id"]):
        [result] = [r for r in audit(daemon, request_id) if r["event"] == "result"]
        assert "body" not in result and "problem" not in result, result
        assert marker.decode() not in json.dumps(result)


def test_another_clients_session_is_not_found(env: tuple[InProcessDaemon, str],
                                             session: str) -> None:
    daemon, bob = env
    url = f"/v1/sessions/{session}/files/mine.bin"
    assert daemon.client.put(url, content=b"alice's").status_code == 200
    with daemon.http(bob) as c:
        for response in (c.get(url), c.put(url, content=b"bob's")):
            assert response.status_code == 404, response.text
            assert response.json()["type"].endswith("/unknown-session")
    assert daemon.client.get(url).content == b"alice's"
    missing = daemon.client.get(f"/v1/sessions/{session}/files/nothing.bin")
    assert missing.status_code == 404 and missing.json()["type"].endswith("/file-not-found")
    anonymous = daemon.anon.put(url, content=b"x" * (MAX_FILE * 2))
    assert anonymous.status_code == 401


def test_client_upload_download_and_bytes(daemon: InProcessDaemon, tmp_path: Path) -> None:
    token = daemon.headers["Authorization"].split()[1]
    data = payload(1024 * 1024 + 3, seed=4)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    with SandboxClient(daemon.url, token=token, transport=daemon.transport) as client, \
            client.session() as s:
        assert s.upload("raw.bin", data).status == "ok"
        with source.open("rb") as fh:
            assert s.upload("file.bin", fh).value == {"path": "file.bin", "bytes": len(data)}
        assert s.download("raw.bin") == data and s.download("file.bin") == data
        assert s.write_file("w.bin", data).status == "ok"  # bytes: base64, no TypeError
        assert s.read_file("w.bin", encoding="base64") == data
        assert s.download("w.bin") == data
        assert s.read_file("file.bin", encoding="base64") == data
        with pytest.raises(ProblemError) as err:
            s.upload("big.bin", b"\0" * (MAX_FILE + 1))
        assert err.value.status == 413
        with pytest.raises(ProblemError) as err:
            s.download("../x")
        assert err.value.status == 403
    asyncio.run(_async_client(daemon, token, source, data))


async def _async_client(daemon: InProcessDaemon, token: str, source: Path, data: bytes) -> None:
    async with AsyncSandboxClient(daemon.url, token=token,
                                  transport=daemon.async_transport()) as client, \
            client.session() as s:
        with source.open("rb") as fh:
            assert (await s.upload("a/file.bin", fh)).status == "ok"
        assert await s.download("a/file.bin") == data
        await s.write_file("a/w.bin", data[:1000])
        assert await s.read_file("a/w.bin", encoding="base64") == data[:1000]
        with pytest.raises(ProblemError) as err:
            await s.download("a/none.bin")
        assert err.value.status == 404
