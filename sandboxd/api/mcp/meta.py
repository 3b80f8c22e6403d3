"""What an MCP request says besides its tool and arguments: the protocol revision it speaks
(and what differs by revision), the instructions of each era, and sandboxd's ``_meta`` keys
(``sandboxd/limits``: lower limits; ``sandboxd/session``: the sandboxd session a call runs in,
for a client that names one itself; a model passes the tools' ``session`` argument)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.responses import JSONResponse

from sandboxd.api import problems
from sandboxd.api.mcp.envelope import rpc_error
from sandboxd.models import LimitsRequest

LIMITS_META = "sandboxd/limits"
#: from this revision on (SEP-1303) bad arguments are a tool error, not -32602: the outcome
#: table's (:data:`sandboxd.api.problems.MCP_ANSWERS`)
ARGUMENT_ERRORS_AS_RESULTS = problems.ARGUMENT_ERRORS_AS_RESULTS
#: every revision served: the initialize-handshake era (an MCP session per client, its own
#: workspace) and the stateless era (each request stands alone: no session, no handshake)
VERSIONS: tuple[str, ...] = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)
SESSION_META = "sandboxd/session"
_ABOUT = ("sandboxd runs code and commands in a confined sandbox under an administrator's "
          "policy. A denied call explains what is allowed. ")
INSTRUCTIONS = _ABOUT + (
    "Files written in this MCP session stay in its workspace, and Python variables in its "
    "interpreter, for the next calls of the same session.")
#: 2026-07-28 has no MCP sessions: state travels in a handle the result names and the model
#: passes back (sandboxd/api/mcp/handles.py)
STATELESS_INSTRUCTIONS = _ABOUT + (
    "Each call without a \"session\" argument runs in a new session; its result names that "
    "session. Pass it back as \"session\" in later calls to keep their files and Python "
    "variables; leave it out for a fresh one.")


def limits(meta: Any) -> LimitsRequest | None:
    """Lower limits a caller may ask for in ``_meta["sandboxd/limits"]`` (the HTTP body's
    ``limits``: each may only lower the effective limit); bad values are -32602 naming them."""
    wanted = meta.get(LIMITS_META) if isinstance(meta, dict) else None
    if wanted is None:
        return None
    try:
        return LimitsRequest.model_validate(wanted)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(limits)"
        raise MCPError(types.INVALID_PARAMS, f"_meta.{LIMITS_META}.{where}: {err['msg']}",
                       {"field": f"_meta.{LIMITS_META}.{where}", "problem": err["msg"]}) from None


def named_session(meta: Any) -> str | None:
    """The sandboxd session a call names in ``_meta["sandboxd/session"]`` (the service checks
    that it is the caller's)."""
    sid = meta.get(SESSION_META) if isinstance(meta, dict) else None
    if sid is None:
        return None
    if not isinstance(sid, str) or not sid:
        raise MCPError(types.INVALID_PARAMS, f"_meta.{SESSION_META}: a session id (a string)",
                       {"field": f"_meta.{SESSION_META}", "problem": "not a string"})
    return sid


def unsupported_version(version: str, ident: str | int | None) -> JSONResponse:
    """The answer to a version MCP never had, or one newer than this server (-32022 names
    the ones it speaks: a client picks a mutual one, as the lifecycle's negotiation says)."""
    error = rpc_error(ident, types.UNSUPPORTED_PROTOCOL_VERSION,
                      f"protocol version {version[:40]!r} is not a version this server "
                      f"speaks (it speaks {', '.join(VERSIONS)})",
                      {"supported": list(VERSIONS), "requested": version[:40]})
    return JSONResponse(error, status_code=400)
