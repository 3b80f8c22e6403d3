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


_GLOB = ("Globs (`{c}`) are not expanded here; name the files, or quote the word to pass "
         "`{c}` literally")
_BRACE = "Braces (`{c}`) are not supported here; quote them to pass them literally"
# unquoted characters the operators dialect refuses anywhere in a word, and at a word's start
_REFUSED_IN_WORD = {"*": _GLOB, "?": _GLOB, "[": _GLOB, "{": _BRACE, "}": _BRACE}
_REFUSED_AT_START = {
    "#": "Comments (`#`) are not supported here; remove the comment, or quote `#` to pass it "
         "literally",
    "~": "`~` is not expanded here; write the path (the workspace is the current directory)"}
#: what a backslash in double quotes escapes, and what it leaves (a line continuation: nothing)
_DOUBLE_QUOTE_ESCAPES = {"$": "$", "`": "`", '"': '"', "\\": "\\", "\n": ""}


class _Scanner:
    """One tokenization: the line, the position, the word being built and the tokens so far.
    Each character that starts a construct has its handler (:data:`_HANDLERS`)."""

    def __init__(self, line: str, operators: bool) -> None:
        self.line, self.operators = line, operators
        self.i = 0
        self.tokens: list[Token] = []
        self.word: list[str] | None = None
        self.quoted = False

    def run(self) -> list[Token]:
        while self.i < len(self.line):
            _HANDLERS.get(self.line[self.i], _Scanner.plain)(self)
        self.end_word()
        return self.tokens

    def add(self, text: str, *, quoted: bool = False, advance: int = 1) -> None:
        """Append ``text`` to the current word (starting one if none) and move on."""
        self.word = (self.word or []) + [text]
        self.quoted = self.quoted or quoted
        self.i += advance

    def end_word(self) -> None:
        if self.word is not None:
            self.tokens.append(Token("word", "".join(self.word), self.quoted))
        self.word, self.quoted = None, False

    def single_quote(self) -> None:
        j = self.line.find("'", self.i + 1)
        if j < 0:
            raise ShellRefused("'", "The command line has an unterminated single quote")
        self.add(self.line[self.i + 1:j], quoted=True, advance=j + 1 - self.i)

    def double_quote(self) -> None:
        text, end = _double_quoted(self.line, self.i + 1, self.operators)
        self.add(text, quoted=True, advance=end + 1 - self.i)

    def backslash(self) -> None:
        following = self.line[self.i + 1:self.i + 2]
        if not following:
            self.add("\\")
        elif following == "\n":  # a line continuation: nothing
            self.i += 2
        else:
            self.add(following, quoted=True, advance=2)

    def blank(self) -> None:
        self.end_word()
        self.i += 1

    def newline(self) -> None:
        self.end_word()
        self.tokens.append(Token("op", "\n"))
        self.i += 1

    def backtick(self) -> None:
        raise ShellRefused("`", _BACKTICKS)

    def dollar(self) -> None:
        _check_dollar(self.line, self.i, self.operators)
        self.add("$")

    def operator(self) -> None:
        c = self.line[self.i]
        prefix = self.io_number(c)
        self.end_word()
        op = next(o for o in OPERATORS if self.line.startswith(o, self.i))
        if op in ("<", ">") and self.line.startswith("(", self.i + 1):
            raise ShellRefused(op + "(", f"Process substitution (`{op}(...)`) is not allowed "
                               "here")
        self.tokens.append(Token("op", prefix + op))
        self.i += len(op)

    def io_number(self, c: str) -> str:
        """The unquoted digits just before a redirect: its descriptor, taken off the word."""
        if self.word is None or self.quoted or c not in "<>" or not _digits("".join(self.word)):
            return ""
        prefix = "".join(self.word)
        if self.operators and len(prefix) > 1:
            raise ShellRefused(prefix + c, f"`{prefix}{c}`: descriptors above 9 are not "
                               f"supported (write `{prefix} {c}` for an argument "
                               f"`{prefix}` followed by a redirect)")
        self.word = None
        return prefix

    def plain(self) -> None:
        c = self.line[self.i]
        if self.operators:
            message = _REFUSED_IN_WORD.get(c)
            if message is None and self.word is None:
                message = _REFUSED_AT_START.get(c)
            if message is not None:
                raise ShellRefused(c, message.format(c=c))
        self.add(c)


_HANDLERS = {"'": _Scanner.single_quote, '"': _Scanner.double_quote, "\\": _Scanner.backslash,
             " ": _Scanner.blank, "\t": _Scanner.blank, "\n": _Scanner.newline,
             "`": _Scanner.backtick, "$": _Scanner.dollar,
             **dict.fromkeys("|&;<>()", _Scanner.operator)}


