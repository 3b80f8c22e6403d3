"""``sandboxd doctor``: prove, on this host and with these settings, that confinement holds.

It builds every enabled backend from the settings exactly as the daemon does, starts it, runs
its ``probe()`` in-process (the same self-test as ``GET /readyz``), and prints one line per
check::

    BACKEND     CHECK                   RESULT  DETAIL
    restricted  socket_blocked          ok      socket(AF_INET) -> EPERM
    restricted  memory_limit            FAIL    allocated 512 MiB under a 64 MiB limit
    container   -                       n/a     unavailable: no Docker engine

Before the backends it lists host facts an admin needs when a probe fails (user, state and
audit directories, workspace quota, then each enabled backend's rows from its registry entry:
cgroup version and write access, seccomp, Docker socket ownership). Which backends exist,
which is the default, and what each adds is the registry's (:mod:`sandboxd.backends.registry`).
Exit status: 1 when the default backend is unavailable or fails a check (the daemon would
refuse to start), 1 with ``--strict`` when any enabled backend does, 2 for bad settings,
else 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import typer

from sandboxd.cli.common import CONFIG_OPTION, STATE_DIR_OPTION, settings_for
from sandboxd.host.statelock import Holder
from sandboxd.models import ProbeCheck, ProbeReport
from sandboxd.util.deadline import within

PROBE_TIMEOUT_S = 120.0


def _default_backend() -> str:
    from sandboxd.backends.registry import default_backend

    return default_backend()


def _known_backends() -> list[str]:
    from sandboxd.backends.registry import names

    return names(executes=True)


def enabled_backends(settings: Any) -> list[str]:
    """Names of the execution backends the settings enable, default backend first."""
    from sandboxd.backends.factory import enabled_backends as enabled

    return enabled(settings)


async def _bounded(step: Any) -> None:
    """Await one of a backend's lifecycle steps, raising TimeoutError when it does not answer
    within the probe timeout."""
    done, _ = await within(step, PROBE_TIMEOUT_S)
    if not done:
        raise TimeoutError(f"no answer within {PROBE_TIMEOUT_S:g} s")


async def probe_backend(name: str, settings: Any) -> tuple[bool, ProbeReport]:
    """``(available, report)`` for one backend: construct, start, probe, close."""
    from sandboxd.backends.factory import build_backend
    from sandboxd.host.uids import UidPool

    try:
        backend = build_backend(name, settings, UidPool.from_settings(settings))
    except Exception as exc:
        return False, ProbeReport(backend=name, ok=False, detail=f"cannot load: {exc}")
    try:
        return await _start_and_probe(name, backend)
    finally:
        try:
            await _bounded(backend.close())
        except Exception as exc:
            typer.echo(f"sandboxd doctor: closing the {name} backend failed: {exc}", err=True)


async def _start_and_probe(name: str, backend: Any) -> tuple[bool, ProbeReport]:
    """Start a constructed backend and, when it says it is available, run its probe."""
    try:
        await _bounded(backend.start())
    except Exception as exc:
        return False, ProbeReport(backend=name, ok=False, detail=f"start failed: {exc}")
    ok, why = backend.availability()
    if not ok:
        return False, ProbeReport(backend=name, ok=False, detail=f"unavailable: {why}")
    try:
        answered, report = await within(backend.probe(), PROBE_TIMEOUT_S)
    except Exception as exc:
        return True, ProbeReport(backend=name, ok=False, detail=f"probe crashed: {exc}")
    if not answered:
        return True, ProbeReport(backend=name, ok=False, detail="probe timed out")
    return True, report


# ------------------------------------------------------------------ host facts


def _status_field(key: str) -> str | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _writable_row(name: str, path: Any, target: Path, absent: str) -> ProbeCheck:
    """Whether the daemon may write ``target`` (the directory that holds or will hold
    ``path``); ``absent`` is added to the detail while ``path`` does not exist yet."""
    writable = os.access(target, os.W_OK)
    note = "" if Path(path).exists() else absent
    return ProbeCheck(name=name, ok=writable,
                      detail=f"{path} ({'writable' if writable else 'NOT writable'}{note})")


def _existing(path: Path) -> Path:
    """``path`` when it exists, else its parent (where it would be created)."""
    return path if path.exists() else path.parent


def host_checks(settings: Any) -> list[ProbeCheck]:
    """Facts about the host and the daemon's own confinement (informational)."""
    from sandboxd.host.uids import identities

    root = os.geteuid() == 0
    systemd = ", under systemd" if os.environ.get("INVOCATION_ID") else ""
    state = Path(settings.state_dir)
    checks = [
        ProbeCheck(name="user", ok=True,
                   detail=f"uid={os.geteuid()} gid={os.getegid()} "
                   f"({'root' if root else 'non-root'}: {identities(settings, root)})"),
        ProbeCheck(name="daemon_confinement", ok=True,
                   detail=f"own seccomp mode {_status_field('Seccomp') or '?'} (2 = filtered, "
                   f"e.g. by systemd), no_new_privs={_status_field('NoNewPrivs') or '?'}"
                   + systemd),
        _writable_row("state_dir", state, _existing(state),
                      "; does not exist yet, the daemon creates it"),
        _writable_row("audit_log", settings.audit_path,
                      _existing(Path(settings.audit_path).parent), "; not written yet"),
        _workspace_quota_check(settings),
    ]
    return checks + _backend_host_checks(settings)


