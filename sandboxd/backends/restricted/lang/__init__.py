"""Language layer of the restricted backend: RestrictedPython plus our guards.

This module runs *inside the confined worker process* (it is pre-imported by the zygote and
executed after the fork). It is the first of two layers: it makes the obvious escapes fail with a
message a model can act on; the process layer (:mod:`.confine`) is the real boundary.

What it adds to ``compile_restricted``:

* a transformer (:class:`SandboxTransformer`) that also allows ``nonlocal``, augmented assignment
  of attributes and items (``d[k] += 1``), common data-model method definitions
  (``__repr__``, ``__len__``...), ``super().__init__`` and reading ``__name__``/``__doc__``,
  single-underscore attributes (``self._items``; at run time only on objects of user classes),
  and that makes limit errors uncatchable (every ``except`` handler and ``finally`` block starts
  with a check that re-raises them) and captures the value of the last expression;
* guarded builtins (no ``open``/``eval``/``exec``/``compile``/``globals``/``vars``/
  ``__import__``/``breakpoint``/``input``/``help``/``exit``; ``type`` only with one argument;
  ``getattr``/``setattr``/``hasattr``/``delattr`` guarded);
* an import hook that admits only the policy allowlist (minus the denylist) *and* the modules
  this backend supports, and hands out a fresh :class:`ModuleProxy` holding only an allowlist of
  names per module - never the host module, so ``json.codecs``, ``random._os`` lead nowhere;
* ``_getattr_`` refusing frame, traceback, code, generator and coroutine internals by the
  object's type, refusing any value that is a real module, frame, traceback or code object, and
  replacing every value that *is* the real ``str.format``/``format_map`` (bound or unbound,
  however reached: ``s.format``, ``type(s).format``, ``super(S, s).format``...) by a formatter
  whose field lookups go through the same guards (``string.Formatter`` is refused);
* ``_write_`` that only lets user code mutate what it created: instances of its classes, its
  classes, its functions, and builtin containers (plus ``decimal.Context``, which lives only in
  this forked worker);
* ``SystemExit``/``KeyboardInterrupt``/``GeneratorExit`` are contained (``SystemExit(n)`` sets the
  exit code), ``MemoryError``, ``RecursionError`` and the output limit cannot be caught;
* a print collector that streams stdout to the parent with an output cap, and a
  workspace-confined, size-capped ``open``.

The pieces, one module each (all imported here, so the zygote's pre-import of this package
loads every one of them before it forks - a chrooted worker cannot import later):
:mod:`.state` (per-run state, limit errors), :mod:`.allowlist` and :mod:`.module_allowlist`
(the allowlist data), :mod:`.transform` (the compile step), :mod:`.guards` (the run-time guards
and the ``str.format`` guard), :mod:`.proxy` and :mod:`.modules` (module proxies, import hook),
:mod:`.output` (stdout/stderr capture, output cap), :mod:`.files` (workspace ``open``); this
module keeps the globals of user code and the :func:`run_user_code` sequencer.

Compile refusals (RestrictedPython errors and syntax errors) are reported as status ``error``
(exit code 1) with the errors in stderr, not ``rejected``: the model wrote the code and needs the
message to fix it, exactly as for a run-time exception.
"""

from __future__ import annotations

import builtins
import json
import linecache
import signal
import traceback
from collections.abc import Callable
from typing import Any

from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence

from sandboxd.backends.restricted.lang.allowlist import SAFE_BUILTIN_NAMES, SAFE_EXCEPTIONS
from sandboxd.backends.restricted.lang.files import WorkspaceOpener
from sandboxd.backends.restricted.lang.guards import (
    SafeType,
    apply,
    augattr,
    augitem,
    getiter,
    guarded_delattr,
    guarded_getattr,
    guarded_getitem,
    guarded_hasattr,
    guarded_setattr,
    guarded_write,
    inplacevar,
    metaclass,
    user_classes,
)
from sandboxd.backends.restricted.lang.modules import ImportHook
from sandboxd.backends.restricted.lang.output import (
    CurrentStdout,
    Displayer,
    OutputStream,
    PrintScope,
)
from sandboxd.backends.restricted.lang.state import (
    SANDBOX_FILENAME,
    STATE,
    LimitExceeded,
    limit_check,
)
from sandboxd.backends.restricted.lang.transform import compile_user_code
from sandboxd.protocol.display import TOO_DEEP, DisplayCaps, too_deep, value_repr
from sandboxd.protocol.rules import OutputBudget

#: the longest exception line a failed call reports as its message (both backends)
MAX_MESSAGE_CHARS = 1000


