"""Container backend, session kernel: a stateful call, ``x += 1; print(x)``, in
a session whose kernel is already running.

    python bench/bench_kernel_container.py [--repeats 3] [--calls 200] [--http]
                                           [--create-to-first N [--floor PATH]]

Prints p50/p95 latency of sequential calls in one session, and calls/s with 4 concurrent
clients (each in its own session: the calls of one session run one at a time), each figure
the median over ``--repeats`` runs. The backend is driven in-process (no HTTP, no policy):
the figures are the backend's own; ``--http`` adds the same through a real daemon (HTTP,
policy, audit). Goal on a 2-core machine: p50 <= 10 ms. ``--create-to-first N`` instead
times, through a real daemon, N sessions created one after another, each to its first
result (``POST /v1/sessions`` and a first ``python`` call, which starts the session's
kernel, and its container unless a ready session had it started), three ways: cold
(``session_pool_size`` 0), from a full pool of ready sessions (the default size), and back to
back with the default pool (faster than it refills); beside the zygote floor of the same run
(``../shared/bench/zygote_floor.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from sandboxd.backends.container import ContainerBackend
from sandboxd.config import Settings
from sandboxd.models import Invocation, Limits, Status, ToolKind
from sandboxd.protocol.plan import ExecutionPlan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_receipts import FLOOR, zygote_floor_ms

from tests.support.daemon import running_daemon

CLIENTS = 4
CODE = "x += 1; print(x)"
POLICY = """\
version: 1
name: bench
clients: ["*"]
tools:
  python:
    backend: container
    imports: {allow: []}
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workspace(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, 10001, 10001)
    return path


class Session:
    """One client's session and the counter its kernel keeps."""

    def __init__(self, backend: ContainerBackend, tmp: Path, name: str) -> None:
        self.backend = backend
        self.name = name
        self.ws = workspace(tmp, name)
        self.x = 0

    async def call(self, code: str = CODE) -> float:
        inv = Invocation(tool="python", client="bench", session=self.name, workspace=self.ws,
                         arguments={"code": code},
                         plan=ExecutionPlan(kind=ToolKind.python, limits=Limits(timeout_s=60),
                                            imports_allow=("*",)))
        start = time.perf_counter()
        res = await self.backend.run(inv, time.monotonic() + 60)
        elapsed = time.perf_counter() - start
        if code == CODE:
            self.x += 1
            if res.stdout != f"{self.x}\n" or res.kernel is None or res.kernel.lost:
                raise RuntimeError(f"bad result: {res}")
        elif res.status is not Status.ok:
            raise RuntimeError(f"bad result: {res}")
        return elapsed

    async def start(self) -> None:
        await self.call("x = 0")


async def sequential(s: Session, n: int) -> list[float]:
    return [await s.call() for _ in range(n)]


