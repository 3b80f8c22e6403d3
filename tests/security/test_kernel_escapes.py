"""Escape attempts against restricted *session kernels* (they live across calls), through the HTTP
API of real daemons.

* The whole escape suite of :mod:`tests.security.test_restricted_escapes` runs in one session
  kernel, call after call: each attack ends as it does in a one-shot call, a limit ends the
  kernel (``kernel.lost`` with the reason), and after each one the attacker's kernel (when it
  survived), a bystander session's kernel and a one-shot call still see pristine modules, and
  the bystander keeps its state.
* Attacks that plant something in one call and use it in the next: guard and builtin names
  shadowed, module proxies written, a generator, an exception (traceback, frames), a
  function kept; a value whose ``repr`` never ends.
* With the language layer assumed broken (:mod:`tests.security.language_bypass`): a kernel
  that monkeypatches real modules in its process keeps that to itself (its next call sees it;
  other kernels and one-shot calls do not: the zygote stays pristine), cannot signal or
  re-limit another session's kernel, and one that writes garbage to its result channel -
  during a call, or between calls from a timer - loses its kernel and nothing else.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.restricted.test_kernel import kernel_process
from tests.security.language_bypass import MARK, bypass_daemon
from tests.security.test_restricted_escapes import (
    ATTACKS,
    CANARY_ENV,
    CANARY_FILE,
    LANGUAGE_LAYER,
    PRISTINE_CODE,
    attack_params,
    pristine_expected,
)
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon

#: the memory bomb's time is a bound, not the property: a fresh kernel's start is part of its
#: call, which took over 5 s under the VM job's emulation on a slow host (a wall_timeout)
LIMITS = {"memory_limit": {"memory_bytes": 64 * 1024 * 1024, "timeout_s": 30},
          "output_limit": {"output_bytes": 20_000},
          "wall_timeout": {"timeout_s": 1.5}, "cpu_or_wall": {"timeout_s": 1.5}}


class Env:
    def __init__(self, daemon: RunningDaemon, root: Path, canary: Path) -> None:
        self.daemon = daemon
        self.root = root
        self.canary = canary
        self.attacker = self.session()
        self.bystander = self.session()
        self.bystander_calls = 1
        res = self.run("marker = 'bystander state'", self.bystander)
        assert res["status"] == "ok", res

    def session(self) -> str:
        resp = self.daemon.client.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        return resp.json()["id"]

    def run(self, code: str, session: str | None, **limits: object) -> dict:
        body: dict = {"arguments": {"code": code}, "limits": {"timeout_s": 5, **limits}}
        if session is not None:
            body["session"] = session
        resp = self.daemon.client.post("/v1/tools/python/invoke", json=body)
        assert resp.status_code == 200, resp.text
        assert CANARY_ENV not in resp.text, "daemon environment secret leaked"
        assert CANARY_FILE not in resp.text, "secret file outside the workspace leaked"
        return resp.json()

    def assert_unaffected(self, attacker_alive: bool) -> None:
        """Pristine modules in the attacker's kernel (when alive), a one-shot call and the
        bystander's kernel, whose state is intact; nothing written outside."""
        expected = json.loads(json.dumps(pristine_expected()))
        sessions = [None, self.bystander] + ([self.attacker] if attacker_alive else [])
        for session in sessions:
            check = self.run(PRISTINE_CODE, session)
            assert check["status"] == "ok", (session, check)
            assert check["value"] == expected, session
        self.bystander_calls += 2
        res = self.run("marker", self.bystander)
        assert res["value"] == "bystander state", res
        assert res["kernel"] == {"fresh": False, "calls": self.bystander_calls, "lost": False,
                                 "reason": None, "interrupted": False}
        assert self.canary.read_text() == CANARY_FILE
        assert not glob.glob("/tmp/pwned_*")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("kernel-escapes")
    os.chmod(root, 0o755)
    canary = root / "canary.txt"
    canary.write_text(CANARY_FILE)
    os.chmod(canary, 0o644)
    with running_daemon(root, env={"SBX_CANARY_SECRET": CANARY_ENV}) as daemon:
        yield Env(daemon, root, canary)


