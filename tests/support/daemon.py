"""Start a real ``sandboxd serve`` process on a free loopback port for tests and benchmarks
(for tests forked from the fork server of :mod:`tests.support.cli`: :data:`FORKED`)."""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sandboxd.cli.daemon import EXIT_LISTEN, EXIT_UID_RANGE
from sandboxd.host import uidclaim
from tests.support import cli
from tests.support.wait import wait_until

#: a daemon's process: a fresh interpreter, or forked from the CLI fork server
Process = subprocess.Popen[bytes] | cli.Forked
#: start daemons from the fork server (:mod:`tests.support.cli`: its imports done once per
#: pytest worker; a daemon's CPU to ready here: 70-90 ms instead of 620-820 ms). The tests'
#: conftest sets it; benchmarks leave it, as they measure a fresh interpreter's start. A
#: daemon behind a ``launcher``, with its own RLIMIT_NOFILE or other interpreter settings
#: (:func:`tests.support.cli.forkable`) is always a fresh interpreter.
FORKED = False

# (the VM job sets a longer self-test call limit: tests/vm/guest/test-suite.sh)
PASSED_SETTINGS = {"SANDBOXD_PYTHON_IMAGE", "SANDBOXD_SHELL_IMAGE",
                   "SANDBOXD_PROBE_CALL_TIMEOUT_S"}
#: settings every test daemon gets unless its ``env`` says otherwise. No warm container pool:
#: most test daemons never call a container tool, and two idle containers per daemon start
#: cost seconds of CPU each under the VM job's emulation; the tests of the pool
#: and of container calls set ``SANDBOXD_WARM_POOL_SIZE`` themselves. No ready sessions
#: either (each holds a started container), but in the tests of them.
TEST_DEFAULTS = {"SANDBOXD_WARM_POOL_SIZE": "0", "SANDBOXD_SESSION_POOL_SIZE": "0",
                 # a test daemon's state goes with the test: a stop ends its sessions (and so
                 # leaves no mount or container behind) unless the test keeps them
                 "SANDBOXD_SESSIONS_SURVIVE_RESTART": "false"}
