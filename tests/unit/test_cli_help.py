"""Every command's --help: plain flags show no metavar, every option and argument has help."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import typer.main

from sandboxd.cli import app
from sandboxd.cli.chat import SLASH_COMMANDS


def _commands() -> list[tuple[str, Any]]:
    root = typer.main.get_command(app)
    found: list[tuple[str, Any]] = []

    def walk(prefix: str, command: Any) -> None:
        if hasattr(command, "commands"):  # a group (typer vendors its own click)
            for name, sub in command.commands.items():
                walk(f"{prefix} {name}".strip(), sub)
        else:
            found.append((prefix, command))

    walk("", root)
    return found


COMMANDS = _commands()


def test_the_cli_has_the_commands_we_document() -> None:
    names = {name for name, _ in COMMANDS}
    assert {"serve", "doctor", "invoke", "tools", "chat", "policy check", "policy explain",
            "audit verify", "audit tail", "token add", "token list", "token remove",
            "images build", "session create", "session list", "session show",
            "session restart", "session delete"} <= names


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_option_has_help_and_flags_have_no_metavar(name: str,
                                                         command: Any) -> None:
    assert command.help, f"{name}: no docstring"
    for param in command.params:
        if param.param_type_name == "option":
            assert param.help, f"{name} {param.opts}: no help text"
    out = subprocess.run([sys.executable, "-m", "sandboxd", *name.split(), "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    assert "<bool>" not in out.stdout
    for param in command.params:
        if param.param_type_name == "option" and param.is_flag:
            for opt in param.opts:
                rows = [line for line in out.stdout.splitlines()
                        if re.search(rf"(^|[\s,]){re.escape(opt)}([\s,]|$)", line)]
                assert rows, f"{name}: {opt} not in the help"
                assert not any(re.search(rf"{re.escape(opt)}\s+<", row) for row in rows), rows


def test_chat_help_lists_the_slash_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "sandboxd", "chat", "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})
    for name, what in SLASH_COMMANDS.items():
        assert f"{name}" in out.stdout and what in out.stdout
