"""The simple commands of bash code, as the policy checks them before a ``bash`` call runs.

:func:`simple_commands` reads bash code the way bash splits it into simple commands (quotes,
``$(...)`` and backticks, whose contents are commands too, comments, here-documents,
``case`` patterns, ``for`` headers, function definitions, assignments and redirects) and
yields each one's words with where it starts. A word bash would expand (``$x``, a glob, a
brace) is ``None``: its value is known only when it runs, and there the kernel's exec
confinement (Landlock, to the allowed programs) decides. This reading is what the policy can
explain and audit; it is not the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: words after which the next word is a command again
_REOPEN = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time", "}", "fi",
           "done", "esac"}
_CONTROL = {";", "&", "|", "&&", "||", ";;", ";&", ";;&", "(", ")", "|&", "\n"}
_REDIRECT = ("<<<", "<<-", "<<", ">>", "<&", ">&", "<>", ">|", "&>>", "&>", "<", ">")
_OPERATORS = sorted([*_CONTROL - {"\n"}, *_REDIRECT], key=len, reverse=True)
_EXPANDS = set("$`*?[{~")
MAX_DEPTH = 32  # nested substitutions


@dataclass
class Simple:
    """One simple command: its words (None: expanded at run time), and where it starts."""

    words: list[str | None] = field(default_factory=list)
    line: int = 1
    column: int = 1


class _Reader:
    """Reading bash code: the position, the commands found, and the state of the reading
    (what the next word is, the command being read, pending here-documents)."""

    def __init__(self, code: str, depth: int = 0) -> None:
        self.code, self.i, self.depth = code, 0, depth
        self.found: list[Simple] = []
        self.heredocs: list[tuple[str, bool]] = []  # delimiters waiting for their line's end
        self.cmd: Simple | None = None  # the command whose arguments are being read
        # what the next word is: "command", "args", "redirect" (a redirect's target),
        # "header" (of for/select/case), "pattern" (of a case) or "function" (its name)
        self.expect = "command"
        self.case = False  # the header being read is a case's

    def where(self, at: int) -> tuple[int, int]:
        line = self.code.count("\n", 0, at) + 1
        return line, at - (self.code.rfind("\n", 0, at) + 1) + 1

    def nested(self, inner: str, start: int) -> None:
        """Commands of a substitution: theirs, placed in this code."""
        if self.depth >= MAX_DEPTH:
            return
        sub = _Reader(inner, self.depth + 1)
        sub.run()
        line0, col0 = self.where(start)
        for cmd in sub.found:
            cmd.column = cmd.column + col0 - 1 if cmd.line == 1 else cmd.column
            cmd.line += line0 - 1
            self.found.append(cmd)

    def end_of(self, text: str, at: int) -> int:
        """The index of ``text`` in the code from ``at``, or the code's end when it is not
        there (an unterminated quote, substitution or here-document runs to the end)."""
        end = self.code.find(text, at)
        return len(self.code) if end < 0 else end

    def closing(self, at: int, opener: str, closer: str) -> int:
        """The index after the ``closer`` that matches an ``opener`` before ``at`` (a pair of
        brackets: a nested pair is skipped, and quoted text)."""
        code, level, i = self.code, 1, at
        while i < len(code):
            c = code[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                i = self.end_of("'", i + 1) + 1
                continue
            if c == opener:
                level += 1
            elif c == closer:
                level -= 1
                if level == 0:
                    return i + 1
            i += 1
        return len(code)

    def word(self) -> tuple[str | None, int]:
        """The word at ``i`` (None when bash would expand it) and where it started: its parts
        (quoted, escaped, substituted, plain characters) read by :data:`_WORD_PARTS`."""
        code, start, out, literal = self.code, self.i, [], True
        while self.i < len(code) and code[self.i] not in _WORD_ENDS:
            text, expands = _WORD_PARTS.get(code[self.i], _Reader.plain)(self)
            out.append(text)
            literal = literal and not expands
        return ("".join(out) if literal else None), start

    def escaped(self) -> tuple[str, bool]:
        """A backslash: the character it quotes."""
        text = self.code[self.i + 1:self.i + 2]
        self.i += 2
        return text, False

    def single_quoted(self) -> tuple[str, bool]:
        """A single-quoted string: its content, never expanded."""
        end = self.end_of("'", self.i + 1)
        text = self.code[self.i + 1:end]
        self.i = end + 1
        return text, False

    def substituted(self) -> tuple[str, bool]:
        """A ``$`` or backtick form: expanded when it runs."""
        self.i = self.substitution(self.i)
        return "", True

    def plain(self) -> tuple[str, bool]:
        """Any other character; a glob, brace, tilde expands."""
        c = self.code[self.i]
        self.i += 1
        return c, c in _EXPANDS

    def double_quoted(self) -> tuple[str, bool]:
        """The content of the double-quoted string at ``i`` (moving past it), and whether it
        expands (a ``$`` or a backtick inside; the commands of a substitution are found)."""
        code, j, expands = self.code, self.i + 1, False
        while j < len(code) and code[j] != '"':
            if code[j] == "\\":
                j += 1
            elif code[j] in "$`":
                expands = True
                j = self.substitution(j) - 1
            j += 1
        text = code[self.i + 1:j]
        self.i = j + 1
        return text, expands

    def substitution(self, at: int) -> int:
        """Read ``$(...)``, backticks, ``${...}``, ``$((...))``, ``$'...'`` at ``at``; the
        commands of a command substitution are found too. Returns the index after it."""
        read = next((r for prefix, r in _SUBSTITUTIONS if self.code.startswith(prefix, at)),
                    None)
        return at + 1 if read is None else read(self, at)

    def arithmetic(self, at: int) -> int:
        """``$((...))``: no commands inside."""
        return self.closing(at + 3, "(", ")") + 1

    def command_substitution(self, at: int) -> int:
        """``$(...)``: its commands are found."""
        end = self.closing(at + 2, "(", ")")
        self.nested(self.code[at + 2:end - 1], at + 2)
        return end

    def parameter(self, at: int) -> int:
        """``${...}``: a parameter expansion (a substitution inside is not read)."""
        return self.closing(at + 2, "{", "}")

    def ansi_c(self, at: int) -> int:
        """``$'...'``: a string with backslash escapes."""
        code, j = self.code, at + 2
        while j < len(code) and code[j] != "'":
            j += 2 if code[j] == "\\" else 1
        return j + 1

    def backticks(self, at: int) -> int:
        """A backtick substitution: its commands are found (an escaped backtick unescaped)."""
        end = self.end_of("`", at + 1)
        self.nested(self.code[at + 1:end].replace("\\`", "`"), at + 1)
        return end + 1

    def skip_heredocs(self) -> None:
        """At a line's end: skip the bodies of the here-documents its redirects opened."""
        code = self.code
        for delimiter, tabs in self.heredocs:
            while self.i < len(code):
                end = self.end_of("\n", self.i)
                line = code[self.i:end]
                self.i = end + 1
                if (line.lstrip("\t") if tabs else line) == delimiter:
                    break
        self.heredocs = []

    def run(self) -> list[Simple]:
        """Read the code to its end: blanks, line ends and comments by their character
        (:data:`_BETWEEN_TOKENS`), the rest token by token; each operator and word goes to the
        handler of the current state (``expect``)."""
        while self.i < len(self.code):
            _BETWEEN_TOKENS.get(self.code[self.i], _Reader.token)(self)
        return self.found

    def blank(self) -> None:
        self.i += 1

    def line_end(self) -> None:
        """A line break: the bodies of the line's here-documents are skipped, and it ends the
        command as ``;`` does."""
        self.i += 1
        self.skip_heredocs()
        self.operator("\n")

    def comment(self) -> None:
        """A ``#`` that starts a word starts a comment, to the line's end; in a word it is
        a character of the word."""
        if self.i == 0 or self.code[self.i - 1] in " \t\n;&|()":
            self.i = self.end_of("\n", self.i)
        else:
            self.token()

    def token(self) -> None:
        """An operator or a word at ``i``."""
        op = next((o for o in _OPERATORS if self.code.startswith(o, self.i)), None)
        if op is not None:
            self.i += len(op)
            self.operator(op)
            return
        word, start = self.word()
        raw = self.code[start:self.i]  # keywords are unquoted, unexpanded words
        _WORD_HANDLERS.get(self.expect, _Reader.simple_word)(self, word, start, raw)

    def operator(self, op: str) -> None:
        """A control operator ends the command (in a ``case``, ``;;`` opens a pattern); a
        redirect is :meth:`redirect`'s."""
        if op in _REDIRECT:
            self.redirect(op)
            return
        if self.expect == "pattern" and op != ")":
            return
        self.cmd = None
        if self.expect == "header" and op not in ("\n", ";"):
            return
        self.expect = "pattern" if op in (";;", ";&", ";;&") else "command"
        if op == "(":
            self.arithmetic_command()

    def arithmetic_command(self) -> None:
        """After a ``(``: a second one opens an arithmetic command ``((...))``, skipped whole
        (no command inside)."""
        if self.code.startswith("(", self.i):
            self.i = self.closing(self.i + 1, "(", ")") + 1

    def redirect(self, op: str) -> None:
        """A redirect makes the next word its target (not in a ``case`` pattern); a
        here-document's delimiter is noted."""
        if op in ("<<", "<<-"):
            self.heredoc(op)
        elif self.expect != "pattern":
            self.expect = "redirect"

    def heredoc(self, op: str) -> None:
        """``<<`` or ``<<-``: its delimiter word; the body is skipped at the line's end."""
        while self.i < len(self.code) and self.code[self.i] in " \t":
            self.i += 1
        word, _ = self.word()
        self.heredocs.append(((word or "").strip("'\""), op == "<<-"))

    def redirect_target(self, word: str | None, start: int, raw: str) -> None:
        self.expect = "args" if self.cmd is not None else "command"

    def header_word(self, word: str | None, start: int, raw: str) -> None:
        """A word of a ``for``/``select``/``case`` header or of a ``case`` pattern."""
        if raw == "in" and self.expect == "header" and self.case:
            self.expect, self.case = "pattern", False
        elif raw == "esac" or (raw == "do" and self.expect == "header"):
            self.expect = "command"

    def function_name(self, word: str | None, start: int, raw: str) -> None:
        self.expect = "command"

    def simple_word(self, word: str | None, start: int, raw: str) -> None:
        """A word in command position starts a command (unless it is a keyword, a function
        definition or an assignment); any other word is the current command's argument."""
        if self.cmd is not None:
            self.cmd.words.append(word)
            return
        keyword = _KEYWORDS.get(raw)
        if keyword is not None:
            keyword(self, raw)
        elif word is not None and self.code.startswith(("()", " ()"), self.i):  # name() { ...
            self.i += 2
        elif _assignment(self.code[start:self.i]):
            if self.code.startswith("(", self.i):  # an array: a=(...)
                self.i = self.closing(self.i + 1, "(", ")")
        else:
            line, column = self.where(start)
            self.cmd = Simple([word], line, column)
            self.found.append(self.cmd)
            self.expect = "args"

    def reopen(self, raw: str) -> None:
        """A keyword after which the next word is a command again."""

    def header(self, raw: str) -> None:
        self.expect, self.case = "header", raw == "case"

    def function(self, raw: str) -> None:
        self.expect = "function"

    def test_brackets(self, raw: str) -> None:
        """``[[ ... ]]``: skipped whole (a test, no command)."""
        end = self.code.find("]]", self.i)
        self.i = len(self.code) if end < 0 else end + 2


