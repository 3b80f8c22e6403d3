"""The restricted backend with real processes and cgroups: limits, mapping, cleanup, restart,
probe, cancellation."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sandboxd.backends.base import Backend
from sandboxd.backends.restricted import RestrictedBackend
from sandboxd.backends.restricted.zygote import STANDBY_WORKERS
from sandboxd.models import Invocation, Limits, Reason, Status, ToolKind
from sandboxd.protocol.plan import ExecutionPlan, Plan
from tests.restricted.conftest import BackendHarness
from tests.support.ci import require
from tests.support.plan import with_limits
from tests.support.wait import async_wait_until, wait_until


def settle(harness: BackendHarness, timeout: float = 5.0) -> tuple[list[psutil.Process], set[str]]:
    """Wait until only standby workers are left; returns (zygote children, cgroup dirs)."""
    zygote = harness.backend._zygote
    assert zygote is not None

    def left() -> tuple[list[psutil.Process], set[str]]:
        children = psutil.Process(zygote.pid).children()
        dirs = {d.name for base in harness.backend.layout.bases.values()
                for d in base.iterdir() if d.is_dir()}
        return children, dirs

    def settled() -> tuple[list[psutil.Process], set[str]] | None:
        children, dirs = left()
        if len(children) <= STANDBY_WORKERS and (  # count-ok: a leak bound (standbys only)
            not harness.backend.layout.version or len(dirs) <= STANDBY_WORKERS
        ):
            return children, dirs
        return None

    return wait_until(settled, timeout=timeout, what="only standby workers left",
                      detail=left)


def busy_worker(harness: BackendHarness, cpu_s: float = 0.2) -> Callable[[], bool]:
    """A check that is true once a worker a call took (one not on standby) has burnt ``cpu_s``
    CPU seconds since the check first saw it: the call's busy loop runs. Call it on the
    harness's loop (it reads the zygote handle)."""
    first: dict[int, float] = {}

    def check() -> bool:
        z = harness.backend._zygote
        for worker in [] if z is None else list(z.workers.values()):
            if worker in z.standby:  # type: ignore[union-attr]
                continue
            try:
                times = psutil.Process(worker.pid).cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            if used - first.setdefault(worker.pid, used) > cpu_s:
                return True
        return False

    return check


def test_implements_protocol(harness: BackendHarness) -> None:
    assert isinstance(harness.backend, Backend)
    assert harness.backend.name == "restricted"


def test_wall_timeout_kills_and_cleans_up(harness: BackendHarness) -> None:
    t0 = time.monotonic()
    res = harness.run("print('start')\nwhile True:\n    pass", timeout_s=1)
    assert time.monotonic() - t0 < 5
    assert res.status is Status.timeout
    assert res.termination.reason is Reason.wall_timeout
    assert res.stdout == "start\n"  # output produced before the deadline is kept
    assert res.cleanup.verified, res.cleanup.detail
    assert res.resources.wall_ms >= 900
    children, _ = settle(harness)
    assert len(children) <= STANDBY_WORKERS  # count-ok: a leak bound (standbys only)


def test_sleep_timeout(harness: BackendHarness) -> None:
    res = harness.run("import time\ntime.sleep(30)", timeout_s=0.5, imports=["time"])
    assert res.termination.reason is Reason.wall_timeout
    assert res.cleanup.verified


def test_memory_bomb_is_memory_limit(harness: BackendHarness) -> None:
    code = "x = []\nwhile True:\n    x.append('a' * 10**6)"
    res = harness.run(code, memory_bytes=64 * 1024 * 1024)
    assert res.status is Status.killed
    assert res.termination.reason is Reason.memory_limit
    assert res.cleanup.verified
    # cgroup peak (root) or max RSS, which also counts pages shared with the zygote
    assert 0 < res.resources.peak_memory_bytes <= 160 * 1024 * 1024


def test_big_allocation_memory_error_cannot_be_caught(harness: BackendHarness) -> None:
    code = (
        "try:\n    x = bytearray(2 * 1024**3)\nexcept MemoryError:\n    print('caught')\n"
        "except BaseException:\n    print('caught base')\nprint('after')"
    )
    res = harness.run(code, memory_bytes=64 * 1024 * 1024)
    assert res.termination.reason is Reason.memory_limit
    assert "caught" not in res.stdout and "after" not in res.stdout