@pytest.mark.parametrize(("name", "code", "expect"), attack_params(ATTACKS))
def test_escape_attempt_in_a_session_kernel(env: Env, name: str, code: str,
                                            expect: str) -> None:
    res = env.run(code, env.attacker, **LIMITS.get(expect, {}))
    reason = res["termination"]["reason"]
    if reason == "policy":  # refused by the policy before reaching the backend
        assert res["status"] in ("rejected", "denied") and expect == "refused", res
        env.assert_unaffected(attacker_alive=True)
        return
    kernel = res["kernel"]
    assert kernel is not None and kernel["calls"] >= 1, res
    if expect in ("refused", "contained"):
        if expect == "refused":
            assert res["status"] in ("error", "rejected", "denied"), res
            assert reason in ("exited", "policy"), res
        else:
            assert res["status"] in ("ok", "error"), res
        assert kernel["lost"] is False, res  # a refusal or an exception keeps the kernel
    else:
        if expect == "cpu_or_wall":
            assert reason in ("wall_timeout", "cpu_limit") and res["status"] == "timeout", res
        else:
            assert reason == expect, res
        if reason == "wall_timeout" and kernel["interrupted"]:
            assert kernel["lost"] is False, res  # interrupted and kept
        else:
            assert kernel["lost"] is True and kernel["reason"] == reason, res
    if expect == "output_limit":
        assert len(res["stdout"].encode()) <= 20_000 and res["truncated"]["stdout"]
    assert res["cleanup"]["verified"], res["cleanup"]
    env.assert_unaffected(attacker_alive=not kernel["lost"])


# (id, planting call, using call, what the using call must show)
PLANTED: list[tuple[str, str, str, str]] = [
    ("shadow_guard_builtins",
     "def getattr(o, n, *d):\n    return 'hijacked'\nsetattr = getattr\nhasattr = getattr\n"
     "def open(*a, **k):\n    return 'hijacked'\ntype = getattr",
     "().__class__.__base__.__subclasses__()", "refused"),
    ("shadow_then_import", "def __import__(*a):\n    return 1",
     "import json\njson.codecs", "refused"),
    ("write_module_proxy", "import json\nj = json\njson.dumps = len",
     "j.dumps({'a': 1})", '{"a": 1}'),
    ("stash_module_then_globals", "import json\nj = json\nd = j.dumps",
     "d.__globals__['sys']", "refused"),
    ("stash_generator", "def g():\n    yield 1\ngen = g()\nnext(gen)",
     "gen.gi_frame.f_back", "refused"),
    ("stash_generator_getattr", "def g():\n    yield 1\ngen = g()",
     "getattr(gen, 'gi' + '_frame')", "refused"),
    ("stash_exception", "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    err = e",
     "err.__traceback__.tb_frame.f_globals", "refused"),
    ("stash_exception_getattr", "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    err = e",
     "getattr(getattr(err, '__traceback__'), 'tb_frame')", "refused"),
    ("stash_function", "def f():\n    return 1",
     "f.__globals__['__builtins__']", "refused"),
    ("stash_function_code", "def f():\n    return 1", "f.__code__.co_consts", "refused"),
    ("stash_class_subclasses", "class A:\n    pass\na = A()",
     "type(a).__base__.__subclasses__()", "refused"),
    ("stash_format", "import string\nfmt = '{0.__class__}'", "fmt.format(1)", "refused"),
]


@LANGUAGE_LAYER
@pytest.mark.parametrize(("name", "plant", "use", "expect"), PLANTED,
                         ids=[p[0] for p in PLANTED])
