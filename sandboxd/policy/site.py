"""Rules on where a call runs: what the host knows of the call's place (its session, the
administrator's wheelhouse) that a tool's decision depends on, beside what the policy file
says. A tool with such a rule names it in :data:`SITE_RULES`; the engine applies it to an
allowed decision when the service asks with the call's :class:`CallSite` (``policy explain``
asks without one and gets the policy file's own answer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandboxd.models import Decision
from sandboxd.policy.models import PACKAGES_TOOL


@dataclass(frozen=True)
class CallSite:
    """Where one call runs: its session (None: a one-shot call) and the wheelhouse setting."""

    session: str | None
    wheelhouse: Path | None


def packages_site(decision: Decision, site: CallSite) -> Decision:
    """An allowed ``install_packages`` decision, denied when the call cannot install anything
    where it runs: without a session (a one-shot call's packages would vanish with it) or
    without a wheelhouse (the ``wheelhouse`` setting, or its directory, missing). (A session
    whose container was made before the wheelhouse existed is told so by the container
    backend, which knows what its container got.)"""
    if site.session is None:
        why = ("install_packages installs into a session: call it with the session whose "
               "later python calls should import the packages (create one first)")
    elif site.wheelhouse is None:
        why = ("install_packages is not available on this host: the administrator has set "
               "no wheelhouse (the `wheelhouse` setting)")
    elif not site.wheelhouse.is_dir():
        why = ("install_packages is not available on this host yet: the administrator's "
               "wheelhouse does not exist (`sandboxd wheelhouse add pip` makes it); once it "
               "does, install in a session created after that")
    else:
        return decision
    return decision.model_copy(update={"allowed": False, "message": why, "plan": None,
                                       "rule": "tools.python.packages"})


#: tool -> its rule on where the call runs (an allowed decision in, the decision out)
SITE_RULES: dict[str, Callable[[Decision, CallSite], Decision]] = {
    PACKAGES_TOOL: packages_site,
}


def at_site(tool: str, decision: Decision, site: CallSite | None) -> Decision:
    """``decision`` once the tool's rule on where the call runs has seen it (a denial, a
    tool without such a rule, or a question without a site: unchanged)."""
    rule = SITE_RULES.get(tool)
    if rule is None or site is None or not decision.allowed:
        return decision
    return rule(decision, site)