def test_output_limit(harness: BackendHarness) -> None:
    res = harness.run("print('x' * 100000)", output_bytes=1000)
    assert res.status is Status.killed
    assert res.termination.reason is Reason.output_limit
    assert len(res.stdout.encode()) == 1000
    assert res.truncated.stdout


def test_output_flood_cannot_catch_limit(harness: BackendHarness) -> None:
    code = (
        "n = 0\nwhile n < 10**6:\n    n += 1\n    try:\n        print('y' * 100)\n"
        "    except BaseException:\n        pass\n"
    )
    res = harness.run(code, output_bytes=5000)
    assert res.termination.reason is Reason.output_limit
    assert len(res.stdout.encode()) <= 5000


def test_exception_traceback_has_no_host_paths(harness: BackendHarness) -> None:
    res = harness.run("import json\ndef f():\n    return json.loads('{bad')\nf()")
    assert res.status is Status.error
    assert res.termination.reason is Reason.exited and res.termination.exit_code == 1
    assert "JSONDecodeError" in res.stderr
    assert 'File "<code>", line 3, in f' in res.stderr
    for host in ("/usr/lib", "site-packages", "sandboxd", ".py"):
        assert host not in res.stderr


def test_compile_refusal_is_error_with_message(harness: BackendHarness) -> None:
    res = harness.run("x = ().__class__")
    assert res.status is Status.error
    assert "__class__" in res.stderr and "Line 1" in res.stderr
    res = harness.run("def f(:\n  pass")
    assert res.status is Status.error and "SyntaxError" in res.stderr


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ("raise SystemExit", Status.ok, 0),
        ("raise SystemExit(0)", Status.ok, 0),
        ("raise SystemExit(3)", Status.error, 3),
        ("raise SystemExit('bye')", Status.error, 1),
        ("raise KeyboardInterrupt", Status.error, 1),
        ("raise GeneratorExit", Status.error, 1),
    ],
)
def test_exit_exceptions_are_contained(
    harness: BackendHarness, code: str, status: Status, exit_code: int
) -> None:
    res = harness.run(code)
    assert res.status is status
    assert res.termination.reason is Reason.exited
    assert res.termination.exit_code == exit_code
    assert res.cleanup.verified


def test_file_size_cap(harness: BackendHarness) -> None:
    res = harness.run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * 5000)",
                      max_file_bytes=1000)
    assert res.status is Status.error
    assert "size limit" in res.stderr


def test_files_persist_in_given_workspace(harness: BackendHarness) -> None:
    ws = harness.workspace()
    assert harness.run("open('a.txt', 'w').write('hello')", workspace=ws).status is Status.ok
    assert (ws / "a.txt").read_text() == "hello"
    res = harness.run("open('a.txt').read()", workspace=ws)
    assert res.value == "hello"


def test_non_python_kind_is_rejected(harness: BackendHarness) -> None:
    inv = Invocation(tool="shell", client="t", workspace=harness.workspace(),
                     plan=ExecutionPlan(kind=ToolKind.command, command=Plan.single(["ls"])))
    res = harness.call(harness.backend.run(with_limits(inv, Limits()), time.monotonic() + 5))
    assert res.status is Status.rejected
    assert res.cleanup.verified


def test_concurrent_calls_are_isolated(harness: BackendHarness) -> None:
    async def many() -> list:
        invs = [harness.invocation(f"x = {i}\nprint(x * 2)\nx") for i in range(12)]
        return await asyncio.gather(*[
            # 12 at once: a deadline that only a hang reaches, also on slow emulated hosts
            harness.backend.run(with_limits(inv, Limits(timeout_s=120)), time.monotonic() + 120)
            for inv in invs])

    results = harness.call(many())
    for i, res in enumerate(results):
        assert res.status is Status.ok
        assert res.stdout == f"{i * 2}\n" and res.value == i


