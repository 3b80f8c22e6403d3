"""``sandboxd fleet haproxy-config --node n1=HOST:PORT --node n2=HOST:PORT ...``: the HAProxy
configuration of a fleet (docs/fleet.md). The generator (:mod:`sandboxd.fleet`) is imported
when the command runs."""

from __future__ import annotations

from pathlib import Path

import typer

from sandboxd.cli.common import fail

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@app.command("haproxy-config")
def haproxy_config(
    node: list[str] = typer.Option(..., "--node", help="ID=HOST:PORT of a node (repeat); "
                                   "ID is that node's node_id setting"),
    bind: str = typer.Option("127.0.0.1:8080", help="HOST:PORT HAProxy listens on"),
    check_interval_ms: int = typer.Option(2000, min=50, help="Health check interval"),
    fall: int = typer.Option(2, min=1, help="Failed checks before a node is out"),
    rise: int = typer.Option(2, min=1, help="Passed checks before a node is back"),
    call_timeout_s: int = typer.Option(600, min=1, help="Longest call or idle stream"),
    output: Path | None = typer.Option(None, "--output", "-o",
                                       help="Write the configuration here (default: stdout)"),
) -> None:
    """Write the HAProxy 2.6 configuration that routes each session to its node."""
    from sandboxd.fleet import FleetConfigError, Node
    from sandboxd.fleet import haproxy_config as generate

    try:
        text = generate([Node.parse(n) for n in node], bind=bind,
                        check_interval_ms=check_interval_ms, fall=fall, rise=rise,
                        call_timeout_s=call_timeout_s)
    except FleetConfigError as exc:
        fail(str(exc))
        return
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        typer.echo(f"wrote {output} ({len(node)} nodes); check it with: haproxy -c -f {output}",
                   err=True)
