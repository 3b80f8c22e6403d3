"""What the invoke path says on a result after its backend ran: one ordered list of steps,
each a small function ``Result -> Result`` given what it needs (observed by the invoke path
while the call ran), applied in one place. The order is the wording: the kernel's own loss
first (its sentence is built from the backend's message), then a full workspace (put in
front of the message: the likely cause of what failed), then a restart that ended the
session's previous kernel (appended: it happened before this call)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial, reduce

from sandboxd.models import (
    KERNEL_INTERRUPTED_MESSAGE,
    KERNEL_LOST_MESSAGE,
    Result,
    kernel_lost_message,
)
from sandboxd.sessions.restarts import note_restart
from sandboxd.workspaces.quota import Usage, full_note

#: one rewrite of a result
Step = Callable[[Result], Result]


@dataclass(frozen=True)
class QuotaSeen:
    """A workspace measured right after its call: ``usage`` (None: it could not be read)
    against the session ``quota``."""

    usage: Usage | None
    quota: Usage


def kernel_lost(result: Result) -> Result:
    """The result, whose message says the session's Python state is gone when its kernel
    was lost (the one sentence of :func:`~sandboxd.models.kernel_lost_message`), or that it
    is kept when its code was interrupted (:data:`~sandboxd.models.KERNEL_INTERRUPTED_MESSAGE`)."""
    kernel = result.kernel
    if kernel is None:
        return result
    if kernel.lost:
        return _state_lost(result)
    return _state_kept(result) if kernel.interrupted else result


def _state_lost(result: Result) -> Result:
    """The result of a call whose kernel was lost, its message saying so (once)."""
    if result.message and KERNEL_LOST_MESSAGE.split("{why}")[0] in result.message:
        return result  # said already
    return result.model_copy(update={"message": kernel_lost_message(result)})


def _state_kept(result: Result) -> Result:
    """The result of an interrupted call, its message saying the kernel's state is kept
    (once, after what it says already)."""
    if result.message and KERNEL_INTERRUPTED_MESSAGE in result.message:
        return result
    message = "; ".join(m for m in (result.message, KERNEL_INTERRUPTED_MESSAGE) if m)
    return result.model_copy(update={"message": message})


def workspace_full(seen: QuotaSeen, result: Result) -> Result:
    """Tell the model when its workspace is full (:func:`~sandboxd.workspaces.quota.full_note`),
    from the workspace ``seen`` and the end of the call's output."""
    note = full_note(seen.usage, result.stderr[-8192:] + result.stdout[-4096:], seen.quota)
    if note is None:
        return result
    message = note if not result.message else f"{note} ({result.message})"
    return result.model_copy(update={"message": message})


def result_steps(*, quota: QuotaSeen | None = None, restart: str | None = None,
                 language: str = "python") -> list[Step]:
    """The steps for one result, in their order: :func:`kernel_lost` always;
    :func:`workspace_full` when the workspace was measured (``quota``: a python or command
    call that reached it); :func:`~sandboxd.sessions.restarts.note_restart` when a restart
    ended the session's kernel on this backend and this call is the first to hear it
    (``restart``: its reason; ``language``: the kernel's)."""
    steps: list[Step] = [kernel_lost]
    if quota is not None:
        steps.append(partial(workspace_full, quota))
    if restart is not None:
        steps.append(partial(note_restart, reason=restart, language=language))
    return steps


def finish(result: Result, steps: Iterable[Step]) -> Result:
    """``result`` through each of ``steps`` in turn."""
    return reduce(lambda done, step: step(done), steps, result)