def test_state_planted_in_one_call_used_in_the_next(env: Env, name: str, plant: str, use: str,
                                                    expect: str) -> None:
    session = env.session()
    first = env.run(plant, session)
    assert first["kernel"]["lost"] is False, first
    res = env.run(use, session)
    assert res["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                            "interrupted": False}, res
    if expect == "refused":
        assert res["status"] in ("error", "rejected", "denied"), res
        assert res["termination"]["reason"] in ("exited", "policy"), res
    else:
        assert res["status"] == "ok" and res["value"] == expect, res
    env.assert_unaffected(attacker_alive=False)
    env.daemon.client.delete(f"/v1/sessions/{session}")


def test_a_planted_value_whose_repr_never_ends_loses_only_that_kernel(env: Env) -> None:
    session = env.session()
    env.run("class Evil:\n    def __repr__(self):\n        while True:\n            pass\n"
            "e = Evil()", session)
    res = env.run("e", session, timeout_s=1.5)
    assert res["termination"]["reason"] in ("wall_timeout", "cpu_limit"), res
    assert res["kernel"]["lost"] is True, res
    assert env.run("1 + 1", session)["kernel"]["fresh"] is True
    env.assert_unaffected(attacker_alive=False)
    env.daemon.client.delete(f"/v1/sessions/{session}")


# ---------------------------------------------------------------- language layer broken


@pytest.fixture(scope="module")
def bypass(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    tmp = tmp_path_factory.mktemp("kernel-bypass")
    os.chmod(tmp, 0o755)
    with bypass_daemon(tmp) as d:
        yield d


def call(daemon: RunningDaemon, code: str, session: str | None, **limits: object) -> dict:
    body: dict = {"arguments": {"code": code}, "limits": {"timeout_s": 10, **limits}}
    if session is not None:
        body["session"] = session
    resp = daemon.client.post("/v1/tools/python/invoke", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def session(daemon: RunningDaemon) -> str:
    resp = daemon.client.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_bypassed_kernel_keeps_its_planting_to_itself(bypass: RunningDaemon) -> None:
    attacker, victim = session(bypass), session(bypass)
    assert call(bypass, "x = 'victim state'", victim)["status"] == "ok"
    planted = call(bypass, MARK + "import math\nmath.pi = 3.0\n"
                                  "os.environ['PLANTED'] = '1'\nresult = math.pi", attacker)
    assert planted["value"] == 3.0, planted
    # the attacker's own process keeps it (the kernel is one process) ...
    again = call(bypass, "import math\nmath.pi", attacker)
    assert again["value"] == 3.0 and again["kernel"]["calls"] == 2, again
    # ... and nothing else sees it: the zygote (one-shot calls, new kernels) and other kernels
    expected = json.loads(json.dumps(pristine_expected()))
    for target in (None, victim, session(bypass)):
        check = call(bypass, PRISTINE_CODE, target)
        assert check["status"] == "ok" and check["value"] == expected, (target, check)
        env_check = call(bypass, MARK + "result = os.environ.get('PLANTED')", target)
        assert env_check["value"] is None, env_check
    assert call(bypass, "x", victim)["value"] == "victim state"


ATTACK_OTHER_KERNEL = """
libc = ctypes.CDLL(None, use_errno=True)
T = %(target)d
def attempt(fn):
    ctypes.set_errno(0)
    res = fn()
    return 0 if res >= 0 else ctypes.get_errno()
class RLimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
one = RLimit(1, 1)
result = {"kill": attempt(lambda: libc.kill(T, 9)),
          "prlimit": attempt(lambda: libc.prlimit(T, 0, ctypes.byref(one), None)),
          "setpriority": attempt(lambda: libc.setpriority(0, T, 19))}
"""


def test_bypassed_kernel_cannot_touch_another_kernel(bypass: RunningDaemon) -> None:
    require(os.geteuid() == 0, "root (per-sandbox uids and namespaces are the root mode)")
    require(platform.machine() == "x86_64", "x86_64 (ctypes libc calls of the bypass suite)")

    attacker, victim = session(bypass), session(bypass)
    assert call(bypass, "x = 'victim state'", victim)["status"] == "ok"
    workspace = bypass.state_dir / "workspaces" / victim
    target = kernel_process(workspace)
    limits = Path(f"/proc/{target.pid}/limits")
    before = limits.read_text()
    res = call(bypass, MARK + ATTACK_OTHER_KERNEL % {"target": target.pid}, attacker)
    assert res["status"] == "ok", res
    assert all(v != 0 for v in res["value"].values()), res["value"]
    assert limits.read_text() == before
    after = call(bypass, "x", victim)
    assert after["value"] == "victim state" and after["kernel"]["lost"] is False, after


FIND_SOCKET = """
def is_sock(fd):
    try:
        return os.fstat(fd).st_mode & 0o170000 == 0o140000
    except OSError:
        return False
chan = [fd for fd in range(3, 64) if is_sock(fd)][0]
"""


@pytest.mark.parametrize("when", ["during_call", "between_calls"])
def test_garbage_on_the_result_channel_loses_only_that_kernel(bypass: RunningDaemon,
                                                              when: str) -> None:
    attacker, victim = session(bypass), session(bypass)
    assert call(bypass, "y = 'victim'", victim)["status"] == "ok"
    if when == "during_call":
        res = call(bypass, MARK + FIND_SOCKET + "os.write(chan, b'\\xffgarbage' * 64)",
                   attacker)
    else:
        # a timer fires after the call's report, while the kernel waits for the next call
        planted = call(bypass, MARK + FIND_SOCKET + (
            "sig = os.sys.modules['signal']\n"
            "sig.signal(sig.SIGALRM, lambda *a: os.write(chan, b'\\xffgarbage' * 64))\n"
            "sig.setitimer(sig.ITIMER_REAL, 0.3)\nresult = chan"), attacker)
        assert planted["status"] == "ok" and planted["kernel"]["lost"] is False, planted
        time.sleep(1.0)  # sleep-ok: the kernel's own 0.3 s timer writes; nothing outside sees it
        res = call(bypass, "1 + 1", attacker)
    assert res["status"] == "error", res
    assert res["kernel"]["lost"] is True and res["kernel"]["reason"] == "crashed", res
    assert "protocol" in (res["message"] or ""), res
    assert res["cleanup"]["verified"], res["cleanup"]
    fresh = call(bypass, "1 + 1", attacker)
    assert fresh["value"] == 2 and fresh["kernel"]["fresh"] is True, fresh
    assert call(bypass, "y", victim)["value"] == "victim"


CPU_LIMIT_IN_KERNEL = """
lang = os.sys.modules["sandboxd.backends.restricted.lang"]
used = resource.getrusage(resource.RUSAGE_SELF)
_soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
resource.setrlimit(resource.RLIMIT_CPU, (int(used.ru_utime + used.ru_stime) + 2, hard))
report = lang.run_user_code("while True:\\n    try:\\n        pass\\n    except BaseException:\\n"
                            "        pass", imports_allow=[], imports_deny=[], workspace="/",
                            output_bytes=1000, max_file_bytes=1000, emit=lambda k, d: None,
                            namespace={})
result = [report["outcome"], os.getpid()]
"""


def test_a_kernels_soft_cpu_limit_ends_restricted_code(bypass: RunningDaemon) -> None:
    """The soft RLIMIT_CPU a kernel moves per call does end restricted code - also in a
    kernel that is PID 1 of its namespace (SIGXCPU's default action is ignored there) and
    through ``except BaseException`` (the limit is uncatchable). The bypass only lowers the
    limit to a second from now, to reach it before the wall deadline."""
    sid = session(bypass)
    res = call(bypass, MARK + CPU_LIMIT_IN_KERNEL, sid, timeout_s=30)
    assert res["status"] == "ok", res
    assert res["value"][0] == "cpu_limit", res
