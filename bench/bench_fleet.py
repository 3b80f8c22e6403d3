"""Benchmark: what HAProxy in front of a fleet costs a node.

Starts a fleet (tests/support/fleet.py: ``--nodes`` real daemons, restricted backend, behind
a real HAProxy with the generated configuration) and measures, in the same run and
alternating, the calls/s of ``--clients`` clients (threads, one keep-alive connection and
one session each, ``python`` ``print(1)`` in the session) on node ``n1``:

* direct: ``POST /v1/sessions/<id>/tools/python/invoke`` to the node's own port;
* proxied: the same requests through HAProxy (routed to ``n1`` by the session id);

then the whole fleet through HAProxy (``--clients`` per node, all at once), for scale.
Prints the median over ``--runs`` runs of each, the ratio proxied/direct (target: the proxy
costs at most 15%), the median of the per-run ratios (each pair measured back to back, so a
busy host's drift cancels out) and the fork floor (``python -c pass``) of the same run.

    python bench/bench_fleet.py [--nodes 3] [--clients 4] [--runs 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fleet import Fleet, running_fleet

CODE = {"arguments": {"code": "print(1)"}}


def floor_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def rate(targets: list[tuple[str, str]], seconds: float) -> float:
    """Calls/s of one thread per ``(base url, session id)`` for ``seconds``."""
    counts = [0] * len(targets)
    failures: list[str] = []
    go = threading.Barrier(len(targets) + 1)

    def client(i: int, url: str, sid: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            http.post(f"/v1/sessions/{sid}/tools/python/invoke", json=CODE)  # warm
            go.wait()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                r = http.post(f"/v1/sessions/{sid}/tools/python/invoke", json=CODE)
                if r.status_code != 200 or r.json().get("stdout") != "1\n":
                    failures.append(f"{r.status_code}: {r.text[:200]}")
                    return
                counts[i] += 1

    threads = [threading.Thread(target=client, args=(i, u, s)) for i, (u, s) in
               enumerate(targets)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(failures[0])
    return sum(counts) / (time.monotonic() - t0)


def sessions_on(fleet: Fleet, node: str, count: int) -> list[str]:
    """``count`` sessions made on ``node`` directly."""
    http = fleet.nodes[node].client
    return [http.post("/v1/sessions", json={}).json()["id"] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4, help="clients per node")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_fleet(Path(tmp), args.nodes,
                                                             check_interval_ms=2000) as fleet:
        own = sessions_on(fleet, "n1", args.clients)
        every = [(fleet.url, s) for n in fleet.nodes for s in sessions_on(fleet, n, args.clients)]
        direct: list[float] = []
        proxied: list[float] = []
        whole: list[float] = []
        floor: list[float] = []
        for run in range(args.runs):
            pair = [("direct", direct, fleet.nodes["n1"].url), ("proxied", proxied, fleet.url)]
            for _name, out, url in (pair if run % 2 == 0 else pair[::-1]):
                out.append(rate([(url, s) for s in own], args.seconds))
            whole.append(rate(every, args.seconds))
            floor.append(floor_s())
    d, p, w = (statistics.median(x) for x in (direct, proxied, whole))
    print(f"node n1, {args.clients} clients, direct:        {d:8.1f} calls/s")
    print(f"node n1, {args.clients} clients, through HAProxy: {p:8.1f} calls/s  "
          f"(ratio {p / d:.3f}: the proxy costs {100 * (1 - p / d):.1f}%)")
    paired = sorted(x / y for x, y in zip(proxied, direct, strict=True))
    print(f"paired ratio per run (proxied/direct, same moment): median "
          f"{statistics.median(paired):.3f}, range {paired[0]:.3f}-{paired[-1]:.3f}")
    print(f"fleet of {args.nodes}, {args.clients} clients per node, through HAProxy: "
          f"{w:8.1f} calls/s ({w / args.nodes:.1f} per node)")
    print(f"python -c pass (floor): {statistics.median(floor) * 1000:.0f} ms  "
          f"({args.runs} runs, medians)")


if __name__ == "__main__":
    main()
