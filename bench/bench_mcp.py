"""Benchmark: one ``python`` call (``print(1)``, restricted backend) through MCP vs the HTTP API.

Starts a real daemon (subprocess, default policy, rate limit off) and measures, alternating
runs, the median latency of
* ``POST /v1/tools/python/invoke`` (one httpx connection, one-shot workspace);
* MCP ``tools/call`` with the official SDK client over Streamable HTTP, in one initialized MCP
  session (its calls run in the session's workspace);
* the same through the ``sandboxd mcp`` stdio bridge (a subprocess), optional with --bridge.
Prints the median of the per-run medians.

    python bench/bench_mcp.py [--runs 5] [--calls 100] [--bridge]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mcp.conftest import bridge_session, http_session
from tests.support.daemon import running_daemon

CODE = {"code": "print(1)"}


def http_median(url: str, calls: int) -> float:
    with httpx.Client(base_url=url, timeout=60) as client:
        times = []
        for _ in range(calls + 5):
            t0 = time.perf_counter()
            r = client.post("/v1/tools/python/invoke", json={"arguments": CODE})
            times.append(time.perf_counter() - t0)
            if r.status_code != 200 or r.json().get("stdout") != "1\n":
                raise RuntimeError(f"unexpected response {r.status_code}: {r.text[:300]}")
    return statistics.median(times[5:]) * 1000


async def mcp_median(session: object, calls: int) -> float:
    times = []
    for _ in range(calls + 5):
        t0 = time.perf_counter()
        result = await session.call_tool("python", CODE)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
        if result.is_error or result.structured_content["stdout"] != "1\n":
            raise RuntimeError(f"unexpected result: {result}")
    return statistics.median(times[5:]) * 1000


async def mcp_http(url: str, calls: int) -> float:
    async with http_session(f"{url}/mcp", None) as session:
        return await mcp_median(session, calls)


async def mcp_bridge(url: str, token_file: Path, calls: int) -> float:
    async with bridge_session(url, token_file) as session:
        return await mcp_median(session, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--bridge", action="store_true", help="also through `sandboxd mcp`")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"http": [], "mcp": [], "bridge": []}
    with tempfile.TemporaryDirectory() as tmp, running_daemon(
            Path(tmp), env={"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0"}) as d:
        token_file = Path(tmp) / "no.token"  # no tokens file: an empty token is never sent
        for run in range(args.runs):
            figures["http"].append(http_median(d.url, args.calls))
            figures["mcp"].append(asyncio.run(mcp_http(d.url, args.calls)))
            if args.bridge:
                token_file.write_text("unused")
                figures["bridge"].append(asyncio.run(mcp_bridge(d.url, token_file, args.calls)))
            print(f"run {run + 1}: http {figures['http'][-1]:.2f} ms, "
                  f"mcp {figures['mcp'][-1]:.2f} ms"
                  + (f", bridge {figures['bridge'][-1]:.2f} ms" if args.bridge else ""))
    print(f"python print(1), median of {args.runs} run medians ({args.calls} calls each):")
    for name, values in figures.items():
        if values:
            print(f"  {name:<7} {statistics.median(values):7.2f} ms")


if __name__ == "__main__":
    main()