async def concurrent(sessions: list[Session], n: int) -> float:
    per = max(n // len(sessions), 1)
    start = time.perf_counter()
    await asyncio.gather(*(sequential(s, per) for s in sessions))
    return per * len(sessions) / (time.perf_counter() - start)


class HttpSession:
    """One session of a real daemon, driven over HTTP."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=60)
        self.id = self.client.post("/v1/sessions").json()["id"]
        self.x = 0
        self.call("x = 0")

    def call(self, code: str = CODE) -> float:
        start = time.perf_counter()
        r = self.client.post("/v1/tools/python/invoke",
                             json={"arguments": {"code": code}, "session": self.id})
        elapsed = time.perf_counter() - start
        body = r.json()
        if code == CODE:
            self.x += 1
            if body.get("stdout") != f"{self.x}\n" or (body.get("kernel") or {}).get("lost",
                                                                                     True):
                raise RuntimeError(f"bad result: {body}")
        return elapsed

    def close(self) -> None:
        self.client.delete(f"/v1/sessions/{self.id}")
        self.client.close()


def http_run(url: str, calls: int) -> tuple[float, float, float]:
    """(p50, p95, calls/s with 4 clients) through the daemon."""
    s = HttpSession(url)
    lat = [s.call() for _ in range(calls)]
    s.close()
    clients = [HttpSession(url) for _ in range(CLIENTS)]
    per = max(calls // CLIENTS, 1)
    threads = [threading.Thread(target=lambda c=c: [c.call() for _ in range(per)])
               for c in clients]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = per * CLIENTS / (time.perf_counter() - start)
    for c in clients:
        c.close()
    return pct(lat, 0.5), pct(lat, 0.95), rate


def http_figures(repeats: int, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        (tmp / "policies").mkdir()
        (tmp / "policies" / "bench.yaml").write_text(POLICY)
        env = {"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_WARM_POOL_SIZE": "1"}
        with running_daemon(tmp, policies_dir=tmp / "policies", env=env) as d:
            runs = []
            for r in range(repeats):
                runs.append(http_run(d.url, calls))
                p50, p95, rate = runs[-1]
                print(f"http run {r + 1}: p50 {p50 * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms, "
                      f"{CLIENTS} clients {rate:.0f} calls/s", flush=True)
    print(f"  through the daemon (HTTP): p50 "
          f"{statistics.median(x[0] for x in runs) * 1000:.2f} ms   p95 "
          f"{statistics.median(x[1] for x in runs) * 1000:.2f} ms   {CLIENTS} clients: "
          f"{statistics.median(x[2] for x in runs):.0f} calls/s")


def create_to_first(n: int, floor: Path) -> None:
    """ms from a session's creation to its first result, container backend, over HTTP: cold
    (``session_pool_size`` 0: the first call starts the container), and with the default
    ready sessions (:mod:`sandboxd.sessions.ready`), each session created once the pool is
    full again (and half a second later) and back to back (faster than it refills)."""
    print(f"zygote floor (same run): p50 {zygote_floor_ms(floor, 200):.2f} ms")
    default = str(Settings().session_pool_size)
    for label, size, gap in (("cold (session_pool_size 0)", "0", 0.0),
                             (f"ready sessions (default {default}), each session from a full pool",
                              default, 0.5),
                             (f"ready sessions (default {default}), back to back", default,
                              0.0)):
        ms = _sessions_to_first(n, {"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
                                    "SANDBOXD_SESSION_POOL_SIZE": size}, gap)
        print(f"container session, create to first result, {label} (n={n}): "
              f"p50 {pct(ms, 0.5):.0f} ms, p95 {pct(ms, 0.95):.0f} ms, "
              f"p99 {pct(ms, 0.99):.0f} ms", flush=True)


def _sessions_to_first(n: int, env: dict[str, str], gap: float) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        (tmp / "policies").mkdir()
        (tmp / "policies" / "bench.yaml").write_text(POLICY)
        with running_daemon(tmp, policies_dir=tmp / "policies", env=env) as d, \
                httpx.Client(base_url=d.url, timeout=120) as c:
            want = int(env["SANDBOXD_SESSION_POOL_SIZE"])
            ms = []
            for _ in range(n + 1):  # the first one warms the daemon's own paths
                _wait_ready(c, want if gap else 0)
                start = time.perf_counter()
                sid = c.post("/v1/sessions").json()["id"]
                body = c.post("/v1/tools/python/invoke", json={
                    "arguments": {"code": "x = 0\nprint(x)"}, "session": sid}).json()
                ms.append((time.perf_counter() - start) * 1000)
                if body.get("stdout") != "0\n":
                    raise RuntimeError(f"bad result: {body}")
                c.delete(f"/v1/sessions/{sid}")
                time.sleep(gap)
            return ms[1:]


def _wait_ready(c: httpx.Client, want: int, within_s: float = 60) -> None:
    """Wait until the daemon has ``want`` ready sessions (GET /v1/capacity)."""
    end = time.monotonic() + within_s
    while c.get("/v1/capacity").json()["sessions"]["ready"] < want:
        if time.monotonic() > end:
            raise RuntimeError(f"the daemon did not make {want} ready sessions")
        time.sleep(0.05)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--http", action="store_true", help="also through a real daemon")
    ap.add_argument("--create-to-first", type=int, default=0, metavar="N",
                    help="only: N container sessions, each from creation to first result")
    ap.add_argument("--floor", type=Path, default=FLOOR)
    args = ap.parse_args()
    if args.create_to_first:
        create_to_first(args.create_to_first, args.floor)
        return
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        settings = Settings(state_dir=tmp / "state", instance=f"bk{secrets.token_hex(4)}",
                            warm_pool_size=2)
        backend = ContainerBackend.from_settings(settings)
        await backend.start()
        ok, why = backend.availability()
        if not ok:
            raise SystemExit(f"container backend unavailable: {why}")
        try:
            p50s, p95s, rates = [], [], []
            for r in range(args.repeats):
                s = Session(backend, tmp, f"seq{r}")
                await s.start()
                lat = await sequential(s, args.calls)
                p50s.append(pct(lat, 0.5))
                p95s.append(pct(lat, 0.95))
                clients = [Session(backend, tmp, f"c{r}-{i}") for i in range(CLIENTS)]
                await asyncio.gather(*(c.start() for c in clients))
                rates.append(await concurrent(clients, args.calls))
                for c in [s, *clients]:
                    await backend.close_session(c.name)
                print(f"run {r + 1}: kernel p50 {p50s[-1] * 1000:.2f} ms, p95 "
                      f"{p95s[-1] * 1000:.2f} ms, {CLIENTS} clients {rates[-1]:.0f} calls/s",
                      flush=True)
        finally:
            await backend.close()
    print(f"\nsession kernel call `{CODE}` (median of {args.repeats} runs, "
          f"{args.calls} calls each):")
    print(f"  p50 {statistics.median(p50s) * 1000:.2f} ms   "
          f"p95 {statistics.median(p95s) * 1000:.2f} ms   "
          f"{CLIENTS} clients: {statistics.median(rates):.0f} calls/s   (backend in-process)")
    if args.http:
        http_figures(args.repeats, args.calls)


if __name__ == "__main__":
    asyncio.run(main())
