"""Sessions at scale on the restricted backend, through a real daemon's HTTP API, with the
zygote floor of the same run (``../shared/bench/zygote_floor.py``: a pre-imported process that
forks per request, no isolation; its path: ``--floor``).

Phases, in ComputeSDK's format (create-to-first-result: ``POST /v1/sessions`` and the session's
first ``python`` call, which starts its kernel and gives it state, a 10,000-item list):

* sequential: one session after another;
* staggered: ``--staggered`` sessions started ``--stagger-ms`` apart, each on its own thread;
* burst: ``--burst`` sessions created and called at once (ok / total, p50 / p95 / p99);
* live: sessions created until ``--sessions`` hold a live kernel with state, then every one
  is called again (it must answer with its own state); the daemon tree's PSS before and
  after, and the PSS of each idle kernel (``/proc/PID/smaps_rollup``);
* fork: a session whose kernel holds 50 MB of state and whose workspace holds 50 MB of files,
  forked ``--forks`` times one by one (p50; the parent's kernel pickles its state in its
  sandbox) with each fork's first call (its fresh kernel restores the state), and once with
  ``count: 16``; beside them the copy floor of the same run (50 MB copied into fresh memory:
  a fork that copies pays it for the state and again for the files). The 1-minute load
  average is printed beside every figure (a shared machine).

The daemon runs with the default settings except ``max_sessions_per_client`` (the client's
cap, which a harness's admin raises), the per-client rate limit (off: a harness's admin sets
it) and the container backend (off: restricted only).

    python bench/bench_scale.py [--sessions 2000] [--burst 100] [--staggered 100]
                                [--forks 20] [--floor PATH] [--fork-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

from bench_receipts import FLOOR, zygote_floor_ms  # noqa: E402

if not FLOOR.exists():  # a worktree beside the main checkout: the shared floor is one up
    FLOOR = HERE.parent.parent / "shared" / "bench" / "zygote_floor.py"
from tests.support.daemon import RunningDaemon, running_daemon  # noqa: E402

STATE = "x = list(range(10000))\nlen(x)"
MIB = 1024 * 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(ms: list[float]) -> str:
    if not ms:
        return "none"
    return (f"p50 {pct(ms, 50):.1f} ms, p95 {pct(ms, 95):.1f} ms, p99 {pct(ms, 99):.1f} ms "
            f"(n={len(ms)})")


class Harness:
    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.local = threading.local()
        self.sessions: list[str] = []
        self.lock = threading.Lock()
        #: ms of each successful creation and of its first call, apart
        self.split: list[tuple[float, float]] = []

    def client(self) -> httpx.Client:
        c = getattr(self.local, "client", None)
        if c is None:
            c = httpx.Client(base_url=self.daemon.url, headers=self.daemon.headers,
                             timeout=120)
            self.local.client = c
        return c

    def create_and_call(self) -> float | None:
        """ms from the session's creation to its first result, or None if refused."""
        c = self.client()
        t0 = time.perf_counter()
        r = c.post("/v1/sessions", json={})
        if r.status_code != 201:
            print(f"  create: {r.status_code} {r.text[:200]}", file=sys.stderr)
            return None
        sid = r.json()["id"]
        created = (time.perf_counter() - t0) * 1000
        r = c.post("/v1/tools/python/invoke",
                   json={"arguments": {"code": STATE}, "session": sid})
        elapsed = (time.perf_counter() - t0) * 1000
        if r.status_code != 200 or r.json().get("value") != 10000:
            print(f"  call: {r.status_code} {r.text[:200]}", file=sys.stderr)
            return None
        with self.lock:
            self.sessions.append(sid)
            self.split.append((created, elapsed - created))
        return elapsed

    def answers(self, sid: str) -> bool:
        r = self.client().post("/v1/tools/python/invoke",
                               json={"arguments": {"code": "len(x)"}, "session": sid})
        return r.status_code == 200 and r.json().get("value") == 10000


