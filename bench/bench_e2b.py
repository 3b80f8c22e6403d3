"""What E2B's wire protocol costs a call: ``run_code("1+1")`` through E2B's own SDK
(``e2b_code_interpreter.Sandbox``, unmodified, pointed at the daemon by its environment)
against the same call in a session through sandboxd's own client (``python`` ``1+1``), on
one daemon (restricted backend, the shipped policy), interleaved in the same run; with the
zygote floor of the same run: ``../shared/bench/zygote_floor.py`` (a pre-imported process
that forks per request, no isolation; its path: ``--floor``).

    python bench/bench_e2b.py [--calls 200] [--floor PATH]

Target: the E2B path within 1.5x of sandboxd's own."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from bench.bench_receipts import FLOOR, zygote_floor_ms  # noqa: E402
from sandboxd_client import SandboxClient  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402

TARGET = 1.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--floor", type=Path, default=FLOOR)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp)) as d:
        os.environ.update({"E2B_API_URL": d.url, "E2B_SANDBOX_URL": d.url,
                           "E2B_API_KEY": "unused-without-tokens"})
        from e2b_code_interpreter import Sandbox

        e2b, own = [], []
        with Sandbox.create() as sbx, SandboxClient(d.url) as client, \
                client.session() as session:
            for i in range(args.calls + 10):
                t0 = time.perf_counter()
                text = sbx.run_code("1+1").text
                t1 = time.perf_counter()
                result = session.invoke("python", {"code": "1+1"})
                t2 = time.perf_counter()
                assert text == "2" and result.value == 2, (text, result)
                if i >= 10:  # the first calls warm the kernels and the connections
                    e2b.append(t1 - t0)
                    own.append(t2 - t1)
    floor = zygote_floor_ms(args.floor, args.calls)
    e2b_ms, own_ms = statistics.median(e2b) * 1000, statistics.median(own) * 1000
    ratio = e2b_ms / own_ms
    print(f"run_code('1+1') in a session (restricted backend), {args.calls} calls each, "
          f"interleaved; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  E2B SDK (e2b-code-interpreter), p50: {e2b_ms:.2f} ms")
    print(f"  sandboxd client,               p50: {own_ms:.2f} ms")
    print(f"  ratio {ratio:.2f}x (target <= {TARGET}x: {'met' if ratio <= TARGET else 'MISSED'})")
    print(f"  zygote floor (fork per request, no isolation), p50: {floor:.2f} ms")


if __name__ == "__main__":
    main()
