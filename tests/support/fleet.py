"""A fleet for tests and benchmarks: real daemons on loopback ports, each with its
own ``node_id``, behind a real HAProxy started with the configuration ``sandboxd fleet
haproxy-config`` generates (its own process: stopped, and waited for, at the end)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from sandboxd.fleet import Node, haproxy_config
from tests.support.daemon import RunningDaemon, free_port, start_daemon
from tests.support.wait import wait_until

#: the restricted backend only (fast to start), and room for a test's sessions on one node
FLEET_ENV = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "64",
             "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0"}
CHECK_INTERVAL_MS = 200


def haproxy() -> str:
    """The haproxy program (``make test`` installs Debian's)."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("haproxy is not installed: apt-get install haproxy (make test does)")
    return found


@dataclass
class Fleet:
    """Nodes by id, and the proxy in front of them."""

    nodes: dict[str, RunningDaemon]
    url: str
    proxy: subprocess.Popen[bytes]
    config: Path
    client: httpx.Client

    def node_of_port(self, port: int) -> str:
        return next(n for n, d in self.nodes.items() if d.url.endswith(f":{port}"))


def start_haproxy(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``haproxy -db -f config`` (foreground: its own pid, no daemon fork)."""
    with open(log, "wb") as out:
        return subprocess.Popen([haproxy(), "-db", "-f", str(config)], stdout=out,
                                stderr=subprocess.STDOUT)


def servers_not_up(stats: Path) -> list[str]:
    """``backend/server status check`` of every server whose health check has not passed
    yet, or failed (the runtime API's ``show stat``: a server starts "UP" with its first
    check still to come, ``INI``; checked and up is ``UP`` with ``L7OK``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(stats))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise OSError(f"not HAProxy's statistics: {data[:200]!r}")
    header = lines[0][2:].split(",")
    rows = [dict(zip(header, line.split(","), strict=False))  # lines end with a comma
            for line in lines[1:] if line.strip()]
    servers = [r for r in rows if r.get("svname") not in ("FRONTEND", "BACKEND")]
    if not servers:
        raise OSError(f"no server in HAProxy's statistics: {data[:200]!r}")
    return [f"{r['pxname']}/{r['svname']} {r['status']} {r['check_status']}" for r in servers
            if r["status"] != "UP" or r["check_status"] != "L7OK"]


@contextlib.contextmanager
def running_fleet(tmp_path: Path, count: int = 3, *, env: Mapping[str, str] | None = None,
                  check_interval_ms: int = CHECK_INTERVAL_MS) -> Iterator[Fleet]:
    """``count`` daemons (``n1``..) behind HAProxy; every process stopped at the end."""
    ids = [f"n{i + 1}" for i in range(count)]

    def start(node: str, state_dir: Path | None = None) -> RunningDaemon:
        node_env = {**FLEET_ENV, **(env or {}), "SANDBOXD_NODE_ID": node}
        return start_daemon(tmp_path / node, env=node_env, state_dir=state_dir)

    nodes: dict[str, RunningDaemon] = {}
    proxy: subprocess.Popen[bytes] | None = None
    try:
        with ThreadPoolExecutor(count) as pool:
            futures = {node: pool.submit(start, node) for node in ids}
        failed = None
        for node, future in futures.items():  # every one started is stopped, even if one failed
            if future.exception() is None:
                nodes[node] = future.result()
            else:
                failed = future.exception()
        if failed is not None:
            raise failed
        port = free_port()
        config = tmp_path / "haproxy.cfg"
        stats = tmp_path / "haproxy.sock"
        # the generated configuration, plus the runtime API on a socket of the test's own
        # (a second global section: HAProxy merges them) to see the proxy's view of nodes
        config.write_text(haproxy_config(
            [Node(n, d.url.removeprefix("http://")) for n, d in nodes.items()],
            bind=f"127.0.0.1:{port}", check_interval_ms=check_interval_ms)
            + f"\nglobal\n    stats socket {stats} mode 600 level admin\n")
        proxy = start_haproxy(config, tmp_path / "haproxy.log")
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as client:
            def up() -> bool:
                assert proxy is not None and proxy.poll() is None, (tmp_path / "haproxy.log"
                                                                    ).read_text()
                return client.get("/healthz", timeout=2).status_code == 200

            wait_until(up, timeout=30, what="HAProxy in front of the fleet",
                       ignore=(httpx.HTTPError,))
            # every node up in every backend once its first check passed: a test's first
            # requests find the proxy's view settled (not a node marked down meanwhile)
            wait_until(lambda: servers_not_up(stats) == [], timeout=60,
                       what="every node up in HAProxy's view",
                       detail=lambda: servers_not_up(stats), ignore=(OSError,))
            yield Fleet(nodes, url, proxy, config, client)
    finally:
        if proxy is not None:
            proxy.terminate()
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(10)
        for node, daemon in nodes.items():
            daemon.client.close()
            if daemon.stop() == -signal.SIGKILL:  # a test killed it: what it left is swept by
                start(node, daemon.state_dir).stop()  # a daemon on its state (then stopped)