def threaded(n: int, work, start_gap_s: float = 0.0, prepare=None) -> list:  # type: ignore[no-untyped-def]
    """``work`` on ``n`` threads, at once or the i-th ``i * start_gap_s`` after the first;
    ``prepare`` runs on each thread before that, off the clock and before any work starts
    (an HTTP client's TLS context costs ~33 ms of this process's CPU: made inside the burst,
    or while the staggered sessions before it run, it would time the client)."""
    out: list = [None] * n
    start: list[float] = []  # when the last thread is prepared
    barrier = threading.Barrier(n + 1, action=lambda: start.append(time.perf_counter()))

    def run(i: int) -> None:
        if prepare is not None:
            prepare()
        barrier.wait()
        if start_gap_s:
            time.sleep(max(0.0, start[0] + i * start_gap_s - time.perf_counter()))
        out[i] = work()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join()
    return out


def pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_pss(root: int) -> tuple[int, list[int]]:
    """PSS of ``root`` and its descendants, and the PSS of each of its kernels (the
    processes whose working directory is a workspace)."""
    total, kernels = 0, []
    proc = psutil.Process(root)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            size = pss(p.pid)
            total += size
            if (("/workspaces/" in p.cwd() or p.cwd() == "/") and p.pid != root
                    and p.uids().real != 0):
                kernels.append(size)
        except (psutil.Error, OSError):
            continue
    return total, kernels


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of the daemon, of its kernels (sandbox uids) and of its other
    children (zygote, mount helper): a burst is bound by the daemon's share per session."""
    out = {"daemon": 0.0, "kernels": 0.0, "helpers": 0.0}
    proc = psutil.Process(root)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            part = ("daemon" if p.pid == root
                    else "kernels" if p.uids().real != 0 else "helpers")
            out[part] += t.user + t.system
        except psutil.Error:
            continue
    return out


def sequential(h: Harness, n: int) -> None:
    """The sequential phase, with where its time went: creation and first call apart,
    and the CPU each session cost the daemon, its kernel and the helpers."""
    h.split.clear()
    before = tree_cpu(h.daemon.proc.pid)
    seq = [h.create_and_call() for _ in range(n)]
    after = tree_cpu(h.daemon.proc.pid)
    ok = [x for x in seq if x is not None]
    print(f"sequential: {summary(ok)}, {len(ok)}/{len(seq)} ok ({load()})")
    if h.split:
        cpu = ", ".join(f"{k} {(after[k] - before[k]) * 1000 / n:.2f}" for k in after)
        print(f"  of which: create p50 {statistics.median(c for c, _ in h.split):.1f} ms, "
              f"first call p50 {statistics.median(f for _, f in h.split):.1f} ms; "
              f"CPU ms per session (kernels: those alive at the end): {cpu}")


def load() -> str:
    """The 1-minute load average now (the machine is shared: said beside every figure)."""
    return f"load {os.getloadavg()[0]:.2f}"


def fresh_copy_ms(size: int = 50_000_000, runs: int = 7) -> float:
    """p50 ms of one copy of ``size`` bytes into fresh memory in this process: the floor of a
    fork that copies (its state and its files each land in pages nobody had)."""
    src = bytes(size)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        dst = bytearray(src)
        times.append((time.perf_counter() - t0) * 1000)
        del dst
    return statistics.median(times)


