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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per run")
    parser.add_argument("--concurrent-calls", type=int, default=800, help="per run")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp, running_daemon(
        Path(tmp), env={"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_QUEUE_SIZE": "256"}
    ) as daemon:
        with httpx.Client(base_url=daemon.url, timeout=60) as client:
            for _ in range(args.warmup):
                one_call(client)
        p50s, p95s, rates = [], [], []
        for run in range(1, args.runs + 1):
            p50, p95 = sequential(daemon.url, args.calls)
            rate = concurrent(daemon.url, args.concurrent_calls)
            p50s.append(p50)
            p95s.append(p95)
            rates.append(rate)
            print(f"run {run}: sequential p50 {p50:.2f} ms  p95 {p95:.2f} ms  |  "
                  f"4 clients {rate:.0f} calls/s", flush=True)
    print()
    print(f"python print(1) via HTTP, restricted backend, median of {args.runs} runs:")
    print(f"  sequential latency p50: {statistics.median(p50s):.2f} ms   (goal <= 8 ms)")
    print(f"  sequential latency p95: {statistics.median(p95s):.2f} ms")
    print(f"  throughput, 4 clients:  {statistics.median(rates):.0f} calls/s   (goal >= 200)")


if __name__ == "__main__":
    main()
