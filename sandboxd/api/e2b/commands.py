"""A command an E2B SDK starts: one ``shell`` tool call in the sandbox's session, through
:meth:`Sandboxd.invoke` (policy, limits, slot, audit, verified cleanup), watched as it runs.

Foreground and background commands are the same here: a call whose output is relayed as it
comes. A background one outlives the stream that started it (within its call's limits) and is
listed and killed by the pid it was given; killing it cancels its call, which the service
ends, cleans up and audits like any cancelled call. Each stream that watches it (the one
that started it, and any that ``connect`` to its pid later) is a listener: every output
event from then on reaches every listener. A command started with stdin is given a
:class:`~sandboxd.backends.stdin.Stdin` its caller writes to while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from sandboxd.backends.stdin import Stdin, feeding
from sandboxd.models import InvokeRequest, Result
from sandboxd.results.streaming import StreamEvent
from sandboxd.service import Sandboxd
from sandboxd.util.deadline import stop_task

TRANSPORT = "e2b"


@dataclass
class Background:
    """One running command: its pid (numbered per sandbox), what it runs, its call."""

    pid: int
    line: str
    config: dict[str, Any]
    task: asyncio.Task[Result]
    started: asyncio.Event = field(default_factory=asyncio.Event)
    listeners: list[asyncio.Queue[StreamEvent]] = field(default_factory=list)
    stdin: Stdin | None = None  # started with stdin: what ``send_stdin`` writes to

    def listen(self) -> asyncio.Queue[StreamEvent]:
        """A new listener: the events from now on (drop it with :meth:`leave`)."""
        queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.listeners.append(queue)
        return queue

    def leave(self, queue: asyncio.Queue[StreamEvent]) -> None:
        with contextlib.suppress(ValueError):
            self.listeners.remove(queue)

    async def stop(self) -> None:
        """Kill it: its call is cancelled, ended and audited by the service."""
        await stop_task(self.task)

    def abandon(self) -> None:
        """Its sandbox ended (the session's end cancels its call): forget it."""
        self.task.cancel()


def start(service: Sandboxd, client: str, session: str, pid: int, line: str,
          envs: dict[str, str], config: dict[str, Any], stdin: Stdin | None = None
          ) -> Background:
    """Start ``line`` as a ``shell`` call of ``session``, its programs given ``envs`` (and
    ``stdin``, if given, as its stdin); its first listener (the starting stream's) is
    ``job.listeners[0]``."""
    listeners: list[asyncio.Queue[StreamEvent]] = [asyncio.Queue()]
    started = asyncio.Event()
    arguments: dict[str, Any] = {"command": line, **({"env": envs} if envs else {})}

    def publish(event: StreamEvent) -> None:
        for queue in listeners:
            queue.put_nowait(event)

    task = asyncio.create_task(service.invoke(
        client, "shell", InvokeRequest(arguments=arguments, session=session),
        transport=TRANSPORT, events=publish, started=started),
        context=None if stdin is None else feeding(stdin))
    return Background(pid, line, config, task, started, listeners, stdin)


async def begun(job: Background) -> None:
    """Returns once the call runs (with its stdin, the command is with its runner) or has
    ended (refused before it ran)."""
    waiting = asyncio.ensure_future(job.started.wait() if job.stdin is None
                                    else job.stdin.attached.wait())
    try:
        await asyncio.wait({waiting, job.task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()


async def next_event(job: Background, events: asyncio.Queue[StreamEvent]
                     ) -> StreamEvent | None:
    """A listener's next output event, or None once the call has ended and all was read."""
    while not job.task.done() or not events.empty():
        get = asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait({get, job.task}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        await stop_task(get)
    return None