def make_builtins(import_hook: ImportHook, opener: WorkspaceOpener) -> dict[str, Any]:
    safe: dict[str, Any] = {n: getattr(builtins, n) for n in SAFE_BUILTIN_NAMES}
    safe.update({n: getattr(builtins, n) for n in SAFE_EXCEPTIONS})
    safe.update(
        __import__=import_hook,
        __build_class__=builtins.__build_class__,
        type=SafeType,
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        setattr=guarded_setattr,
        delattr=guarded_delattr,
        open=opener,
    )
    return safe


def make_globals(
    import_hook: ImportHook, opener: WorkspaceOpener, stdout: OutputStream,
    displayer: Displayer | None = None,
) -> dict[str, Any]:
    """The globals dict user code runs in (``displayer``: the ``display`` builtin)."""

    def print_factory(_getattr: Any = None) -> PrintScope:
        return PrintScope(stdout)

    def set_value(value: Any) -> None:
        STATE.value = value
        STATE.has_value = True

    safe_builtins = make_builtins(import_hook, opener)
    if displayer is not None:
        safe_builtins["display"] = displayer
    return {
        "__builtins__": safe_builtins,
        "__name__": "__main__",
        "__metaclass__": metaclass,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": getiter,
        "_write_": guarded_write,
        "_inplacevar_": inplacevar,
        "_apply_": apply,
        "_print_": print_factory,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_sbx_augattr_": augattr,
        "_sbx_augitem_": augitem,
        "_sbx_limit_check_": limit_check,
        "_sbx_set_value_": set_value,
    }


# ----------------------------------------------------------------- runner


