"""A fleet of sandboxd nodes behind HAProxy (docs/fleet.md): the configuration.

Every session id names its node (``ses_<node>_<random>``, MCP's ``mcp_<node>_<random>``:
:func:`sandboxd.models.new_id`), and everything a session does is under its own path
(``/v1/sessions/<id>/...``) or carries its ``Mcp-Session-Id``; a ``tools/call`` at MCP's
sessionless revision (2026-07-28) names it in its JSON body (``params.arguments.session``,
else ``params._meta["sandboxd/session"]``), which the proxy reads from the first
:data:`BODY_BUFFER_BYTES` it buffers of a ``POST /mcp``. So the proxy routes by the request
alone, with no table of its own:

* a request naming a session goes to that session's node, and only there (no redispatch:
  no other node has the session). A node that is down answers with the RFC 9457 problem
  ``node-unavailable`` (503, naming the node) that :func:`haproxy_config` writes into the
  node's backend, never HAProxy's HTML page. The node backend checks ``/healthz`` (alive):
  a draining node keeps getting its sessions' calls until it stops;
* everything else (new sessions, one-shot calls, MCP ``initialize``, tool lists) goes to
  the ready node with the fewest connections; the pool checks ``/readyz``, so a draining
  or not-ready node gets no new work, and a call a node refused before it ran anything
  (503: draining, a connection refused) is retried on another node.

Tokens pass through untouched (``Authorization``): every node reads the same tokens file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sandboxd import __version__
from sandboxd.config import NODE_ID_PATTERN
from sandboxd.errors import SandboxdError

#: the problem type of a session whose node is down (the one table: sandboxd.api.problems)
NODE_UNAVAILABLE = "node-unavailable"
#: HAProxy's buffer (``tune.bufsize``, its default): a ``POST /mcp`` whose headers and body
#: fit in it, less HAProxy's rewrite reserve (1 KiB), is read whole for the session it names;
#: a longer one goes on unread (to any ready node). Bounded so that a proxy holding
#: ``maxconn`` requests holds a known amount of memory.
BODY_BUFFER_BYTES = 16384
#: the longest the proxy waits for a ``POST /mcp``'s body before it routes by what it has
BODY_WAIT_S = 10
_ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$")

#: a POST to the MCP endpoint that named no session in its path or headers
_MCP_POST = "METH_POST { path /mcp } !{ var(txn.sid) -m found }"


def body_session_paths() -> tuple[str, str]:
    """Where a 2026-07-28 ``tools/call`` names its session, as ``json_query`` paths, in the
    order the daemon reads them (the argument wins); json_query takes the slash of
    ``sandboxd/session`` in a dotted key (checked with HAProxy 2.6)."""
    from sandboxd.api.mcp.handles import ARGUMENT
    from sandboxd.api.mcp.meta import SESSION_META

    return f"$.params.arguments.{ARGUMENT}", f"$.params._meta.{SESSION_META}"


class NodeUnavailable(SandboxdError):
    """The node a session lives on is down: the fleet's proxy answers its calls with this
    problem (503), written into the HAProxy configuration by :func:`haproxy_config`."""

    code = NODE_UNAVAILABLE


class FleetConfigError(SandboxdError, ValueError):
    """A node given to the generator is not ``id=host:port`` with a valid id."""

    code = "fleet-config-invalid"


@dataclass(frozen=True)
class Node:
    """One sandboxd node: its id (``node_id`` setting) and its ``host:port``."""

    id: str
    address: str

    @classmethod
    def parse(cls, text: str) -> Node:
        """``n1=10.0.0.5:8765`` (the id as the node's ``node_id`` setting says it)."""
        name, sep, address = text.partition("=")
        if not sep or not re.match(NODE_ID_PATTERN, name):
            raise FleetConfigError(
                f"{text!r}: a node is ID=HOST:PORT, the ID as its node_id setting "
                "([a-z0-9-], at most 32 characters)")
        if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise FleetConfigError(f"{text!r}: the address must be HOST:PORT")
        return cls(name, address)


def problem_body(node: str, status: int = 503) -> str:
    """The problem+json HAProxy answers for a session of ``node`` when the node is down."""
    from sandboxd.api.problems import PROBLEM_TYPE, PROBLEMS

    _status, slug, title = PROBLEMS[NODE_UNAVAILABLE]
    return json.dumps({
        "type": PROBLEM_TYPE + slug, "title": title, "status": status, "node": node,
        "detail": f"node {node}, where this session lives, is not answering; its sessions "
                  "are unavailable until it is back (docs/fleet.md)"}, separators=(",", ":"))


def _check_fleet(nodes: list[Node], bind: str) -> None:
    """``FleetConfigError`` unless there are nodes, their ids differ and ``bind`` is
    ``HOST:PORT``."""
    if not nodes:
        raise FleetConfigError("a fleet needs at least one node (--node ID=HOST:PORT)")
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise FleetConfigError(f"node ids must differ: {', '.join(ids)}")
    if not _ADDRESS.match(bind):
        raise FleetConfigError(f"{bind!r}: --bind must be HOST:PORT")


def _node_backend(node: Node, check: str) -> list[str]:
    """The HAProxy backend of one node's sessions (``check``: its health-check options)."""
    return [
        "",
        f"backend node_{node.id}",
        f"    # the sessions of {node.id}: there or nowhere (no redispatch); alive is",
        "    # enough (a draining node finishes its sessions' calls until it stops)",
        "    option httpchk",
        "    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost",
        "    http-check expect status 200",
        "    # a request its connection closed on without a word (a kept-alive connection",
        "    # the stopping node closed as the request went out): sent again on a new",
        "    # connection, which the node answers or refuses (a live node never closes on a",
        "    # request it has read: it answers)",
        "    option http-buffer-request",
        "    retry-on conn-failure empty-response",
        "    retries 2",
        f"    server {node.id} {node.address} {check}",
        *(f"    http-error status {status} content-type application/problem+json "
          f"string '{problem_body(node.id, status)}'" for status in (502, 503)),
    ]


def haproxy_config(nodes: list[Node], *, bind: str = "127.0.0.1:8080",
                   check_interval_ms: int = 2000, fall: int = 2, rise: int = 2,
                   call_timeout_s: int = 600) -> str:
    """The HAProxy (2.6) configuration of a fleet of ``nodes`` (see the module docstring).
    ``call_timeout_s``: the longest a call (or an idle SSE/MCP stream) may take."""
    _check_fleet(nodes, bind)
    check = f"check inter {check_interval_ms}ms fall {fall} rise {rise}"
    lines = [
        f"# A sandboxd fleet of {len(nodes)} node(s): generated by `sandboxd fleet "
        f"haproxy-config` (sandboxd {__version__}).",
        "# How it routes, and how to run it: docs/fleet.md. HAProxy 2.6 (Debian 12).",
        "global",
        "    maxconn 4096",
        "    # a request's headers and the part of its body read for routing (a POST /mcp)",
        f"    tune.bufsize {BODY_BUFFER_BYTES}",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 3s",
        "    timeout http-request 10s",
        "    timeout queue 30s",
        f"    timeout client {call_timeout_s}s",
        f"    timeout server {call_timeout_s}s",
        f"    timeout tunnel {call_timeout_s}s",
        f"    timeout check {max(check_interval_ms, 1000)}ms",
        "",
        "frontend sandboxd",
        f"    bind {bind}",
        "    # the session a request belongs to: the id in its path, else its Mcp-Session-Id",
        "    http-request set-var(txn.sid) path,field(4,/) if { path_beg /v1/sessions/ }",
        "    http-request set-var(txn.sid) req.hdr(mcp-session-id) if "
        "!{ var(txn.sid) -m found } { req.hdr(mcp-session-id) -m found }",
        "    # E2B's SDKs (sandboxd.api.e2b): the sandbox (a session) in the control plane's path,",
        "    # else in the sandbox plane's E2b-Sandbox-Id header",
        "    http-request set-var(txn.sid) path,field(3,/) if !{ var(txn.sid) -m found } "
        "{ path_beg /sandboxes/ }",
        "    http-request set-var(txn.sid) path,field(4,/) if !{ var(txn.sid) -m found } "
        "{ path_beg /v2/sandboxes/ }",
        "    http-request set-var(txn.sid) req.hdr(e2b-sandbox-id) if "
        "!{ var(txn.sid) -m found } { req.hdr(e2b-sandbox-id) -m found }",
        "    # else, for a POST /mcp (2026-07-28: no Mcp-Session-Id), the session its JSON",
        "    # body names: the tool's session argument, else _meta's sandboxd/session. The",
        f"    # body is read up to the buffer ({BODY_BUFFER_BYTES} bytes with the headers) or "
        f"for {BODY_WAIT_S}s at most",
        f"    http-request wait-for-body time {BODY_WAIT_S}s if {_MCP_POST}",
        *(f"    http-request set-var(txn.sid) req.body,json_query('{path}') if {_MCP_POST}"
          for path in body_session_paths()),
        "    # its node: the middle part of ses_<node>_<random> / mcp_<node>_<random>",
        "    http-request set-var(txn.node) var(txn.sid),field(2,_) if "
        "{ var(txn.sid) -m reg ^(ses|mcp)_[a-z0-9-]+_[A-Za-z0-9]+$ }",
        *(f"    use_backend node_{n.id} if {{ var(txn.node) -m str {n.id} }}" for n in nodes),
        "    # new sessions, one-shot calls, MCP initialize, tool lists: any ready node",
        "    default_backend pool",
        "",
        "backend pool",
        "    balance leastconn",
        "    # ready nodes only: a draining (SIGTERM) or not-ready node answers 503 here",
        "    option httpchk",
        "    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost",
        "    http-check expect status 200",
        "    # refused before anything ran (a connection refused, 503 draining): another node",
        "    option http-buffer-request  # a retry resends the request: keep its copy",
        "    retry-on conn-failure 503",
        "    retries 3",
        "    option redispatch 1",
        *(f"    server {n.id} {n.address} {check}" for n in nodes),
    ]
    for node in nodes:
        lines += _node_backend(node, check)
    return "\n".join(lines) + "\n"
