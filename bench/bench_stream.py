"""Streamed invoke benchmark through a real daemon (uvicorn, policy, audit, restricted backend).

    python bench/bench_stream.py [--repeats 30]

Prints medians and p95 of: a plain ``print(1)`` invoke (request to JSON result), the same
call streamed (request to the first ``stdout`` event, and to the ``result`` event), and the
time to the first event of a call that prints and then works for 0.5 s (what a user watching
an agent sees first)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from httpx_sse import connect_sse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.daemon import running_daemon

SSE = {"Accept": "text/event-stream"}


def streamed(c: httpx.Client, code: str) -> tuple[float, float]:
    """(seconds to the first stdout event, seconds to the result event)."""
    t0 = time.perf_counter()
    first = None
    with connect_sse(c, "POST", "/v1/tools/python/invoke", headers=SSE,
                     json={"arguments": {"code": code}}) as src:
        for sse in src.iter_sse():
            if sse.event == "stdout" and first is None:
                first = time.perf_counter() - t0
            if sse.event == "result":
                return first or 0.0, time.perf_counter() - t0
    raise RuntimeError("no result event")


def show(name: str, samples: list[float]) -> None:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, int(len(s) * 0.95))]
    print(f"{name:<44} p50 {statistics.median(s) * 1000:8.2f} ms   p95 {p95 * 1000:8.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp)) as d, \
            httpx.Client(base_url=d.url, headers=d.headers, timeout=60) as c:
        for _ in range(3):  # warm the zygote and the connection
            c.post("/v1/tools/python/invoke", json={"arguments": {"code": "print(1)"}})
        plain, first, whole, slow_first = [], [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = c.post("/v1/tools/python/invoke", json={"arguments": {"code": "print(1)"}})
            assert r.json()["status"] == "ok"
            plain.append(time.perf_counter() - t0)
            f, w = streamed(c, "print(1)")
            first.append(f)
            whole.append(w)
        for _ in range(max(3, args.repeats // 5)):
            f, _ = streamed(c, "import time\nprint('working', flush=True)\ntime.sleep(0.5)")
            slow_first.append(f)
    print(f"streamed invoke, restricted backend, {args.repeats} repeats")
    show("plain invoke print(1): request -> result", plain)
    show("streamed print(1): request -> first stdout", first)
    show("streamed print(1): request -> result event", whole)
    show("print then 0.5 s of work: -> first stdout", slow_first)


if __name__ == "__main__":
    main()
