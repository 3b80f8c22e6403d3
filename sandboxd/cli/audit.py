"""``sandboxd audit verify [PATH]`` and ``sandboxd audit tail [-f] [filters] [PATH]``."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sandboxd.cli.common import CONFIG_OPTION, STATE_DIR_OPTION, settings_for
from sandboxd.util.text import json_visible, visible

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sandboxd.audit import VerifyReport
    from sandboxd.receipts.keys import KeySet

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


def _default_path(path: Path | None, config: Path | None, state_dir: Path | None) -> Path:
    """The audit log named on the command line, else the one the daemon writes."""
    if path is not None:
        return path
    return settings_for(config, state_dir).audit_path


_PATH_ARGUMENT = typer.Argument(
    None, help="Audit log (default: the daemon's, from --state-dir/--config)")


def _receipt_keys(key: Path | None, path: Path | None, config: Path | None,
                  state_dir: Path | None) -> KeySet | None:
    """The key set to check the signed heads with; None when there is none (a warning).

    ``--key`` first; else the key set of :func:`_keys_directory`."""
    from sandboxd.cli.receipt import read_keyset_file
    from sandboxd.receipts.keys import ReceiptKeyError, load_keyset

    if key is not None:
        keys: KeySet = read_keyset_file(key)
        return keys
    directory = _keys_directory(path, config, state_dir)
    try:
        return load_keyset(directory) if directory is not None else None
    except ReceiptKeyError:
        return None


def _keys_directory(path: Path | None, config: Path | None,
                    state_dir: Path | None) -> Path | None:
    """The state directory whose key set signed the heads of the log checked: for a log named
    on its own, the one beside it (or the daemon's, when it is the daemon's log): never
    another daemon's keys, which would call every head of this log forged; else the
    daemon's, from the settings (None when there are none)."""
    from sandboxd.config import load_settings

    try:
        settings = load_settings(config, state_dir=state_dir)
    except (ValueError, OSError):  # settings errors are ValueErrors: a log checked alone
        settings = None
    if path is None or config is not None or state_dir is not None:  # not a log named alone
        return settings.state_dir if settings is not None else None
    if settings is None or path.absolute() != settings.audit_path:
        return path.absolute().parent
    return settings.state_dir


