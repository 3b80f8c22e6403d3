"""The session's bash kernel: one persistent ``bash`` process per container, so that a
session's ``bash`` calls share its working directory, variables, functions and aliases.

It is forked from the runner like the python kernel (see :mod:`.kernel`: its own session and
process group, oom_score_adj 1000, the request's environment, the call's rlimits kept for its
life, the same pipes, relay and output caps) and then executes ``bash``, confined first by
Landlock to the programs the policy allows (the request's ``programs``, and bash itself: a
nested bash is confined the same way). Whatever a call's code runs, through a variable, an
alias, ``eval`` or a script, can only execute those programs.

Interactive bash (``-i``, no job control, no history, no line editing), because an
interactive shell is the one that returns to reading its next command when it gets SIGINT:
the runner's interrupt (``I``) is SIGINT to the kernel's process group, i.e. to the
foreground job (which dies of it unless it catches it) and to bash, which abandons the rest
of the call and comes back to its loop with its state. Its standard input is the request
pipe; each request is one command line, which sets the kernel's ``ERR`` trap again and runs
the code with ``! eval "$__sandboxd_code" </dev/null`` (the call's code reads /dev/null,
never the requests; ``!`` keeps the eval's own failure from the ``ERR`` trap, which the
code's commands still reach, and its real status is ``PIPESTATUS``). Its answer is written by
``PROMPT_COMMAND`` (read-only, as are the functions), which bash runs before reading each
command line, also after an interrupt: the ``v`` frame of the python kernel with the last
command's exit status as its status byte and, for a failed call, where it failed (the
``ERR`` trap's line and command, or a syntax error ``bash -n`` finds), which the runner
turns into the result's message (:func:`failure_message`), never into a value.

Proven idle as the python kernel is (:meth:`Kernel.not_idle_because`): blocked in ``read``
on its request fd (0), alone (bash has no threads). Bash catches signals (SIGINT, SIGCHLD)
and cannot block them while it reads, so the signal part of the proof is that no signal is
pending for it; what could send it one later is a process the call left, and those are killed
once the call ends, as for the python kernel.
"""

from __future__ import annotations

import json
import os
import signal

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerRequest

from .base import find_program, write_all
from .execution import MAX_VALUE_JSON
from .kernel import KERNEL_REPLY, Kernel, _status_field
from .kernel_child import confine_child, place_fds
from .rlimits import Rlimits

BASH_REP, BASH_ERR, BASH_RC = 4, 6, 7  # the answer fd, stderr until the rc file, the rc file
#: the rc file (read from a pipe): stderr back from /dev/null (where bash's notes on job
#: control went at start), the prompts empty, no history, and the answer with where a failed
#: call failed, read-only (no command substitution on its way: a fork before every answer;
#: only a call that failed with status 2 forks ``bash -n``, for a syntax error's line)
RC = rb"""exec 2>&6 6>&- 7<&-
set +H +o history
unset HISTFILE
PS1= PS2= PS0= PS4='+ '
shopt -s expand_aliases
__sandboxd_err() {
  if [[ ${#FUNCNAME[@]} == 1 ]]; then
    __sandboxd_fail=$1 __sandboxd_line=$(($2 - __sandboxd_base)) __sandboxd_cmd=$BASH_COMMAND
  fi
}
__sandboxd_syntax() {
  local o x=+O
  if shopt -q extglob; then x=-O; fi
  o=$("$__sandboxd_bash" -n $x extglob 2>&1 <<<"$__sandboxd_code")
  if [[ $o =~ ^[^:]*:\ line\ ([0-9]+):\ ([^$'\n']*) ]]; then
    __sandboxd_fail=2 __sandboxd_line=$((BASH_REMATCH[1] - 1)) __sandboxd_cmd=${BASH_REMATCH[2]}
    __sandboxd_kind=s
  fi
}
__sandboxd_answer() {
  local s=$? p=${PIPESTATUS[0]} o m= __sandboxd_kind=c
  if [[ -n $__sandboxd_busy ]]; then
    __sandboxd_busy=
    if [[ $p =~ ^[0-9]+$ ]] && ((s < 2 && (p == 0) == s)); then s=$p; fi
    if ((s == 2)); then __sandboxd_syntax; fi
    if ((s != 0)) && [[ $__sandboxd_fail == "$s" ]]; then
      m=$__sandboxd_kind$__sandboxd_line
    fi
    __sandboxd_code= __sandboxd_fail=
    local LC_ALL=C
    if [[ -n $m ]]; then m+=$'\1'${__sandboxd_cmd:0:200}; fi
    printf -v o '\\%03o\\%03o' $((1 + ${#m})) "$s"
    printf "v\0\0\0\0\0\0\0$o%s" "$m" >&4
  fi
}
readonly -f __sandboxd_err __sandboxd_syntax __sandboxd_answer
PROMPT_COMMAND=__sandboxd_answer
readonly PROMPT_COMMAND
"""
#: the kernel's ERR trap, set again at the start of every call (the kernel reserves ERR): it
#: notes the status, line (within the call's code) and text of a failing command at the
#: code's top level
ERR_TRAP = "'__sandboxd_err $? $LINENO'"
#: the most characters of the failing command (or of bash's syntax error) a message quotes
MAX_COMMAND_CHARS = 200
BASH_ARGV = ["bash", "--noprofile", "--rcfile", f"/dev/fd/{BASH_RC}", "--noediting", "+m",
             "-i"]


