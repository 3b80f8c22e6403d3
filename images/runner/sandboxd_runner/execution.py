"""Python code in a fresh fork of the runner (a worker) or in the session kernel: the user's
streams, environment and builtins (the policy's import rule, ``display``), and a cell's
execution (its last expression's value, its exit status, its traceback)."""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from sandboxd.protocol import display as display_rules
from sandboxd.protocol import rules
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.packages import SITE_DIR

from .displays import display_for_call, hook_pyplot, show_figures
from .interrupts import CELL, INTERRUPT_FRAMES, CellState


def user_import(allow: list[str], deny: list[str],
                after: Callable[[], None] | None = None) -> Callable[..., Any]:
    """``__import__`` for user code: the policy's imports rule (sandboxd/protocol/rules.py);
    ``after()`` runs after each import (it hooks matplotlib's ``show``)."""
    real = builtins.__import__

    # (Any: user code calls it, with whatever arguments it likes)
    def guarded(name: Any, globals: Any = None, locals: Any = None, fromlist: Any = (),
                level: Any = 0) -> Any:
        if level == 0:
            names = tuple(f for f in fromlist or () if isinstance(f, str))
            admitted, _ = rules.import_verdict(str(name), allow, deny, names)
            if not admitted:
                raise ImportError(f"import of '{name}' is not allowed by the policy")
        module = real(name, globals, locals, fromlist, level)
        if after is not None:
            after()
        return module

    return guarded


MAX_VALUE_JSON = 1024 * 1024 + 64  # the value's JSON text, beyond which it is dropped
MAX_MESSAGE = 1000  # the exception line a failed cell reports as the result's message


def user_streams() -> None:
    """The user's stdin (/dev/null), stdout and stderr (fds 0-2, written through)."""
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stdin = open(os.devnull)
    sys.argv = ["<sandbox>"]


def user_environment(req: WorkerRequest) -> None:
    os.environ.clear()
    os.environ.update(req.runner.env)
    sys.path[:] = [p for p in sys.path if not p.startswith("/opt/sandboxd")]
    cwd = os.getcwd()
    site = os.path.join(cwd, SITE_DIR)  # what install_packages put in this workspace
    sys.path[:0] = [p for p in (cwd, site) if p not in sys.path]


_SITE_SEEN: list[int | None] = [None]


def fresh_site() -> None:
    """In a kernel, before each call: when the session's site directory changed (an
    ``install_packages`` call ran), the import system forgets what it knew of it (it may have
    cached that the directory did not exist). One stat when nothing changed."""
    try:
        mtime: int | None = os.stat(SITE_DIR).st_mtime_ns
    except OSError:
        mtime = None
    if mtime != _SITE_SEEN[0]:
        _SITE_SEEN[0] = mtime
        importlib.invalidate_caches()


def user_builtins(req: WorkerRequest, display: Callable[..., None] | None = None,
                  after_import: Callable[[], None] | None = None) -> dict[str, Any]:
    """A copy of the builtins with the policy's import rule (an empty allow list admits
    nothing: default deny, as in the policy engine) and ``display``."""
    bi = dict(vars(builtins))
    bi["__import__"] = user_import(list(req.imports_allow), list(req.imports_deny),
                                    after_import)
    if display is not None:
        bi["display"] = display
    return bi


