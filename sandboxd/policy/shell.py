"""Parsing a ``shell`` command line into the structure that is checked *and* executed.

A command line never reaches a shell. :func:`parse` turns it into pipelines of simple commands
(argv after POSIX quote removal, plus redirects); the policy engine checks every program of
that structure and hands the same structure to the backend as a
:class:`~sandboxd.protocol.plan.Plan`, which the backend's runner executes itself (pipes, ``&&`` /
``||`` / ``;`` sequencing, redirects opened inside the workspace). So what is checked is what
runs, by construction: there is no second parser whose reading could differ.

Two dialects, chosen by the policy's ``operators`` switch:

* **plain** (``operators: false``, the default): the line is one program and its arguments,
  split like ``shlex``: quotes and backslashes are removed, and nothing else has a meaning
  (``$HOME``, ``*.py`` and ``#`` are literal arguments: no shell is involved). Any unquoted
  operator is refused; so are ``$(...)``, backticks and process substitution, which a reader
  would take for commands.
* **operators** (``operators: true``): the POSIX shell subset that is executed as written:
  simple commands joined by ``|``, ``&&``, ``||``, ``;`` and newlines, and redirects ``[n]<``,
  ``[n]>``, ``[n]>>``, ``[n]>|``, ``[n]<>`` (to a workspace file or ``/dev/null``), ``[n]>&m``,
  ``[n]<&m``, ``[n]>&-``. Every construct ``/bin/sh`` would give a meaning this parser does not
  model is refused, with a message saying what to write instead: comments, ``$`` expansions
  (parameters, arithmetic, command substitution), backticks, globs (``*``, ``?``, ``[``),
  brace words, a leading ``~``, background ``&``, subshells, here-documents, ``!``, keywords
  (``if``, ``for``, ...), variable assignments, ``&>``, ``|&``, ``;;`` and descriptors above 9.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandboxd.errors import SandboxdError

if TYPE_CHECKING:
    from sandboxd.protocol.plan import RedirectMode, RunIf

OPERATORS = sorted(
    ["&&", "||", ";;", "|&", "<<<", "<<-", "<<", ">>", "<&", ">&", "<>", ">|", "&>>", "&>",
     "|", "&", ";", "<", ">", "(", ")"],
    key=len,
    reverse=True,
)
SEPARATORS = {"|", "||", "&&", ";", "\n"}
REDIRECTS: dict[str, RedirectMode] = {
    "<": "read", ">": "write", ">|": "write", ">>": "append", "<>": "readwrite",
    ">&": "dup", "<&": "dup"}
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until",
            "for", "in", "function", "select", "!", "{", "}", "[[", "]]", "coproc"}
# programs that run another program given as an argument: that one is checked too
WRAPPERS = {"env", "nice", "nohup", "timeout", "time", "stdbuf", "xargs", "command", "exec",
            "setsid", "ionice", "taskset", "flock", "watch", "busybox", "sudo", "doas", "chroot",
            "unshare", "nsenter", "strace", "ltrace", "runuser", "su", "builtin"}
# shell builtins that are no program: without a shell there is nothing to run
SHELL_ONLY = {"cd", "export", "unset", "set", "alias", "unalias", "read", "exit", "return",
              "shift", "source", ".", "eval", "exec", "trap", "wait", "umask", "ulimit", "hash",
              "type", "getopts", "local", "readonly", "jobs", "fg", "bg", "builtin", "command",
              "declare", "typeset", "let", "shopt", "pushd", "popd", "dirs", "break",
              "continue", "times"}
TRUSTED_DIRS = {"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/usr/local/sbin"}
_RUN_IF: dict[str | None, RunIf] = {
    None: "always", ";": "always", "\n": "always", "&&": "ok", "||": "failed"}


class ShellRefused(SandboxdError, ValueError):
    """The line uses a construct that is refused. ``construct`` is what was found."""

    code = "shell-refused"

    def __init__(self, construct: str, message: str) -> None:
        super().__init__(message)
        self.construct = construct


@dataclass
class Token:
    kind: str  # "word" | "op"
    text: str  # word: after quote removal; op: the operator (with its IO number)
    quoted: bool = False  # word: some part of it was quoted or escaped


@dataclass
class Redirect:
    fd: int
    op: str  # one of REDIRECTS
    target: str  # a file name, or for dup operators a descriptor number or "-"


@dataclass
class Command:
    """One simple command: its argv (after quote removal) and redirects, in order."""

    argv: list[str]
    redirects: list[Redirect] = field(default_factory=list)


@dataclass
class Pipeline:
    run_if: RunIf  # see sandboxd.protocol.plan.Pipeline
    commands: list[Command]


_SUBSTITUTION = "Command substitution (`$(...)`) is not allowed here"
_BACKTICKS = "Command substitution (backticks) is not allowed here"


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also admits ``²`` and ``٣``, which sh does not)."""
    return text.isascii() and text.isdigit()