def format_user_traceback(exc: BaseException) -> str:
    """A traceback showing only frames of the user's code (no host paths)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SANDBOX_FILENAME]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        if len(frames) > 12:
            lines.extend(traceback.format_list(frames[:3]))
            lines.append(f"  [... {len(frames) - 9} more frames ...]\n")
            frames = frames[-6:]
        lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines)


def exception_line(exc: BaseException) -> str:
    """What a failed call's ``message`` says (both backends): the traceback's last line,
    ``ZeroDivisionError: division by zero``, cut at :data:`MAX_MESSAGE_CHARS`."""
    try:
        line = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except BaseException:  # the exception's __str__ failed
        line = type(exc).__name__
    return line[:MAX_MESSAGE_CHARS]


def encode_value(value: Any, cap: int) -> tuple[Any, str | None]:
    """The last expression's value: itself if JSON-serialisable, else its repr (capped)."""
    if value is None:
        return None, None
    note = None
    try:
        text = json.dumps(value, allow_nan=False)
        if len(text) > cap:
            return None, f"value omitted: its JSON is larger than the output limit ({cap} bytes)"
        decoded = json.loads(text)
        if not too_deep(decoded):
            return decoded, None
        note = f"value shown as text: {TOO_DEEP}"
    except (TypeError, ValueError, RecursionError, OverflowError):
        pass
    try:
        text = repr(value)
    except Exception as exc:  # user __repr__ failed
        return None, f"value omitted: repr() failed: {type(exc).__name__}: {exc}"
    # the report carries it JSON-escaped (up to 12 bytes a character): keep that within cap
    text = text[:cap]
    while len(encoded := json.dumps(text)) > cap and text:
        text = text[: max(0, len(text) * cap // len(encoded) - 1)]
    return text, note


def refresh_namespace(namespace: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """Put the trusted entries of ``fresh`` (a :func:`make_globals` result) into a kernel's
    persistent ``namespace``; returns ``namespace``. User code cannot name these entries
    (underscore names and ``__builtins__`` are refused at compile time); setting them again
    anyway means nothing a call did to them survives into the next call."""
    new_builtins = fresh.pop("__builtins__")
    kept = namespace.get("__builtins__")
    if isinstance(kept, dict) and type(kept) is dict:
        kept.clear()
        kept.update(new_builtins)
    else:
        kept = new_builtins
    namespace.update(fresh)
    namespace["__builtins__"] = kept
    return namespace


def reset_run_state() -> None:
    """Forget everything a run left behind (the zygote's priming runs, before it forks)."""
    STATE.limit_hit, STATE.memory_hit, STATE.value, STATE.has_value = None, False, None, False
    CurrentStdout.stream = None
    user_classes.clear()
    linecache.cache.pop(SANDBOX_FILENAME, None)


def _exit_code(exc: SystemExit, stderr: OutputStream) -> int:
    """The exit code of the user's ``SystemExit``: 0 for none, its number (mod 256), else 1
    with its argument written to stderr (as Python does)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    stderr.write_raw(f"{code}\n")
    return 1


def _end_report(report: dict[str, Any], stderr: OutputStream, output_bytes: int) -> None:
    """After the user's code: a limit it met (memory, or one :data:`STATE` recorded) decides
    the report; else a call that ended ``ok`` reports its value."""
    if STATE.memory_hit:
        report.update(outcome="memory_limit", exit_code=1)
        stderr.write_raw("MemoryError: the memory limit was exceeded\n")
    elif STATE.limit_hit is not None:
        report.update(outcome=STATE.limit_hit.reason, exit_code=1, message=str(STATE.limit_hit))
    elif report["outcome"] == "ok" and STATE.has_value:
        _report_value(report, stderr, output_bytes)


def _report_value(report: dict[str, Any], stderr: OutputStream, output_bytes: int) -> None:
    """The call's value in ``report`` (:func:`encode_value`, and Python's view of it when its
    JSON changes it); why it is omitted or shown as text goes to stderr."""
    try:
        report["value"], note = encode_value(STATE.value, output_bytes)
        # Python's view of a value JSON changes (a tuple), when the value is its JSON
        # (not its repr already: a value that is no JSON)
        as_json = report["value"] is not None and not (
            isinstance(report["value"], str) and not isinstance(STATE.value, str))
        shown = value_repr(STATE.value) if as_json else None
        if shown is not None and len(json.dumps(shown)) <= output_bytes:
            report["value_repr"] = shown
    except BaseException as exc:
        report["value"], note = None, f"value omitted: {type(exc).__name__}"
    if note:
        stderr.write_raw(note + "\n")


def run_user_code(
    source: str,
    *,
    imports_allow: list[str],
    imports_deny: list[str],
    workspace: str,
    output_bytes: int,
    max_file_bytes: int,
    emit: Callable[[bytes, bytes], None],
    namespace: dict[str, Any] | None = None,
    display: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Compile and run ``source``; stream output through ``emit(kind, data)``; return the final
    report ``{"outcome", "exit_code", "value", ...}``. Never raises (except on a broken emit).

    ``namespace``: a session kernel's persistent globals (empty on its first call). Every
    trusted entry (guards, print, the builtins) is set again before each call - the builtins
    dict is updated in place, so that functions defined by earlier calls use this call's
    import hook, ``open`` and output - and everything else is the user's own state.
    ``display``: the call's display caps (:meth:`sandboxd.protocol.display.DisplayCaps.to_wire`)."""
    budget = OutputBudget(output_bytes)  # one cap for stdout and stderr together
    stdout = OutputStream(b"o", emit, budget)
    CurrentStdout.stream = stdout
    stderr = OutputStream(b"e", emit, budget)
    STATE.limit_hit, STATE.memory_hit, STATE.value, STATE.has_value = None, False, None, False
    reserve = bytearray(1 << 16)  # released on MemoryError so that reporting can work
    report: dict[str, Any] = {"outcome": "ok", "exit_code": 0, "value": None}
    code, errors = compile_user_code(source)
    if code is None:
        stderr.write_raw(
            "Your code was refused by the sandbox compiler:\n" + "\n".join(errors) + "\n"
        )
        stderr.flush()
        report.update(outcome="error", exit_code=1, message="compile error")
        return report
    linecache.cache[SANDBOX_FILENAME] = (
        len(source),
        None,
        source.splitlines(True),
        SANDBOX_FILENAME,
    )
    caps = DisplayCaps(**display) if display else DisplayCaps()
    g = make_globals(
        ImportHook(imports_allow, imports_deny), WorkspaceOpener(workspace, max_file_bytes), stdout,
        Displayer(emit, caps, (stdout, stderr)),
    )
    if namespace is not None:
        g = refresh_namespace(namespace, g)
    old_alarm = signal.signal(signal.SIGALRM, lambda *_: stdout.tick())
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    STATE.running, STATE.interrupt_pending = True, False
    try:
        try:
            exec(code, g)
        finally:
            STATE.running = False
    except MemoryError:
        del reserve
        g.clear()
        STATE.memory_hit = True
    except LimitExceeded:
        pass
    except SystemExit as exc:
        report["exit_code"] = _exit_code(exc, stderr)
        if report["exit_code"] != 0:
            report.update(outcome="error", message="SystemExit")
    except BaseException as exc:  # user exceptions, KeyboardInterrupt (an interrupt)...
        try:
            stderr.write_raw(format_user_traceback(exc))
        except BaseException:
            stderr.write_raw(f"{type(exc).__name__}\n")
        report.update(outcome="error", exit_code=1, message=exception_line(exc))
    _end_report(report, stderr, output_bytes)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old_alarm)
    report["truncated_stdout"] = stdout.truncated
    stdout.flush()
    stderr.flush()
    return report
