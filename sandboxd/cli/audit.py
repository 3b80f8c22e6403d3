"""`sandboxd audit ...` (placeholder: the owning issue fills this in)."""

import typer

app = typer.Typer(no_args_is_help=True)
