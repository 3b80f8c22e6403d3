"""Display items of python code: the user's ``display(*objs)`` builtin (IPython's rich-repr
conventions), matplotlib's ``show()`` and the figures a cell leaves open.

The user's process writes each item as a ``d`` frame on a pipe of its own; the runner reads
that pipe with a bounded decoder (the call's caps, :class:`sandboxd_runner.calls.Call`) and
relays the frames; the daemon checks every item again (sandboxd/outputs.py).
"""

import os
import sys

from sandboxd.protocol import display as display_rules
from sandboxd.protocol import wire

from .interrupts import CELL, after_emit


def user_display(fd, caps, write=os.write, pack=wire.HEADER.pack, memoryview=memoryview,
                  cell=CELL, after_emit=after_emit):
    """The user's ``display(*objs)``: each object's mime bundle as one ``d`` frame on ``fd``
    (cut or counted by ``caps``: sandboxd/protocol/display.py). Once the runner stops reading (the
    call's count is reached, or it refused a frame), further items are dropped. A kernel's
    interrupt waits until a frame is written whole."""
    sent = [0]

    def display(*objs, **kwargs):
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

    return display


def show_figures(display):
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


def hook_pyplot(display):
    """Make ``matplotlib.pyplot.show()`` display the open figures (once it is imported)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or getattr(plt.show, "_sandboxd_display", None) is display:
        return

    def show(*args, **kwargs):
        show_figures(display)

    show._sandboxd_display = display
    try:
        plt.show = show
    except Exception:
        pass


def display_for_call(req, fd):
    """``(display, after_import)`` for a python call whose display pipe is ``fd``."""
    caps = display_rules.DisplayCaps(**(req.get("display") or {}))
    display = user_display(fd, caps)
    return display, (lambda: hook_pyplot(display))