def _double_quoted(line: str, j: int, operators: bool) -> tuple[str, int]:
    """The text of a double-quoted string whose content starts at ``line[j]``, and the index
    of its closing quote. Substitutions are refused; ``$`` too in the operators dialect."""
    buf: list[str] = []
    while j < len(line) and line[j] != '"':
        d = line[j]
        if d == "\\" and line[j + 1:j + 2] in _DOUBLE_QUOTE_ESCAPES:
            buf.append(_DOUBLE_QUOTE_ESCAPES[line[j + 1]])
            j += 2
            continue
        if d == "`":
            raise ShellRefused("`", _BACKTICKS)
        if d == "$":
            _check_dollar(line, j, operators)
        buf.append(d)
        j += 1
    if j >= len(line):
        raise ShellRefused('"', "The command line has an unterminated double quote")
    return "".join(buf), j


def _check_dollar(line: str, i: int, operators: bool) -> None:
    """``$`` at ``line[i]``: a substitution is refused in both dialects, any expansion in the
    operators dialect; otherwise the ``$`` is literal."""
    if operators:
        _refuse_expansion(line, i)
    if line.startswith("$(", i):
        _refuse_substitution(line, i)


def scan(line: str, *, operators: bool = False) -> list[Token]:
    """Tokenize ``line`` with POSIX quoting. In the operators dialect every unmodeled construct
    raises :class:`ShellRefused`; in the plain dialect only substitutions do."""
    return _Scanner(line, operators).run()


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


_NEEDS_COMMAND = "A redirect needs a command (write `cmd > file`)"
# after these (or at the start) a line break is a blank line, not an empty command
_BREAK_CONTINUES = {None, "\n", ";", "&&", "||", "|"}


class _Grouper:
    """Grouping the tokens of the operators dialect: the pipelines done, the commands of the
    current pipeline, the command being read and a redirect waiting for its target."""

    def __init__(self) -> None:
        self.pipelines: list[Pipeline] = []
        self.commands: list[Command] = []
        self.current: Command | None = None
        self.pending: tuple[int, str] | None = None
        self.run_if: RunIf = "always"
        self.last_sep: str | None = None  # the last separator seen (None at the start)

    def command(self) -> Command:
        if self.current is None:
            self.current = Command([])
        return self.current

    def word(self, tok: Token) -> None:
        if self.pending is not None:
            self.target(*self.pending, tok.text)
            return
        cmd = self.command()
        if not cmd.argv and not tok.quoted and tok.text in KEYWORDS:
            raise ShellRefused(tok.text, f"Shell keywords such as `{tok.text}` are not "
                               "supported here; run one program per command")
        cmd.argv.append(tok.text)

    def target(self, fd: int, op: str, text: str) -> None:
        """The word after a redirect operator: its file, or for a dup its descriptor."""
        if REDIRECTS[op] == "dup" and not ((_digits(text) and len(text) == 1) or text == "-"):
            raise ShellRefused(op, f"`{op}` must be followed by a descriptor 0-9 or `-`")
        self.command().redirects.append(Redirect(fd, op, text))
        self.pending = None

    def operator(self, op: str) -> None:
        self.no_pending()
        if op in SEPARATORS:
            self.separator(op)
            return
        digits = op[:len(op) - len(op.lstrip("0123456789"))]
        base = op[len(digits):]
        if base not in REDIRECTS:
            raise ShellRefused(op, _UNSUPPORTED.get(base, f"`{op}` is not supported here"))
        self.pending = (int(digits) if digits else (0 if base[0] == "<" else 1), base)
        self.command()

    def separator(self, op: str) -> None:
        if self.current is None:
            if op == "\n" and self.last_sep in _BREAK_CONTINUES:
                return
            raise ShellRefused(op, f"Syntax error near `{op.strip() or 'newline'}`")
        if not self.current.argv:
            raise ShellRefused(op, _NEEDS_COMMAND)
        self.commands.append(self.current)
        self.current, self.last_sep = None, op
        if op != "|":
            self.pipelines.append(Pipeline(self.run_if, self.commands))
            self.commands, self.run_if = [], _RUN_IF[op]

    def no_pending(self) -> None:
        if self.pending is not None:
            raise ShellRefused(self.pending[1], f"`{self.pending[1]}` needs a target")

    def finish(self) -> list[Pipeline]:
        self.no_pending()
        if self.current is not None:
            if not self.current.argv:
                raise ShellRefused(">", _NEEDS_COMMAND)
            self.commands.append(self.current)
            self.pipelines.append(Pipeline(self.run_if, self.commands))
        elif self.last_sep in ("|", "||", "&&"):
            raise ShellRefused(self.last_sep, "The command line ends with an operator")
        return self.pipelines


def _pipelines(tokens: list[Token]) -> list[Pipeline]:
    """Group the tokens of the operators dialect into pipelines of commands."""
    grouper = _Grouper()
    for tok in tokens:
        if tok.kind == "word":
            grouper.word(tok)
        else:
            grouper.operator(tok.text)
    return grouper.finish()


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
