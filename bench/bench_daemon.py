"""The daemon's own path: every row of its cost table (fixed memory, per-call time and CPU,
start) from one run, with
the fork floor measured in the same run.

    python bench/bench_daemon.py [--runs 3] [--calls 200] [--baseline /path/to/other/checkout]

Each run starts a fresh daemon (default policy and settings, rate limit off) and measures, in
this order: its fixed cost (PSS of the daemon and its children after start, idle); a stateful
``python`` kernel call over HTTP (p50, and the daemon's CPU per call from
``/proc/<pid>/stat``); the one-shot restricted ``print(1)`` (p50, 4-client throughput); a
``shell`` call in a session (container); a one-shot ``shell`` call on a warm pool (one call
every ``WARM_GAP_S``, as an agent's turns space them: the pool refills in between), and the
same calls back to back (faster than the pool refills: every few calls starts a container).
The same run
also measures the floor: ``python -I -S -c 'print(1)'`` (fork + exec of a fresh interpreter,
p50 and 4-client throughput), the kernel call on the backend in-process (no HTTP, no service),
``docker run --rm`` of the same image, and the HTTP floor: the same POST as a kernel call
answered by a trivial endpoint on the daemon's server stack (uvicorn alone, and a FastAPI
route: ``bench/http_floor.py``), the same client. ``--baseline``: the same daemon measures
of another checkout (its code on the daemon's ``PYTHONPATH``), interleaved run by run (in
alternating order). Medians over runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import bench_container  # noqa: E402
import bench_kernel_restricted as bkr  # noqa: E402
import bench_restricted  # noqa: E402
import http_floor  # noqa: E402

from sandboxd.config import Settings  # noqa: E402
from tests.support.daemon import RunningDaemon, running_daemon  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

CLIENTS = 4
FLOOR = [sys.executable, "-I", "-S", "-c", "print(1)"]
ENV = {"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_QUEUE_SIZE": "256",
       "SANDBOXD_WARM_POOL_SIZE": str(Settings.model_fields["warm_pool_size"].default)}
pct = bkr.percentile


def floor_once() -> float:
    t0 = time.perf_counter()
    out = subprocess.run(FLOOR, check=True, capture_output=True).stdout
    elapsed = time.perf_counter() - t0
    if out != b"1\n":
        raise RuntimeError(f"floor printed {out!r}")
    return elapsed


def throughput(fn: Callable[[], object], calls: int) -> float:
    """calls/s of ``calls`` calls of ``fn`` spread over CLIENTS threads."""
    per = calls // CLIENTS
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(per):
                fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return per * CLIENTS / (time.perf_counter() - t0)


def pss_mib(pid: int) -> float:
    """Sum of Pss (smaps_rollup) over the process and all its descendants, MiB."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0
    for p in procs:
        try:
            for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, psutil.Error):
            continue
    return total / 1024


def pool_idle(daemon: RunningDaemon, name: str) -> None:
    """Wait for the daemon's start-up work to settle: its readiness and its warm pool."""
    wait_until(lambda: daemon.client.get("/readyz").status_code == 200, timeout=120,
               what="/readyz", ignore=(httpx.HTTPError,))
    size = int(ENV["SANDBOXD_WARM_POOL_SIZE"])
    if size:
        def pooled() -> bool:
            out = subprocess.run([bench_container.DOCKER, "ps", "-q", "--filter",
                                  f"label=sandboxd.daemon={name}"],
                                 capture_output=True, text=True).stdout
            return len(out.split()) >= size
        wait_until(pooled, timeout=120, what="the warm pool")


def cpu_times(pid: int) -> tuple[float, float]:
    """utime and stime of one process (all its threads, ended ones too) from
    /proc/<pid>/stat, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_s(pid: int) -> float:
    """utime + stime of one process, seconds."""
    return sum(cpu_times(pid))


def kernel_calls(daemon: RunningDaemon, calls: int) -> tuple[float, float]:
    """p50 (ms) of a stateful kernel call over HTTP and the daemon's CPU per call (ms)."""
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        counter = bkr.Counter(client)
        for _ in range(10):
            counter.step()
        c0 = cpu_s(daemon.proc.pid)
        times = [counter.step() for _ in range(calls)]
        c1 = cpu_s(daemon.proc.pid)
        counter.close()
    return pct(times, 0.5) * 1000, (c1 - c0) / calls * 1000


