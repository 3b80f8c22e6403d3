"""Benchmark: a stateful ``python`` call in a session kernel (restricted backend)
through the HTTP API: ``x += 1; print(x)``, the printed counter checked on every call.

Starts a real daemon (subprocess, default policy, rate limit off, container backend off),
then measures
* sequential latency (one client, one session): p50 / p95 per run;
* throughput with 4 concurrent clients (threads, one HTTP connection and one session each):
  calls/s per run;
* for comparison, the sequential p50 of the same code as a one-shot call (a fresh worker);
* the CPU time per call of the daemon and of the kernel (robust on a loaded host);
* the same call straight on the backend, in process (no HTTP, no service layer): p50 / p95;
and prints the median over repeated runs. Goal on a 2-core machine: kernel p50 <= 3 ms (no
fork per call).

    python bench/bench_kernel_restricted.py [--runs 5] [--calls 300] [--concurrent-calls 800]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.plan import with_limits

STEP = "x += 1; print(x)"


class Counter:
    """One session and the value its kernel's ``x`` must have."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        resp = client.post("/v1/sessions", json={})
        if resp.status_code != 201:
            raise RuntimeError(f"no session: {resp.status_code} {resp.text[:300]}")
        self.session = resp.json()["id"]
        self.x = 0
        self.call("x = 0", "")

    def call(self, code: str, expected: str) -> float:
        body = {"arguments": {"code": code}, "session": self.session}
        t0 = time.perf_counter()
        resp = self.client.post("/v1/tools/python/invoke", json=body)
        elapsed = time.perf_counter() - t0
        data = resp.json() if resp.status_code == 200 else {}
        if data.get("stdout") != expected or (data.get("kernel") or {}).get("lost") is not False:
            raise RuntimeError(f"unexpected response {resp.status_code}: {resp.text[:400]}")
        return elapsed

    def step(self) -> float:
        self.x += 1
        return self.call(STEP, f"{self.x}\n")

    def close(self) -> None:
        self.client.delete(f"/v1/sessions/{self.session}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_of(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def kernel_of(workspace: Path) -> psutil.Process:
    """The session's kernel: the live process working in its workspace."""
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if Path(proc.cwd()) == workspace and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
    raise RuntimeError(f"no kernel process in {workspace}")


def sequential(daemon: RunningDaemon, calls: int) -> tuple[float, float, float, float]:
    """p50 and p95 (ms), and the daemon's and the kernel's CPU time per call (ms): the CPU
    figures hold on a loaded host, where latencies mostly measure the wait for a core."""
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        counter = Counter(client)
        kernel = kernel_of(daemon.state_dir / "workspaces" / counter.session)
        me = psutil.Process(daemon.proc.pid)
        d0, k0 = cpu_of(me), cpu_of(kernel)
        times = [counter.step() for _ in range(calls)]
        d1, k1 = cpu_of(me), cpu_of(kernel)
        counter.close()
    return (percentile(times, 0.50) * 1000, percentile(times, 0.95) * 1000,
            (d1 - d0) / calls * 1000, (k1 - k0) / calls * 1000)


def one_shot(url: str, calls: int) -> float:
    body = {"arguments": {"code": "x = 0\n" + STEP}}
    times = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(calls):
            t0 = time.perf_counter()
            resp = client.post("/v1/tools/python/invoke", json=body)
            times.append(time.perf_counter() - t0)
            if resp.status_code != 200 or resp.json().get("stdout") != "1\n":
                raise RuntimeError(f"unexpected response {resp.status_code}: {resp.text[:300]}")
    return percentile(times, 0.50) * 1000


def backend_only(calls: int) -> tuple[float, float]:
    """p50 and p95 (ms) of the same call straight on a :class:`RestrictedBackend` in this
    process (no HTTP, no service layer): what the kernel path itself costs."""
    from sandboxd.models import Limits
    from tests.restricted.conftest import BackendHarness

    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp:
        os.chmod(tmp, 0o755)
        h = BackendHarness(Path(tmp), "kbench")
        try:
            ws = h.workspace()

            def run(code: str) -> tuple[float, str]:
                inv = h.invocation(code, ws).model_copy(update={"session": "bench"})
                t0 = time.perf_counter()
                res = h.call(h.backend.run(with_limits(inv, Limits(timeout_s=20)),
                                           time.monotonic() + 20))
                return time.perf_counter() - t0, res.stdout

            run("x = 0")
            times = []
            for i in range(calls):
                elapsed, out = run(STEP)
                if out != f"{i + 1}\n":
                    raise RuntimeError(f"unexpected output {out!r}")
                times.append(elapsed)
        finally:
            h.close()
    return percentile(times, 0.50) * 1000, percentile(times, 0.95) * 1000


def concurrent(url: str, calls: int, clients: int = 4) -> float:
    per_client = calls // clients
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            counter = Counter(client)  # session and kernel made before the clock starts
            counter.step()
            barrier.wait()
            try:
                for _ in range(per_client):
                    counter.step()
            except BaseException as exc:
                errors.append(exc)
            counter.close()

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
    parser.add_argument("--one-shot-calls", type=int, default=100, help="per run")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp,
        running_daemon(
            Path(tmp),
            env={
                "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
                "SANDBOXD_QUEUE_SIZE": "256",
                "SANDBOXD_CONTAINER_ENABLED": "false",
            },
        ) as daemon,
    ):
        sequential(daemon, args.warmup)
        p50s, p95s, rates, shots, dcpu, kcpu = [], [], [], [], [], []
        for run in range(args.runs):
            p50, p95, daemon_ms, kernel_ms = sequential(daemon, args.calls)
            dcpu.append(daemon_ms)
            kcpu.append(kernel_ms)
            rate = concurrent(daemon.url, args.concurrent_calls)
            shot = one_shot(daemon.url, args.one_shot_calls)
            p50s.append(p50)
            p95s.append(p95)
            rates.append(rate)
            shots.append(shot)
            print(f"run {run + 1}: kernel p50 {p50:.2f} ms, p95 {p95:.2f} ms, "
                  f"4 clients {rate:.0f} calls/s; one-shot p50 {shot:.2f} ms; CPU per call: "
                  f"daemon {daemon_ms:.2f} ms, kernel {kernel_ms:.2f} ms", flush=True)
        print(f"median kernel call p50: {statistics.median(p50s):.2f} ms (goal <= 3 ms)")
        print(f"median kernel call p95: {statistics.median(p95s):.2f} ms")
        print(f"median 4-client throughput: {statistics.median(rates):.0f} calls/s")
        print(f"median one-shot call p50 (same code, fresh worker): "
              f"{statistics.median(shots):.2f} ms")
        print(f"median CPU per kernel call: daemon {statistics.median(dcpu):.2f} ms, "
              f"kernel {statistics.median(kcpu):.2f} ms")
    backend = [backend_only(args.calls) for _ in range(args.runs)]
    print(f"median kernel call p50 / p95 on the backend itself (no HTTP): "
          f"{statistics.median(b[0] for b in backend):.2f} / "
          f"{statistics.median(b[1] for b in backend):.2f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
