"""The fenced blocks of the README and docs/*.md, and the commands of a shell example.

A block is every fenced code block (```` ``` ```` or ``~~~``, any info string, indented or
not) of :data:`DOC_FILES`; tests/docs/catalogue.py says of each one whether it runs or why not.
Commands are parsed with :mod:`shlex` into argv lists and run without a shell: a pipe ``|``
between two commands is the only shell syntax understood, anything else is refused."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
#: operators that need a shell: an example using one has to be rewritten or skipped
SHELL_OPERATORS = {";", "&&", "||", ">", ">>", "<", "&", "$(", "`"}
#: the address the docs use for the daemon `make run` starts
DOC_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8765\b")


def doc_files(repo: Path = REPO) -> list[Path]:
    """README.md and every docs/*.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced block: its file (relative to the repository), the line of its opening
    fence, its language (the info string's first word, "" without one) and its text."""

    file: str
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        first = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return f"{self.file}:{self.line} ```{self.lang} {first.strip()[:60]!r}"


def extract(path: Path, repo: Path = REPO) -> list[Block]:
    """The fenced blocks of one Markdown file, in order. An unclosed fence is an error (the
    rest of the file would silently be code)."""
    blocks: list[Block] = []
    opened: tuple[int, str, str, str] | None = None  # line, indent, fence, info
    body: list[str] = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        m = _FENCE.match(line)
        if opened is None:
            if m:
                opened = (number, m["indent"], m["fence"], m["info"].strip())
                body = []
            continue
        start, indent, fence, info = opened
        if m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence) \
                and not m["info"].strip():
            lang = info.split()[0] if info else ""
            blocks.append(Block(str(path.relative_to(repo)), start, lang, "\n".join(body) + "\n"))
            opened = None
            continue
        body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
    if opened is not None:
        raise ValueError(f"{path}:{opened[0]}: fenced block never closed")
    return blocks


def all_blocks(repo: Path = REPO) -> list[Block]:
    """Every fenced block of the README and docs/*.md."""
    return [b for path in doc_files(repo) for b in extract(path, repo)]


@dataclass(frozen=True)
class Command:
    """One shell example: its command line (continuations joined) and, in a console block,
    the output the doc shows under it ("" when none)."""

    line: str
    output: str


def console_commands(text: str) -> list[Command]:
    """The ``$ `` commands of a console block, each with the output shown under it."""
    commands: list[Command] = []
    current: list[str] = []
    output: list[str] = []
    continued = False
    for line in text.splitlines():
        if continued:
            current.append(line)
            continued = line.endswith("\\")
        elif line.startswith("$ "):
            if current:
                commands.append(Command(_joined(current), "\n".join(output)))
            current, output = [line[2:]], []
            continued = line.endswith("\\")
        elif current:
            output.append(line)
        elif line.strip():
            raise ValueError(f"console block: output before any command: {line!r}")
    if current:
        commands.append(Command(_joined(current), "\n".join(output)))
    return commands


def script_commands(text: str) -> list[Command]:
    """The commands of a sh block (one a line, ``\\`` continues it, ``#`` comments)."""
    commands: list[Command] = []
    current: list[str] = []
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if not line.endswith("\\"):
            commands.append(Command(_joined(current), ""))
            current = []
    if current:
        commands.append(Command(_joined(current), ""))
    return commands


def _joined(lines: list[str]) -> str:
    return " ".join(ln[:-1] if ln.endswith("\\") else ln for ln in lines)


def pipeline(line: str) -> list[list[str]]:
    """A command line as argv lists, one per stage of a ``|`` pipeline; comments dropped.
    Any other shell operator is a ValueError: the example cannot run without a shell."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    stages: list[list[str]] = [[]]
    for token in lexer:
        if token == "|":
            stages.append([])
        elif token in SHELL_OPERATORS or token in ("(", ")") or "`" in token:
            raise ValueError(f"needs a shell ({token!r}): {line}")
        else:
            stages[-1].append(token)
    if not all(stages):
        raise ValueError(f"empty command in a pipeline: {line}")
    return stages


def substitute(argv: list[str], url: str, variables: dict[str, str]) -> list[str]:
    """The docs' daemon address replaced by ``url``'s, and ``$NAME`` by ``variables[NAME]``
    (an unknown variable is a KeyError: the runner must set up what the example assumes)."""
    address = url.split("://", 1)[-1]

    def one(arg: str) -> str:
        arg = DOC_ADDRESS.sub(address, arg)
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables[m[1]], arg)

    return [one(a) for a in argv]


def layout_missing(text: str, repo: Path = REPO) -> list[str]:
    """The names of a layout block (paths in the first column of each entry, and every
    ``*.py`` an entry mentions, in its directory or from the top) that do not exist."""
    missing = []
    directory = repo
    for line in text.splitlines():
        names: list[str] = []
        if line and not line[0].isspace():
            names = re.split(r" {2,}", line, maxsplit=1)[0].split()
            directory = repo / names[0] if names[0].endswith("/") else (repo / names[0]).parent
        names += re.findall(r"\b[\w/]+\.py\b", line)
        missing += [n for n in dict.fromkeys(names)
                    if not ((repo / n).exists() or (directory / n).exists())]
    return missing
