"""Parsing a ``shell`` command line the way ``/bin/sh`` would, to check it before running it.

:func:`scan` tokenizes with POSIX quoting rules (quote removal included), so that the program
name the policy checks is the program the shell would run. Command and process substitution
(``$(...)``, backticks, ``<(...)``) are always refused: their commands would escape the check.
:func:`split_commands` splits a line into simple commands when the policy enables operators;
it refuses the constructs it does not check (background ``&``, subshells, here-documents,
``&>``), and variables, globs or assignments in the program position.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

OPERATORS = sorted(
    ["&&", "||", ";;", "|&", "<<<", "<<-", "<<", ">>", "<&", ">&", "<>", ">|", "&>>", "&>",
     "|", "&", ";", "<", ">", "(", ")"],
    key=len,
    reverse=True,
)
SEPARATORS = {"|", "||", "&&", ";", "\n"}
REDIRECTS = {"<", ">", ">>", "<>", ">|", "<&", ">&"}
# programs that run another program given as an argument: that one is checked too
WRAPPERS = {"env", "nice", "nohup", "timeout", "time", "stdbuf", "xargs", "command", "exec",
            "setsid", "ionice", "taskset", "flock", "watch", "busybox", "sudo", "doas", "chroot",
            "unshare", "nsenter", "strace", "ltrace", "runuser", "su", "builtin"}
TRUSTED_DIRS = {"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/usr/local/sbin"}


class ShellRefused(ValueError):
    """The line uses a construct that is refused. ``construct`` is what was found."""

    def __init__(self, construct: str, message: str) -> None:
        super().__init__(message)
        self.construct = construct


@dataclass
class Token:
    kind: str  # "word" | "op"
    text: str  # word: after quote removal; op: the operator (with its IO number)
    meta: bool = False  # word: unquoted $, glob or brace characters (the shell would expand)


@dataclass
class Command:
    """One simple command: its argv (after quote removal) and redirect targets."""

    argv: list[str]
    first_meta: bool = False
    redirects: list[str] = field(default_factory=list)


def scan(line: str) -> list[Token]:
    """Tokenize ``line``; raises :class:`ShellRefused` for substitutions and bad quoting."""
    tokens: list[Token] = []
    word: list[str] | None = None
    meta = False
    quoted = False
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal word, meta, quoted
        if word is not None:
            tokens.append(Token("word", "".join(word), meta))
        word, meta, quoted = None, False, False

    while i < n:
        c = line[i]
        if c == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ShellRefused("'", "unterminated single quote")
            word = (word or []) + [line[i + 1:j]]
            quoted = True
            i = j + 1
        elif c == '"':
            j = i + 1
            buf: list[str] = []
            while True:
                if j >= n:
                    raise ShellRefused('"', "unterminated double quote")
                d = line[j]
                if d == '"':
                    break
                if d == "\\" and j + 1 < n and line[j + 1] in '$`"\\\n':
                    if line[j + 1] != "\n":
                        buf.append(line[j + 1])
                    j += 2
                    continue
                if d == "`" or (d == "$" and line[j + 1:j + 2] == "("):
                    raise ShellRefused("$(" if d == "$" else "`", "command substitution")
                if d == "$":
                    meta = True
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
            raise ShellRefused("`", "command substitution")
        elif c == "$" and line[i + 1:i + 2] == "(":
            raise ShellRefused("$(", "command substitution")
        elif c in "|&;<>()":
            prefix = ""
            if word is not None and not quoted and c in "<>" and "".join(word).isdigit():
                prefix = "".join(word)
                word = None
                meta = False
            end_word()
            op = next(o for o in OPERATORS if line.startswith(o, i))
            if op in ("<", ">") and line[i + 1:i + 2] == "(":
                raise ShellRefused(op + "(", "process substitution")
            tokens.append(Token("op", prefix + op))
            i += len(op)
        else:
            if c in "$*?[{~":
                meta = True
            word = (word or []) + [c]
            i += 1
    end_word()
    return tokens


def first_operator(tokens: list[Token]) -> str | None:
    """The first operator of a token list (None for a plain command)."""
    return next((t.text for t in tokens if t.kind == "op"), None)


def split_commands(tokens: list[Token]) -> list[Command]:
    """Split a token list into simple commands (for policies that enable operators)."""
    commands: list[Command] = []
    current: Command | None = None
    pending_redirect: str | None = None
    last_sep: str | None = None
    for tok in tokens:
        if tok.kind == "word":
            if pending_redirect is not None:
                if pending_redirect.endswith("&") and not (tok.text.isdigit() or tok.text == "-"):
                    raise ShellRefused(pending_redirect, f"`{pending_redirect}` must be followed "
                                       "by a file descriptor number")
                if current is None:
                    current = Command([])
                current.redirects.append(tok.text)
                pending_redirect = None
                continue
            if current is None:
                current = Command([], first_meta=tok.meta)
            if not current.argv:
                current.first_meta = tok.meta
            current.argv.append(tok.text)
            continue
        op = tok.text
        if pending_redirect is not None:
            raise ShellRefused(pending_redirect, f"`{pending_redirect}` needs a target")
        if op in SEPARATORS:
            if current is None or not current.argv:
                if op == "\n" and last_sep in (None, "\n", ";"):
                    continue  # blank line
                raise ShellRefused(op, f"syntax error near `{op.strip() or 'newline'}`")
            commands.append(current)
            current = None
            last_sep = op
            continue
        base = op.lstrip("0123456789")
        if base in REDIRECTS:
            pending_redirect = op
            if current is None:
                current = Command([])
            continue
        names = {"&": "background jobs (`&`)", "(": "subshells", ")": "subshells",
                 "<<": "here-documents", "<<-": "here-documents", "<<<": "here-strings",
                 ";;": "`;;`", "|&": "`|&`", "&>": "`&>`", "&>>": "`&>>`"}
        raise ShellRefused(op, f"{names.get(base, '`' + op + '`')} are not supported here")
    if pending_redirect is not None:
        raise ShellRefused(pending_redirect, f"`{pending_redirect}` needs a target")
    if current is not None and current.argv:
        commands.append(current)
    elif current is not None or last_sep in ("|", "||", "&&"):
        raise ShellRefused(last_sep or "", "the command line ends with an operator "
                           "(or has a redirect without a command)")
    return commands


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


def wrapped_program(name: str, args: list[str]) -> str | None:
    """For a wrapper such as ``env``, ``timeout`` or ``xargs``: the program it would run."""
    if name not in WRAPPERS:
        return None
    positional_to_skip = 1 if name in ("timeout", "flock") else 0
    for arg in args:
        if arg.startswith("-"):
            continue
        if name == "env" and "=" in arg:
            continue
        if positional_to_skip:
            positional_to_skip -= 1
            continue
        return arg
    return None


def is_assignment(word: str) -> bool:
    """``NAME=value`` in the program position (a shell variable assignment)."""
    name, eq, _ = word.partition("=")
    return bool(eq) and name.replace("_", "a").isalnum() and not name[:1].isdigit()
