"""Workspace-relative paths and the globs of file-tool path rules.

Glob syntax: ``*`` any characters but ``/``; ``**`` any characters including ``/``; ``**/``
also matches no directory at all (``**/.env`` matches ``.env``); ``?`` one character but ``/``;
``[abc]`` / ``[!abc]`` character classes. Matching is on the whole normalised path and
case-sensitive; ``*`` and ``**`` match dot-files too.
"""

from __future__ import annotations

import functools
import re

MAX_PATH = 4096


class PathRefused(ValueError):
    """A path that is not a plain workspace-relative path."""


def normalise(path: str) -> str:
    """``"./a//b/"`` -> ``"a/b"``; the workspace root is ``"."``. Refuses absolute paths,
    ``..`` components and NUL bytes."""
    if "\x00" in path:
        raise PathRefused("paths must not contain NUL bytes")
    if len(path) > MAX_PATH:
        raise PathRefused(f"paths must be at most {MAX_PATH} characters")
    if path.startswith("/"):
        raise PathRefused("paths must be relative to the workspace (no leading '/')")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused("paths must not contain '..'")
    return "/".join(parts) or "."


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regular expression of one glob (repeated ``**`` collapse: no runaway backtracking)."""
    while "**/**" in pattern:
        pattern = pattern.replace("**/**", "**")
    while "***" in pattern:
        pattern = pattern.replace("***", "**")
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            j = pattern.find("]", i + 2)
            if j < 0:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1:j]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            body = body.replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[{'^' if negate else ''}{body}]" if not negate else f"(?!/)[^{body}]")
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_match(pattern: str, path: str) -> bool:
    """Whether the normalised ``path`` matches ``pattern``."""
    return compile_glob(pattern).fullmatch(path) is not None
