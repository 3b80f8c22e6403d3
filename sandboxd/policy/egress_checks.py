"""Checks of an ``egress:`` block that need more than the block: the backend it is granted
on, the ``network:`` beside it, the hosts its ``secrets`` name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sandboxd.backends import registry
from sandboxd.egress.rules import EgressRules, EgressSpec, parse_entry

Loc = tuple[str | int, ...]


def effective(tool: Any, policy: Any) -> EgressSpec | None:
    """The egress block that applies to ``tool``: its own, else the policy's."""
    own = getattr(tool, "egress", None)
    return own if own is not None else getattr(policy, "egress", None)


def _block_of(spec: Any, tool: str) -> EgressSpec | None:
    """The egress block that applies to the tool named ``tool`` in the policy file ``spec``
    (None: the tool is gone, or is of a kind that takes no egress)."""
    cfg = getattr(spec.tools, tool) if tool in type(spec.tools).model_fields \
        else spec.custom_tools.get(tool)
    if "egress" not in getattr(type(cfg), "model_fields", ()):  # None has no fields either
        return None
    return effective(cfg, spec)


def rules_for(policy: Any, tool: str) -> EgressRules:
    """The egress rules ``tool`` has under ``policy`` (a ``LoadedPolicy``; None: no policy
    applies any more): nothing allowed when the tool or its egress is gone."""
    if policy is None:
        return EgressRules(policy="(none)", rules=())
    block = _block_of(policy.spec, tool)
    return block.compiled(policy.name) if block is not None else \
        EgressRules(policy=policy.name, rules=())


def lacks_network(backend: str) -> bool:
    """Whether ``backend`` is registered and can grant no network (an unknown backend is
    refused by the schema, not here)."""
    entry = registry.get(backend)
    return entry is not None and not entry.network


def networked_backends(group: registry.ToolGroup) -> str:
    """The backends serving ``group`` that can grant a network, as ``a or b``: what a tool
    that needs one should name."""
    return " or ".join(e.name for e in registry.entries() if group in e.serves and e.network)


def egress_problems(name: str, tool: Any, group: registry.ToolGroup, policy: Any,
                    loc: Loc) -> Iterator[tuple[Loc, str]]:
    """An egress block on a backend without a network (the restricted backend's seccomp
    filter forbids sockets), or beside a named ``network:`` (which would grant everything
    that network reaches, past the proxy)."""
    if "egress" not in type(tool).model_fields:
        return
    spec = effective(tool, policy)
    if spec is None:
        return
    where: Loc = (*loc, "egress") if tool.egress is not None else ("egress",)
    if lacks_network(tool.backend):
        yield where, (f"the {tool.backend} backend has no network (its sandbox may not open "
                      f"sockets); '{name}' needs backend: {networked_backends(group)} for "
                      "egress")
    network = tool.network or policy.network
    if network != "none":
        yield where, (f"'{name}' has both egress and network {network!r}: a Docker network "
                      "reaches past the egress proxy; use network: none with egress")


def block_problems(spec: EgressSpec | None, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Secrets for a host that no allow entry names on any port."""
    if spec is None:
        return
    named = {parse_entry(e).host for e in spec.allow}
    for host in spec.secrets:
        if host not in named:
            yield (*loc, "secrets", host), (
                f"secrets for {host!r}, which no allow entry names exactly")