def _backend_host_checks(settings: Any) -> list[ProbeCheck]:
    """Each enabled backend's own host rows; one failing row for a backend that cannot say
    (a backend's rows must not hide the others)."""
    from sandboxd.backends import registry

    checks: list[ProbeCheck] = []
    for entry in registry.enabled(settings):
        try:
            checks += entry.host_checks(settings)
        except Exception as exc:
            checks.append(ProbeCheck(name=f"{entry.name}_rows", ok=False,
                                     detail=f"could not be read: {exc}"))
    return checks


def _workspace_quota_check(settings: Any) -> ProbeCheck:
    """Whether this process may mount a size/inode-limited tmpfs per workspace (the kernel
    then holds the quota during calls), tried in a scratch directory."""
    import tempfile

    from sandboxd.workspaces.quota import WorkspaceFS

    scratch = Path(tempfile.mkdtemp(prefix="sandboxd-doctor-"))
    try:
        fs = WorkspaceFS(scratch, quota_bytes=settings.session_quota_bytes,
                         quota_entries=settings.session_quota_entries,
                         setting=settings.workspace_quota)
        fs.detect()
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()
    detail = fs.detail
    if not fs.ok:
        detail += " - workspace_quota=kernel: the daemon will not be ready"
    return ProbeCheck(name="workspace_quota", ok=fs.kernel, detail=detail)


# ------------------------------------------------------------------ output


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("BACKEND", "CHECK", "RESULT", "DETAIL")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = []
    for row in [header, *rows]:
        cells = [row[i].ljust(widths[i]) for i in range(3)]
        lines.append("  ".join([*cells, row[3]]).rstrip())
    return "\n".join(lines)


_RESULT = {True: "ok", False: "FAIL"}


def _rows(name: str, available: bool, report: ProbeReport) -> list[tuple[str, str, str, str]]:
    """One backend's table rows: a row per check and the summary, or one row without checks."""
    if not report.checks:
        result = _RESULT[report.ok] if available else "n/a"
        return [(name, "-", result, report.detail or ("ok" if report.ok else "failed"))]
    rows = [(name, c.name, _RESULT[c.ok], c.detail) for c in report.checks]
    if report.detail:
        rows.append((name, "(summary)", _RESULT[report.ok], report.detail))
    return rows


async def run_doctor(settings: Any, names: list[str]) -> list[tuple[str, bool, ProbeReport]]:
    """Probe each named backend in turn (never in parallel: probes measure limits)."""
    results = []
    for name in names:
        available, report = await probe_backend(name, settings)
        results.append((name, available, report))
    return results


