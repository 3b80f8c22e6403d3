"""Where the CPU of a one-shot restricted call goes, for two or more checkouts
interleaved run by run (alternating order): one daemon per run (container backend off),
``print(1)`` over HTTP: the sequential p50, then ``--calls`` calls from 4 clients with the
CPU of the daemon, its zygote and the zygote's reaped workers (``/proc``) and of the whole
machine (``/proc/stat``, busy time: the clients, the mount helper and the kernel's threads
too) per call. The fork floor (``bench_daemon.floor_once``: p50, and 4 clients' calls/s) is
measured in the same run, between the trees.

    python bench/profiles/ab_oneshot_cpu.py [--runs 5] [--calls 800] <checkout> <checkout>...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import bench_daemon as bd  # noqa: E402
import bench_restricted as br  # noqa: E402

from tests.support.daemon import running_daemon  # noqa: E402

KEYS = ("p50", "rps", "daemon", "zygote", "workers", "machine")


def machine_busy_s() -> float:
    """CPU time of every CPU but idle and iowait so far (``/proc/stat``), seconds."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one_run(tree: Path, calls: int) -> dict[str, float]:
    env = {**bd.ENV, "PYTHONPATH": str(tree), "SANDBOXD_CONTAINER_ENABLED": "false",
           "SANDBOXD_INSTANCE": f"ab{secrets.token_hex(4)}"}
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tree), \
            running_daemon(Path(tmp), env=env) as daemon:
        br.sequential(daemon.url, 50)
        out = {"p50": br.sequential(daemon.url, 200)[0]}
        before, busy = br.cpu_seconds(daemon.proc.pid), machine_busy_s()
        out["rps"] = br.concurrent(daemon.url, calls)
        after, busy = br.cpu_seconds(daemon.proc.pid), machine_busy_s() - busy
        done = calls // 4 * 4
        out.update({k: (after[k] - before[k]) / done * 1000 for k in after})
        out["machine"] = busy / done * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=800)
    ap.add_argument("trees", type=Path, nargs="+")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    floors: list[tuple[float, float]] = []
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            results[tree].append(one_run(tree, args.calls))
            print(f"run {run + 1} {tree}: " + ", ".join(
                f"{k} {results[tree][-1][k]:.2f}" for k in KEYS), flush=True)
        floor_p50 = statistics.median(bd.floor_once() for _ in range(21)) * 1000
        floors.append((floor_p50, bd.throughput(bd.floor_once, args.calls // 2)))
        print(f"run {run + 1} floor: p50 {floors[-1][0]:.2f} ms, 4 clients "
              f"{floors[-1][1]:.0f}/s", flush=True)
    floor_p50 = statistics.median(f for f, _ in floors)
    floor_rps = statistics.median(r for _, r in floors)
    print(f"\nfork floor ({' '.join(bd.FLOOR[1:])}): p50 {floor_p50:.2f} ms, 4 clients "
          f"{floor_rps:.0f}/s (medians of {args.runs})")
    for tree, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        print(f"{tree}: p50 {med['p50']:.2f} ms ({med['p50'] / floor_p50:.2f}x the floor), "
              f"4 clients {med['rps']:.0f}/s ({med['rps'] / floor_rps:.2f}x); CPU per call: "
              f"daemon {med['daemon']:.2f}, zygote {med['zygote']:.2f}, workers "
              f"{med['workers']:.2f}, machine {med['machine']:.2f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
