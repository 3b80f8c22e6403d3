"""Benchmark: the ``python`` tool (restricted backend) running ``print(1)`` through the HTTP API.

Starts a real daemon (subprocess, default policy, rate limit off), then measures
* sequential latency (one client): p50 / p95 per run;
* throughput with 4 concurrent clients (threads, one HTTP connection each): calls/s per run;
and prints the median over repeated runs. Goal on a 2-core machine: p50 <= 8 ms and
>= 200 calls/s.

    python bench/bench_restricted.py [--runs 5] [--calls 300] [--concurrent-calls 800]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.daemon import running_daemon

BODY = {"arguments": {"code": "print(1)"}}


def one_call(client: httpx.Client) -> float:
    t0 = time.perf_counter()
    resp = client.post("/v1/tools/python/invoke", json=BODY)
    elapsed = time.perf_counter() - t0
    if resp.status_code != 200 or resp.json().get("stdout") != "1\n":
        raise RuntimeError(f"unexpected response {resp.status_code}: {resp.text[:300]}")
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sequential(url: str, calls: int) -> tuple[float, float]:
    with httpx.Client(base_url=url, timeout=60) as client:
        times = [one_call(client) for _ in range(calls)]
    return percentile(times, 0.50) * 1000, percentile(times, 0.95) * 1000


def concurrent(url: str, calls: int, clients: int = 4) -> float:
    per_client = calls // clients
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            one_call(client)  # connect before the clock starts
            barrier.wait()
            try:
                for _ in range(per_client):
                    one_call(client)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return per_client * clients / elapsed


def cpu_seconds(daemon_pid: int) -> dict[str, float]:
    """CPU time used so far by the daemon, its zygote, and the zygote's reaped workers."""
    daemon = psutil.Process(daemon_pid)
    t = daemon.cpu_times()
    out = {"daemon": t.user + t.system, "zygote": 0.0, "workers": 0.0}
    for child in daemon.children():
        try:
            if "sandboxd.backends.restricted.zygote" not in " ".join(child.cmdline()):
                continue
            c = child.cpu_times()
        except psutil.Error:
            continue
        out["zygote"] += c.user + c.system
        out["workers"] += c.children_user + c.children_system
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per run")
    parser.add_argument("--concurrent-calls", type=int, default=800, help="per run")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp,
        running_daemon(
            Path(tmp),
            env={
                "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
                "SANDBOXD_QUEUE_SIZE": "256",
                # only the restricted backend is measured: no container warm pool in the background
                "SANDBOXD_CONTAINER_ENABLED": "false",
            },
        ) as daemon,
    ):
        with httpx.Client(base_url=daemon.url, timeout=60) as client:
            for _ in range(args.warmup):
                one_call(client)
        p50s, p95s, rates, cpu = [], [], [], []
        for run in range(1, args.runs + 1):
            p50, p95 = sequential(daemon.url, args.calls)
            before = cpu_seconds(daemon.proc.pid)
            rate = concurrent(daemon.url, args.concurrent_calls)
            after = cpu_seconds(daemon.proc.pid)
            n = args.concurrent_calls // 4 * 4
            cpu.append({k: (after[k] - before[k]) / n * 1000 for k in after})
            p50s.append(p50)
            p95s.append(p95)
            rates.append(rate)
            print(
                f"run {run}: sequential p50 {p50:.2f} ms  p95 {p95:.2f} ms  |  "
                f"4 clients {rate:.0f} calls/s",
                flush=True,
            )
    print()
    print(f"python print(1) via HTTP, restricted backend, median of {args.runs} runs:")
    print(f"  sequential latency p50: {statistics.median(p50s):.2f} ms   (goal <= 8 ms)")
    print(f"  sequential latency p95: {statistics.median(p95s):.2f} ms")
    print(f"  throughput, 4 clients:  {statistics.median(rates):.0f} calls/s   (goal >= 200)")
    per_call = {k: statistics.median(c[k] for c in cpu) for k in cpu[0]}
    total = sum(per_call.values())
    print(
        f"  CPU per call: daemon {per_call['daemon']:.2f} ms, zygote {per_call['zygote']:.2f} ms,"
        f" worker {per_call['workers']:.2f} ms = {total:.2f} ms"
        f" -> CPU-bound ceiling on {psutil.cpu_count()} cores:"
        f" {psutil.cpu_count() * 1000 / total:.0f} calls/s"
    )
    print(f"  (load average during the run: {', '.join(f'{x:.1f}' for x in psutil.getloadavg())})")


if __name__ == "__main__":
    main()
