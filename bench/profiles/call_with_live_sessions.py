"""One session's ``python`` call while ``N`` other sessions hold a live restricted kernel: does a
call's cost grow with the sessions the host holds? (It did: every kernel call scanned every
live kernel, ~1-3 ms at 2,000-5,000.) The zygote floor of the same run
(``../shared/bench/zygote_floor.py``) is printed first; compare trees interleaved.

    PYTHONPATH=$PWD .venv/bin/python bench/profiles/call_with_live_sessions.py [--sessions 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

from bench_receipts import zygote_floor_ms  # noqa: E402
from bench_scale import FLOOR, Harness, summary, threaded  # noqa: E402

from tests.support.daemon import running_daemon  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--floor", type=Path, default=FLOOR)
    args = ap.parse_args()
    print(f"zygote floor (same run): p50 {zygote_floor_ms(args.floor, 200):.2f} ms")
    env = {"SANDBOXD_MAX_SESSIONS_PER_CLIENT": str(args.sessions + 100),
           "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_CONTAINER_ENABLED": "false",
           "SANDBOXD_SANDBOX_UID_FIRST": "41000"}
    with tempfile.TemporaryDirectory(prefix="call-live-") as tmp:
        os.chmod(tmp, 0o755)
        with running_daemon(Path(tmp), env=env) as d:
            h = Harness(d)
            per = max(1, args.sessions // 4)
            threaded(4, lambda: [h.create_and_call() for _ in range(per)])
            c, sid = h.client(), h.sessions[0]
            ms = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                r = c.post("/v1/tools/python/invoke",
                           json={"arguments": {"code": "len(x)"}, "session": sid})
                ms.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200 and r.json()["value"] == 10000, r.text[:300]
            print(f"{len(h.sessions)} live sessions: one session's call {summary(ms)}")


if __name__ == "__main__":
    main()
