"""``sandboxd receipt key | verify | rotate``: the signed receipts of results (docs/receipts.md).

``verify`` needs nothing but the receipt (or the whole result) and the public key set: no
daemon, no audit log, no network."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer

from sandboxd.cli.common import CONFIG_OPTION, STATE_DIR_OPTION, fail, settings_for

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


def _die(message: str) -> NoReturn:
    """:func:`fail` (exit 2 with one line), typed as not returning."""
    fail(message)
    raise AssertionError("unreachable")


@app.command("key")
def key_cmd(
    pem: bool = typer.Option(False, "--pem", help="Print the current public key as PEM "
                             "instead of the key set (JSON)"),
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Print the public key set (every key that signed receipts), as GET /v1/receipts/key
    serves it: give it to whoever checks receipts."""
    from cryptography.hazmat.primitives import serialization

    from sandboxd.receipts.keys import ReceiptKeyError, load_keyset

    try:
        keyset = load_keyset(settings_for(config, state_dir).state_dir)
    except ReceiptKeyError as exc:
        fail(str(exc))
        return
    if not pem:
        typer.echo(json.dumps(keyset.document, indent=2))
        return
    public = keyset.keys.get(keyset.current or "")
    if public is None:
        fail("the key set names no current key")
        return
    typer.echo(public.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
               nl=False)


@app.command("rotate")
def rotate_cmd(
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Make a new signing key. The old public keys stay in the key set (old receipts still
    verify); the old private key is deleted. The daemon signs with the new key once
    restarted."""
    from sandboxd.receipts.keys import ReceiptKeyError, rotate

    try:
        kid = rotate(settings_for(config, state_dir).state_dir)
    except ReceiptKeyError as exc:
        fail(str(exc))
        return
    typer.echo(f"new receipt key {kid}; restart the daemon to sign with it")


def _read_json(path: Path, what: str) -> Any:
    """The JSON of ``path`` (``-``: stdin), or exit 2 with ``path:line:col: why``."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _die(f"{path}: cannot read the {what}: {getattr(exc, 'strerror', None) or exc}")
    try:
        return json.loads(text)
    except ValueError as exc:
        line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
        _die(f"{path}:{line}:{col}: the {what} is not JSON: {getattr(exc, 'msg', exc)}")


def _keyset(key: Path | None, config: Path | None, state_dir: Path | None) -> Any:
    from sandboxd.receipts.keys import ReceiptKeyError, load_keyset

    if key is None:  # on the daemon's host: its own key set
        try:
            return load_keyset(settings_for(config, state_dir).state_dir)
        except ReceiptKeyError as exc:
            _die(f"{exc} (or give the public key set with --key)")
    return read_keyset_file(key)


def read_keyset_file(key: Path) -> Any:
    """The public key set in ``key`` (JSON as ``receipt key`` prints it, or one PEM key), or
    exit 2 with one ``path:line:col`` line."""
    from sandboxd.receipts.keys import KeySet

    try:
        data = key.read_bytes()
    except OSError as exc:
        _die(f"{key}: cannot read the key: {exc.strerror or exc}")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return KeySet.from_pem(data)
        return KeySet.from_document(_read_json(key, "key set"))
    except ValueError as exc:
        _die(f"{key}:1:1: {exc}")


@app.command("verify")
def verify_cmd(
    path: Path = typer.Argument(..., help="A result as the daemon returned it (JSON, its "
                                "receipt inside), or a receipt alone; - reads stdin"),
    key: Path | None = typer.Option(
        None, "--key", help="The public key set (`sandboxd receipt key` or GET "
        "/v1/receipts/key) or one public key as PEM; default: the daemon's, from "
        "--state-dir/--config"),
    config: Path | None = CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Check a receipt's signature and, given the whole result, that every output and field
    matches it. Offline. Exit 0 when it holds, 1 when it does not."""
    from sandboxd.receipts.canonical import check_receipt, check_result

    data = _read_json(path, "result")
    keys = _keyset(key, config, state_dir)
    result, receipt = _result_and_receipt(data)
    why = check_receipt(receipt, keys)
    if why is not None:
        typer.echo(f"FAILED: {path}: the receipt does not verify: {why}")
        raise typer.Exit(1)
    problems = check_result(result, receipt) if result is not None else []
    for problem in problems:
        typer.echo(f"FAILED: {path}: the result does not match its receipt: {problem}")
    if problems:
        raise typer.Exit(1)
    typer.echo(_verified(receipt, whole=result is not None))


def _result_and_receipt(data: Any) -> tuple[dict[str, Any] | None, Any]:
    """A result with its receipt inside (the result, the receipt), or a receipt alone
    (None, the receipt)."""
    if isinstance(data, dict) and "receipt" in data:
        return data, data["receipt"]
    return None, data


def _verified(receipt: dict[str, Any], whole: bool) -> str:
    """The line that says what a receipt that holds vouches for (``whole``: with the
    result's outputs)."""
    what = "the receipt and the result's outputs" if whole else "the receipt"
    return (f"ok: {what} of {receipt.get('id')} (tool {receipt.get('tool')}, status "
            f"{receipt.get('status')}, ended {receipt.get('ended')}, audit seq "
            f"{(receipt.get('audit') or {}).get('seq')}) signed by key {receipt['key_id']}")