async def _probe_without_touching_state(
        settings: Any, names: list[str], live: Holder | None,
) -> list[tuple[str, bool, ProbeReport]]:
    """Probe the backends. In the daemon's state directory only when it exists and no daemon
    holds it (the backends' start-up then sweeps what a crashed daemon left); otherwise in a
    scratch one under an instance name of its own, removed afterwards: the doctor creates
    nothing, and never sweeps, stops or removes a live daemon's containers, cgroups or files."""
    if Path(settings.state_dir).exists() and live is None:
        return await run_doctor(settings, names)
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="sandboxd-doctor-state-"))
    try:  # instance None: named after the scratch directory, so no daemon's label or cgroup
        return await run_doctor(
            settings.model_copy(update={"state_dir": scratch, "instance": None}), names)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


def _probe_uids(settings: Any) -> tuple[Any, Any]:
    from sandboxd.host import uidclaim

    try:
        return uidclaim.claim_for_probes(settings)
    except (uidclaim.UidRangeTaken, uidclaim.UidClaimError) as exc:
        typer.echo(f"sandboxd doctor: {exc}", err=True)
        raise typer.Exit(1) from exc


def _lock_or_holder(settings: Any) -> tuple[int | None, Holder | None]:
    """``(fd, None)``: the doctor holds the state directory's lock while it probes (a daemon
    started meanwhile refuses, instead of losing its containers to the doctor's sweep);
    ``(None, holder)``: a daemon holds it; ``(None, None)``: there is no state directory."""
    from sandboxd.host import statelock

    state = Path(settings.state_dir)
    if not state.exists():
        return None, None
    try:
        return statelock.acquire(state), None
    except statelock.StateDirLocked as exc:
        return None, Holder(statelock.lock_path(state), exc.pid)
    except OSError as exc:  # cannot tell: the safe answer is "live"
        return None, statelock.holder(state) or Holder(
            statelock.lock_path(state), None, f"cannot be taken: {exc.strerror or exc}")


def left_alone(settings: Any) -> list[str]:
    """What the enabled backends' start-up sweep would remove in the daemon's state directory
    and engine (each entry's ``leftovers``: containers, runner directory, probe leftovers):
    read, never touched."""
    from sandboxd.backends import registry

    things: list[str] = []
    for entry in registry.enabled(settings):
        try:
            things += entry.left_behind(settings)
        except Exception as exc:  # cannot tell: say so, touch nothing
            things.append(f"{entry.name} leftovers unknown ({exc})")
    return things


def _live_note(settings: Any, live: Holder) -> str:
    things = left_alone(settings)
    what = "would remove " + ", ".join(things) if things else "nothing to clean up"
    return (f"{what} ({live}: a live daemon's own, left alone; the probes ran in a scratch "
            "state directory)")


def _bad_choice(message: str) -> typer.Exit:
    """Say why a ``--backend`` cannot be probed; the exit (2) for the caller to raise."""
    typer.echo(f"sandboxd doctor: {message}", err=True)
    return typer.Exit(2)


def _chosen_backends(settings: Any, backend: list[str]) -> list[str]:
    """The enabled backends to probe (``--backend``: only those), or exit 2 naming one that
    is unknown or disabled."""
    names = enabled_backends(settings)
    known = _known_backends()
    for b in backend:
        if b not in known:
            raise _bad_choice(f"unknown backend {b!r} (choose {' or '.join(known)})")
    if not backend:
        return names
    for b in backend:
        if b not in names:
            raise _bad_choice(f"backend {b!r} is disabled in the settings")
    return [n for n in names if n in backend]


