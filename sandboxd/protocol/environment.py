"""The environment variables a caller may give a call (the ``shell`` tool's ``env``, E2B's
``envs``): how many, how large, and which names are refused, defined once.

A caller's variables are added to the environment sandboxd gives the call's processes, so
they must not change what the confinement relies on: ``PATH`` (the programs the policy
checked by name are looked up on it, and Landlock's exec rule is built from it), the dynamic
loader's ``LD_*`` (``LD_PRELOAD`` would run the caller's own library inside an allowed
program), the egress proxy's ``*_PROXY`` (the only route out), ``BASH_ENV``/``ENV`` (a script
every non-interactive shell sources), ``PYTHON*`` startup and path variables (code Python
runs before a checked script) and sandboxd's own ``SANDBOXD_*``. The names are checked in
any case (``ld_preload`` too), since some programs read lower-case variants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_VARS = 64
MAX_NAME_BYTES = 128
MAX_VALUE_BYTES = 32 * 1024
MAX_TOTAL_BYTES = 128 * 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: refused names (upper-cased) and the prefixes of refused names, each with why
REFUSED_NAMES = {
    "PATH": "programs are looked up on it: the policy checked them by name",
    "BASH_ENV": "every non-interactive bash would source the file it names",
    "ENV": "every sh would source the file it names",
    "IFS": "it changes how shells split words",
}
REFUSED_PREFIXES = {
    "LD_": "the dynamic loader would load the caller's own code into allowed programs",
    "PYTHON": "Python would run or import the caller's code before a checked script",
    "SANDBOXD_": "sandboxd's own settings",
    "GCONV_": "glibc would load the caller's own modules",
}
REFUSED_SUFFIXES = {"_PROXY": "the egress proxy is the only way out of a sandbox"}


#: how a name is matched against each table of refused names, in the order they are tried
_REFUSALS = ((str.__eq__, REFUSED_NAMES), (str.startswith, REFUSED_PREFIXES),
             (str.endswith, REFUSED_SUFFIXES))


def refused_because(name: str) -> str | None:
    """Why ``name`` may not be set by a caller, else None."""
    upper = name.upper()
    return next((why for matches, table in _REFUSALS for part, why in table.items()
                 if matches(upper, part)), None)


def check_env(env: Any, what: str = "env") -> dict[str, str]:
    """``env`` as a checked ``{name: value}``, else ``ValueError`` saying what is wrong."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValueError(f"{what} must be an object of names and values")
    if len(env) > MAX_VARS:
        raise ValueError(f"{what} has {len(env)} variables; at most {MAX_VARS} are accepted")
    out = {name: _checked_variable(name, value, what) for name, value in env.items()}
    if sum(map(len, out)) + sum(map(_utf8_size, out.values())) > MAX_TOTAL_BYTES:
        raise ValueError(f"{what} is over {MAX_TOTAL_BYTES} bytes in all")
    return out


def _checked_variable(name: Any, value: Any, what: str) -> str:
    """One variable's value, its name and value checked (``ValueError`` otherwise): the
    name's form, then the value, then whether the name is refused."""
    _check_name_form(name, what)
    checked = _checked_value(name, value, what)
    why = refused_because(name)
    if why is not None:
        raise ValueError(f"{what}: {name} may not be set ({why})")
    return checked


def _check_name_form(name: Any, what: str) -> None:
    """``ValueError`` unless ``name`` is a variable name within :data:`MAX_NAME_BYTES`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what}: {name!r} is not a variable name (letters, digits, _)")
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"{what}: the name {name[:32]}... is over {MAX_NAME_BYTES} bytes")


def _checked_value(name: str, value: Any, what: str) -> str:
    """``value``, or ``ValueError`` unless it is a string within :data:`MAX_VALUE_BYTES`, no NUL."""
    if not isinstance(value, str):
        raise ValueError(f"{what}[{name}] must be a string")
    if "\x00" in value or _utf8_size(value) > MAX_VALUE_BYTES:
        raise ValueError(f"{what}[{name}] must be at most {MAX_VALUE_BYTES} bytes, "
                         "without NUL")
    return value


def _utf8_size(text: str) -> int:
    """``text``'s size in bytes, as UTF-8 (a lone surrogate as its three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))
