"""The languages ``run_code`` serves: each one the session tool that runs its code, and how
its code sets environment variables. Serving another language is one row of
:data:`LANGUAGES` (its tool must be a session kernel, such as ``python`` or ``bash``).

E2B's ``envs`` reach a kernel as E2B's own code interpreter sets them: a line of code run
before the cell, in the cell's call (the same policy decision, limits and audit record): the
sandbox's variables once per kernel (a restarted kernel gets them again), the previous
cell's own variables put back, a cell's own ones on top, so that a call's variables last for
that call only, as in E2B (see :class:`Envs`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sandboxd.api.e2b.sandboxes import not_served

#: the variable a kernel keeps once it has the sandbox's variables (a restarted kernel has
#: not); a caller cannot set it (``SANDBOXD_*`` is refused, :mod:`sandboxd.protocol.environment`)
MARK = "SANDBOXD_E2B_ENVS"


@dataclass(frozen=True)
class Envs:
    """What a cell's line sets: the sandbox's variables (once per kernel, so that a cell that
    changes one keeps its change, as in E2B), then the previous cell's own variables back to
    the sandbox's value (``reset``) or removed (``unset``), then the cell's own."""

    sandbox: Mapping[str, str]
    reset: Mapping[str, str]
    unset: tuple[str, ...]
    cell: Mapping[str, str]


def _python_envs(envs: Envs) -> str:
    # `import os` as E2B's interpreter writes it: no name with an underscore, which the
    # restricted backend's compiler refuses
    first = (f"**({json.dumps({**envs.sandbox, MARK: '1'})} if {MARK!r} not in os.environ "
             "else {}), " if envs.sandbox else "")
    line = f"import os; os.environ.update({{{first}**{json.dumps({**envs.reset, **envs.cell})}}})"
    if envs.unset:
        line += f"; [os.environ.pop(k, None) for k in {json.dumps(list(envs.unset))}]"
    return line


def _exports(values: Mapping[str, str]) -> str:
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


def _bash_envs(envs: Envs) -> str:
    parts = ([f"[[ -n ${{{MARK}-}} ]] || {_exports({**envs.sandbox, MARK: '1'})}"]
             if envs.sandbox else [])
    if envs.unset:
        parts.append("unset " + " ".join(envs.unset))
    now = {**envs.reset, **envs.cell}
    if now:
        parts.append(_exports(now))
    return "; ".join(parts)


def _js_envs(envs: Envs) -> str:
    # process.env of the node kernel (its globals' process: the variables its code reads)
    line = (f"if (!process.env.{MARK}) Object.assign(process.env, "
            f"{json.dumps({**envs.sandbox, MARK: '1'})}); " if envs.sandbox else "")
    line += f"Object.assign(process.env, {json.dumps({**envs.reset, **envs.cell})});"
    if envs.unset:
        line += f" for (const k of {json.dumps(list(envs.unset))}) delete process.env[k];"
    return line


@dataclass(frozen=True)
class Language:
    """One language of ``run_code``: the session tool that runs its code, and the code that
    sets its environment variables."""

    tool: str
    envs: Callable[[Envs], str]


LANGUAGES: dict[str, Language] = {
    "python": Language("python", _python_envs),
    "bash": Language("bash", _bash_envs),
    # E2B's names and their short forms; both tools share the session's node kernel
    "javascript": Language("javascript", _js_envs),
    "js": Language("javascript", _js_envs),
    "typescript": Language("typescript", _js_envs),
    "ts": Language("typescript", _js_envs),
}
DEFAULT = "python"


def language(name: object) -> tuple[str, Language]:
    """The language a request names (None: Python), else a 501 naming it and those served."""
    key = DEFAULT if name in (None, "") else name
    if not isinstance(key, str) or key.lower() not in LANGUAGES:
        raise not_served(f"run_code language '{name}'",
                         f"the languages served are {', '.join(sorted(LANGUAGES))}")
    return key.lower(), LANGUAGES[key.lower()]


def with_envs(lang: Language, code: str, sandbox: Mapping[str, str],
              cell: Mapping[str, str], previous: Iterable[str]) -> str:
    """``code`` preceded by the line that sets the variables (nothing to do: ``code`` as it
    is). ``previous``: the names the kernel's last cell set of its own."""
    envs = _envs(sandbox, cell, previous)
    if not (sandbox or envs.reset or envs.unset or cell):
        return code
    return lang.envs(envs) + "\n" + code


def _envs(sandbox: Mapping[str, str], cell: Mapping[str, str], previous: Iterable[str]) -> Envs:
    """The variables a cell sets: the sandbox's and its own, and of the names the last cell
    set of its own (``previous``) but this one does not, the sandbox's value back (``reset``)
    or none (``unset``)."""
    back = [name for name in previous if name not in cell]
    return Envs(sandbox, {n: sandbox[n] for n in back if n in sandbox},
                tuple(sorted(n for n in back if n not in sandbox)), cell)
