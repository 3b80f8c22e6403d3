"""The egress proxy's place in the service: its connection records go to the audit log and
the metrics, and a policy load re-computes every sandbox's egress rules (open connections the
new rules refuse are cut by the proxy)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sandboxd.health.metrics import Metrics
from sandboxd.policy import PolicyStore
from sandboxd.policy.egress_checks import rules_for


def wire_egress(backends: Iterable[Any], policy: PolicyStore, metrics: Metrics,
                record: Callable[..., Awaitable[None]],
                listeners: list[Callable[[], None]]) -> None:
    """Hook every backend's egress proxy (a container backend's, when it has one) to the
    audit log, the metrics and the policy's reloads."""
    for backend in backends:
        proxy = getattr(getattr(backend, "boxes", None), "egress_proxy", None)
        if proxy is not None:
            proxy.sink = functools.partial(_record, metrics, record)
            listeners.append(functools.partial(_reload, policy, proxy))


def _reload(policy: PolicyStore, proxy: Any) -> None:
    """A policy load took effect: every sandbox's egress follows it now."""
    for ident in list(proxy.identities):
        proxy.update(ident, rules_for(policy.policy_for(ident.client), ident.tool))


async def _record(metrics: Metrics, record: Callable[..., Awaitable[None]],
                  fields: dict[str, Any]) -> None:
    """One egress connection attempt: its audit record and counters."""
    metrics.egress.labels(fields["verdict"]).inc()
    metrics.egress_bytes.labels("out").inc(fields["bytes_out"])
    metrics.egress_bytes.labels("in").inc(fields["bytes_in"])
    await record(event="egress", **fields)
