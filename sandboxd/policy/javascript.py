"""The policy's decision for a ``javascript`` or ``typescript`` call: every module its code
names literally (:mod:`sandboxd.languages.javascript`) checked against the tool's
``modules`` (a denied one refused with its line and column), and the plan that hands the
session's node kernel the same rule for what the code requires at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxd.config.images import PROFILES
from sandboxd.languages.javascript import ModuleUse, effective_deny, named_modules, verdict
from sandboxd.models import Decision
from sandboxd.policy.models import JavascriptTool
from sandboxd.policy.specs import listing

if TYPE_CHECKING:
    from sandboxd.policy.engine import _Ctx

#: the image a javascript tool runs in unless its policy names another: the one the
#: javascript profile builds (its tag is defined once, in the profiles' table)
_TAG = PROFILES["javascript"].tag
assert _TAG is not None, "the javascript profile builds an image of its own"
JAVASCRIPT_IMAGE: str = _TAG


def decide_javascript(ctx: _Ctx, tool: str, cfg: JavascriptTool, network: str | None,
                      arguments: dict[str, Any]) -> Decision:
    """The decision for one call of ``tool`` (``javascript`` or ``typescript``)."""
    code = str(arguments.get("code", ""))
    if "\x00" in code:
        return ctx.deny(f"tools.{tool}", "The code must not contain NUL characters.")
    allow = list(cfg.modules.allow)
    deny = effective_deny(allow, list(cfg.modules.deny))
    hint = "any module but " + listing(deny) if "*" in allow else listing(allow)
    for use in named_modules(code):
        admitted, rule = verdict(use.name, allow, list(cfg.modules.deny))
        if not admitted:
            return _refusal(ctx, tool, use, rule, hint)
    return ctx.allow(f"tools.{tool}", cfg.limits, network, image=cfg.image or JAVASCRIPT_IMAGE,
                     imports_allow=tuple(allow), imports_deny=tuple(deny))


def _refusal(ctx: _Ctx, tool: str, use: ModuleUse, rule: str, hint: str) -> Decision:
    """The denial of one module the code names, blamed at the rule that denies it (a module
    denied by default, ``builtin``, at the tool's ``modules``)."""
    where = f"line {use.line}, column {use.column}"
    if rule == "builtin":
        return ctx.deny(f"tools.{tool}.modules",
                        f"Module `{use.name}` is not allowed here ({where}; denied unless "
                        f"tools.{tool}.modules.allow names it); allowed modules: {hint}.")
    return ctx.deny(f"tools.{tool}.modules.{rule}",
                    f"Module `{use.name}` is not allowed here ({where}); allowed modules: "
                    f"{hint}.")