def test_cancellation_kills_worker(harness: BackendHarness) -> None:
    async def cancel_one() -> bool:
        inv = harness.invocation("while True:\n    pass")
        task = asyncio.create_task(
            harness.backend.run(with_limits(inv, Limits(timeout_s=30)), time.monotonic() + 30))
        await async_wait_until(busy_worker(harness), timeout=20,
                               what="the call's busy loop running in its worker")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    t0 = time.monotonic()
    assert harness.call(cancel_one())
    assert time.monotonic() - t0 < 10
    children, dirs = settle(harness)
    assert len(children) <= STANDBY_WORKERS  # count-ok: a leak bound (standbys only)
    assert len(dirs) <= STANDBY_WORKERS
    for child in children:  # the survivors are fresh standbys, not the busy loop
        assert child.cpu_times().user < 1.0


def test_zygote_restarts_after_crash(harness: BackendHarness) -> None:
    zygote = harness.backend._zygote
    assert zygote is not None
    before = harness.backend.restarts
    old_cgroups = [w.cgroup for w in zygote.workers.values()]
    assert old_cgroups
    os.kill(zygote.pid, signal.SIGKILL)
    wait_until(lambda: not zygote.alive, timeout=5, interval=0.02,
               what="the backend to notice the zygote's death")
    res = harness.run("print('back')")
    assert res.status is Status.ok and res.stdout == "back\n"
    assert harness.backend.restarts == before + 1
    assert harness.backend._zygote is not None and harness.backend._zygote.pid != zygote.pid
    assert not psutil.pid_exists(zygote.pid)  # reaped, no zombie
    # the dead zygote's standby workers are gone, and so are their cgroups
    for name in old_cgroups:
        assert not any(d.exists() for d in harness.backend.layout.dirs(name)), name


def test_a_dead_zygote_is_replaced_once_when_a_call_and_a_health_check_race(
        harness: BackendHarness) -> None:
    """A health ping that timed out on a zygote which was in fact dead must not replace it a
    second time while a call is already starting its successor (seen in the modern-host VM)."""
    zygote = harness.backend._zygote
    assert zygote is not None
    before = harness.backend.restarts
    os.kill(zygote.pid, signal.SIGKILL)
    wait_until(lambda: not zygote.alive, timeout=5, interval=0.02,
               what="the backend to notice the zygote's death")

    async def race() -> None:
        starting = asyncio.create_task(harness.backend._ensure_zygote())
        await asyncio.sleep(0)  # the call is now inside the replacement
        await harness.backend.replace_zygote(zygote)
        await starting

    harness.call(race())
    assert harness.backend.restarts == before + 1
    new = harness.backend._zygote
    assert new is not None and new.alive and new.pid != zygote.pid
    res = harness.run("print('once')")
    assert res.status is Status.ok and res.stdout == "once\n"
    assert harness.backend._zygote is new


def test_zygote_crash_during_call_reports_error(harness: BackendHarness) -> None:
    async def crash() -> object:
        inv = harness.invocation("while True:\n    pass")
        task = asyncio.create_task(
            harness.backend.run(with_limits(inv, Limits(timeout_s=20)), time.monotonic() + 20))
        await async_wait_until(busy_worker(harness), timeout=15,
                               what="the call's busy loop running in its worker")
        z = harness.backend._zygote
        assert z is not None
        os.kill(z.pid, signal.SIGKILL)
        return await task

    res = harness.call(crash())
    assert res.status is Status.error
    assert "worker failed" in (res.message or "")
    assert harness.run("print(2)").stdout == "2\n"


def test_probe_proves_confinement(harness: BackendHarness) -> None:
    report = harness.call(harness.backend.probe())
    names = {c.name: c for c in report.checks}
    assert report.ok, report
    for name in ("socket_blocked", "write_outside_blocked", "memory_limit", "seccomp",
                 "unprivileged"):
        assert names[name].ok, names[name]