def _refuse_substitution(line: str, i: int) -> None:
    """``$(`` at ``line[i]``: command substitution or arithmetic, refused in both dialects."""
    if line.startswith("$((", i):
        raise ShellRefused("$((", "Arithmetic expansion (`$((...))`) is not allowed here; "
                           "write the number itself")
    raise ShellRefused("$(", _SUBSTITUTION)


def _refuse_expansion(line: str, i: int) -> None:
    """``$`` at ``line[i]`` (unquoted or in double quotes), in the operators dialect."""
    if line.startswith("$(", i):
        _refuse_substitution(line, i)
    raise ShellRefused("$", "`$` expansions (variables such as `$HOME`, `${...}`, `$((...))`) "
                       "are not performed here; write the value itself, or put `$` in single "
                       "quotes to pass it literally")


def scan(line: str, *, operators: bool = False) -> list[Token]:
    """Tokenize ``line`` with POSIX quoting. In the operators dialect every unmodeled construct
    raises :class:`ShellRefused`; in the plain dialect only substitutions do."""
    tokens: list[Token] = []
    word: list[str] | None = None
    quoted = False
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal word, quoted
        if word is not None:
            tokens.append(Token("word", "".join(word), quoted))
        word, quoted = None, False

    while i < n:
        c = line[i]
        if c == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ShellRefused("'", "The command line has an unterminated single quote")
            word = (word or []) + [line[i + 1:j]]
            quoted = True
            i = j + 1
        elif c == '"':
            j = i + 1
            buf: list[str] = []
            while True:
                if j >= n:
                    raise ShellRefused('"', "The command line has an unterminated double quote")
                d = line[j]
                if d == '"':
                    break
                if d == "\\" and j + 1 < n and line[j + 1] in '$`"\\\n':
                    if line[j + 1] != "\n":
                        buf.append(line[j + 1])
                    j += 2
                    continue
                if d == "`":
                    raise ShellRefused("`", _BACKTICKS)
                if d == "$" and line[j + 1:j + 2] == "(":
                    _refuse_substitution(line, j)
                if d == "$" and operators:
                    _refuse_expansion(line, j)
                buf.append(d)
                j += 1
            word = (word or []) + ["".join(buf)]
            quoted = True
            i = j + 1
        elif c == "\\":
            if i + 1 < n:
                if line[i + 1] != "\n":
                    word = (word or []) + [line[i + 1]]
                    quoted = True
                i += 2
            else:
                word = (word or []) + ["\\"]
                i += 1
        elif c in " \t":
            end_word()
            i += 1
        elif c == "\n":
            end_word()
            tokens.append(Token("op", "\n"))
            i += 1
        elif c == "`":
            raise ShellRefused("`", _BACKTICKS)
        elif c == "$" and line[i + 1:i + 2] == "(":
            _refuse_substitution(line, i)
        elif c in "|&;<>()":
            prefix = ""
            if word is not None and not quoted and c in "<>" and _digits("".join(word)):
                prefix = "".join(word)
                if operators and len(prefix) > 1:
                    raise ShellRefused(prefix + c, f"`{prefix}{c}`: descriptors above 9 are not "
                                       f"supported (write `{prefix} {c}` for an argument "
                                       f"`{prefix}` followed by a redirect)")
                word = None
            end_word()
            op = next(o for o in OPERATORS if line.startswith(o, i))
            if op in ("<", ">") and line[i + 1:i + 2] == "(":
                raise ShellRefused(op + "(", f"Process substitution (`{op}(...)`) is not allowed "
                                   "here")
            tokens.append(Token("op", prefix + op))
            i += len(op)
        else:
            if operators:
                if c == "$":
                    _refuse_expansion(line, i)
                if c in "*?[":
                    raise ShellRefused(c, f"Globs (`{c}`) are not expanded here; name the "
                                       f"files, or quote the word to pass `{c}` literally")
                if c in "{}":
                    raise ShellRefused(c, f"Braces (`{c}`) are not supported here; quote them "
                                       "to pass them literally")
                if word is None and c == "#":
                    raise ShellRefused("#", "Comments (`#`) are not supported here; remove the "
                                       "comment, or quote `#` to pass it literally")
                if word is None and c == "~":
                    raise ShellRefused("~", "`~` is not expanded here; write the path "
                                       "(the workspace is the current directory)")
            word = (word or []) + [c]
            i += 1
    end_word()
    return tokens


def first_operator(tokens: list[Token]) -> str | None:
    """The first operator of a token list (None for a plain command)."""
    return next((t.text for t in tokens if t.kind == "op"), None)


_HEREDOC = ("Here-documents (`<<`) are not supported here; write the text to a file "
            "(write_file) and redirect it with `<`")
_UNSUPPORTED = {"&": "Background jobs (`&`) are not supported here",
                "(": "Subshells (`(...)`) are not supported here",
                ")": "Subshells (`(...)`) are not supported here",
                "<<": _HEREDOC, "<<-": _HEREDOC, "<<<": _HEREDOC,
                ";;": "`;;` is not supported here",
                "|&": "`|&` is not supported here; write `2>&1 |`",
                "&>": "`&>` is not supported here; write `>file 2>&1`",
                "&>>": "`&>>` is not supported here; write `>>file 2>&1`"}


