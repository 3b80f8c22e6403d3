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
    def __init__(self, code: str, depth: int = 0) -> None:
        self.code, self.i, self.depth = code, 0, depth
        self.found: list[Simple] = []
        self.heredocs: list[tuple[str, bool]] = []  # delimiters waiting for their line's end

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

    def closing(self, at: int, opener: str, closer: str) -> int:
        """The index after the ``closer`` that matches an ``opener`` before ``at``."""
        code, level, i = self.code, 1, at
        while i < len(code):
            c = code[i]
            if c == "\\":
                i += 2
                continue
            if c == "'" and opener != "'":
                end = code.find("'", i + 1)
                i = len(code) if end < 0 else end + 1
                continue
            if c == opener and opener != closer:
                level += 1
            elif c == closer:
                level -= 1
                if level == 0:
                    return i + 1
            i += 1
        return len(code)

    def word(self) -> tuple[str | None, int]:
        """The word at ``i`` (None when bash would expand it) and where it started."""
        code, start, out, literal = self.code, self.i, [], True
        while self.i < len(code):
            c = code[self.i]
            if c in " \t\n;&|()<>":
                break
            if c == "\\":
                out.append(code[self.i + 1:self.i + 2])
                self.i += 2
            elif c == "'":
                end = code.find("'", self.i + 1)
                end = len(code) if end < 0 else end
                out.append(code[self.i + 1:end])
                self.i = end + 1
            elif c == '"':
                j = self.i + 1
                while j < len(code) and code[j] != '"':
                    if code[j] == "\\":
                        j += 1
                    elif code[j] in "$`":
                        literal = False
                        j = self.substitution(j) - 1
                    j += 1
                out.append(code[self.i + 1:j])
                self.i = j + 1
            elif c in "$`":
                literal = False
                self.i = self.substitution(self.i)
            else:
                if c in _EXPANDS:
                    literal = False
                out.append(c)
                self.i += 1
        return ("".join(out) if literal else None), start

    def substitution(self, at: int) -> int:
        """Read ``$(...)``, backticks, ``${...}``, ``$((...))``, ``$'...'`` at ``at``; the
        commands of a command substitution are found too. Returns the index after it."""
        code = self.code
        if code.startswith("$((", at):
            return self.closing(at + 3, "(", ")") + 1
        if code.startswith("$(", at):
            end = self.closing(at + 2, "(", ")")
            self.nested(code[at + 2:end - 1], at + 2)
            return end
        if code.startswith("${", at):
            return self.closing(at + 2, "{", "}")
        if code.startswith("$'", at):
            j = at + 2
            while j < len(code) and code[j] != "'":
                j += 2 if code[j] == "\\" else 1
            return j + 1
        if code[at] == "`":
            end = code.find("`", at + 1)
            end = len(code) if end < 0 else end
            self.nested(code[at + 1:end].replace("\\`", "`"), at + 1)
            return end + 1
        return at + 1

    def skip_heredocs(self) -> None:
        """At a line's end: skip the bodies of the here-documents its redirects opened."""
        code = self.code
        for delimiter, tabs in self.heredocs:
            while self.i < len(code):
                end = code.find("\n", self.i)
                end = len(code) if end < 0 else end
                line = code[self.i:end]
                self.i = end + 1
                if (line.lstrip("\t") if tabs else line) == delimiter:
                    break
        self.heredocs = []

    def run(self) -> list[Simple]:
        code = self.code
        cmd: Simple | None = None
        expect = "command"  # or: "redirect", "header" (for/select/case), "pattern", "function"
        while self.i < len(code):
            c = code[self.i]
            if c in " \t":
                self.i += 1
                continue
            if c == "#" and (self.i == 0 or code[self.i - 1] in " \t\n;&|()"):
                end = code.find("\n", self.i)
                self.i = len(code) if end < 0 else end
                continue
            op = next((o for o in _OPERATORS if code.startswith(o, self.i)), None)
            if c == "\n":
                self.i += 1
                self.skip_heredocs()
                op = "\n"
            elif op is not None:
                self.i += len(op)
            if op is not None:
                if op in _REDIRECT:
                    if op in ("<<", "<<-"):
                        while self.i < len(code) and code[self.i] in " \t":
                            self.i += 1
                        word, _ = self.word()
                        self.heredocs.append(((word or "").strip("'\""), op == "<<-"))
                    else:
                        expect = "redirect" if expect != "pattern" else expect
                    continue
                if expect == "pattern" and op != ")":
                    continue
                cmd = None
                if expect == "header" and op not in ("\n", ";"):
                    continue
                expect = "pattern" if op in (";;", ";&", ";;&") else "command"
                if op == "(" and code.startswith("(", self.i):  # (( arithmetic ))
                    self.i = self.closing(self.i + 1, "(", ")") + 1
                continue
            word, start = self.word()
            raw = code[start:self.i]  # keywords are unquoted, unexpanded words
            if expect == "redirect":
                expect = "args" if cmd is not None else "command"
                continue
            if expect in ("header", "pattern"):
                if raw == "in" and expect == "header" and self._case:
                    expect, self._case = "pattern", False
                elif raw == "esac" or (raw == "do" and expect == "header"):
                    expect = "command"
                continue
            if expect == "function":
                expect = "command"
                continue
            if cmd is None:
                if raw in _REOPEN:
                    continue
                if raw in ("for", "select", "case"):
                    expect, self._case = "header", raw == "case"
                    continue
                if raw == "function":
                    expect = "function"
                    continue
                if raw == "[[":
                    end = code.find("]]", self.i)
                    self.i = len(code) if end < 0 else end + 2
                    continue
                if word is not None and code.startswith("()", self.i):  # name() { ...
                    self.i += 2
                    continue
                if word is not None and code.startswith(" ()", self.i):
                    self.i += 2
                    continue
                if _assignment(code[start:self.i]):
                    if code.startswith("(", self.i):  # an array: a=(...)
                        self.i = self.closing(self.i + 1, "(", ")")
                    continue
                line, column = self.where(start)
                cmd = Simple([word], line, column)
                self.found.append(cmd)
                expect = "args"
            else:
                cmd.words.append(word)
        return self.found

    _case = False


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    name = name.removesuffix("+").split("[", 1)[0]
    return bool(eq) and bool(name) and name.replace("_", "a").isalnum() and \
        not name[:1].isdigit()


def simple_commands(code: str) -> list[Simple]:
    """Every simple command of ``code`` (and of its command substitutions), in order."""
    return _Reader(code).run()