def fork_phase(h: Harness, forks: int) -> None:
    print(f"copy floor (same run): 50 MB into fresh memory p50 {fresh_copy_ms():.1f} ms "
          f"({load()})")
    c = h.client()
    sid = c.post("/v1/sessions", json={}).json()["id"]
    code = ("blob = bytearray(50_000_000)\nfor i in range(50):\n"
            "    with open(f'part{i}.bin', 'wb') as f:\n        f.write(bytes(1_000_000))\n"
            "len(blob)")
    r = c.post("/v1/tools/python/invoke", json={"arguments": {"code": code}, "session": sid,
                                                 "limits": {"memory_bytes": 256 * MIB}})
    assert r.status_code == 200 and r.json().get("value") == 50_000_000, r.text[:300]
    one, first = [], []
    for _ in range(forks):
        t0 = time.perf_counter()
        r = c.post(f"/v1/sessions/{sid}/fork", json={"count": 1})
        one.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 201, r.text[:300]
        child = r.json()["sessions"][0]["id"]
        t0 = time.perf_counter()  # the fork's first call: a fresh kernel restores the state
        r = c.post("/v1/tools/python/invoke", json={"arguments": {"code": "len(blob)"},
                                                     "session": child})
        first.append((time.perf_counter() - t0) * 1000)
        assert r.json().get("value") == 50_000_000, r.text[:300]
        c.delete(f"/v1/sessions/{child}")
    print(f"fork (50 MB kernel state, 50 files of 1 MB): count 1 {summary(one)} ({load()}); "
          f"the fork's first call (restores the state) {summary(first)} ({load()})")
    t0 = time.perf_counter()
    r = c.post(f"/v1/sessions/{sid}/fork", json={"count": 16})
    sixteen = (time.perf_counter() - t0) * 1000
    assert r.status_code == 201, r.text[:300]
    kernel = r.json()["kernel"]
    for child in r.json()["sessions"]:
        c.delete(f"/v1/sessions/{child['id']}")
    c.delete(f"/v1/sessions/{sid}")
    print(f"fork count 16: {sixteen:.0f} ms ({load()}); kernel carried: {kernel['carried']}, "
          f"{kernel.get('bytes', 0) / MIB:.1f} MiB pickled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--staggered", type=int, default=100)
    parser.add_argument("--stagger-ms", type=float, default=20)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--forks", type=int, default=20)
    parser.add_argument("--floor", type=Path, default=FLOOR)
    parser.add_argument("--fork-only", action="store_true",
                        help="the zygote floor and the fork phase only")
    args = parser.parse_args()
    print(f"zygote floor (same run): p50 {zygote_floor_ms(args.floor, 200):.2f} ms ({load()})")
    env = {"SANDBOXD_MAX_SESSIONS_PER_CLIENT": str(args.sessions + 100),
           "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_CONTAINER_ENABLED": "false",
           "SANDBOXD_SANDBOX_UID_FIRST": "41000"}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        os.chmod(tmp, 0o755)
        with running_daemon(Path(tmp), env=env) as d:
            h = Harness(d)
            if args.fork_only:
                fork_phase(h, args.forks)
                return
            cap = h.client().get("/v1/capacity").json()
            print(f"capacity: max_kernels {cap['kernels']['max']} (derived: "
                  f"{cap['kernels']['derived']}), sandbox uids {cap['sandbox_uids']}, "
                  f"memory headroom {cap['memory']['headroom_bytes'] // MIB} MiB")
            base, _ = tree_pss(d.proc.pid)
            h.create_and_call()  # warm
            sequential(h, args.sequential)
            stag = threaded(args.staggered, h.create_and_call, args.stagger_ms / 1000, h.client)
            print(f"staggered ({args.stagger_ms:g} ms apart): "
                  f"{summary([x for x in stag if x is not None])}, "
                  f"{sum(x is not None for x in stag)}/{len(stag)} ok")
            burst = threaded(args.burst, h.create_and_call, prepare=h.client)
            print(f"burst of {args.burst}: {summary([x for x in burst if x is not None])}, "
                  f"{sum(x is not None for x in burst)}/{len(burst)} ok")
            t0 = time.perf_counter()
            missing = args.sessions - len(h.sessions)
            per = max(1, missing // 4)
            threaded(4, lambda: [h.create_and_call() for _ in range(per)])
            while len(h.sessions) < args.sessions:
                if h.create_and_call() is None:
                    break
            print(f"live: {len(h.sessions)} sessions with a kernel holding state "
                  f"({time.perf_counter() - t0:.0f} s to fill)")
            total, kernels = tree_pss(d.proc.pid)
            if kernels:
                print(f"daemon tree PSS {base / MIB:.0f} -> {total / MIB:.0f} MiB; idle kernel "
                      f"PSS p50 {statistics.median(kernels) / MIB:.2f} MiB "
                      f"(n={len(kernels)}, mean {statistics.mean(kernels) / MIB:.2f})")
            chunks = [h.sessions[i::4] for i in range(4)]
            oks = []
            lock = threading.Lock()

            def check(part: list[str]) -> None:
                good = sum(h.answers(s) for s in part)
                with lock:
                    oks.append(good)

            ts = [threading.Thread(target=check, args=(part,)) for part in chunks]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            print(f"all answering afterwards: {sum(oks)}/{len(h.sessions)}")
            cap = h.client().get("/v1/capacity").json()
            print(f"capacity now: kernels {cap['kernels']['live']}/{cap['kernels']['max']}, "
                  f"headroom {cap['memory']['headroom_bytes'] // MIB} MiB, full {cap['full']}")
            for sid in h.sessions:
                h.client().delete(f"/v1/sessions/{sid}")
            fork_phase(h, args.forks)


if __name__ == "__main__":
    main()
