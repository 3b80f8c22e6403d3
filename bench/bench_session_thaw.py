"""Container backend, idle pause (idle sessions hold no CPU): what a thaw adds to a session call.

    python bench/bench_session_thaw.py [--repeats 5] [--calls 40]

Each run interleaves, in one session whose kernel is running, the call ``x += 1; print(x)``
on its running container and the same call on its container paused just before (the engine's
pause, as the idle check does it); prints the p50 of each, their difference (the thaw's cost)
and the fork floor (``python -c pass``) of the same run; the summary is the median over
``--repeats`` runs. The backend is driven in-process (no HTTP, no policy): both rows carry
the same overhead. Target: thaw cost <= 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandboxd.backends.container import ContainerBackend
from sandboxd.config import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernel_container import CODE, pct
from bench_kernel_container import Session as KernelSession


def floor_s() -> float:
    """One fork floor: a bare interpreter, start to exit."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


class Session(KernelSession):
    """bench_kernel_container's session, which its idle check may pause."""

    async def pause(self) -> None:
        """Pause its container as the idle check does (it is idle: no call runs)."""
        idle = self.backend.sessions.idle
        paused = await idle.pause_idle(self.backend.sessions.by_key)
        if len(paused) != 1:
            raise RuntimeError(f"expected one paused container, got {paused}")


async def one_run(backend: ContainerBackend, tmp: Path, calls: int, r: int
                  ) -> tuple[float, float, float]:
    """(p50 running, p50 paused, fork floor) of one run."""
    s = Session(backend, tmp, f"thaw{r}")
    await s.call("x = 0")
    running, paused, floor = [], [], []
    for _ in range(calls):
        running.append(await s.call())
        await s.pause()
        paused.append(await s.call())
        floor.append(await asyncio.to_thread(floor_s))
    await backend.close_session(s.name)
    return pct(running, 0.5), pct(paused, 0.5), statistics.median(floor)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        # no idle check of its own: the bench pauses (idle after 0 s) when it means to
        settings = Settings(state_dir=tmp / "state", instance=f"bt{secrets.token_hex(4)}",
                            warm_pool_size=1, session_pause_after_s=0)
        backend = ContainerBackend.from_settings(settings)
        await backend.start()
        backend.sessions.idle.after_s = 0.0
        ok, why = backend.availability()
        if not ok:
            raise SystemExit(f"container backend unavailable: {why}")
        runs = []
        try:
            for r in range(args.repeats):
                runs.append(await one_run(backend, tmp, args.calls, r))
                run_, paused, fl = runs[-1]
                print(f"run {r + 1}: running p50 {run_ * 1000:.2f} ms, paused p50 "
                      f"{paused * 1000:.2f} ms (thaw +{(paused - run_) * 1000:.2f} ms), "
                      f"python -c pass {fl * 1000:.1f} ms", flush=True)
        finally:
            await backend.close()
    run_ = statistics.median(x[0] for x in runs)
    paused = statistics.median(x[1] for x in runs)
    added = statistics.median(x[1] - x[0] for x in runs)
    fl = statistics.median(x[2] for x in runs)
    print(f"\nsession kernel call `{CODE}`, medians of {args.repeats} runs x {args.calls} "
          f"calls each:")
    print(f"  running container: p50 {run_ * 1000:.2f} ms")
    print(f"  paused container:  p50 {paused * 1000:.2f} ms   (thaw adds {added * 1000:.2f} ms;"
          f" target <= 20 ms)")
    print(f"  python -c pass (floor): {fl * 1000:.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