@app.command("verify")
def verify_cmd(
    path: Path | None = _PATH_ARGUMENT,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
    key: Path | None = typer.Option(
        None, "--key", help="The receipt key set to check the signed heads with (`sandboxd "
        "receipt key`); default: the state directory's beside a log named alone, else the "
        "daemon's"),
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Check the hash chain (rotated files included) and that it reaches the last signed head
    (records cut from the end). Exit 1 naming the first bad record."""
    from sandboxd.audit import verify
    from sandboxd.receipts.heads import last_head

    log_path = _default_path(path, config, state_dir)
    keys = _receipt_keys(key, path, config, state_dir)
    head, head_problem = last_head(log_path, keys)
    signed_seq = head.seq if head is not None else None
    report = verify(log_path, (head.seq, head.sha256) if head is not None else None)
    if head_problem is not None:
        _judge_heads(report, log_path, head_problem, trusted=keys is not None)
    if as_json:
        typer.echo(_report_json(report, signed_seq))
    else:
        _print_report(report, log_path)
    if not report.ok:
        raise typer.Exit(1)


def _print_report(report: VerifyReport, log_path: Path) -> None:
    """The verification report for a person: its warnings on stderr, then its summary."""
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(report.summary() + (f" (log: {log_path})" if report.ok else ""))


def _judge_heads(report: VerifyReport, log_path: Path, problem: tuple[int, str],
                 trusted: bool) -> None:
    """A problem with the signed heads file: without the keys, a warning; with them, a
    forged head fails a chain that is otherwise good."""
    from sandboxd.audit import BadRecord
    from sandboxd.receipts.heads import heads_path

    line, why = problem
    if not trusted:
        report.warnings.append(f"{heads_path(log_path)}: {why}")
    elif report.ok:
        report.ok = False
        report.first_bad = BadRecord(heads_path(log_path), line, None, why)


def _report_json(report: VerifyReport, signed_seq: int | None) -> str:
    """The verification report as ``--json`` prints it."""
    bad = report.first_bad
    return json.dumps({
        "ok": report.ok, "records": report.records,
        "files": [str(f) for f in report.files],
        "head_seq": report.head_seq, "head_sha256": report.head_hash,
        "anchor_seq": report.anchor_seq, "anchored_by": report.anchored_by,
        "signed_seq": signed_seq, "missing": report.missing,
        "first_bad": None if bad is None else {
            "file": str(bad.file), "line": bad.line, "seq": bad.seq, "reason": bad.reason},
        "warnings": report.warnings,
    }, indent=2)


_SHOWN = ("request_id", "client", "tool", "decision", "status", "rule", "backend")
_KNOWN = {"ts", "seq", "event", "prev", "termination", "resources", "args_preview", "message",
          "args_sha256", "args_bytes", "limits", "truncated", "cleanup", "invocation",
          "session", "source", "policy", "stdout_bytes", "stderr_bytes", "displays", *_SHOWN}


def _text(value: Any) -> str:
    """A field value as one safe line: strings with every non-printable character (and the
    backslash) escaped, anything else as JSON with its non-printable characters escaped."""
    if isinstance(value, str):
        return visible(value)
    return json_visible(json.dumps(value, ensure_ascii=False))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _outcome(record: dict[str, Any]) -> list[str]:
    """How a result record's call ended: its termination reason and wall time."""
    parts = []
    termination = record.get("termination")
    if isinstance(termination, dict) and termination.get("reason"):
        parts.append(f"reason={_text(termination['reason'])}")
    resources = record.get("resources")
    if isinstance(resources, dict) and "wall_ms" in resources:
        parts.append(f"wall={_text(resources['wall_ms'])}ms")
    return parts


def _others(record: dict[str, Any]) -> list[str]:
    """The fields ``tail`` has no place of its own for, each as ``key=value``."""
    return [f"{_text(str(key))}={_cut(_text(value), 160)}" for key, value in record.items()
            if key not in _KNOWN and value not in (None, "", [], {})]


def format_record(record: dict[str, Any]) -> str:
    """One readable line for a record. Every field is escaped (records carry text chosen by
    clients and sandboxed code: tool names, messages, arguments), so that a record is always
    exactly one line and no control, escape or bidi character reaches the terminal."""
    ts = _text(str(record.get("ts", ""))[:23].replace("T", " "))
    parts = [ts, f"#{_text(record.get('seq', '?'))}",
             f"{_text(record.get('event', '?')):<13}"]
    parts += [f"{key}={_text(record[key])}" for key in _SHOWN
              if record.get(key) not in (None, "")]
    parts += _outcome(record)
    if record.get("args_preview"):
        # a JSON text already: only its non-printable characters need escaping
        parts.append(f"args={json_visible(_cut(str(record['args_preview']), 120))}")
    if record.get("message"):
        parts.append(f'message="{_cut(_text(str(record["message"])), 160)}"')
    return "  ".join(parts + _others(record))


@app.command("tail")
def tail(
    path: Path | None = _PATH_ARGUMENT,
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new records"),
    client: str | None = typer.Option(None, "--client", help="Only this client's records"),
    tool: str | None = typer.Option(None, "--tool", help="Only this tool's records"),
    status: str | None = typer.Option(
        None, "--status", help="ok, error, denied, timeout, killed, rejected; or allow/deny"),
    event: str | None = typer.Option(None, "--event", help="e.g. decision, result, "
                                     "auth_failure, policy_refused"),
    lines: int = typer.Option(20, "-n", "--lines", help="How many records to show first"),
    as_json: bool = typer.Option(False, "--json", help="Print the raw JSON records"),
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Print the last records readably, optionally filtered, optionally following."""
    from sandboxd.audit import chain_files, read_records
    from sandboxd.audit import follow as follow_records

    log_path = _default_path(path, config, state_dir)
    if not chain_files(log_path) and not follow:
        typer.echo(f"sandboxd: {log_path}: no such audit log", err=True)
        raise typer.Exit(2)

    def wanted(record: dict[str, Any]) -> bool:
        if client is not None and record.get("client") != client:
            return False
        if tool is not None and record.get("tool") != tool:
            return False
        if event is not None and record.get("event") != event:
            return False
        return status is None or status in (record.get("status"), record.get("decision"))

    def show(record: dict[str, Any]) -> None:
        typer.echo(json_visible(json.dumps(record, ensure_ascii=False)) if as_json
                   else format_record(record))

    last = deque(filter(wanted, read_records(log_path)), maxlen=max(lines, 0))
    for record in last:
        show(record)
    if follow:
        _keep_showing(follow_records(log_path), log_path, wanted, show)


def _keep_showing(records: Iterator[dict[str, Any]], log_path: Path,
                  wanted: Callable[[dict[str, Any]], bool],
                  show: Callable[[dict[str, Any]], None]) -> None:
    """Show each new record ``wanted`` as it is written, until Ctrl-C (exit 0)."""
    typer.echo(f"-- following {log_path} (Ctrl-C to stop) --", err=True)
    try:
        for record in filter(wanted, records):
            show(record)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
