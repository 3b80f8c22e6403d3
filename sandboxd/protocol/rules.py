"""The rules every enforcement point applies, defined once: import admission, workspace path
normalisation and the output cap.

Used by the policy engine (the decision), the restricted backend (its ``__import__``, ``open``
and output streams), the workspace backend (the file tools) and the container runner (its
``__import__``, its redirects and its output pipes). The image has no sandboxd but this
package: the image build copies it next to the runner (``/opt/sandboxd/sandboxd/protocol/``,
imported there as ``sandboxd.protocol``), so it must stay standard-library only, free of
other sandboxd imports, and run on Python 3.11+.

Imports (``imports: {allow, deny}`` of the python tool)
    An entry is a module name or ``"*"``. A name admits that module and its submodules
    (``os`` covers ``os.path``; ``os.path`` does not cover ``os``); ``"*"`` in ``allow`` admits
    every module. The deny list is checked first (deny beats allow), against the module and,
    for ``from m import a``, against ``m.a`` too; then an allow entry must cover the module;
    otherwise the import is refused (default deny: an empty ``allow`` admits nothing).
    Relative imports are always refused.

Workspace paths (file tools, restricted ``open()``, shell redirects)
    See :func:`normalise_path`: a path is relative to the workspace; ``/workspace`` (the
    container mount point, which models tend to use) and ``/workspace/x`` are accepted
    everywhere and mean ``.`` and ``x``; every other absolute path, ``..``, non-printable
    characters, names with a space at either end and non-NFC text are refused, never cleaned.

Output (``limits.output``)
    One budget for stdout and stderr together (:class:`OutputBudget`): the call may write at
    most ``output_bytes`` bytes on both streams combined; the write that would pass the cap is
    cut at the cap, the call is stopped and ends with ``output_limit``.
"""

from __future__ import annotations

import unicodedata

MAX_PATH = 4096
MAX_NAME_BYTES = 255  # NAME_MAX: the longest name a Linux filesystem takes
MOUNT = "/workspace"


# ------------------------------------------------------------------ imports


def _covers(entry: str, module: str) -> bool:
    return entry == "*" or module == entry or module.startswith(entry + ".")


def import_verdict(module: str, allow: list[str] | tuple[str, ...],
                   deny: list[str] | tuple[str, ...],
                   fromlist: list[str] | tuple[str, ...] = ()) -> tuple[bool, str]:
    """``(admitted, rule)`` for importing ``module`` (``from module import *fromlist``).

    ``rule`` names the entry that decided: ``"deny[i]"``, ``"allow[i]"``, ``"allow"`` (no
    allow entry covers it) or ``"relative"`` (a name starting with ``.``)."""
    if module.startswith("."):
        return False, "relative"
    for name in _names(module, fromlist):
        i = _first_covering(deny, name)
        if i is not None:
            return False, f"deny[{i}]"
    i = _first_covering(allow, module)
    return (False, "allow") if i is None else (True, f"allow[{i}]")


def _names(module: str, fromlist: list[str] | tuple[str, ...]) -> list[str]:
    """The names an import reaches: the module, and ``module.x`` for each ``from`` name."""
    return [module, *(f"{module}.{n}" for n in fromlist if n and n != "*")]


def _first_covering(entries: list[str] | tuple[str, ...], name: str) -> int | None:
    """The index of the first entry that covers ``name`` (``None``: none does)."""
    return next((i for i, entry in enumerate(entries) if _covers(entry, name)), None)


def denied_name(module: str, deny: list[str] | tuple[str, ...],
                fromlist: list[str] | tuple[str, ...] = ()) -> str:
    """The name that a ``deny[i]`` verdict refused (``module`` or ``module.x``)."""
    return next((name for name in _names(module, fromlist)
                 if _first_covering(deny, name) is not None), module)


# ------------------------------------------------------------------ workspace paths


