"""The ``sandboxd`` command line (typer). One module per command group.

The app is built on first use (``app``, :func:`main`), not at import, and a command loads only
its own module: ``sandboxd audit verify`` builds the ``audit`` group alone, ``sandboxd serve``
only the daemon's commands (so that the running daemon does not keep the other groups'
modules' memory for its whole life). The whole CLI is built for ``sandboxd --help`` and for
a name no module owns (typer's own "No such command"). :data:`GROUPS` and :data:`COMMANDS` are the
one table of what each module adds; ``tests/unit/test_cli_help.py`` checks it against the
modules."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

_app: typer.Typer | None = None

#: command groups (``sandboxd <group> <command>``): name -> the help line; the module
#: ``sandboxd.cli.<name>`` holds the group's ``app``
GROUPS: dict[str, str] = {
    "policy": "Check and explain policy files.",
    "audit": "Verify and read the audit log.",
    "receipt": "Check results' signed receipts offline; print and rotate the key.",
    "token": "Manage client tokens.",
    "images": "Build the sandbox images.",
    "session": "Your sessions on a running daemon.",
    "approvals": "Calls waiting for your approval on a running daemon.",
    "wheelhouse": "Fill and list the wheelhouse install_packages installs from.",
    "fleet": "Run several nodes behind HAProxy.",
}
#: modules whose ``register(app)`` adds top-level commands -> the commands they add (in the
#: order ``sandboxd --help`` lists them, with the groups between doctor and chat)
COMMANDS: dict[str, tuple[str, ...]] = {
    "daemon": ("serve", "tools", "invoke", "version"),
    "doctor": ("doctor",),
    "clean": ("clean",),
    "chat": ("chat",),
    "mcp": ("mcp",),
}


def _typer_app() -> typer.Typer:
    import typer

    return typer.Typer(
        name="sandboxd",
        help="Hardened sandboxed execution service for AI-agent tools.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # plain help: no type column, no `<bool>` after flags
    )


def _module(name: str) -> Any:
    return importlib.import_module(f"sandboxd.cli.{name}")


def _register(app: typer.Typer, name: str) -> None:
    """Add the commands of module ``name`` (a group or a :data:`COMMANDS` module)."""
    if name in GROUPS:
        app.add_typer(_module(name).app, name=name, help=GROUPS[name])
    else:
        _module(name).register(app)


def owner(command: str) -> str | None:
    """The module that adds ``command`` (a group or a top-level command), or None."""
    if command in GROUPS:
        return command
    return next((module for module, names in COMMANDS.items() if command in names), None)


def _group_anyway() -> None:
    """The root's callback: it makes typer keep the command's name on the command line
    (an app of one command is otherwise that command, without its name)."""


def build_one(module: str) -> typer.Typer:
    """An app with the commands of one module only (``sandboxd <command> ...``)."""
    app = _typer_app()
    app.callback()(_group_anyway)
    _register(app, module)
    return app


def build() -> typer.Typer:
    """The whole CLI: every command group."""
    app = _typer_app()
    for name in ("daemon", "doctor", "clean", *GROUPS, "chat", "mcp"):
        _register(app, name)
    return app


def __getattr__(name: str) -> Any:
    """``sandboxd.cli.app``: the CLI, built once on first use."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = build()
    return _app


def main() -> None:
    """Console-script entry point."""
    args = sys.argv[1:]
    if args[:1] == ["mcp"]:  # the stdio bridge: its own command only
        from sandboxd.cli import mcp

        mcp.standalone(args[1:])
        return
    module = owner(args[0]) if args else None
    if module is not None:
        build_one(module)()
        return
    __getattr__("app")()
