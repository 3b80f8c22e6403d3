"""What a session kernel's SIGINT handler needs to know while user code runs (the runner's
interrupt before kill: see sandboxd_runner.kernel)."""

from __future__ import annotations


class CellState:
    """What a session kernel's SIGINT handler needs to know (see :func:`interrupt_user_code`);
    one per process (a forked kernel has its own copy)."""

    running = False  # the user's code runs now
    emitting = False  # a display frame is being written: an interrupt waits until it is whole
    pending = False  # an interrupt came while a frame was being written
    message: str | None = None  # the last cell's exception line: its result's message


CELL = CellState()


def interrupt_user_code(signum: int | None = None, frame: object = None,
                        cell: CellState = CELL) -> None:
    """SIGINT in a session kernel: a ``KeyboardInterrupt`` in the user's code while it runs -
    deferred while a display frame is being written, so that the display pipe never carries
    half a frame (:func:`after_emit` raises it then) - and nothing once the code has ended
    (the call is over: the interrupt came too late)."""
    if cell.running and not cell.emitting:
        raise KeyboardInterrupt
    cell.pending = cell.running


def after_emit(cell: CellState = CELL) -> None:
    """Raise the interrupt that came while a frame was being written (see above)."""
    if cell.pending and cell.running and not cell.emitting:
        cell.pending = False
        raise KeyboardInterrupt


INTERRUPT_FRAMES = frozenset({(__file__, "interrupt_user_code"), (__file__, "after_emit")})