# Rated D by radon (complexity 24) and kept whole on purpose: the user's code runs in this
# frame, and the traceback a cell shows drops exactly this one frame (``tb.tb_next``); the
# exception handlers that follow must survive a cell that broke what they use (``len``,
# ``print``) and an interrupt that may land at any line while ``cell.running`` is set, so the
# steps are not spread over frames that would have to know of each other.
def execute(code: str, namespace: dict[str, Any], display: Callable[..., None] | None = None,
            cell: CellState = CELL) -> tuple[int, Any]:
    """Run ``code`` in ``namespace`` as a cell: (exit status, value of a last expression).
    With ``display``: a rich last value (a DataFrame, a figure) is displayed, and so are the
    matplotlib figures the cell leaves open. ``cell.running`` says when user code runs (a
    kernel's interrupt lands only then)."""
    status = 0
    value = None
    cell.message = None
    if display is not None:
        hook_pyplot(display)  # pyplot imported by an earlier cell of a kernel
    # the cell's source for its traceback's lines, as the restricted backend shows them
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    try:
        try:
            cell.running, cell.pending = True, False
            tree = ast.parse(code, "<code>", "exec")
            last = None
            tail = tree.body[-1] if tree.body else None
            if isinstance(tail, ast.Expr):
                tree.body.pop()
                last = ast.Expression(tail.value)
            exec(compile(tree, "<code>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<code>", "eval"), namespace)
        finally:
            cell.running = False
    except SystemExit as exc:
        code_ = exc.code
        status = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if code_ is not None and not isinstance(code_, int):
            print(code_, file=sys.stderr)
        cell.message = "SystemExit" if status & 0xFF else None
    except BaseException as exc:
        etype, evalue, tb = type(exc), exc, exc.__traceback__
        status = 1
        try:
            cell.message = etype.__name__
            cell.message = "".join(
                traceback.format_exception_only(etype, evalue)).strip()[:MAX_MESSAGE]
        except BaseException:
            pass
        try:
            # drop the runner's own frame from the traceback (and an interrupt's handler)
            report = traceback.TracebackException(etype, evalue, tb.tb_next if tb else None)
            if issubclass(etype, KeyboardInterrupt):
                while report.stack and (report.stack[-1].filename,
                                        report.stack[-1].name) in INTERRUPT_FRAMES:
                    report.stack.pop()
            sys.stderr.write("".join(report.format()))
        except BaseException:  # the cell broke what formatting needs (builtins.len = ...)
            try:
                os.write(2, (etype.__name__ + " (its traceback could not be formatted)\n")
                         .encode("utf-8", "replace"))
            except BaseException:
                pass
    if display is not None:
        try:
            try:
                cell.running = True
                if status == 0 and display_rules.has_rich_repr(value):
                    display(value)
                show_figures(display)
            finally:
                cell.running = False
        except BaseException:  # an exception of the user's repr, an interrupt
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return status & 0xFF, value


def value_json(value: Any, message: str | None = None, dumps: Any = json.dumps,
               repr: Any = repr, value_repr: Any = display_rules.value_repr) -> bytes:
    """``{"value": ..., "value_repr": ...}`` as JSON bytes (the value a repr when not
    JSON-safe; ``value_repr`` Python's repr when JSON would change it: a tuple), cut at the
    cap; ``{"message": ...}`` (the exception line) for a failed cell."""
    if value is None:
        return dumps({"message": message}).encode() if message else b""
    try:
        data = dumps({"value": value}, allow_nan=False).encode()
        shown = value_repr(value)
        if shown is not None:
            data = dumps({"value": value, "value_repr": shown}, allow_nan=False).encode()
            if len(data) > MAX_VALUE_JSON:  # the repr must not cost the value
                data = dumps({"value": value}, allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError):
        try:
            data = dumps({"value": repr(value)}).encode()
        except Exception:
            data = b'{"value": "<unrepresentable>"}'
    return bytes(data[:MAX_VALUE_JSON])


def answer_fields(report: WorkerReport, data: bytes | bytearray) -> WorkerReport:
    """The exit record ``report`` with what a worker or the kernel reported
    (:func:`value_json`): its value, value_repr and message."""
    try:
        doc = json.loads(bytes(data).decode())
    except (ValueError, UnicodeDecodeError):
        return report
    if not isinstance(doc, dict):
        return report
    if "value" in doc:
        report = replace(report, value=doc["value"], has_value=True)
    if isinstance(doc.get("value_repr"), str):
        report = replace(report, value_repr=doc["value_repr"])
    if isinstance(doc.get("message"), str):
        report = replace(report, message=doc["message"][:MAX_MESSAGE])
    return report


def run_python(req: WorkerRequest, value_fd: int, display_fd: int) -> NoReturn:
    """Execute the request's code in this (fresh, forked) interpreter; exit with its status."""
    user_streams()
    user_environment(req)
    display, after_import = display_for_call(req, display_fd)
    namespace = {"__name__": "__main__",
                 "__builtins__": user_builtins(req, display, after_import)}
    status, value = execute(req.code, namespace, display)
    data = value_json(value if status == 0 else None, CELL.message)
    if data:
        try:
            os.write(value_fd, data)
        except OSError:
            pass
    os._exit(status)
