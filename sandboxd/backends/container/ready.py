"""Session containers started before their session has a client (:mod:`sandboxd.sessions.ready`
keeps the sessions; this module their containers).

A ready session's container is made exactly as its first ``python`` call would make it: the
session's workspace bind-mounted, the session's own uid, labelled with the session's id, the
default python image, default limits, no network, the wheelhouse when there is one. Claimed,
it is the session's container (``(client, session, image)``): its first call finds it, changes
its limits to the call's (as every call does), and uses it, unless the call's policy wants
what it was not made with (a network, egress rules): then it is replaced by a container made
for the call (:class:`~sandboxd.backends.container.sessions.SessionContainers`, where a call
finds its session's container).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes, runner_lost
from sandboxd.backends.container.pool import idle_room
from sandboxd.backends.container.sessions import SessionContainers
from sandboxd.models import Limits
from sandboxd.util.deadline import within

#: how long a new container's runner may take to connect before it counts as failed (a
#: bound for a hang: an emulated host takes tens of seconds; the refill waits meanwhile)
RUNNER_CONNECT_S = 300.0


@dataclass(frozen=True)
class ReadyBox:
    """A ready session's container, and the session it was made for."""

    box: Box
    session: str


class ReadyContainers:
    """Starts, hands over and removes the containers of ready sessions."""

    def __init__(self, boxes: Boxes, sessions: SessionContainers) -> None:
        self.boxes = boxes
        self.sessions = sessions

    def ready_wanted(self) -> int:
        """``session_pool_size``, while the engine answers and free memory allows it."""
        size = self.boxes.config.session_pool_size
        if size <= 0 or self.boxes.closing or not self.boxes.available[0]:
            return 0
        room = idle_room(Limits().memory_bytes)
        return size if room is None else min(size, room)

    async def prestart(self, session: str, uid: int | None, workspace: Path) -> ReadyBox:
        """Start the container of the prepared session ``session`` (its uid and workspace);
        back once its runner is connected. Raises when it is not (nothing of it is left
        then)."""
        box = await self.boxes.new(
            image=self.boxes.config.python_image, shape=engine.Shape.of(Limits()),
            role="session", invocation="ready", workspace=workspace, session=session, uid=uid)
        box.prestarted = True
        try:
            await within(box.endpoint.settled.wait(), RUNNER_CONNECT_S)
            if not box.endpoint.ready:
                raise RuntimeError(box.endpoint.failure or "its runner did not connect")
        except BaseException:
            await self.boxes.destroy_shielded(box)
            raise
        return ReadyBox(box, session)

    def prestarted_usable(self, handle: object) -> bool:
        box = _ready(handle).box
        return not box.dead and not runner_lost(box) and self.boxes.available[0]

    def claim(self, handle: object, client: str) -> None:
        ready = _ready(handle)
        box = ready.box
        key = (client, ready.session, box.image)
        assert key not in self.sessions.by_key  # a new session has no container yet
        self.sessions.by_key[key] = box

    async def discard(self, handle: object) -> None:
        await self.boxes.destroy_holding_uid(_ready(handle).box)


def _ready(handle: object) -> ReadyBox:
    assert isinstance(handle, ReadyBox)
    return handle
