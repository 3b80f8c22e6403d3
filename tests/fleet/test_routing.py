"""A fleet behind HAProxy: every session-bound call lands on its session's node.

Three real daemons (restricted backend) on loopback ports behind a real HAProxy started with
the configuration ``sandboxd fleet haproxy-config`` writes."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd_client import SandboxClient
from tests.support import cli
from tests.support.fleet import Fleet, haproxy, running_fleet
from tests.support.mcp_raw import RawMcp

SESSIONS = 60


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as f:
        yield f


def _node(session_id: str) -> str:
    prefix, node, _random = session_id.split("_")
    assert prefix in ("ses", "mcp")
    return node


def _stream_result(fleet: Fleet, sid: str) -> dict[str, object]:
    """The ``result`` event of a streamed call in session ``sid`` (SSE)."""
    body = {"arguments": {"code": "print('streamed')"}}
    with fleet.client.stream("POST", f"/v1/sessions/{sid}/tools/python/invoke", json=body,
                             headers={"accept": "text/event-stream"}) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    blocks = [b for b in text.split("\n\n") if "event: result" in b]
    (block,) = blocks
    data = "".join(line[5:].strip() for line in block.splitlines() if line.startswith("data:"))
    return json.loads(data)


def test_every_session_call_lands_on_its_node(fleet: Fleet) -> None:
    sessions = []
    for _ in range(SESSIONS):
        r = fleet.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        view = r.json()
        assert view["node"] == _node(view["id"])
        sessions.append(view["id"])
    placed = Counter(_node(s) for s in sessions)
    assert set(placed) == set(fleet.nodes), placed
    assert min(placed.values()) >= SESSIONS // len(fleet.nodes) // 2, placed  # spread (leastconn)

    results: dict[str, list[str]] = {n: [] for n in fleet.nodes}  # request ids per node
    for sid in sessions:
        node = _node(sid)
        # invoke by path, the file routes, the session view, a streamed call
        r = fleet.client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                              json={"arguments": {"code": "x = 41\nprint(x + 1)"}})
        assert r.status_code == 200, r.text
        result = r.json()
        assert (result["node"], result["session"], result["stdout"]) == (node, sid, "42\n")
        results[node].append(result["id"])
        r = fleet.client.put(f"/v1/sessions/{sid}/files/note.txt", content=sid.encode())
        assert r.status_code == 200 and r.json()["node"] == node, r.text
        results[node].append(r.json()["id"])
        r = fleet.client.get(f"/v1/sessions/{sid}/files/note.txt")
        assert r.status_code == 200 and r.content == sid.encode(), r.text
        assert fleet.client.get(f"/v1/sessions/{sid}").json()["node"] == node
        streamed = _stream_result(fleet, sid)
        assert (streamed["node"], streamed["stdout"]) == (node, "streamed\n")
        results[node].append(str(streamed["id"]))

    for node, daemon in fleet.nodes.items():  # each node's own session store and audit log
        stored = {p.stem for p in (daemon.state_dir / "sessions").glob("*.json")}
        assert stored == {s for s in sessions if _node(s) == node}
        audit = daemon.audit_path.read_text()
        assert all(rid in audit for rid in results[node])
        assert not any(rid in audit for other in fleet.nodes if other != node
                       for rid in results[other])
    for sid in sessions:
        assert fleet.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_the_client_uses_session_paths(fleet: Fleet) -> None:
    with SandboxClient(fleet.url) as client:
        for _ in range(len(fleet.nodes)):
            with client.session() as session:
                assert session.info.node == _node(session.id)
                result = session.invoke("python", {"code": "print(1)"})
                assert (result.node, result.stdout) == (session.info.node, "1\n")
                session.write_file("a.txt", "hello")
                assert session.read_file("a.txt") == "hello"


def test_mcp_sessions_route_by_their_header(fleet: Fleet) -> None:
    seen = set()
    clients = [RawMcp(fleet.url) for _ in range(2 * len(fleet.nodes))]
    try:
        for mcp in clients:
            node = _node(mcp.headers["mcp-session-id"])
            seen.add(node)
            for ident in range(1, 4):
                answer = mcp.call("python", {"code": "print(7)"}, ident=ident)
                structured = answer["result"]["structuredContent"]
                assert (structured["node"], structured["stdout"]) == (node, "7\n")
    finally:
        for mcp in clients:
            mcp.close()
    assert len(seen) >= 2, seen  # placed by leastconn, then followed by the header


def test_the_path_alone_names_the_session(fleet: Fleet) -> None:
    """A session path's body has no ``session``: one is refused as the schema refuses any
    unknown member (422 naming it), before anything runs; without it the call runs there."""
    sid = fleet.client.post("/v1/sessions", json={}).json()["id"]
    try:
        for named in ("ses_n1_other", sid):
            r = fleet.client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                                  json={"arguments": {"code": "1"}, "session": named})
            assert r.status_code == 422, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert "session" in r.text
        r = fleet.client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                              json={"arguments": {"code": "print(2)"}})
        assert r.status_code == 200 and r.json()["stdout"] == "2\n", r.text
    finally:
        fleet.client.delete(f"/v1/sessions/{sid}")


def test_the_generated_and_shipped_configurations_pass_haproxy_check(
        fleet: Fleet, tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
    for config in (fleet.config, shipped):
        check = subprocess.run([haproxy(), "-c", "-f", str(config)], capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    out = tmp_path / "h.cfg"
    made = cli.run("fleet", "haproxy-config", "--node", "n1=10.0.0.11:8765", "--node",
                   "n2=10.0.0.12:8765", "--node", "n3=10.0.0.13:8765", "--bind",
                   "0.0.0.0:8080", "-o", str(out))
    assert made.returncode == 0, made.stderr
    assert out.read_text() == shipped.read_text()  # the shipped file is the generator's


@pytest.mark.parametrize("node", ["N1=127.0.0.1:1", "n_1=127.0.0.1:1", "n1=nohost",
                                  "n1=127.0.0.1:99999", "n1"])
def test_the_generator_refuses_a_bad_node(node: str) -> None:
    run = cli.run("fleet", "haproxy-config", "--node", node)
    assert run.returncode == 2 and "HOST:PORT" in run.stderr + run.stdout, run.stderr


def test_an_id_without_a_known_node_goes_to_some_node(fleet: Fleet) -> None:
    r = fleet.client.get("/v1/sessions/ses_nowhere_abc")
    assert r.status_code == 404 and r.json()["type"].endswith("/unknown-session")
    r = fleet.client.get("/v1/sessions/ses_abc")  # an id of a version before fleets
    assert r.status_code == 404, r.text
