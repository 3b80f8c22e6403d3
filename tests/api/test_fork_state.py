"""A session's live Python state carried to its forks, through the real daemon and the
restricted backend: the parent's kernel pickles its names inside its sandbox, each fork's
fresh kernel restores them inside its own before its first call. Variables, imports,
functions (which read the fork's globals), classes and their instances are carried; forks
diverge; a name that cannot be carried is named (answer and audit); a state over the limit
is not carried at all, and the answer says why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon

#: the daemon's limit on a pickled state here: small, so that a test can go past it
STATE_LIMIT = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    env = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "12",
           "SANDBOXD_FORK_STATE_BYTES": str(STATE_LIMIT)}
    with running_daemon(tmp_path_factory.mktemp("forkstate"), env=env) as d:
        yield d


def _defined(d: RunningDaemon, sid: str, *names: str) -> list[str]:
    """Which of ``names`` the session's kernel has."""
    code = "had = []\n" + "".join(f"try:\n    {n}\n    had.append('{n}')\nexcept NameError:\n"
                                  "    pass\n" for n in names) + "had"
    return d.python(sid, code)["value"]


def _fork(d: RunningDaemon, sid: str, count: int) -> dict:
    r = d.client.post(f"/v1/sessions/{sid}/fork", json={"count": count})
    assert r.status_code == 201, r.text
    return r.json()


SETUP = """
import math
import collections
x = 41
data = {'k': [1, 2, 3], 'b': b'bytes'}
shared = [0]
alias = shared
def f():
    return x + 1
scale = lambda v: v * math.floor(math.pi)
class Counter:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += 1
        return self.n
c = Counter()
c.bump()
od = collections.OrderedDict(a=1)
gen = (i for i in range(3))
handle = open('notes.txt', 'w')
"""


def test_variables_imports_and_functions_are_carried_and_forks_diverge(
        daemon: RunningDaemon) -> None:
    d = daemon
    parent = d.client.post("/v1/sessions").json()["id"]
    assert d.python(parent, SETUP)["status"] == "ok"
    body = _fork(d, parent, 2)
    kernel = body["kernel"]
    assert kernel["carried"] is True and kernel["parent_backends"] == ["restricted"], kernel
    assert "reason" not in kernel and kernel["bytes"] > 0
    left_out = {n["name"]: n["why"] for n in kernel["not_carried"]}
    assert set(left_out) == {"gen", "handle"}, left_out
    assert "generator" in left_out["gen"]
    one, two = (s["id"] for s in body["sessions"])
    # a function defined before the fork reads the fork's global, changed after it
    seen = d.python(one, "x = 100\nalias.append(1)\n"
                           "[f(), scale(2), c.bump(), data['k'], list(od), shared, "
                           "math.sqrt(16)]")
    assert seen["status"] == "ok", seen
    assert seen["value"] == [101, 6, 2, [1, 2, 3], ["a"], [0, 1], 4.0], seen
    assert seen["kernel"]["fresh"] is True
    # the other fork and the parent are untouched by it
    assert d.python(two, "[f(), c.n, shared]")["value"] == [42, 1, [0]]
    assert d.python(parent, "[f(), c.n, shared]")["value"] == [42, 1, [0]]
    # what was not carried is absent in the fork, present in the parent
    assert _defined(d, one, "gen", "handle", "f") == ["f"]
    assert _defined(d, parent, "gen", "handle") == ["gen", "handle"]
    # a user class rebuilt in the fork is the fork's own: its instances can be changed
    assert d.python(two, "class Sub(Counter):\n    pass\ns = Sub()\ns.bump()")[
        "value"] == 1
    records = [x for x in audit_records(d.audit_path) if x["event"] == "session_forked"
               and x["session"] == parent]
    assert [(x["kernel_carried"], x["not_carried"], x["children"]) for x in records] == [
        (True, ["gen", "handle"], [one, two])]
    assert records[0]["state_bytes"] == kernel["bytes"]
    for sid in (parent, one, two):
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_restarted_fork_starts_empty_and_a_session_without_kernel_carries_nothing(
        daemon: RunningDaemon) -> None:
    d = daemon
    parent = d.client.post("/v1/sessions").json()["id"]
    empty = _fork(d, parent, 1)
    assert empty["kernel"]["carried"] is False
    assert "no live Python kernel" in empty["kernel"]["reason"]
    assert d.python(parent, "y = 7")["status"] == "ok"
    child = _fork(d, parent, 1)["sessions"][0]["id"]
    assert d.client.post(f"/v1/sessions/{child}/restart").status_code == 200
    assert _defined(d, child, "y") == []
    for sid in (parent, child, empty["sessions"][0]["id"]):
        d.client.delete(f"/v1/sessions/{sid}")


def test_a_state_over_the_limit_is_not_carried_and_the_parent_keeps_it(
        daemon: RunningDaemon) -> None:
    d = daemon
    parent = d.client.post("/v1/sessions").json()["id"]
    assert d.python(parent, f"blob = b'x' * {STATE_LIMIT + 1024}\nsmall = 1")[
        "status"] == "ok"
    body = _fork(d, parent, 2)
    kernel = body["kernel"]
    assert kernel["carried"] is False and "bytes" not in kernel, kernel
    assert f"larger than {STATE_LIMIT} bytes" in kernel["reason"], kernel
    for s in body["sessions"]:  # nothing half-made: no fork has any of it
        assert _defined(d, s["id"], "blob", "small") == []
    assert d.python(parent, "[len(blob), small]")["value"] == [STATE_LIMIT + 1024, 1]
    records = [x for x in audit_records(d.audit_path) if x["event"] == "session_forked"
               and x["session"] == parent]
    assert [x["kernel_carried"] for x in records] == [False]
    for sid in (parent, *(s["id"] for s in body["sessions"])):
        d.client.delete(f"/v1/sessions/{sid}")
