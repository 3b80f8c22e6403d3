"""Idle restricted kernels hibernated to disk (``kernel_hibernate_after_s``): what a sleeping
kernel costs and what waking it costs, through a real daemon's HTTP API, with the zygote floor
of the same run (``../shared/bench/zygote_floor.py``: a pre-imported process that forks per
request, no isolation; its path: ``--floor``).

``--sessions`` sessions each get a kernel holding state (a 10,000-item list, as in
``bench_scale.py``); then:

* awake: the daemon tree's PSS and each idle kernel's (``smaps_rollup``);
* asleep: once every kernel has hibernated (``GET /v1/capacity``), the tree's PSS again and
  the bytes on disk, per session;
* wake: each session's next call, one after another (p50 / p95 / p99): a fresh kernel from
  the zygote restores the state, then runs the call; beside it, the same call in a kernel
  that is awake (each session's second call, made at once), and a session's first call (a
  fresh kernel, no state to restore).

The daemon runs with the default settings except ``max_sessions_per_client``, the rate limit
(off), the container backend (off), ``kernel_hibernate_after_s`` (``--after``) and, for more
sessions than the derived uid range holds, ``sandbox_uid_count``.

    python bench/bench_hibernate.py [--sessions 200] [--after 30] [--floor PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

from bench_receipts import FLOOR, zygote_floor_ms  # noqa: E402
from bench_scale import MIB, STATE, load, summary, tree_pss  # noqa: E402

if not FLOOR.exists():  # a worktree beside the main checkout: the shared floor is one up
    FLOOR = HERE.parent.parent / "shared" / "bench" / "zygote_floor.py"
from tests.support.daemon import running_daemon  # noqa: E402

CALL = "len(x)"


def timed(c: httpx.Client, sid: str, code: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = c.post("/v1/tools/python/invoke", json={"arguments": {"code": code}, "session": sid})
    ms = (time.perf_counter() - t0) * 1000
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    return ms, r.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--after", type=float, default=30.0,
                        help="kernel_hibernate_after_s of the daemon")
    parser.add_argument("--floor", type=Path, default=FLOOR)
    args = parser.parse_args()
    print(f"zygote floor (same run): p50 {zygote_floor_ms(args.floor, 200):.2f} ms ({load()})")
    env = {"SANDBOXD_MAX_SESSIONS_PER_CLIENT": str(args.sessions + 100),
           "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_CONTAINER_ENABLED": "false",
           "SANDBOXD_SANDBOX_UID_FIRST": "43000",
           # each session holds its uid while its kernel sleeps: past the derived range
           # (max_kernels + 256), the range is raised as an admin would
           "SANDBOXD_SANDBOX_UID_COUNT": str(max(3200, args.sessions + 300)),
           "SANDBOXD_KERNEL_HIBERNATE_AFTER_S": str(args.after)}
    with tempfile.TemporaryDirectory(prefix="bench-hibernate-") as tmp:
        os.chmod(tmp, 0o755)
        with running_daemon(Path(tmp), env=env) as d:
            c = httpx.Client(base_url=d.url, headers=d.headers, timeout=120)
            base, _ = tree_pss(d.proc.pid)
            sessions, first, warm = [], [], []
            for _ in range(args.sessions):
                sid = c.post("/v1/sessions", json={}).json()["id"]
                ms, body = timed(c, sid, STATE)
                assert body["value"] == 10000, body
                sessions.append(sid)
                first.append(ms)
                warm.append(timed(c, sid, CALL)[0])  # its kernel is awake
            awake, kernels = tree_pss(d.proc.pid)
            print(f"awake: {len(sessions)} sessions, daemon tree PSS {base / MIB:.0f} -> "
                  f"{awake / MIB:.0f} MiB; idle kernel PSS p50 "
                  f"{statistics.median(kernels) / MIB:.2f} MiB (n={len(kernels)})")
            t0 = time.perf_counter()
            while c.get("/v1/capacity").json()["kernels"]["hibernated"] < len(sessions):
                time.sleep(0.1)
                if time.perf_counter() - t0 > 600:
                    raise SystemExit("the kernels did not all hibernate within 600 s")
            asleep, left = tree_pss(d.proc.pid)
            disk = sum(f.stat().st_size for f in (d.state_dir / "hibernated").iterdir())
            print(f"asleep: all {len(sessions)} hibernated ({time.perf_counter() - t0:.1f} s "
                  f"after the last call, kernel_hibernate_after_s {args.after:g}); daemon tree "
                  f"PSS {asleep / MIB:.0f} MiB ({len(left)} kernel processes); per session "
                  f"{(asleep - base) / len(sessions) / 1024:.0f} KiB of memory and "
                  f"{disk / len(sessions) / 1024:.1f} KiB on disk ({load()})")
            wake = []
            for sid in sessions:
                ms, body = timed(c, sid, CALL)
                assert body["value"] == 10000 and body["kernel"]["fresh"] is False, body
                wake.append(ms)
            print(f"wake (restore, then the call): {summary(wake)} ({load()})")
            print(f"the same call in an awake kernel: {summary(warm)}; a session's first call "
                  f"(a fresh kernel, no state): {summary(first)} ({load()})")
            for sid in sessions:
                c.delete(f"/v1/sessions/{sid}")


if __name__ == "__main__":
    main()
