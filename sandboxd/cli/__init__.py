"""The ``sandboxd`` command line (typer). One module per command group."""

from __future__ import annotations

import typer

from sandboxd.cli import audit, chat, daemon, doctor, images, mcp, policy, session, token

app = typer.Typer(
    name="sandboxd",
    help="Hardened sandboxed execution service for AI-agent tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no type column, no `<bool>` after flags
)
daemon.register(app)
doctor.register(app)
app.add_typer(policy.app, name="policy", help="Check and explain policy files.")
app.add_typer(audit.app, name="audit", help="Verify and read the audit log.")
app.add_typer(token.app, name="token", help="Manage client tokens.")
app.add_typer(images.app, name="images", help="Build the sandbox images.")
app.add_typer(session.app, name="session", help="Your sessions on a running daemon.")
chat.register(app)
mcp.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
