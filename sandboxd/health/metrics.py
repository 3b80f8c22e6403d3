"""Prometheus metrics of one daemon (own registry, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    """Invocations by tool and status, durations, queue depth, slots in use."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queued: Callable[[], float], in_use: Callable[[], float],
                 transfers: Callable[[], float] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        self.invocations = Counter(
            "sandboxd_invocations", "Tool invocations by tool and status",
            ["tool", "status"], registry=self.registry,
        )
        self.duration = Histogram(
            "sandboxd_invocation_duration_seconds", "Wall time of invocations (queue included)",
            ["tool"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.rejections = Counter(
            "sandboxd_rejections", "Calls refused before running (queue full, rate limit, ...)",
            ["reason"], registry=self.registry,
        )
        self.policy_reloads = Counter(
            "sandboxd_policy_reloads_total",
            "Policy loads and reloads by result (refused: invalid files, the previous policy "
            "stays in force)", ["result"], registry=self.registry,
        )
        self.auth_failures = Counter(
            "sandboxd_auth_failures", "Requests with a missing or unknown token",
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "sandboxd_connections_closed",
            "Connections the daemon closed: header_timeout, evicted (an idle connection over "
            "a cap made room for a new one), refused (over a cap, nothing idle to evict), "
            "body_timeout (a request body that stopped), write_timeout (an answer not read)",
            ["reason"], registry=self.registry,
        )
        self.mcp_requests = Counter(
            "sandboxd_mcp_requests", "MCP requests by method (tools/list, tools/call, ...)",
            ["method"], registry=self.registry,
        )
        self.mcp_calls = Counter(
            "sandboxd_mcp_tool_calls", "MCP tools/call by tool and outcome (a sandboxd status, "
            "or invalid_params / error for calls refused before they ran)",
            ["tool", "status"], registry=self.registry,
        )
        self.mcp_sessions = Gauge("sandboxd_mcp_sessions", "Open MCP sessions",
                                  registry=self.registry)
        self.egress = Counter(
            "sandboxd_egress_connections", "Egress proxy connection attempts by verdict "
            "(allowed, denied)", ["verdict"], registry=self.registry)
        self.egress_bytes = Counter(
            "sandboxd_egress_bytes", "Bytes through the egress proxy by direction (out: from "
            "sandboxes)", ["direction"], registry=self.registry)
        self.connections_open = Gauge("sandboxd_connections_open", "Open client connections",
                                      registry=self.registry)
        queue = Gauge("sandboxd_queue_depth", "Calls waiting for a slot", registry=self.registry)
        queue.set_function(queued)
        slots = Gauge("sandboxd_slots_in_use", "Executions running now", registry=self.registry)
        slots.set_function(in_use)
        moving = Gauge("sandboxd_transfers_in_use",
                       "Raw file transfers holding a transfer slot now (never an execution slot)",
                       registry=self.registry)
        moving.set_function(transfers)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
