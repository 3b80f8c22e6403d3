"""The Docker engine's health, watched by the daemon: the container backend is available only
while the engine answers. The watch pings it every :data:`CHECK_S` (with a short timeout); a
failed ping marks the backend unavailable at once (new calls get 503, readiness and the tool
list say why), and while it is down the watch retries with exponential backoff up to
:data:`MAX_BACKOFF_S`, then reconnects by itself (sweep of leftovers, fresh warm pool). A
daemon started while the engine was down is just "down" from the start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sandboxd.util.deadline import within

log = logging.getLogger("sandboxd.container")

CHECK_S = 1.0
#: a stopped engine refuses at once; this bound is for a slow one (a busy or emulated host
#: can take seconds to answer), which must not be mistaken for an outage
PING_TIMEOUT_S = 10.0
MAX_BACKOFF_S = 10.0


class EngineWatch:
    """Calls ``ping`` (raises when the engine does not answer), ``down(why)`` on the first
    failure, ``up()`` (True once the backend is usable again) while it is down. The backend
    sets ``is_up`` False itself when its own state vanished (its runner directory): the next
    round rebuilds through ``up()``."""

    def __init__(self, ping: Callable[[], Awaitable[None]], down: Callable[[str], Awaitable[None]],
                 up: Callable[[], Awaitable[bool]], *, is_up: bool) -> None:
        self.ping = ping
        self.down = down
        self.up = up
        self.is_up = is_up
        self.wake = asyncio.Event()  # a call saw the engine fail: check now

    async def run(self) -> None:
        """Forever (cancelled at shutdown)."""
        backoff = CHECK_S
        while True:
            delay = CHECK_S if self.is_up else backoff
            await within(self.wake.wait(), delay)
            self.wake.clear()
            if self.is_up:
                try:
                    answered, _ = await within(self.ping(), PING_TIMEOUT_S)
                    if not answered:
                        raise TimeoutError(f"no answer within {PING_TIMEOUT_S:g} s")
                except Exception as exc:
                    self.is_up = False
                    backoff = CHECK_S / 2
                    why = str(exc) or type(exc).__name__
                    log.warning("the Docker engine does not answer: %s", why)
                    await self.down(why)
                continue
            try:
                self.is_up = await self.up()
            except Exception as exc:
                log.debug("the Docker engine is still unreachable: %s", exc)
                self.is_up = False
            if self.is_up:
                log.warning("the Docker engine is back: the container backend is available")
                backoff = CHECK_S
            else:
                backoff = min(backoff * 2, MAX_BACKOFF_S)
