"""Workspace-relative paths of the file tools, and the globs of their path rules.

:func:`normalise` (:func:`sandboxd.protocol.rules.normalise_path`) is the one normalisation of a
workspace path. The policy engine applies it once; the decision's rules are matched against
its result, and that same result (carried on the decision and the invocation) is the path the
workspace backend opens. Nothing is cleaned:
a path that does not say plainly which file it means is refused, so that the name a rule sees
is unmistakably the name the filesystem gets (``"app.key "``, ``".env\\n"``, ``".env\\u00a0"``,
``" .git/hooks/x"``, a decomposed ``"é"`` are refused, not trimmed or recomposed). Refused:

* lone surrogates (not Unicode text), NUL and every other character ``str.isprintable``
  rejects: C0/C1 controls, format characters (bidi overrides, zero-width spaces), line and
  paragraph separators and every space but U+0020;
* a space at the start or end of any component, and any text not in Unicode NFC form;
* absolute paths other than ``/workspace/...`` (the container mount point, which models tend
  to use: it maps to the workspace root), ``..`` components, more than 4096 characters, a
  name longer than 255 bytes (UTF-8).

``.`` components, repeated and trailing slashes mean nothing to the kernel either and are
dropped: ``"./a//b/"`` -> ``"a/b"``; the workspace root is ``"."``.

Glob syntax: ``*`` any characters but ``/``; ``**`` any characters including ``/``; ``**/``
also matches no directory at all (``**/.env`` matches ``.env``); ``?`` one character but ``/``;
``[abc]`` / ``[!abc]`` character classes. Matching is on the whole normalised path and
case-sensitive; ``*`` and ``**`` match dot-files too.
"""

from __future__ import annotations

import functools
import re

from sandboxd.protocol import rules

# the one normalisation, shared with the backends and the container runner (sandboxd.protocol.rules)
MAX_PATH = rules.MAX_PATH
MOUNT = rules.MOUNT
PathRefused = rules.PathRefused
normalise = rules.normalise_path
components = rules.path_components


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