def _pipelines(tokens: list[Token]) -> list[Pipeline]:
    """Group the tokens of the operators dialect into pipelines of commands."""
    pipelines: list[Pipeline] = []
    commands: list[Command] = []
    current: Command | None = None
    pending: tuple[int, str] | None = None  # a redirect waiting for its target
    run_if: RunIf = "always"
    last_sep: str | None = None  # the last separator seen (None at the start)

    for tok in tokens:
        if tok.kind == "word":
            if pending is not None:
                fd, op = pending
                if REDIRECTS[op] == "dup" and not (
                        (_digits(tok.text) and len(tok.text) == 1) or tok.text == "-"):
                    raise ShellRefused(op, f"`{op}` must be followed by a descriptor 0-9 or `-`")
                if current is None:
                    current = Command([])
                current.redirects.append(Redirect(fd, op, tok.text))
                pending = None
                continue
            if current is None:
                current = Command([])
            if not current.argv and not tok.quoted and tok.text in KEYWORDS:
                raise ShellRefused(tok.text, f"Shell keywords such as `{tok.text}` are not "
                                   "supported here; run one program per command")
            current.argv.append(tok.text)
            continue
        op = tok.text
        if pending is not None:
            raise ShellRefused(pending[1], f"`{pending[1]}` needs a target")
        if op in SEPARATORS:
            if current is None:
                if op == "\n" and last_sep in (None, "\n", ";", "&&", "||", "|"):
                    continue  # a blank line, or a line break after an operator
                raise ShellRefused(op, f"Syntax error near `{op.strip() or 'newline'}`")
            if not current.argv:
                raise ShellRefused(op, "A redirect needs a command (write `cmd > file`)")
            commands.append(current)
            current = None
            last_sep = op
            if op != "|":
                pipelines.append(Pipeline(run_if, commands))
                commands = []
                run_if = _RUN_IF[op]
            continue
        digits = op[:len(op) - len(op.lstrip("0123456789"))]
        base = op[len(digits):]
        if base in REDIRECTS:
            fd = int(digits) if digits else (0 if base[0] == "<" else 1)
            pending = (fd, base)
            if current is None:
                current = Command([])
            continue
        raise ShellRefused(op, _UNSUPPORTED.get(base, f"`{op}` is not supported here"))
    if pending is not None:
        raise ShellRefused(pending[1], f"`{pending[1]}` needs a target")
    if current is not None:
        if not current.argv:
            raise ShellRefused(">", "A redirect needs a command (write `cmd > file`)")
        commands.append(current)
        pipelines.append(Pipeline(run_if, commands))
    elif last_sep in ("|", "||", "&&"):
        raise ShellRefused(last_sep, "The command line ends with an operator")
    return pipelines


def parse(line: str, *, operators: bool) -> list[Pipeline]:
    """The pipelines of ``line`` in the chosen dialect (see the module docstring); raises
    :class:`ShellRefused`. Without operators the result is one pipeline of one command."""
    tokens = scan(line, operators=operators)
    if not operators:
        op = first_operator(tokens)
        if op is not None:
            raise ShellRefused(op, f"Shell operators are not allowed here (found "
                               f"`{op.strip() or 'newline'}`)")
        words = [t.text for t in tokens]
        return [Pipeline("always", [Command(words)])] if words else []
    return _pipelines(tokens)


def program_name(word: str) -> str | None:
    """The program name to check: a bare name, or the basename of an absolute path in a
    system bin directory. ``None`` for anything else (relative paths, other directories)."""
    if "/" not in word:
        return word or None
    norm = posixpath.normpath(word)
    if not norm.startswith("/"):
        return None
    directory, base = posixpath.split(norm)
    return base if directory in TRUSTED_DIRS and base else None


def wrapped_index(name: str, argv: list[str]) -> int | None:
    """For a wrapper such as ``env``, ``timeout`` or ``xargs`` at ``argv[0]``: the index in
    ``argv`` of the program it would run (None: not a wrapper, or it runs nothing)."""
    if name not in WRAPPERS:
        return None
    positional_to_skip = 1 if name in ("timeout", "flock") else 0
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("-"):
            continue
        if name == "env" and "=" in arg:
            continue
        if positional_to_skip:
            positional_to_skip -= 1
            continue
        return i
    return None


def deny_rule(deny: list[str], name: str) -> str | None:
    """The ``commands.deny`` rule that denies program ``name``, or None (the one check of a
    denied program, for the shell tool and the bash tool)."""
    for i, denied in enumerate(deny):
        if name == denied:
            return f"tools.shell.commands.deny[{i}]"
    return None


def is_assignment(word: str) -> bool:
    """``NAME=value`` in the program position (a shell variable assignment)."""
    name, eq, _ = word.partition("=")
    return bool(eq) and name.replace("_", "a").isalnum() and not name[:1].isdigit()
