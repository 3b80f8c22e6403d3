"""A rolling restart of every node loses no session (an upgrade of a fleet,
with the sessions that survive a restart): each node in turn is stopped (SIGTERM) and started again
on its state directory and port; the proxy's health checks take it out and back; afterwards
every session of the fleet still answers on its node, with its files, and its first python
call says that the kernel went with the restart (restricted kernels die with their daemon)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.daemon import start_daemon
from tests.support.fleet import FLEET_ENV, running_fleet
from tests.support.wait import wait_until

SURVIVE = {"SANDBOXD_SESSIONS_SURVIVE_RESTART": "true"}


def test_a_rolling_restart_of_every_node_loses_no_session(tmp_path: Path) -> None:
    with running_fleet(tmp_path, env=SURVIVE) as fleet:
        client = fleet.client
        sessions: dict[str, str] = {}  # id -> node
        while set(sessions.values()) != set(fleet.nodes) or len(sessions) < 9:
            body = client.post("/v1/sessions", json={}).json()
            sessions[body["id"]] = body["node"]
            assert len(sessions) < 60, "the proxy never spread sessions over every node"
        for sid in sessions:
            r = client.put(f"/v1/sessions/{sid}/files/note.txt", content=sid.encode())
            assert r.status_code == 200, r.text
            r = client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                            json={"arguments": {"code": "x = 1"}})
            assert r.json()["status"] == "ok", r.text

        def answers(sid: str) -> bool:
            r = client.get(f"/v1/sessions/{sid}/files/note.txt")
            return r.status_code == 200 and r.content == sid.encode()

        for round_, node in enumerate(sorted(fleet.nodes)):
            old = fleet.nodes[node]
            assert old.uids is not None
            port = int(old.url.rsplit(":", 1)[1])
            assert old.stop() == 0
            old.client.close()
            uids = {"SANDBOXD_SANDBOX_UID_FIRST": str(old.uids.start),
                    "SANDBOXD_SANDBOX_UID_COUNT": str(len(old.uids))}
            (tmp_path / node / f"restart{round_}").mkdir()
            fleet.nodes[node] = start_daemon(
                tmp_path / node / f"restart{round_}", state_dir=old.state_dir, port=port,
                env={**FLEET_ENV, **SURVIVE, **uids, "SANDBOXD_NODE_ID": node})
            for sid in sessions:  # the proxy finds the node back; nothing was lost meanwhile
                wait_until(lambda sid=sid: answers(sid), timeout=30,  # type: ignore[misc]
                           what=f"session {sid} answering after {node} restarted",
                           ignore=(httpx.HTTPError,))
        for sid, node in sessions.items():
            r = client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                            json={"arguments": {"code": "print(open('note.txt').read())"}})
            body = r.json()
            assert body["status"] == "ok" and body["stdout"] == f"{sid}\n", body
            assert body["node"] == node
            assert body["kernel"]["lost"] is True, body
            assert body["kernel"]["reason"] == "daemon_restart", body
        for sid in sessions:  # none left for the fleet's stop to keep (and its mounts)
            assert client.delete(f"/v1/sessions/{sid}").status_code == 204