def _quoted(text: str) -> str:
    """``text`` as one single-quoted bash word."""
    return "'" + text.replace("'", "'\\''") + "'"


def failure_message(status: int, body: bytes) -> str | None:
    """A failed call's message from what the kernel answered after its status byte (user
    code can write that answer too: only this shape is taken, bounded and made one plain
    line): ``c`` (a command failed) or ``s`` (a syntax error), the line within the call's
    code in decimal, ``\\1``, the command's text or bash's words on the syntax error."""
    kind, head, sep, text = body[:1], *body[1:].partition(b"\1")
    if status == 0 or kind not in (b"c", b"s") or not sep or not head.isdigit() \
            or len(head) > 9 or int(head) < 1:
        return None
    shown = "".join(c if c.isprintable() else " " for c in
                    text.decode("utf-8", "replace")[:MAX_COMMAND_CHARS]).strip()
    if kind == b"s":
        return f"line {int(head)}: {shown}"
    return f"line {int(head)}: {shown}: exit status {status}"


def request_line(code: str) -> bytes:
    """The command line that runs ``code`` in the kernel (single-quoted whole: bash parses
    all of it before it runs any, so an interrupt abandons all of it)."""
    quoted = _quoted("__sandboxd_base=$LINENO\n" + code)
    return (f"__sandboxd_busy=1; __sandboxd_fail=; trap {ERR_TRAP} ERR; "
            f"__sandboxd_code={quoted}; ! eval \"$__sandboxd_code\" </dev/null\n"
            ).encode("utf-8", "surrogateescape")


def bash_child(req: WorkerRequest, ctl_r: int, rep_w: int, out_w: int, err_w: int,
               disp_w: int, rlimits: Rlimits = ()) -> None:
    """In the fork: fds, session, signals, limits, the exec confinement, then ``bash``."""
    try:
        os.setsid()
        path = req.runner.env.get("PATH", "/usr/bin:/bin")
        bash = find_program("bash", path)
        if bash is None:
            raise OSError(2, "there is no bash in this image")
        rc_r, rc_w = os.pipe()
        write_all(rc_w, RC + b"readonly __sandboxd_bash=" + _quoted(bash).encode() + b"\n")
        os.close(rc_w)
        devnull = os.open(os.devnull, os.O_RDWR)
        targets = {0: ctl_r, 1: out_w, 2: devnull, BASH_REP: rep_w, BASH_ERR: err_w,
                   BASH_RC: rc_r}
        place_fds(targets, [(3, BASH_REP), (BASH_REP + 1, BASH_ERR), (BASH_RC + 1, 65536)])
        confine_child("bash", req.runner.cwd, rlimits, [*req.runner.programs, bash], path)
        os.execve(bash, BASH_ARGV, dict(req.runner.env))
    except BaseException as exc:
        message = f"sandboxd bash kernel: {exc}\n".encode()
        try:
            try:
                os.write(BASH_ERR, message)
            except OSError:
                os.write(2, message)
        finally:
            os._exit(126)


class BashKernel(Kernel):
    """The container's bash kernel, as the runner keeps it."""

    PARKED_FD = 0

    @staticmethod
    def child(req: WorkerRequest, ctl_r: int, rep_w: int, out_w: int, err_w: int,
              disp_w: int, rlimits: Rlimits) -> None:
        bash_child(req, ctl_r, rep_w, out_w, err_w, disp_w, rlimits)

    def send(self, req: WorkerRequest) -> None:
        """Hand the kernel a call: one command line on its standard input."""
        self.decoder = wire.Decoder(KERNEL_REPLY, max_frames=1,
                                    max_bytes=wire.HEADER.size + 1 + MAX_VALUE_JSON)
        self.calls += 1
        write_all(self.ctl_w, request_line(req.code))

    @staticmethod
    def answer_body(reply: bytes) -> bytes:
        """Where a failed call failed (:func:`failure_message`) as the ``message`` of the
        answer's JSON; never a value (bash has none)."""
        message = failure_message(reply[0], reply[1:])
        return json.dumps({"message": message}).encode() if message else b""

    def send_interrupt(self) -> None:
        """SIGINT to the foreground job and to bash (its process group)."""
        os.killpg(self.pid, signal.SIGINT)

    @staticmethod
    def signals_not_idle(status: bytes) -> str | None:
        for name in (b"SigPnd", b"ShdPnd"):
            field = _status_field(status, name)
            try:
                if field is None:
                    raise ValueError("no such field")
                pending = int(field, 16)
            except ValueError:
                return "its pending signals could not be read"
            if pending:
                return "a signal is pending for it"
        return None