def shell_session(url: str, calls: int) -> float:
    with httpx.Client(base_url=url, timeout=60) as client:
        sid = client.post("/v1/sessions", json={}).json()["id"]
        try:
            times = [shell_call(client, sid) for _ in range(calls + 1)][1:]  # first: cold start
        finally:
            client.delete(f"/v1/sessions/{sid}")
    return pct(times, 0.5) * 1000


def shell_call(client: httpx.Client, session: str | None = None) -> float:
    body: dict[str, object] = {"arguments": {"command": "echo hi"}}
    if session:
        body["session"] = session
    t0 = time.perf_counter()
    resp = client.post("/v1/tools/shell/invoke", json=body)
    elapsed = time.perf_counter() - t0
    if resp.status_code != 200 or resp.json().get("stdout") != "hi\n":
        raise RuntimeError(f"shell: {resp.status_code} {resp.text[:300]}")
    return elapsed


#: the pause between warm-pool one-shot calls: longer than a pool container's start here
WARM_GAP_S = 0.5


def one_shot_shell(url: str, calls: int, gap_s: float = 0.0) -> float:
    """p50 (ms) of ``calls`` one-shot shell calls, ``gap_s`` apart (0: back to back)."""
    times = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(calls):
            times.append(shell_call(client))
            time.sleep(gap_s)
    return pct(times, 0.5) * 1000


def daemon_run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    name = f"bench{secrets.token_hex(4)}"
    env = {**ENV, "PYTHONPATH": str(tree), "SANDBOXD_INSTANCE": name}
    out: dict[str, float] = {}
    # `python -m sandboxd` imports from its working directory first, before PYTHONPATH
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp, \
            contextlib.chdir(tree), running_daemon(Path(tmp), env=env) as daemon:
        pool_idle(daemon, name)
        time.sleep(1)  # idle: nothing of the start-up left running
        out["pss"] = pss_mib(daemon.proc.pid)
        out["kernel_p50"], out["daemon_cpu"] = kernel_calls(daemon, args.calls)
        bench_restricted.sequential(daemon.url, 10)
        out["oneshot_p50"] = bench_restricted.sequential(daemon.url, args.calls)[0]
        out["oneshot_rps"] = bench_restricted.concurrent(daemon.url, args.calls * 2)
        if not args.no_container:
            out["shell_session_p50"] = shell_session(daemon.url, args.container_calls * 2)
            pool_idle(daemon, name)
            out["shell_oneshot_p50"] = one_shot_shell(daemon.url, args.container_calls,
                                                      WARM_GAP_S)
            pool_idle(daemon, name)
            out["shell_oneshot_b2b_p50"] = one_shot_shell(daemon.url, args.container_calls)
    return out


def floor_run(args: argparse.Namespace) -> dict[str, float]:
    for _ in range(5):
        floor_once()
    out = {"floor_p50": pct([floor_once() for _ in range(args.calls)], 0.5) * 1000,
           "floor_rps": throughput(floor_once, args.calls * 2),
           "backend_p50": bkr.backend_only(args.calls)[0]}
    body = {"arguments": {"code": bkr.STEP}, "session": "ses_0123456789abcdef01234567"}
    for kind in ("asgi", "fastapi"):
        out[f"http_{kind}_p50"] = http_floor.floor_p50(kind, args.calls, body)
    if not args.no_container:
        image = Settings().shell_image
        out["docker_p50"] = pct([bench_container.docker_run_once(image)
                                 for _ in range(args.docker_calls)], 0.5) * 1000
    return out


