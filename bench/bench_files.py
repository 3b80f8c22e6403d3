"""File transfer benchmark through a real daemon (uvicorn, policy, audit, workspace backend).

    python bench/bench_files.py [--size-mib 4] [--repeats 9]

Prints the median and p95 wall time and the throughput of moving one file of ``--size-mib``
random bytes into and out of a session workspace by the raw endpoints (``PUT``/``GET
/v1/sessions/{id}/files/{path}``) and by ``write_file``/``read_file`` with ``encoding:
"base64"``; every transfer is checked byte for byte.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.daemon import running_daemon

POLICY = """\
version: 1
name: bench-files
clients: ["*"]
limits: {{timeout: 60s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 64Mi, max_output: 64Mi}}
tools:
  read_file: {{paths: {{allow: ["**"]}}, max_bytes: {cap}}}
  write_file: {{paths: {{allow: ["**"]}}, max_bytes: {cap}}}
"""


def timed(fn: Callable[[], None], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def report(name: str, times: list[float], size: int) -> None:
    p50 = statistics.median(times)
    p95 = sorted(times)[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"{name:<22} p50 {p50 * 1000:8.1f} ms  p95 {p95 * 1000:8.1f} ms  "
          f"{size / p50 / 2**20:7.1f} MiB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    size = int(args.size_mib * 2**20)
    data = os.urandom(size)
    text = base64.b64encode(data).decode()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "policies").mkdir()
        (tmp / "policies" / "bench.yaml").write_text(POLICY.format(cap=size))
        env = {"SANDBOXD_MAX_BODY_BYTES": str(4 * size + 2**20),
               "SANDBOXD_SESSION_QUOTA_BYTES": str(8 * size)}
        with running_daemon(tmp, policies_dir=tmp / "policies", env=env) as d:
            sid = d.client.post("/v1/sessions").json()["id"]
            url = f"/v1/sessions/{sid}/files/blob.bin"

            def put() -> None:
                assert d.client.put(url, content=data).status_code == 200

            def get() -> None:
                assert d.client.get(url).content == data

            def write64() -> None:
                r = d.invoke("write_file", {"path": "blob.bin", "content": text,
                                            "encoding": "base64"}, session=sid).json()
                assert r["status"] == "ok", r

            def read64() -> None:
                r = d.invoke("read_file", {"path": "blob.bin", "encoding": "base64"},
                             session=sid).json()
                assert base64.b64decode(r["stdout"]) == data

            print(f"{size} bytes, {args.repeats} runs each")
            for name, fn in (("PUT raw", put), ("GET raw", get),
                             ("write_file base64", write64), ("read_file base64", read64)):
                report(name, timed(fn, args.repeats), size)


if __name__ == "__main__":
    main()
