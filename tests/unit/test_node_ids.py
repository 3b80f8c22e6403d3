"""Node ids (a fleet routes each call to the node its id names): the setting, the ids that carry it,
and sessions stored before it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandboxd.config import NODE_ID_PATTERN, Settings, default_node_id
from sandboxd.fleet import FleetConfigError, Node, haproxy_config, problem_body
from sandboxd.models import new_id, node_of
from sandboxd.sessions.manager import SessionManager


def test_the_default_node_id_is_a_valid_one() -> None:
    assert re.match(NODE_ID_PATTERN, default_node_id())
    assert Settings().node_id == default_node_id()


@pytest.mark.parametrize("bad", ["", "N1", "n_1", "-n1", "n1-", "a" * 33, "n 1", "n1.x"])
def test_a_bad_node_id_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        Settings(node_id=bad)


def test_ids_name_their_node_and_stay_random() -> None:
    ids = {new_id("ses", "n-7") for _ in range(1000)}
    assert len(ids) == 1000 and all(node_of(i) == "n-7" for i in ids)
    assert all(len(i.split("_")[2]) == 16 for i in ids)  # 12 random bytes, as without a node
    assert node_of(new_id("ses")) is None


def test_a_session_of_a_version_before_fleets_still_loads(tmp_path: Path) -> None:
    """A session stored as ``ses_<random>`` without ``node`` is recovered and shown with the
    node it lives on; a new one gets ``ses_<node>_<random>``."""
    old = "ses_AbCdEfGhIjKlMnOp"
    (tmp_path / "sessions").mkdir()
    (tmp_path / "workspaces" / old).mkdir(parents=True)
    (tmp_path / "sessions" / f"{old}.json").write_text(json.dumps({
        "id": old, "client": "local", "created_at": 1.0, "expires_at": 4e9, "ttl_s": 3600.0,
        "quota_bytes": 1 << 20, "workspace": str(tmp_path / "workspaces" / old)}))
    manager = SessionManager(tmp_path, ttl_s=3600, quota_bytes=1 << 20, max_per_client=4,
                             uids=None, quota_mode="advisory", node_id="n2")
    report = manager.sweep()
    assert report["recovered"] == [old]
    assert manager.get(old, "local").public(None)["node"] == "n2"


def test_the_generator_refuses_what_it_cannot_route() -> None:
    with pytest.raises(FleetConfigError):
        haproxy_config([])
    with pytest.raises(FleetConfigError):
        haproxy_config([Node("n1", "a:1"), Node("n1", "b:1")])
    with pytest.raises(FleetConfigError):
        Node.parse("n1=a:0")
    body = json.loads(problem_body("n3"))
    assert (body["status"], body["node"]) == (503, "n3")
    assert body["type"] == "https://sandboxd.dev/problems/node-unavailable"
