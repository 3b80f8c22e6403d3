"""The ``sandboxd`` command line (typer). One module per command group.

The app is built on first use (``app``, :func:`main`), not at import: ``sandboxd mcp`` (the
stdio bridge a host launches and waits for) loads only its own command, ``sandboxd serve``
only the daemon's."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

_app: typer.Typer | None = None


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


def build_daemon() -> typer.Typer:
    """The daemon's own commands only (serve, tools, invoke, version): what ``sandboxd serve``
    loads, so that the running daemon does not keep the other groups' modules (issue 25)."""
    from sandboxd.cli import daemon

    app = _typer_app()
    daemon.register(app)
    return app


def build() -> typer.Typer:
    """The whole CLI: every command group."""
    from sandboxd.cli import (
        audit,
        chat,
        daemon,
        doctor,
        fleet,
        images,
        mcp,
        policy,
        session,
        token,
        wheelhouse,
    )

    app = _typer_app()
    daemon.register(app)
    doctor.register(app)
    app.add_typer(policy.app, name="policy", help="Check and explain policy files.")
    app.add_typer(audit.app, name="audit", help="Verify and read the audit log.")
    app.add_typer(token.app, name="token", help="Manage client tokens.")
    app.add_typer(images.app, name="images", help="Build the sandbox images.")
    app.add_typer(session.app, name="session", help="Your sessions on a running daemon.")
    app.add_typer(wheelhouse.app, name="wheelhouse",
                  help="Fill and list the wheelhouse install_packages installs from.")
    app.add_typer(fleet.app, name="fleet", help="Run several nodes behind HAProxy.")
    chat.register(app)
    mcp.register(app)
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
    if args[:1] == ["serve"]:
        build_daemon()()
        return
    __getattr__("app")()
