"""What a signed receipt costs a call: the receipt (the canonical record, its hashes and the
Ed25519 signature: ``Receipts.receipt``, exactly what the daemon runs after a call's result
record is written) timed on real results of a real daemon, against the whole call over HTTP
(``print(1)`` on the restricted backend) in the same run, with the zygote floor of the same
run: ``../shared/bench/zygote_floor.py`` (a pre-imported process that forks per request,
no isolation; its path: ``--floor``).

    python bench/bench_receipts.py [--calls 200] [--signs 5000] [--floor PATH]

Target: the receipt ≤ 0.2 ms a call."""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from sandboxd.models import Result  # noqa: E402
from sandboxd.receipts.sign import Receipts  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402

#: the shared zygote floor, beside the checkout (``../shared``, as CI and every session lay it)
FLOOR = HERE.parent / "shared" / "bench" / "zygote_floor.py"
TARGET_MS = 0.2


def zygote_floor_ms(path: Path, calls: int) -> float:
    """p50 of one ``print(1)`` through the zygote floor (fork per request, stdout back)."""
    proc = subprocess.Popen([sys.executable, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    code = b"print(1)"
    times = []
    try:
        for i in range(calls + 10):
            t0 = time.perf_counter()
            proc.stdin.write(struct.pack(">I", len(code)) + code)
            proc.stdin.flush()
            (n,) = struct.unpack(">I", proc.stdout.read(4))
            out = proc.stdout.read(n)
            if i >= 10:  # the first calls warm it
                times.append(time.perf_counter() - t0)
            assert out == b"1\n", out
    finally:
        proc.stdin.close()
        proc.wait(10)
    return statistics.median(times) * 1000


def receipt_us(receipts: Receipts, results: list[Result], signs: int) -> tuple[float, float]:
    """Median cost of one receipt (µs: wall clock, and this thread's CPU time, which a busy
    shared host inflates less) over ``signs`` receipts of the daemon's own results."""
    walls, cpus = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(signs):
            result = results[i % len(results)]
            receipts.receipt("local", result, "http", time.monotonic(), (i, "0" * 64))
        cpus.append((time.thread_time() - c0) / signs * 1e6)
        walls.append((time.perf_counter() - t0) / signs * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def sign_us(receipts: Receipts, signs: int) -> float:
    """CPU time of the Ed25519 signature alone (µs), over a receipt-sized message."""
    message = b"x" * 900
    c0 = time.thread_time()
    for _ in range(signs):
        receipts.key.sign(message)
    return (time.thread_time() - c0) / signs * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--signs", type=int, default=5000)
    ap.add_argument("--floor", type=Path, default=FLOOR)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with running_daemon(Path(tmp)) as d:
            for _ in range(5):  # warm the zygote and the connection
                d.invoke("python", {"code": "print(1)"})
            times, results = [], []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                r = d.invoke("python", {"code": "print(1)"})
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                results.append(Result.model_validate({**r.json(), "receipt": None}))
            state, audit = d.state_dir, d.audit_path
        call_ms = statistics.median(times) * 1000
        # the daemon's key, in this process: the same signer on the same results
        receipts = Receipts.open(state, Path(tmp) / "bench-audit.jsonl")
        wall_us, cpu_us = receipt_us(receipts, results, args.signs)
        ed25519_us = sign_us(receipts, args.signs)
        assert audit.exists()
    floor_ms = zygote_floor_ms(args.floor, args.calls)
    cost_ms = cpu_us / 1000
    print(f"receipts, {args.calls} calls of print(1) (restricted, one-shot, HTTP), "
          f"{args.signs} x 5 receipts of their results; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  receipt per call (canonical record + hashes + Ed25519), CPU: {cost_ms:.3f} ms "
          f"(target <= {TARGET_MS} ms: {'met' if cost_ms <= TARGET_MS else 'MISSED'}); "
          f"of which the Ed25519 signature {ed25519_us / 1000:.3f} ms; wall clock "
          f"{wall_us / 1000:.3f} ms")
    print(f"  call with its receipt, p50:      {call_ms:.2f} ms")
    print(f"  call without it (p50 - receipt): {call_ms - cost_ms:.2f} ms; the receipt is "
          f"{cost_ms / call_ms * 100:.1f} % of the call")
    print(f"  zygote floor (fork per request, no isolation), p50: {floor_ms:.2f} ms; the "
          f"receipt is {cost_ms / floor_ms * 100:.1f} % of it")

if __name__ == "__main__":
    main()