def _probe(settings: Any, names: list[str]) -> tuple[Any, Holder | None, str | None]:
    """Every chosen backend's probe result, beside a live daemon if there is one (its state,
    uids and lock left alone), and the note saying so."""
    lock_fd, live = _lock_or_holder(settings)
    uid_claim = None
    try:
        note = _live_note(settings, live) if live is not None else None
        # the probes' sandbox uids: never ones a live daemon hands out (sandboxd.host.uidclaim)
        probing, uid_claim = _probe_uids(settings)
        results = asyncio.run(_probe_without_touching_state(probing, names, live))
    finally:
        if uid_claim is not None:
            uid_claim.release()
        if lock_fd is not None:
            os.close(lock_fd)
    return results, live, note


def _verdict_line(name: str, available: bool, ok: bool, default: str) -> str:
    """One backend's verdict: ok, FAIL (the default backend: the daemon will not start) or
    warn (another backend: its tools are unavailable)."""
    label = "default backend" if name == default else "backend"
    if available and ok:
        return f"ok: {label} '{name}': confinement holds"
    if name == default:
        return (f"FAIL: {label} '{name}': confinement NOT proven - the daemon refuses to "
                "start without --allow-unconfined")
    verdict = "unavailable" if not available else "confinement NOT proven"
    return f"warn: {label} '{name}': {verdict} - its tools are unavailable"


def _all_rows(host: list[ProbeCheck], results: Any) -> list[tuple[str, str, str, str]]:
    """The table: the host rows (a failed one is a warning), then each backend's."""
    rows = [("host", c.name, "ok" if c.ok else "warn", c.detail) for c in host]
    for name, available, report in results:
        rows += _rows(name, available, report)
    return rows


def _print_text(host: list[Any], results: Any, note: str | None, default: str,
                default_enabled: bool) -> None:
    typer.echo(_table(_all_rows(host, results)))
    typer.echo("")
    if note is not None:
        typer.echo(note)
    if not default_enabled:
        typer.echo(f"FAIL: the default backend '{default}' is disabled in the settings")
    for name, available, report in results:
        typer.echo(_verdict_line(name, available, report.ok, default))


def doctor(
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
    backend: list[str] = typer.Option(
        [], "--backend", "-b", help="Probe only this backend (repeatable)"
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 when any enabled backend fails, not only the default"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON"),
) -> None:
    """Run each enabled backend's confinement self-test here and print every check."""
    # No warm pool: the doctor starts a backend only to probe it once.
    settings = settings_for(config, state_dir, warm_pool_size=0)
    names = _chosen_backends(settings, backend)
    default = _default_backend()
    host = host_checks(settings)  # first: the cgroup row says what the probes will do
    results, live, note = _probe(settings, names)
    default_enabled = default in enabled_backends(settings)
    failed = _failed(results, names, default, default_enabled, strict)
    if as_json:
        typer.echo(_json_report(default, failed, host, live, note, results))
    else:
        _print_text(host, results, note, default, default_enabled)
    if failed:
        raise typer.Exit(1)


def _json_report(default: str, failed: bool, host: list[ProbeCheck], live: Holder | None,
                 note: str | None, results: Any) -> str:
    """``--json``'s document: the verdict, the host facts, a live daemon, each backend."""
    return json.dumps({
        "default_backend": default,
        "ok": not failed,
        "host": [c.model_dump() for c in host],
        "daemon": None if live is None else {
            "lock": str(live.path), "pid": live.pid, "note": note},
        "backends": [{"available": a, **r.model_dump()} for _n, a, r in results],
    }, indent=2)


def _failed(results: Any, names: list[str], default: str, default_enabled: bool,
            strict: bool) -> bool:
    """Whether the doctor exits 1: the default backend is disabled, unavailable or failing,
    or (``--strict``) any other enabled backend is."""
    proven = _proven(results)
    if not default_enabled or (default in names and default not in proven):
        return True
    return strict and any(n not in proven for n, _a, _r in results if n != default)


def _proven(results: Any) -> set[str]:
    """The backends that are available and whose confinement holds."""
    return {n for n, available, report in results if available and report.ok}


def register(app: typer.Typer) -> None:
    """Add ``sandboxd doctor`` to the main app."""
    app.command()(doctor)
