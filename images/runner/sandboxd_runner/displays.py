"""Display items of python code: the user's ``display(*objs)`` builtin (IPython's rich-repr
conventions), matplotlib's ``show()`` and the figures a cell leaves open.

The user's process writes each item as a ``d`` frame on a pipe of its own; the runner reads
that pipe with a bounded decoder (the call's caps, :class:`sandboxd_runner.calls.Call`) and
relays the frames; the daemon checks every item again (sandboxd/results/outputs.py).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from sandboxd.protocol import display as display_rules
from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerRequest

from .interrupts import CELL, after_emit

FIONREAD = 0x541B  # Linux: the bytes in a pipe (either end)
DISPLAY_READ_WAIT_S = 2.0  # how long display() waits for the runner to read its frame


def frame_read(fd: int, ioctl: Any = fcntl.ioctl, monotonic: Any = time.monotonic,
               sleep: Any = time.sleep, from_bytes: Any = int.from_bytes,
               order: Any = sys.byteorder) -> None:
    """Wait (bounded) until the runner has read everything on the display pipe ``fd``: it
    relays the stdout/stderr written before an item first (``Call.drain_text``), so output
    written after ``display()`` returns comes after the item, in the order it was written."""
    until, pause = monotonic() + DISPLAY_READ_WAIT_S, 0.0001
    try:
        while from_bytes(ioctl(fd, FIONREAD, bytes(4)), order) and monotonic() < until:
            sleep(pause)
            pause = min(pause * 2, 0.005)
    except OSError:
        pass


def user_display(fd: int, caps: Any, write: Any = os.write, pack: Any = wire.HEADER.pack,
                 memoryview: Any = memoryview, cell: Any = CELL,
                 after_emit: Any = after_emit, frame_read: Any = frame_read
                 ) -> Callable[..., None]:
    """The user's ``display(*objs)``: each object's mime bundle as one ``d`` frame on ``fd``
    (cut or counted by ``caps``: sandboxd/protocol/display.py), after flushing stdout and
    stderr, and once the runner has read it, back to the caller (so prints keep their place
    around it). Once the runner stops reading (the call's count is reached, or it refused a
    frame), further items are dropped. A kernel's interrupt waits until a frame is written
    whole."""
    sent = [0]

    def display(*objs: Any, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError("display() takes no keyword arguments")
        for obj in objs:
            if sent[0] > caps.count:  # the daemon keeps one note past the count
                return
            payload = display_rules.encode_item(display_rules.mime_bundle(obj), caps)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            view = memoryview(pack(b"d", 0, len(payload)) + payload)
            cell.emitting = True
            try:
                while view:
                    view = view[write(fd, view):]
                sent[0] += 1
            except OSError:
                sent[0] = caps.count + 1
            finally:
                cell.emitting = False
            after_emit()
            if sent[0] <= caps.count:
                frame_read(fd)

    return display


def show_figures(display: Callable[..., None]) -> None:
    """Display every open matplotlib figure and close them all (a cell's end, ``show()``)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            display(plt.figure(num))
        except Exception:
            pass
    try:
        plt.close("all")
    except Exception:
        pass


def hook_pyplot(display: Callable[..., None]) -> None:
    """Make ``matplotlib.pyplot.show()`` display the open figures (once it is imported)."""
    plt: Any = sys.modules.get("matplotlib.pyplot")
    if plt is None or getattr(plt.show, "_sandboxd_display", None) is display:
        return

    def show(*args: Any, **kwargs: Any) -> None:
        show_figures(display)

    show._sandboxd_display = display  # type: ignore[attr-defined]
    try:
        plt.show = show
    except Exception:
        pass


def display_for_call(req: WorkerRequest, fd: int
                     ) -> tuple[Callable[..., None], Callable[[], None]]:
    """``(display, after_import)`` for a python call whose display pipe is ``fd``."""
    caps = req.display
    display = user_display(fd, caps)
    return display, (lambda: hook_pyplot(display))