ROWS = [  # (label, target, formula over one tree's medians and the floor's)
    ("kernel call over HTTP p50 ÷ the same call on the backend in-process", "≤ 1.6x",
     lambda d, f: f"{d['kernel_p50'] / f['backend_p50']:.2f}x"),
    ("HTTP floor: (the call in-process + a trivial POST on the same stack) ÷ the call "
     "in-process; uvicorn alone, a FastAPI route", "(the floor of the row above)",
     lambda d, f: f"{1 + f['http_asgi_p50'] / f['backend_p50']:.2f}x; "
                  f"{1 + f['http_fastapi_p50'] / f['backend_p50']:.2f}x"),
    ("daemon CPU per kernel call", "≤ 1.5 ms", lambda d, f: f"{d['daemon_cpu']:.2f} ms"),
    ("kernel call over HTTP p50 ÷ fork floor", "≤ 0.6x",
     lambda d, f: f"{d['kernel_p50'] / f['floor_p50']:.2f}x"),
    ("one-shot restricted p50 ÷ fork floor; 4-client throughput ÷ floor", "≤ 2.0x; ≥ 0.7x",
     lambda d, f: f"{d['oneshot_p50'] / f['floor_p50']:.2f}x; "
                  f"{d['oneshot_rps'] / f['floor_rps']:.2f}x"),
    ("session shell (container) p50 ÷ fork floor", "≤ 3x",
     lambda d, f: f"{d['shell_session_p50'] / f['floor_p50']:.2f}x"
     if "shell_session_p50" in d else "n/a"),
    ("one-shot container p50 ÷ `docker run --rm` (warm pool: a call every "
     f"{WARM_GAP_S} s)", "≤ 0.25x",
     lambda d, f: f"{d['shell_oneshot_p50'] / f['docker_p50']:.3f}x"
     if "shell_oneshot_p50" in d else "n/a"),
    ("the same calls back to back (faster than the pool refills)", "",
     lambda d, f: f"{d['shell_oneshot_b2b_p50'] / f['docker_p50']:.3f}x"
     if "shell_oneshot_b2b_p50" in d else "n/a"),
    ("daemon fixed cost, PSS after start, idle", "≤ 80 MiB", lambda d, f: f"{d['pss']:.0f} MiB"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200, help="sequential calls per measure")
    ap.add_argument("--container-calls", type=int, default=30)
    ap.add_argument("--docker-calls", type=int, default=10)
    ap.add_argument("--no-container", action="store_true", help="skip the container rows")
    ap.add_argument("--baseline", type=Path, help="another checkout, measured interleaved")
    args = ap.parse_args()
    trees = {"now": HERE, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    floors: list[dict[str, float]] = []
    results: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
    for run in range(args.runs):
        floors.append(floor_run(args))
        order = list(trees.items())
        for name, tree in order[::-1] if run % 2 else order:  # alternate: no order bias
            results[name].append(daemon_run(tree, args))
            print(f"run {run + 1} {name}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in results[name][-1].items()), flush=True)
        print(f"run {run + 1} floor: " + ", ".join(f"{k} {v:.2f}" for k, v in floors[-1].items()),
              flush=True)

    def med(runs: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    f = med(floors)
    m = {n: med(r) for n, r in results.items()}
    print(f"\nfloor (same run, medians of {args.runs}): `python -I -S -c 'print(1)'` p50 "
          f"{f['floor_p50']:.2f} ms, {CLIENTS} clients {f['floor_rps']:.0f}/s; kernel call on "
          f"the backend in-process p50 {f['backend_p50']:.2f} ms; HTTP floor (a trivial POST, "
          f"same stack and client) p50 {f['http_asgi_p50']:.2f} ms uvicorn alone, "
          f"{f['http_fastapi_p50']:.2f} ms a FastAPI route"
          + (f"; `docker run --rm` p50 {f['docker_p50']:.0f} ms" if "docker_p50" in f else ""))
    print("\n| measure | " + " | ".join(trees) + " | target |")
    print("|---|" + "---:|" * len(trees) + "---:|")
    for label, target, fmt in ROWS:
        print(f"| {label} | " + " | ".join(fmt(m[n], f) for n in trees) + f" | {target} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
