"""``/mcp`` before the first MCP request: the MCP SDK is a third of the daemon's import time
and most daemons never see an MCP client, so the door (:mod:`sandboxd.api.mcp.server`) is imported,
built and started on its first request, inside the lifespan's exit stack (stopped at
shutdown, as a door built at start would be)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from sandboxd.api import problems

if TYPE_CHECKING:
    from sandboxd.api.mcp.server import McpFrontDoor
    from sandboxd.service import Sandboxd


class LazyMcpDoor:
    """The ``/mcp`` ASGI endpoint; the real door is made on the first request."""

    def __init__(self, service: Sandboxd) -> None:
        self.service = service
        self.door: McpFrontDoor | None = None
        self._lock = asyncio.Lock()
        self._stack: contextlib.AsyncExitStack | None = None

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The app's lifespan: a door started meanwhile is stopped when it ends."""
        async with contextlib.AsyncExitStack() as stack:
            self._stack = stack
            try:
                yield
            finally:
                self._stack = None

    async def _door(self) -> McpFrontDoor | None:
        async with self._lock:
            if self.door is None and self._stack is not None:
                # the import runs once, in a thread: the event loop keeps serving meanwhile
                module = await asyncio.to_thread(importlib.import_module, "sandboxd.api.mcp.server")
                door: McpFrontDoor = module.McpFrontDoor(self.service)
                await self._stack.enter_async_context(door.run())
                self.door = door
            return self.door

    def clients(self) -> set[str]:
        """The clients that own an MCP session now (none before the first MCP request)."""
        return self.door.clients() if self.door is not None else set()

    async def end_client(self, client: str) -> list[str]:
        """End every MCP session of ``client`` (:meth:`McpFrontDoor.end_client`)."""
        return await self.door.end_client(client) if self.door is not None else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        door = self.door or (None if self.service.draining else await self._door())
        if door is None:  # outside the lifespan, or draining before any MCP request
            await problems.problem_response(problems.Problem(
                503, "draining", "Shutting down",
                "the daemon is shutting down; retry on another instance or later",
                headers={"Retry-After": "5"}))(scope, receive, send)
            return
        await door(scope, receive, send)
