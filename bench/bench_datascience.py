"""Data-science image benchmark: what importing the stack costs in a sandbox.

    python bench/bench_datascience.py [--repeats 5]

Each repeat is a fresh session (a new ``sandboxd/datascience:latest`` container, confined as
the container backend always does, with the limits of ``policies/examples/datascience.yaml``'s
python tool) running one call that imports numpy, pandas, scipy, scikit-learn and
matplotlib.pyplot and saves a small plot. Prints the medians of: the whole first call (container
start included), the import time measured inside, the worker's peak RSS (VmHWM) and its thread
count, and the first plot's time (font cache built in the fresh /tmp/matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandboxd.backends.container import ContainerBackend
from sandboxd.cli.images import PROFILES
from sandboxd.config import Settings
from sandboxd.models import Invocation, Limits, Status, ToolKind
from sandboxd.protocol.plan import ExecutionPlan

CODE = """\
import time
t0 = time.perf_counter()
import numpy, pandas, scipy.stats, sklearn.linear_model, matplotlib.pyplot as plt
t1 = time.perf_counter()
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [3, 1, 2])
fig.savefig('plot.png')
t2 = time.perf_counter()
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
[t1 - t0, t2 - t1, int(status['VmHWM'].split()[0]), int(status['Threads'])]
"""
#: the python tool's limits in policies/examples/datascience.yaml
LIMITS = Limits(timeout_s=120, memory_bytes=2 * 1024**3, cpus=2, pids=128)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    image = PROFILES["datascience"].tag
    tmp = Path(tempfile.mkdtemp(prefix="bench-datascience-"))
    settings = Settings(state_dir=tmp / "state", instance=f"bench{secrets.token_hex(4)}",
                        warm_pool_size=0)
    backend = ContainerBackend.from_settings(settings)
    await backend.start()
    # the identity the daemon would take from its uid pool for a session: the pool's last one
    uid = settings.sandbox_uid_first + settings.sandbox_uid_count - 1
    if backend.uids is not None and not backend.uids.adopt("bench", uid):
        raise SystemExit(f"uid {uid} is taken")
    figures: dict[str, list[float]] = {k: [] for k in (
        "first_call_s", "import_s", "first_plot_s", "peak_rss_mib", "threads")}
    try:
        for i in range(args.repeats):
            session = f"ds{i}-{secrets.token_hex(3)}"
            ws = tmp / session
            ws.mkdir()
            if os.geteuid() == 0:
                os.chown(ws, uid, uid)
            inv = Invocation(tool="python", client="bench", session=session, workspace=ws,
                             arguments={"code": CODE},
                             plan=ExecutionPlan(kind=ToolKind.python, limits=LIMITS,
                                                image=image, imports_allow=("*",)),
                             uid=uid if backend.uids is not None else None)
            start = time.perf_counter()
            res = await backend.run(inv, time.monotonic() + 120)
            elapsed = time.perf_counter() - start
            if res.status is not Status.ok:
                raise SystemExit(f"bad result: {res.status} {res.message} {res.stderr[-2000:]}")
            imp, plot, rss_kib, threads = res.value
            for key, val in (("first_call_s", elapsed), ("import_s", imp),
                             ("first_plot_s", plot), ("peak_rss_mib", rss_kib / 1024),
                             ("threads", threads)):
                figures[key].append(val)
            await backend.close_session(session)
    finally:
        await backend.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{image}, limits memory {LIMITS.memory_bytes >> 20} MiB, pids {LIMITS.pids}, "
          f"cpus {LIMITS.cpus}; medians of {args.repeats}:")
    for key, values in figures.items():
        print(f"  {key:14s} {statistics.median(values):8.2f}   (min {min(values):.2f}, "
              f"max {max(values):.2f})")


if __name__ == "__main__":
    asyncio.run(main())