# Test daemons take sandbox uid ranges of this size from TEST_UID_BASE up: above the default
# range (10100-10999, an installed service's) and the VM lanes' in-process backends (12100 +
# 1000 x lane), each claimed host-wide by its daemon (sandboxd.host.uidclaim)
TEST_UID_BASE = 20000
TEST_UID_COUNT = 200
#: tests/service/test_uid_claim picks its own ranges from here up
TEST_UID_TOP = 40000
UID_SETTINGS = ("SANDBOXD_SANDBOX_UID_FIRST", "SANDBOXD_SANDBOX_UID_COUNT")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections for as long as the block runs: bound by
    us and never listening, so no other process (a parallel test's daemon) can take it, as it
    could take a fixed port or one that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def _serve(args: Sequence[str], env: dict[str, str], log_path: Path, *,
           launcher: Sequence[str] = (), nofile: int | None = None) -> Process:
    """``sandboxd *args`` (``serve ...``) started with its output to ``log_path``: forked from
    the fork server when :data:`FORKED` (and nothing about its start is its own), else a
    fresh interpreter behind ``launcher`` with RLIMIT_NOFILE ``nofile``."""
    with open(log_path, "wb") as log:
        if FORKED and not launcher and not nofile:
            return cli.spawn("sandboxd", args, env=env, stdout=log.fileno())
        return subprocess.Popen([*launcher, *cli.argv("sandboxd", args)],
                                stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_nofile(nofile) if nofile else None)


def _nofile(limit: int):  # type: ignore[no-untyped-def]
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def uid_range_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``SANDBOXD_SANDBOX_UID_FIRST``/``_COUNT`` of a range no live daemon on this host claims
    (empty when ``env`` names the range itself, or when not root: a non-root daemon claims
    none). Ranges of TEST_UID_COUNT between TEST_UID_BASE and TEST_UID_TOP, each xdist worker
    taking every Nth of them (so two workers never pick the same one at once), from a random
    one on (parallel test runs spread). A daemon that still loses a race (another run on this
    host) exits with EXIT_UID_RANGE, and :func:`start_daemon` then tries another range."""
    if os.geteuid() != 0 or any(k in (env or {}) for k in UID_SETTINGS):
        return {}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    mine = int(worker[2:]) % workers if worker.startswith("gw") and worker[2:].isdigit() else 0
    slots = [n for n in range((TEST_UID_TOP - TEST_UID_BASE) // TEST_UID_COUNT)
             if n % max(workers, 1) == mine]
    offset = random.randrange(len(slots))
    for n in slots[offset:] + slots[:offset]:
        first = TEST_UID_BASE + n * TEST_UID_COUNT
        if uidclaim.holder(first, TEST_UID_COUNT) is None:
            break
    else:
        raise AssertionError("no free sandbox uid range for test daemons on this host")
    return {UID_SETTINGS[0]: str(first), UID_SETTINGS[1]: str(TEST_UID_COUNT)}


def daemon_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A test daemon's environment: ours without SANDBOXD_* settings (except the images), no
    config file, TEST_DEFAULTS, ``env`` on top, and a free sandbox uid range unless ``env``
    names one."""
    # the daemon's settings come from the test, except the sandbox images: a checkout may build
    # its own (sandboxd images build --tag ...) and point the whole suite at it
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("SANDBOXD_") or k in PASSED_SETTINGS}
    # a host's /etc/sandboxd/sandboxd.yaml (an installed service) must not leak into tests
    full_env["SANDBOXD_CONFIG"] = os.devnull
    full_env.update(TEST_DEFAULTS)
    full_env.update(env or {})
    full_env.update(uid_range_env(env))
    return full_env


def uid_range(env: Mapping[str, str]) -> range | None:
    """The sandbox uids a daemon started with ``env`` hands out (None: the default range)."""
    if UID_SETTINGS[0] not in env:
        return None
    first = int(env[UID_SETTINGS[0]])
    return range(first, first + int(env.get(UID_SETTINGS[1], "900")))


