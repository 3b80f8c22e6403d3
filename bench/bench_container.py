"""Container backend benchmark: warm-pool one-shot calls, session calls, and `docker run --rm`.

    python bench/bench_container.py [--repeats 3] [--calls 40] [--pool 4]

Prints, for each path, p50/p95 latency of sequential calls and calls/s with 4 concurrent
clients, each figure the median over ``--repeats`` runs, and the ratios against `docker run
--rm` measured in the same run. The backend is driven in-process (no HTTP, no policy) so the
figures are the backend's own; the call is `echo hi` (shell tool) everywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxd.backends.container import ContainerBackend
from sandboxd.config import Settings
from sandboxd.models import Invocation, Limits, Status, ToolKind
from sandboxd.protocol.plan import ExecutionPlan, Plan

DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
CLIENTS = 4


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workspace(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, 10001, 10001)
    return path


class Bench:
    def __init__(self, backend: ContainerBackend, tmp: Path) -> None:
        self.backend = backend
        self.tmp = tmp
        self.n = 0

    async def call(self, session: str | None = None) -> float:
        self.n += 1
        ws = workspace(self.tmp, session or f"one{self.n}")
        inv = Invocation(tool="shell", client="bench", session=session, workspace=ws,
                         plan=ExecutionPlan(kind=ToolKind.command, limits=Limits(timeout_s=60),
                                            command=Plan.single(["echo", "hi"])))
        start = time.perf_counter()
        res = await self.backend.run(inv, time.monotonic() + 60)
        elapsed = time.perf_counter() - start
        if res.status is not Status.ok or res.stdout != "hi\n" or not res.cleanup.verified:
            raise RuntimeError(f"bad result: {res}")
        if session is None:
            shutil.rmtree(ws, ignore_errors=True)
        return elapsed

    async def pool_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            boxes = [b for q in self.backend.pool.queues.values() for b in q]
            if boxes and all(b.endpoint.ready for b in boxes) and \
                    len(boxes) >= self.backend.pool.target():
                return
            await asyncio.sleep(0.02)


async def sequential(fn: Callable[[], Awaitable[float]], n: int,
                     before: Callable[[], Awaitable[None]] | None = None) -> list[float]:
    out = []
    for _ in range(n):
        if before is not None:
            await before()
        out.append(await fn())
    return out


async def concurrent(fn: Callable[[int], Awaitable[float]], n: int) -> float:
    """calls/s of ``n`` calls spread over CLIENTS concurrent clients."""
    per = n // CLIENTS

    async def client(i: int) -> None:
        for _ in range(per):
            await fn(i)

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return per * CLIENTS / (time.perf_counter() - start)


def docker_run_once(image: str) -> float:
    start = time.perf_counter()
    subprocess.run([DOCKER, "run", "--rm", "--network", "none", "--read-only", "--cap-drop",
                    "ALL", "--security-opt", "no-new-privileges", "--user", "10001:10001",
                    "--memory", "256m", "--memory-swap", "256m", "--pids-limit", "70",
                    "--init", "--entrypoint", "echo", image, "hi"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


async def docker_run_bench(image: str, n_seq: int, n_conc: int) -> tuple[list[float], float]:
    seq = [await asyncio.to_thread(docker_run_once, image) for _ in range(n_seq)]

    async def one(_: int) -> float:
        return await asyncio.to_thread(docker_run_once, image)

    return seq, await concurrent(one, n_conc)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40, help="calls per measurement")
    ap.add_argument("--pool", type=int, default=4, help="warm pool size")
    ap.add_argument("--docker-calls", type=int, default=12)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-container-"))
    settings = Settings(state_dir=tmp / "state", instance=f"bench{secrets.token_hex(4)}",
                        warm_pool_size=args.pool)
    backend = ContainerBackend.from_settings(settings)
    await backend.start()
    ok, why = backend.availability()
    if not ok:
        raise SystemExit(f"container backend unavailable: {why}")
    bench = Bench(backend, tmp)
    figures: dict[str, list[float]] = {k: [] for k in (
        "oneshot_warm_p50", "oneshot_warm_p95", "oneshot_b2b_p50", "oneshot_b2b_p95",
        "oneshot_rps", "session_p50", "session_p95", "session_rps", "session_first",
        "docker_p50", "docker_p95", "docker_rps")}
    try:
        await bench.pool_ready()
        for r in range(args.repeats):
            # one-shot, pool warm before each call (the latency the pool is for)
            warm = await sequential(bench.call, max(args.calls // 4, 5), bench.pool_ready)
            figures["oneshot_warm_p50"].append(statistics.median(warm))
            figures["oneshot_warm_p95"].append(pct(warm, 0.95))
            # one-shot, back to back (the pool refills as fast as the engine starts containers)
            await bench.pool_ready()
            b2b = await sequential(bench.call, max(args.calls // 4, 5))
            figures["oneshot_b2b_p50"].append(statistics.median(b2b))
            figures["oneshot_b2b_p95"].append(pct(b2b, 0.95))
            await bench.pool_ready()
            figures["oneshot_rps"].append(await concurrent(lambda i: bench.call(), args.calls // 2))
            # sessions
            sid = f"bench-{r}"
            figures["session_first"].append(await bench.call(sid))
            seq = await sequential(lambda sid=sid: bench.call(sid), args.calls * 2)
            figures["session_p50"].append(statistics.median(seq))
            figures["session_p95"].append(pct(seq, 0.95))
            for i in range(CLIENTS):  # each client has its own session (container started)
                await bench.call(f"{sid}-c{i}")
            figures["session_rps"].append(
                await concurrent(lambda i, sid=sid: bench.call(f"{sid}-c{i}"), args.calls * 4))
            for s in [sid] + [f"{sid}-c{i}" for i in range(CLIENTS)]:
                await backend.close_session(s)
            # the same run's docker run --rm
            dseq, drps = await docker_run_bench(settings.shell_image, args.docker_calls,
                                                args.docker_calls)
            figures["docker_p50"].append(statistics.median(dseq))
            figures["docker_p95"].append(pct(dseq, 0.95))
            figures["docker_rps"].append(drps)
            print(f"run {r + 1}/{args.repeats} done", flush=True)
            await bench.pool_ready()
    finally:
        await backend.close()
        shutil.rmtree(tmp, ignore_errors=True)

    m = {k: statistics.median(v) for k, v in figures.items()}
    ms = 1000.0
    print(f"\ncontainer backend, medians over {args.repeats} runs "
          f"(pool {args.pool}, {CLIENTS} concurrent clients, call: echo hi)")
    print(f"{'path':<34}{'p50 ms':>9}{'p95 ms':>9}{'calls/s (4 clients)':>22}")
    print(f"{'one-shot, warm pool':<34}{m['oneshot_warm_p50'] * ms:>9.1f}"
          f"{m['oneshot_warm_p95'] * ms:>9.1f}{m['oneshot_rps']:>22.1f}")
    print(f"{'one-shot, back to back':<34}{m['oneshot_b2b_p50'] * ms:>9.1f}"
          f"{m['oneshot_b2b_p95'] * ms:>9.1f}{'':>22}")
    print(f"{'session call':<34}{m['session_p50'] * ms:>9.1f}{m['session_p95'] * ms:>9.1f}"
          f"{m['session_rps']:>22.1f}")
    print(f"{'session, first call (cold start)':<34}{m['session_first'] * ms:>9.1f}")
    print(f"{'docker run --rm':<34}{m['docker_p50'] * ms:>9.1f}{m['docker_p95'] * ms:>9.1f}"
          f"{m['docker_rps']:>22.1f}")
    print(f"\nratios vs docker run --rm: one-shot p50 "
          f"{m['docker_p50'] / m['oneshot_warm_p50']:.1f}x faster, "
          f"{m['oneshot_rps'] / m['docker_rps']:.2f}x throughput; session p50 "
          f"{m['docker_p50'] / m['session_p50']:.0f}x faster, "
          f"{m['session_rps'] / m['docker_rps']:.0f}x throughput")


if __name__ == "__main__":
    asyncio.run(main())
