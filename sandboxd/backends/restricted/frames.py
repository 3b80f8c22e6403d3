"""The daemon's reader of a restricted worker's result socket: bounded, and distrustful.

The worker runs user code; once the language layer is bypassed, everything on this socket is
written by an attacker. So (see :mod:`sandboxd.protocol.wire` for the frame format):

* the work per event-loop callback is bounded: one ``read`` of at most
  :data:`sandboxd.protocol.wire.READ_BYTES`, decoded, then back to the loop;
* only ``o`` (stdout), ``e`` (stderr) - each 1 byte up to the call's output cap -, ``d``
  (a display item, checked by :mod:`sandboxd.results.outputs`) and one ``r`` (the report, at most
  the output cap plus :data:`REPORT_SLACK`) are accepted, and nothing after the report;
* a kernel's snapshot alone may also send one ``s`` frame, its pickled state, within the
  request's ``state_bytes``;
* the frames and bytes of a call are bounded (:func:`frame_budget`);
* the report must be a JSON object with exactly the known members, of the known types.

Anything else is a protocol violation: the reader stops at once and records why
(``violation``); the backend kills the worker and fails that call only. A session kernel's
call (``until_report``) ends at its report: anything after it in the same read is a
violation too. What a kernel writes between calls is read by the next call's reader, under
the same bounds: garbage is a violation there, and well-formed frames can only pose as that
call's output - of the same session, whose kernel wrote them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Callable

from sandboxd.protocol.call import WorkerReport
from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.wire import HEADER, READ_BYTES, Decoder, ProtocolError
from sandboxd.results.items import Position
from sandboxd.results.outputs import DisplayCollector
from sandboxd.results.streaming import EventSink, TextRelay, emit

#: room in the report for what is not the value (outcome, message, flags, probe results)
REPORT_SLACK = 64 * 1024
#: the most bytes one read of a snapshot's channel takes (its state can be large)
STATE_READ_BYTES = 1 << 20
#: how often a worker may flush each stream by itself (OutputStream.FLUSH_SECONDS = 0.02)
FLUSHES_PER_SECOND = 50


def frame_budget(cap: int, timeout_s: float,
                 display: DisplayCaps | None = None) -> tuple[int, int]:
    """``(frames, bytes)`` a well-behaved worker stays within for a call with output cap
    ``cap``: a frame per 4 KiB of output (it sends 8 KiB ones), plus timed flushes of both
    streams, plus its display items (one past the count: the worker stops there), plus slack;
    the bytes are both streams, the display items, the report and every header."""
    display = display or DisplayCaps()
    frames = (1024 + 2 * (cap // 4096) + 2 * FLUSHES_PER_SECOND * math.ceil(timeout_s + 1)
              + display.count + 1)
    return frames, (2 * cap + cap + REPORT_SLACK + (display.count + 1) * display.frame_bytes
                    + frames * HEADER.size)


def check_report(payload: bytes) -> WorkerReport:
    """The worker's final report, validated (raises :class:`ProtocolError`): a
    :class:`~sandboxd.protocol.call.WorkerReport` (the one definition both sandboxes'
    reports are decoded with) that says its ``outcome``."""
    try:
        report = WorkerReport.from_wire(json.loads(payload))
    except RecursionError:
        raise ProtocolError("the report is not JSON (RecursionError)") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ProtocolError(f"the report is not valid: {str(exc)[:200]}") from None
    if report.outcome is None:
        raise ProtocolError("the report's outcome is missing")
    if report.exit_code is not None and report.exit_code < 0:
        raise ProtocolError("the report's exit_code is not an integer in 0..255")
    return report


class FrameReader:
    """Reads one worker's frames from its socket (non-blocking, via ``add_reader``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: int,
                 timeout_s: float, until_report: bool = False,
                 display: DisplayCaps | None = None, events: EventSink | None = None,
                 state_bytes: int = 0) -> None:
        self.loop = loop
        self.fd = fd
        self.cap = cap
        display = display or DisplayCaps()
        frames, total = frame_budget(cap, timeout_s, display)
        sizes = {b"o": (1, cap), b"e": (1, cap), b"d": (2, display.frame_bytes),
                 b"r": (2, cap + REPORT_SLACK)}
        if state_bytes:  # a kernel's snapshot: one ``s`` frame of its pickled state
            sizes[b"s"] = (0, state_bytes)
            total += HEADER.size + state_bytes
        # a snapshot's state is read straight into a buffer of its own (one copy of it)
        self.decoder = Decoder(sizes, max_frames=frames, max_bytes=total,
                               direct_bytes=STATE_READ_BYTES if state_bytes else None)
        #: bytes per read: a snapshot's large state in fewer wake-ups (still bounded work)
        self.read_bytes = STATE_READ_BYTES if state_bytes else READ_BYTES
        #: a snapshot's state, as opaque bytes (the daemon never unpickles it)
        self.state: bytes | None = None
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.displays = DisplayCollector(display)
        self.events = events  # a streaming caller's sink (sandboxd.results.streaming)
        self.relay = TextRelay(events, cap)
        self.report: WorkerReport | None = None
        self.overflow = False
        self.violation: str | None = None
        self.eof = False
        # a session kernel's call ends with its report, not with EOF (the worker stays)
        self.until_report = until_report
        self.done = asyncio.Event()
        #: called once the reading ends, as ``done`` is set (a caller that waits for more
        #: than the reader alone wakes on one event: see kernel.py)
        self.on_stop: Callable[[], None] | None = None
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._on_readable)
        self.registered = True

    def _on_readable(self) -> None:
        """One bounded read per callback; the loop serves others before the next one."""
        into = self.decoder.into()
        try:
            if into is not None:
                with into, into[: self.read_bytes] as view:
                    n = os.readv(self.fd, [view])
            else:
                chunk = os.read(self.fd, self.read_bytes)
                n = len(chunk)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self.eof = True
            self._stop()
            return
        try:
            for frame in (self.decoder.filled(n) if into is not None
                          else self.decoder.feed(chunk)):
                self._take(frame.kind, frame.payload)
                if self.overflow:
                    break
        except ProtocolError as exc:
            self.violation = str(exc)
        if self._ends():
            self._stop()

    def _ends(self) -> bool:
        """Whether the reading ends after this read: an overflow, a violation, or a kernel's
        report (then any byte buffered after it is a violation)."""
        if self.until_report and self.report is not None and self.violation is None:
            if self.decoder.buffered:  # the start of a frame after the report
                self.violation = "bytes after the final report"
            return True
        return self.overflow or self.violation is not None

    def _take(self, kind: bytes, payload: bytes) -> None:
        if self.report is not None:
            raise ProtocolError("a frame after the final report")
        if kind == b"r":
            self.report = check_report(payload)
        elif kind == b"s":
            self._take_state(payload)
        elif kind == b"d":
            self._take_display(payload)
        else:
            self._take_output(kind, payload)

    def _take_state(self, payload: bytes) -> None:
        """A kernel's pickled state (one frame at most)."""
        if self.state is not None:
            raise ProtocolError("a second state frame")
        self.state = payload

    def _take_display(self, payload: bytes) -> None:
        """A display item, kept when the caps admit it, with where it happened in the output
        (for order), and relayed to a streaming caller."""
        item = self.displays.take(payload)
        if item is not None:
            item.at = Position(**self.relay.position())
            emit(self.events, "display", item.model_dump(mode="json"))

    def _take_output(self, kind: bytes, payload: bytes) -> None:
        """stdout (``o``) or stderr, within one cap for both (protocol.rules)."""
        target = self.stdout if kind == b"o" else self.stderr
        target += payload
        self.relay.feed("stdout" if kind == b"o" else "stderr", payload)
        if len(self.stdout) + len(self.stderr) > self.cap:
            self.overflow = True

    def _stop(self) -> None:
        self.close()
        self.relay.close()
        self.done.set()
        if self.on_stop is not None:
            self.on_stop()

    def close(self) -> None:
        if self.registered:
            self.loop.remove_reader(self.fd)
            self.registered = False