@dataclass
class RunningDaemon:
    """A daemon subprocess and an HTTP client bound to it."""

    url: str
    proc: Process
    state_dir: Path
    audit_path: Path
    log_path: Path
    client: httpx.Client
    headers: dict[str, str] = field(default_factory=dict)
    uids: range | None = None  # its sandbox uid range (None: the settings' default)
    #: the sd_notify socket it said READY=1 on (kept open for its STOPPING=1)
    notify: socket.socket | None = None

    def log(self) -> str:
        """What the daemon printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def invoke(self, tool: str, arguments: dict, **body: object) -> httpx.Response:
        """POST /v1/tools/{tool}/invoke."""
        return self.client.post(f"/v1/tools/{tool}/invoke", json={"arguments": arguments, **body})

    def python(self, session: str, code: str) -> dict[str, Any]:
        """A session's ``python`` call that must be answered 200: its result."""
        r = self.invoke("python", {"code": code}, session=session)
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` and wait for the process; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.notify is not None:
            self.notify.close()
        return self.proc.returncode


def start_daemon(
    tmp_path: Path,
    *,
    policies_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    state_dir: Path | None = None,
    token: str | None = None,
    ready_timeout: float = 240.0,
    nofile: int | None = None,
    launcher: Sequence[str] = (),
    port: int | None = None,
) -> RunningDaemon:
    """Start ``python -m sandboxd serve`` (behind ``launcher``, e.g. a capability-dropping
    wrapper, when given) and wait until ``/healthz`` answers (``nofile``: the daemon's
    RLIMIT_NOFILE, soft and hard). Unless ``env`` names one, the daemon gets a sandbox uid
    range that is free on this host (another one if a parallel run claimed it first), and a
    port that was free a moment ago (another one if a parallel process bound it first)."""
    for _ in range(4):
        try:
            return _start_daemon(tmp_path, policies_dir=policies_dir, env=env, args=args,
                                 state_dir=state_dir, token=token, ready_timeout=ready_timeout,
                                 nofile=nofile, launcher=launcher, port=port)
        except (_UidRangeLost, _PortLost):
            continue
    raise RuntimeError("four sandbox uid ranges or ports in a row were taken by others")


class _UidRangeLost(Exception):
    """The daemon exited EXIT_UID_RANGE on a range this module picked (a parallel run won)."""


class _PortLost(Exception):
    """The daemon exited EXIT_LISTEN: another process bound the port this module picked
    between :func:`free_port` and the daemon's bind."""


def _start_daemon(
    tmp_path: Path,
    *,
    policies_dir: Path | None,
    env: Mapping[str, str] | None,
    args: Sequence[str],
    state_dir: Path | None,
    token: str | None,
    ready_timeout: float,
    nofile: int | None,
    launcher: Sequence[str],
    port: int | None,
) -> RunningDaemon:
    state_dir = state_dir or tmp_path / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    chosen = port is not None  # a restart on the port a proxy knows: not another one
    port = port if port is not None else free_port()
    log_path = tmp_path / f"daemon-{port}.log"
    full_env = daemon_env(env)
    notify = _notify_socket(full_env) if "NOTIFY_SOCKET" not in (env or {}) else None
    picked = not any(k in (env or {}) for k in UID_SETTINGS)
    serve = ["serve", "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir)]
    if policies_dir is not None:
        serve += ["--policies", str(policies_dir)]
    proc = _serve([*serve, *args], full_env, log_path, launcher=launcher, nofile=nofile)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # one client for the polls and the test: each ``httpx.get`` builds a client and its TLS
    # context (~20 ms of CPU here, ~0.7 s under the VM job's emulation), taken from the daemon
    # starting beside it on every poll
    client = httpx.Client(base_url=url, headers=headers, timeout=120.0)

    def healthy() -> bool:
        if proc.poll() is not None:
            if picked and proc.returncode == EXIT_UID_RANGE:
                raise _UidRangeLost
            if proc.returncode == EXIT_LISTEN and "--port" not in args and not chosen:
                raise _PortLost
            raise RuntimeError(f"daemon exited with {proc.returncode}:\n{log_path.read_text()}")
        if notify is not None:
            _said_ready(notify)  # at most half a second; /healthz is asked either way
        return client.get("/healthz", timeout=1.0).status_code == 200

    try:
        # with the notify socket, the wait is paced by its receive (READY=1 or half a second)
        wait_until(healthy, timeout=ready_timeout, what="the daemon's /healthz",
                   ignore=(httpx.HTTPError,), interval=0.0 if notify is not None else 0.05)
    except BaseException as exc:
        client.close()
        if notify is not None:
            notify.close()
        if isinstance(exc, AssertionError):
            proc.kill()
            raise RuntimeError(
                f"daemon did not become healthy:\n{log_path.read_text()}") from None
        raise
    audit = Path(full_env.get("SANDBOXD_AUDIT_LOG", state_dir / "audit.jsonl"))
    return RunningDaemon(url, proc, state_dir, audit, log_path, client, headers,
                         uid_range(full_env), notify)


def _notify_socket(env: dict[str, str]) -> socket.socket:
    """An abstract sd_notify socket for a test daemon (``NOTIFY_SOCKET=@name`` in ``env``):
    the start waits for its READY=1 (sent once the daemon listens, after its self-test)
    instead of asking ``/healthz`` every 50 ms, which under the VM job's emulation took CPU
    from the daemon starting beside it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    name = f"sandboxd-test-{os.getpid()}-{secrets.token_hex(8)}"
    sock.bind(b"\0" + name.encode())
    env["NOTIFY_SOCKET"] = "@" + name
    return sock


def _said_ready(sock: socket.socket, wait_s: float = 0.5) -> bool:
    """True once a READY=1 datagram arrived, False after ``wait_s`` without one (a daemon in
    another network namespace cannot reach an abstract socket: its caller asks ``/healthz``
    all the same)."""
    sock.settimeout(wait_s)
    try:
        while b"READY=1" not in sock.recv(4096).split(b"\n"):
            pass
    except TimeoutError:
        return False
    return True


#: how much of a daemon's log a failing test shows
LOG_TAIL_LINES = 30


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a daemon's log, each cut at 300 characters."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"daemon log {path}: {exc}"
    tail = [line[:300] for line in text.splitlines()[-lines:]]
    return f"the daemon's log ({path.name}), last {len(tail)} lines:\n" + "\n".join(
        "  | " + line for line in tail)


@contextlib.contextmanager
def daemon_list() -> Iterator[list[RunningDaemon]]:
    """The daemons a test starts (it appends them); each is stopped at the end, whatever
    happened."""
    started: list[RunningDaemon] = []
    try:
        yield started
    finally:
        for d in started:
            d.client.close()
            d.stop()


def start_on_state(tmp_path: Path, daemons: list[RunningDaemon],
                   env: dict[str, str]) -> RunningDaemon:
    """One more daemon (of a :func:`daemon_list`) on the test's one state directory,
    ``tmp_path/state``: a restart as a test sees it."""
    where = tmp_path / f"d{len(daemons)}"
    where.mkdir()
    d = start_daemon(where, state_dir=tmp_path / "state", env=env)
    daemons.append(d)
    return d


@contextlib.contextmanager
def running_daemon(tmp_path: Path, **kwargs: object) -> Iterator[RunningDaemon]:
    """Context manager around :func:`start_daemon`; stops the daemon (SIGTERM) on exit."""
    daemon = start_daemon(tmp_path, **kwargs)  # type: ignore[arg-type]
    try:
        yield daemon
    except BaseException as exc:  # a failure, or pytest-timeout's: say what the daemon said
        exc.add_note(log_tail(daemon.log_path))
        raise
    finally:
        daemon.client.close()
        daemon.stop()


@contextlib.contextmanager
def unix_socket_daemon(tmp_path: Path, env: Mapping[str, str] | None = None,
                       ready_timeout: float = 240.0) -> Iterator[Path]:
    """``sandboxd serve --uds`` (no TCP listener) until ``/healthz`` answers on the socket;
    yields the socket's path and stops the daemon (SIGTERM) on exit."""
    sock = tmp_path / "sandboxd.sock"
    for _ in range(4):  # another range when a parallel run claimed the picked one first
        try:
            proc = _start_uds(sock, tmp_path, env, ready_timeout)
        except _UidRangeLost:
            continue
        try:
            yield sock
        finally:
            proc.terminate()
            proc.wait(60)
        return
    raise RuntimeError("four sandbox uid ranges in a row were claimed by other daemons")


def _start_uds(sock: Path, tmp_path: Path, env: Mapping[str, str] | None,
               ready_timeout: float) -> Process:
    log_path = tmp_path / "uds.log"
    picked = not any(k in (env or {}) for k in UID_SETTINGS)
    proc = _serve(["serve", "--uds", str(sock), "--state-dir", str(tmp_path / "state")],
                  daemon_env(env), log_path)

    def up() -> bool:
        if picked and proc.poll() == EXIT_UID_RANGE:
            raise _UidRangeLost
        assert proc.poll() is None, log_path.read_text()
        return http.get("/healthz").status_code == 200

    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                          base_url="http://x") as http:
            wait_until(up, timeout=ready_timeout, interval=0.1,
                       what="the daemon to come up on the socket", ignore=(httpx.HTTPError,))
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        raise
    return proc
