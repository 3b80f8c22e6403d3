"""Revocation ends what it must: a client left without a valid token (every token removed from
the tokens file, or expired) loses everything it holds.

Every :attr:`~sandboxd.access.tokens.TokenStore.CHECK_INTERVAL_S` (a second) the watcher re-reads
the
tokens file if it changed and compares the clients that hold something (a sandboxd session,
with its kernels, containers and workspace; an MCP session) with the clients that have an
unexpired token. Each holder without one is revoked: its MCP sessions end (404 from then on),
then its sessions end through the service's one close path (a DELETE's and a TTL expiry's),
audited as one ``client_revoked`` record; its kernels stop counting against ``max_kernels``.
The check is level-triggered: anything the client still gets hold of (a call authenticated
just before the removal) is ended at the next check. Rotation (a new token for the client
added before the old one is removed) keeps everything. A tokens file that fails to parse is
not a removal: the last good tokens stay in force (:meth:`TokenStore.refresh`).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxd.access.tokens import TokenStore
    from sandboxd.api.mcp.door import LazyMcpDoor
    from sandboxd.service import Sandboxd

log = logging.getLogger("sandboxd.revocation")


async def revoke_tokenless(tokens: TokenStore, service: Sandboxd,
                           mcp: LazyMcpDoor) -> dict[str, dict[str, Any]]:
    """Revoke every client that holds something but has no valid token; returns the
    ``client_revoked`` fields of each."""
    await asyncio.to_thread(tokens.refresh)
    now = datetime.now(UTC)
    valid = tokens.valid_clients(now)
    holders = {s.client for s in service.sessions.registered()} | mcp.clients()
    revoked: dict[str, dict[str, Any]] = {}
    for client in sorted(holders - valid):
        expired = any(e.client == client for e in tokens.entries)
        reason = "its tokens expired" if expired else "its tokens were removed"
        ended = await mcp.end_client(client)
        revoked[client] = await service.revoke_client(client, reason, mcp_sessions=ended)
        log.warning("client %s revoked (%s): %d session(s), %d MCP session(s) ended", client,
                    reason, len(revoked[client]["sessions"]), len(ended))
    return revoked


async def watch(tokens: TokenStore, service: Sandboxd, mcp: LazyMcpDoor) -> None:
    """Forever: :func:`revoke_tokenless` every ``CHECK_INTERVAL_S``; a failure is logged and
    retried at the next check, it never ends the loop."""
    while True:
        try:
            await revoke_tokenless(tokens, service, mcp)
        except Exception:
            log.exception("revoking clients without a valid token failed")
        await asyncio.sleep(tokens.CHECK_INTERVAL_S)
