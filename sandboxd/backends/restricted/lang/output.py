"""Output capture: stdout/stderr streamed to the parent in frames within the output cap,
the ``print`` collector, and ``display()``."""

from __future__ import annotations

import builtins
import pprint
import time
from collections.abc import Callable
from typing import Any

from sandboxd.backends.restricted.lang.guards import expose, guarded_getattr
from sandboxd.backends.restricted.lang.state import STATE, LimitExceeded
from sandboxd.protocol.display import DisplayCaps, encode_item, plain_bundle
from sandboxd.protocol.rules import OutputBudget


@expose("write", "flush")
class OutputStream:
    """Collects one stream (stdout or stderr) and forwards it to the parent in frames, within
    the call's output budget (:class:`sandboxd.protocol.rules.OutputBudget`, shared by stdout and
    stderr). Exceeding it raises :class:`LimitExceeded` (sticky)."""

    FLUSH_BYTES = 8192
    FLUSH_SECONDS = 0.02

    def __init__(
        self, kind: bytes, emit: Callable[[bytes, bytes], None], budget: OutputBudget
    ) -> None:
        self.kind = kind
        self.emit = emit
        self.budget = budget
        self.cap = budget.cap
        self.pending: list[bytes] = []
        self.pending_size = 0
        self.last_flush = -1e9
        self.truncated = False
        self.busy = False

    def write(self, text: str) -> int:
        if STATE.limit_hit is not None:
            raise STATE.limit_hit
        if not isinstance(text, str):
            raise TypeError("write() argument must be str")
        self.busy = True
        try:
            return self._write(text)
        finally:
            self.busy = False

    def tick(self) -> None:
        """Periodic flush (from a timer signal) unless a write is in progress, so that output
        printed before a hang or a kill reaches the parent."""
        if not self.busy and self.pending:
            self.busy = True
            try:
                self.flush()
            except KeyboardInterrupt:  # a kernel's interrupt, deferred during the write
                raise
            except BaseException:
                pass
            finally:
                self.busy = False

    def _write(self, text: str) -> int:
        data = text.encode("utf-8", "surrogateescape")
        room = self.budget.room()
        if len(data) > room:
            data = data[: max(room, 0)]
            # do not cut a UTF-8 sequence in half
            while data and (data[-1] & 0xC0) == 0x80:
                data = data[:-1]
            if data and data[-1] >= 0xC0:
                data = data[:-1]
            self._add(data)
            self.flush()
            self.truncated = self.budget.exceeded = True
            STATE.limit_hit = LimitExceeded(
                "output_limit", f"output limit of {self.cap} bytes exceeded"
            )
            raise STATE.limit_hit
        self._add(data)
        now = time.monotonic()
        if self.pending_size >= self.FLUSH_BYTES or now - self.last_flush >= self.FLUSH_SECONDS:
            self.flush()
            self.last_flush = now
        return len(text)

    def _add(self, data: bytes) -> None:
        if data:
            self.pending.append(data)
            self.pending_size += len(data)
            self.budget.used += len(data)

    def flush(self) -> None:
        if self.pending:
            data = b"".join(self.pending)
            self.pending.clear()
            self.pending_size = 0
            self.emit(self.kind, data)

    def flush_soon(self) -> None:
        """An explicit flush, at most every ``FLUSH_SECONDS`` (the timer flushes the rest):
        the daemon bounds the frames of a call, and nothing is streamed before its end."""
        now = time.monotonic()
        if now - self.last_flush >= self.FLUSH_SECONDS:
            self.flush()
            self.last_flush = now

    def write_raw(self, text: str) -> None:
        """For the runner's own messages (tracebacks): within the budget but never raising; a
        message cut by the cap ends the call with ``output_limit`` like any other output."""
        raw = text.encode("utf-8", "surrogateescape")
        data = raw[: self.budget.room()]
        if len(data) < len(raw):
            self.truncated = self.budget.exceeded = True
            if STATE.limit_hit is None:
                STATE.limit_hit = LimitExceeded(
                    "output_limit", f"output limit of {self.cap} bytes exceeded"
                )
        self._add(data)


@expose()
class PrintScope:
    """What ``_print_`` returns: RestrictedPython calls ``_print._call_print(...)``."""

    def __init__(self, stream: OutputStream) -> None:
        self.stream = stream

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        target = kwargs.get("file")
        if target is not None:
            guarded_getattr(target, "write")
            builtins.print(*objects, **kwargs)
            return
        unknown = set(kwargs) - {"sep", "end", "flush", "file"}
        if unknown:
            raise TypeError(f"print() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        sep = kwargs.get("sep")
        end = kwargs.get("end")
        if sep is not None and not isinstance(sep, str):
            raise TypeError("sep must be None or a string")
        if end is not None and not isinstance(end, str):
            raise TypeError("end must be None or a string")
        # one write per print() call, so that a line is never split across flushes
        text = (" " if sep is None else sep).join([str(o) for o in objects])
        self.stream.write(text + ("\n" if end is None else end))
        if kwargs.get("flush"):
            self.stream.flush_soon()

    def __call__(self) -> str:  # the ``printed`` variable: not supported
        return ""


@expose()
class CurrentStdout:
    """The current run's stdout stream, for helpers that print (pprint.pprint)."""

    stream: Any = None


def sandbox_pprint(obj: Any, *args: Any, **kwargs: Any) -> None:
    kwargs.pop("stream", None)
    text = pprint.pformat(obj, *args, **kwargs)
    if CurrentStdout.stream is not None:
        CurrentStdout.stream.write(text + "\n")


@expose()
class Displayer:
    """The ``display(*objs)`` builtin of the restricted backend: each object becomes one
    display item of plain values - ``text/plain`` (its repr) and, when the value is JSON,
    ``application/json`` - sent as a ``d`` frame after the output written so far (so prints
    and items keep their order), within the call's caps (:mod:`sandboxd.protocol.display`)."""

    def __init__(self, emit: Callable[[bytes, bytes], None], caps: DisplayCaps,
                 streams: tuple[OutputStream, OutputStream]) -> None:
        self.emit = emit
        self.caps = caps
        self.streams = streams
        self.sent = 0

    def __call__(self, *objs: Any, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError("display() takes no keyword arguments")
        for obj in objs:
            if STATE.limit_hit is not None:
                raise STATE.limit_hit
            if self.sent > self.caps.count:  # the daemon keeps one note past the count
                return
            bundle = plain_bundle(obj, self.caps)
            for stream in self.streams:
                stream.flush()
            self.emit(b"d", encode_item(bundle, self.caps))
            self.sent += 1