class PathRefused(ValueError):
    """A path that is not a plain workspace-relative path (the message says why)."""


def _escape(char: str) -> str:
    code = ord(char)
    return (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
            else f"\\U{code:08x}")


def normalise_path(path: str) -> str:
    """The workspace-relative form of a path (``"./a//b/"`` -> ``"a/b"``, ``"/workspace/a"``
    -> ``"a"``, the root is ``"."``), or :class:`PathRefused` with a reason a model can act on.

    Refused: more than 4096 characters; lone surrogates, NUL and every character
    ``str.isprintable`` rejects; text not in Unicode NFC form; absolute paths other than
    ``/workspace`` and ``/workspace/...``; ``..`` components; a space at either end of a name;
    a name longer than 255 bytes in UTF-8 (the filesystems' ``NAME_MAX``).
    """
    _check_text(path)
    parts = [p for p in _under_mount(path).split("/") if p not in ("", ".")]
    _check_names(parts)
    return "/".join(parts) or "."


def _unprintable(char: str) -> str:
    """What an unprintable character of a path is, in words."""
    if 0xD800 <= ord(char) <= 0xDFFF:
        return "a lone surrogate (not valid Unicode text)"
    return "a NUL byte" if char == "\x00" else f"the invisible or control character {_escape(char)}"


def _check_text(path: object) -> None:
    """A path's text as a whole: a string, not too long, printable, in NFC form."""
    if not isinstance(path, str):
        raise PathRefused("the path must be a string")
    if len(path) > MAX_PATH:
        raise PathRefused(f"paths must be at most {MAX_PATH} characters")
    if not path.isprintable():
        bad = next(c for c in path if not c.isprintable())
        raise PathRefused(f"the path contains {_unprintable(bad)}; use plain printable "
                          "characters")
    if not unicodedata.is_normalized("NFC", path):
        raise PathRefused("the path is not in Unicode NFC form; write it as "
                          f"`{unicodedata.normalize('NFC', path)}`")


def _under_mount(path: str) -> str:
    """A relative path as it is, an absolute one with ``/workspace`` taken off (any other
    absolute path is outside the workspace)."""
    if not path.startswith("/"):
        return path
    if path != MOUNT and not path.startswith(MOUNT + "/"):
        raise PathRefused("it is outside the workspace; paths are relative to the workspace "
                          "(no leading '/', or /workspace/...)")
    return path[len(MOUNT):]


def _check_names(parts: list[str]) -> None:
    """Each name of a path: no ``..``, no space at either end, at most NAME_MAX bytes."""
    if ".." in parts:
        raise PathRefused("paths must not contain '..'")
    if any(p != p.strip(" ") for p in parts):
        raise PathRefused("a name in the path starts or ends with a space; remove the space")
    longest = max((len(p.encode("utf-8")) for p in parts), default=0)
    if longest > MAX_NAME_BYTES:
        raise PathRefused(f"a name in the path is {longest} bytes long; names may be at most "
                          f"{MAX_NAME_BYTES} bytes (UTF-8)")


def path_components(path: str) -> list[str]:
    """The components of a :func:`normalise_path`-d path (``[]`` for the workspace root)."""
    return [] if path == "." else path.split("/")


# ------------------------------------------------------------------ output


class OutputBudget:
    """The output cap of one call: ``cap`` bytes for stdout and stderr together."""

    __slots__ = ("cap", "exceeded", "used")

    def __init__(self, cap: int) -> None:
        self.cap = int(cap)
        self.used = 0
        self.exceeded = False

    def room(self) -> int:
        """Bytes that may still be written."""
        return max(self.cap - self.used, 0)

    def take(self, size: int) -> int:
        """Account for a write of ``size`` bytes; returns how many of them fit (all of them
        unless the write passes the cap, which marks the budget exceeded)."""
        fits = min(size, self.room())
        if fits < size:
            self.exceeded = True
        self.used += fits
        return fits
