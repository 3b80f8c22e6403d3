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


#: a glob's tokens: ``**/``, ``**``, ``*``, ``?``, a character class (its first character may
#: be ``]``), or any other single character (a ``[`` that closes no class among them)
_GLOB_TOKEN = re.compile(r"\*\*/|\*\*|\*|\?|\[(?P<cls>.[^\]]*)\]|.", re.DOTALL)
#: the regular expression of each wildcard token
_WILDCARDS = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _char_class(body: str) -> str:
    """The regular expression of a ``[body]`` class; ``[!...]`` negates it (and never matches
    ``/``)."""
    negate = body.startswith("!")
    body = body.removeprefix("!").replace("\\", "\\\\").replace("^", "\\^")
    return f"(?!/)[^{body}]" if negate else f"[{body}]"


def _token_regex(token: re.Match[str]) -> str:
    """The regular expression of one glob token."""
    if token["cls"] is not None:
        return _char_class(token["cls"])
    return _WILDCARDS.get(token[0]) or re.escape(token[0])


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regular expression of one glob (repeated ``**`` collapse: no runaway backtracking)."""
    while "**/**" in pattern:
        pattern = pattern.replace("**/**", "**")
    while "***" in pattern:
        pattern = pattern.replace("***", "**")
    return re.compile("".join(map(_token_regex, _GLOB_TOKEN.finditer(pattern))), re.DOTALL)


def glob_match(pattern: str, path: str) -> bool:
    """Whether the normalised ``path`` matches ``pattern``."""
    return compile_glob(pattern).fullmatch(path) is not None
