"""What the egress proxy adds to an allowed HTTPS request: the same GET on a kept-alive TLS
connection to the fake internet's server (:mod:`tests.support.fakenet`, this machine only),
timed from inside a sandbox through the daemon's proxy (forwarder, unix socket, proxy,
tunnel) and direct from the host, in the same run, with the zygote floor of the same run:
``../shared/bench/zygote_floor.py`` (a pre-imported process that forks per request, no
isolation; its path: ``--floor``).

    python bench/bench_egress.py [--requests 500] [--floor PATH]

Target: the proxy adds <= 2 ms to the p50."""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import os
import socket
import ssl
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.support.egress import egress_lab  # noqa: E402
from tests.support.fakenet import ALLOWED_IP  # noqa: E402

TARGET_MS = 2.0
WARM = 20


def _receipts_module():  # type: ignore[no-untyped-def]
    """bench_receipts.py (its zygote floor and default path: one definition)."""
    spec = importlib.util.spec_from_file_location("bench_receipts",
                                                  HERE / "bench" / "bench_receipts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def direct_ms(pem: bytes, port: int, requests: int) -> list[float]:
    """GET / on one kept-alive TLS connection from the host straight to the server."""
    ctx = ssl.create_default_context(cadata=pem.decode())
    conn = http.client.HTTPSConnection("api.test", port, context=ctx, timeout=30)
    conn.sock = ctx.wrap_socket(socket.create_connection((ALLOWED_IP, port)),
                                server_hostname="api.test")
    times = []
    for i in range(requests + WARM):
        t0 = time.perf_counter()
        conn.request("GET", "/k")
        body = conn.getresponse().read()
        if i >= WARM:
            times.append((time.perf_counter() - t0) * 1000)
        assert body == b"hello from api-tls /k\n", body
    conn.close()
    return times


SANDBOX = """\
import http.client, time
conn = http.client.HTTPSConnection("127.0.0.1", 3128, context=ctx, timeout=30)
conn.set_tunnel("api.test", {port})
times = []
for i in range({total}):
    t0 = time.perf_counter()
    conn.request("GET", "/k")
    body = conn.getresponse().read()
    if i >= {warm}:
        times.append((time.perf_counter() - t0) * 1000)
    assert body == b"hello from api-tls /k\\n", body
times"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--floor", type=Path, default=None)
    args = ap.parse_args()
    receipts = _receipts_module()
    floor = args.floor or receipts.FLOOR
    with egress_lab() as lab:
        port = lab.net.https_port
        body = lab.py(lab.ca_code() + SANDBOX.format(port=port, total=args.requests + WARM,
                                                      warm=WARM))
        assert body["status"] == "ok", body
        proxied = body["value"]
        direct = direct_ms(lab.net.ca.pem(), port, args.requests)
        record = lab.wait_egress(host="api.test", port=port, method="CONNECT")
        assert record["verdict"] == "allowed"
    floor_ms = receipts.zygote_floor_ms(floor, 200)
    p_proxy, p_direct = statistics.median(proxied), statistics.median(direct)
    added = p_proxy - p_direct
    print(f"egress, {args.requests} GETs on one kept-alive HTTPS connection each way (after "
          f"{WARM} to warm); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  through the proxy, from a sandbox, p50: {p_proxy:.3f} ms "
          f"(p90 {statistics.quantiles(proxied, n=10)[-1]:.3f} ms)")
    print(f"  direct from the host, p50:              {p_direct:.3f} ms "
          f"(p90 {statistics.quantiles(direct, n=10)[-1]:.3f} ms)")
    print(f"  added by the proxy, p50: {added:.3f} ms (target <= {TARGET_MS} ms: "
          f"{'met' if added <= TARGET_MS else 'MISSED'})")
    print(f"  zygote floor (fork per request, no isolation), p50: {floor_ms:.2f} ms")


if __name__ == "__main__":
    main()
