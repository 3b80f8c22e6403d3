"""The languages ``run_code`` serves: each one the session tool that runs its code, and how
its code sets environment variables. Serving another language is one row of
:data:`LANGUAGES` (its tool must be a session kernel, such as ``python`` or ``bash``).

E2B's ``envs`` reach a kernel as E2B's own code interpreter sets them: a line of code run
before the cell, in the cell's call (the same policy decision, limits and audit record). The
sandbox's variables are set before every cell (a restarted kernel gets them again), a cell's
own ones on top, and the previous cell's own ones that the sandbox does not set are removed
first, so that a call's variables last for that call only, as in E2B.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sandboxd.api.e2b.sandboxes import not_served

#: ``(set, unset) -> code`` that sets ``set`` and removes ``unset``, one line
EnvCode = Callable[[Mapping[str, str], Iterable[str]], str]


def _python_envs(values: Mapping[str, str], unset: Iterable[str]) -> str:
    gone = sorted(unset)
    code = f"__import__('os').environ.update({json.dumps(dict(values))})"
    if gone:
        code += f"; [__import__('os').environ.pop(k, None) for k in {json.dumps(gone)}]"
    return code


def _bash_envs(values: Mapping[str, str], unset: Iterable[str]) -> str:
    parts = [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    gone = sorted(unset)
    if gone:
        parts.append("unset " + " ".join(gone))
    return "; ".join(parts)


@dataclass(frozen=True)
class Language:
    """One language of ``run_code``: the session tool that runs its code, and the code that
    sets its environment variables."""

    tool: str
    envs: EnvCode


LANGUAGES: dict[str, Language] = {
    "python": Language("python", _python_envs),
    "bash": Language("bash", _bash_envs),
}
DEFAULT = "python"


def language(name: object) -> tuple[str, Language]:
    """The language a request names (None: Python), else a 501 naming it and those served."""
    key = DEFAULT if name in (None, "") else name
    if not isinstance(key, str) or key.lower() not in LANGUAGES:
        raise not_served(f"run_code language '{name}'",
                         f"the languages served are {', '.join(sorted(LANGUAGES))}")
    return key.lower(), LANGUAGES[key.lower()]


def with_envs(lang: Language, code: str, values: Mapping[str, str],
              unset: Iterable[str]) -> str:
    """``code`` preceded by the line that sets ``values`` and removes ``unset`` (nothing to
    do: ``code`` as it is)."""
    gone = [name for name in unset if name not in values]
    if not values and not gone:
        return code
    return lang.envs(values, gone) + "\n" + code
