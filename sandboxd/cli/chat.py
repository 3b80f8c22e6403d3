"""`sandboxd chat` (placeholder: the owning issue fills this in)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's command(s) to the main app."""
