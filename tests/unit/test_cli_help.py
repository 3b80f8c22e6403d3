"""Every command's --help: plain flags show no metavar, every option and argument has help."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main

from sandboxd import cli
from sandboxd.cli import app
from sandboxd.cli.chat import SLASH_COMMANDS
from tests.support import cli as command_line
from tests.support.imports import loaded


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
    out = command_line.run(*name.split(), "--help",
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
    out = command_line.run("chat", "--help",
                           env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})
    for name, what in SLASH_COMMANDS.items():
        assert f"{name}" in out.stdout and what in out.stdout


def _top_level(app: Any) -> set[str]:
    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_the_table_of_command_modules_is_what_each_module_adds() -> None:
    """``sandboxd <command>`` builds only the module :func:`sandboxd.cli.owner` names: each
    module adds exactly the commands the table gives it, and together they are the whole
    CLI (a command added to a module and not to the table fails here)."""
    modules = [*cli.GROUPS, *cli.COMMANDS]
    added: set[str] = set()
    for module in modules:
        names = _top_level(cli.build_one(module))
        assert names == ({module} if module in cli.GROUPS else set(cli.COMMANDS[module]))
        assert all(cli.owner(name) == module for name in names)
        added |= names
    assert added == _top_level(app)
    assert cli.owner("nosuch") is None


def test_a_command_loads_only_its_own_module() -> None:
    code = ("import contextlib, json, sys\nsys.argv = ['sandboxd', 'audit', '--help']\n"
            "from sandboxd.cli import main\nwith contextlib.suppress(SystemExit):\n    main()\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sandboxd.cli.'))))\n")
    modules = loaded(code)
    assert "sandboxd.cli.audit" in modules
    assert not {"sandboxd.cli.doctor", "sandboxd.cli.images", "sandboxd.cli.daemon"} & set(
        modules), modules