_BETWEEN_TOKENS = {" ": _Reader.blank, "\t": _Reader.blank, "\n": _Reader.line_end,
                   "#": _Reader.comment}
_WORD_ENDS = frozenset(" \t\n;&|()<>")
#: the reader of each part of a word, by its first character (any other: ``plain``)
_WORD_PARTS = {"\\": _Reader.escaped, "'": _Reader.single_quoted, '"': _Reader.double_quoted,
               "$": _Reader.substituted, "`": _Reader.substituted}
#: the reader of each substitution, by how it starts (longest first)
_SUBSTITUTIONS = (("$((", _Reader.arithmetic), ("$(", _Reader.command_substitution),
                  ("${", _Reader.parameter), ("$'", _Reader.ansi_c), ("`", _Reader.backticks))
_WORD_HANDLERS = {"redirect": _Reader.redirect_target, "header": _Reader.header_word,
                  "pattern": _Reader.header_word, "function": _Reader.function_name}
_KEYWORDS = {**dict.fromkeys(_REOPEN, _Reader.reopen),
             **dict.fromkeys(("for", "select", "case"), _Reader.header),
             "function": _Reader.function, "[[": _Reader.test_brackets}


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    name = name.removesuffix("+").split("[", 1)[0]
    return bool(eq) and bool(name) and name.replace("_", "a").isalnum() and \
        not name[:1].isdigit()


def simple_commands(code: str) -> list[Simple]:
    """Every simple command of ``code`` (and of its command substitutions), in order."""
    return _Reader(code).run()