def test_startup_sweep_removes_leftover_cgroups(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "root: cgroups are only used when the daemon runs as root")
    os.chmod(tmp_path, 0o755)
    h = BackendHarness(tmp_path, "sweeptest" + os.urandom(3).hex())
    try:
        layout = h.backend.layout
        assert layout.version
        leftover = [base / "wdeadbeef" for base in layout.bases.values()]
        for d in leftover:
            d.mkdir()
        scratch = tmp_path / "restricted-probe-deadbeef"  # a probe killed with its daemon
        (scratch / "ws").mkdir(parents=True)
        h.call(h.backend.close())
        h.call(h.backend.start())
        assert not any(d.exists() for d in leftover)
        assert not scratch.exists()
        assert h.run("print(1)").stdout == "1\n"
    finally:
        h.close()
    # close() removed everything of this instance, its instance directories included
    for base in h.backend.layout.bases.values():
        assert not base.exists()


def test_unavailable_when_disabled(tmp_path: Path) -> None:
    from sandboxd.config import Settings

    backend = RestrictedBackend.from_settings(
        Settings(state_dir=tmp_path, restricted_enabled=False))
    asyncio.run(backend.start())
    ok, reason = backend.availability()
    assert not ok and "disabled" in (reason or "")


def test_symlink_out_of_workspace_is_not_followed(harness: BackendHarness, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret-value")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    ws = harness.workspace()
    (ws / "link").symlink_to(secret)
    (ws / "dirlink").symlink_to(tmp_path)
    for code in ("open('link').read()", "open('dirlink/secret.txt').read()",
                 f"open({str(secret)!r}).read()"):
        res = harness.run(code, workspace=ws)
        assert res.status is Status.error, res
        assert "top-secret-value" not in res.stdout + res.stderr + str(res.value)


def test_landlock_reported_by_probe(harness: BackendHarness) -> None:
    from sandboxd.backends.restricted import landlock

    report = harness.call(harness.backend.probe())
    check = next(c for c in report.checks if c.name == "landlock")
    assert check.ok, check
    if landlock.landlock_abi() > 0:
        assert check.detail.startswith("enforced")


def test_large_code_is_delivered_whole(harness: BackendHarness) -> None:
    code = "# " + "x" * 400_000 + "\nvalues = [" + ", ".join(str(i) for i in range(20_000)) + "]\n"
    code += "print(len(values), sum(values))"
    res = harness.run(code)
    assert res.status is Status.ok, res.stderr
    assert res.stdout == f"20000 {sum(range(20_000))}\n"


def test_run_before_start_is_an_error(tmp_path: Path) -> None:
    from sandboxd.config import Settings

    backend = RestrictedBackend.from_settings(Settings(state_dir=tmp_path))
    inv = Invocation(tool="python", client="t", workspace=tmp_path,
                     arguments={"code": "print(1)"}, plan=ExecutionPlan(kind=ToolKind.python))
    res = asyncio.run(backend.run(with_limits(inv, Limits()), time.monotonic() + 5))
    assert res.status is Status.error and "unavailable" in (res.message or "")
    assert backend.availability()[0] is False


def test_memory_limit_below_worker_needs(harness: BackendHarness) -> None:
    require(bool(harness.backend.layout.version), "writable cgroups (root)")
    res = harness.run("print(1)", memory_bytes=1024 * 1024)
    assert res.status is Status.killed
    assert res.termination.reason is Reason.memory_limit
    assert "below what the python worker needs" in (res.message or "")
    assert res.cleanup.verified


OPEN_MANY = (
    "held = []\n"
    "try:\n"
    "    for i in range(300):\n"
    "        held.append(open(f'f{i}', 'w'))\n"
    "except OSError as exc:\n"
    "    print('refused', exc.errno)\n"
    "print('held', len(held))\n"
)


def test_open_files_limit_is_the_calls_rlimit(harness: BackendHarness) -> None:
    """``limits.open_files`` is RLIMIT_NOFILE of the worker (soft = hard): a call may hold
    fewer descriptors than its limit (the worker's own use a few), never more; a higher
    limit lets it hold more."""
    low = harness.run(OPEN_MANY, open_files=32)
    assert low.status is Status.ok, low
    assert "refused 24" in low.stdout  # EMFILE
    held_low = int(low.stdout.split("held ")[1])
    assert 16 < held_low < 32
    high = harness.run(OPEN_MANY, open_files=256)
    assert "refused 24" in high.stdout
    held_high = int(high.stdout.split("held ")[1])
    assert held_high - held_low == 256 - 32
