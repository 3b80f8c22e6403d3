"""``sandboxd chat``: an interactive terminal agent on a local OpenAI-compatible LLM.

Every tool call the model makes runs in sandboxd (through :mod:`sandboxd_client`). Tokens are
streamed as they arrive; each tool call is shown as one ``->`` line and its result as one
``<-`` line. Ctrl-C cancels the current turn (the running sandbox call is cancelled too) and
returns to the prompt; Ctrl-D, ``/exit`` or ``/quit`` leave. ``/reset`` starts a new
conversation, ``/tools`` lists the tools offered. Input lines are kept in a readline history
file when the terminal is interactive.

Works with piped stdin too (one message per line, no prompts), which is how it is tested;
then the exit status is 1 when any turn failed (LLM server error), else 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer

DEFAULT_HISTORY = Path("~/.sandboxd_chat_history")

# The slash commands, one definition: `--help`, `/help` and the loop below use it.
SLASH_COMMANDS = {
    "/tools": "list the tools offered to the model",
    "/reset": "start a new conversation",
    "/help": "show these commands",
    "/exit": "leave (also /quit or Ctrl-D); Ctrl-C cancels the current turn",
}


def slash_help() -> str:
    """The slash commands, one per line."""
    return "\n".join(f"  {name:<8} {what}" for name, what in SLASH_COMMANDS.items())


def register(app: typer.Typer) -> None:
    """Add ``chat`` to the main app."""
    app.command("chat", epilog="\b\nSlash commands at the prompt:\n" + slash_help())(chat)


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class _Display:
    """Writes the streamed turn to the terminal."""

    def __init__(self, show_reasoning: bool) -> None:
        self.show_reasoning = show_reasoning
        self.tty = sys.stdout.isatty()
        self.at_line_start = True
        self.in_reasoning = False

    def write(self, text: str) -> None:
        if not text:
            return
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def newline(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def fragment(self, fragment: Any) -> None:
        if not fragment.reasoning:
            self._end_reasoning("\n")
        elif not self.show_reasoning:
            return
        elif not self.in_reasoning:
            self.newline()
            self.write("\033[2m[thinking] " if self.tty else "[thinking] ")
            self.in_reasoning = True
        self.write(fragment.content)

    def _end_reasoning(self, after: str) -> None:
        """Leave the dimmed ``[thinking]`` text, if in it, writing ``after``."""
        if self.in_reasoning:
            self.write(("\033[0m" if self.tty else "") + after)
            self.in_reasoning = False

    def message(self, message: dict[str, Any]) -> None:
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return
        self._end_reasoning("")
        self.newline()
        for call in message["tool_calls"]:
            fn = call.get("function", {})
            args = fn.get("arguments", "{}")
            with contextlib.suppress(TypeError, ValueError):
                args = json.dumps(json.loads(args), ensure_ascii=False)
            self.write(f"  -> {fn.get('name')} {_one_line(str(args), 200)}\n")

    def tool_result(self, record: Any) -> None:
        label = "ok" if record.error is None else record.error.kind.replace("_", " ")
        lines = record.content.strip().splitlines() or [""]
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        self.write(f"  <- {label}: {_one_line(' '.join(lines), 200)}{more}\n")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"sandboxd chat: {message}", err=True)
    raise typer.Exit(code)


def _fail_closing(client: Any, message: str) -> NoReturn:
    """Close the sandboxd client, then exit 2 saying ``message``."""
    client.close()
    _fail(message)


def chat(
    llm: str = typer.Option(..., "--llm", envvar="SANDBOXD_CHAT_LLM",
                            help="OpenAI-compatible API root, e.g. http://localhost:1234/v1"),
    model: str = typer.Option(..., "--model", envvar="SANDBOXD_CHAT_MODEL",
                              help="Model name as the LLM server knows it"),
    url: str | None = typer.Option(None, "--url", envvar="SANDBOXD_URL",
                                   help="sandboxd URL (default http://127.0.0.1:8765)"),
    sandbox: str | None = typer.Option(None, "--sandbox", hidden=True,
                                       help="Deprecated spelling of --url"),
    socket: Path | None = typer.Option(None, "--socket", envvar="SANDBOXD_SOCKET",
                                       help="sandboxd unix socket (instead of --url)"),
    token: str | None = typer.Option(None, "--token", envvar="SANDBOXD_TOKEN",
                                     help="Bearer token for sandboxd"),
    api_key: str | None = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY",
                                       help="API key for the LLM server, if it wants one"),
    tools: str | None = typer.Option(None, "--tools",
                                     help="Comma-separated sandboxd tools (default: all "
                                          "available to this client)"),
    system: str | None = typer.Option(None, "--system", help="System prompt"),
    max_rounds: int = typer.Option(10, "--max-rounds", min=1, help="Tool rounds per turn"),
    parallel: bool = typer.Option(False, "--parallel", help="Run one round's calls in parallel"),
    tool_timeout: float | None = typer.Option(None, "--tool-timeout", min=0.1,
                                              help="Seconds per tool call (lowers the policy's)"),
    context_tokens: int | None = typer.Option(None, "--context-tokens", min=256,
                                              help="Trim the history to this many tokens"),
    show_reasoning: bool = typer.Option(False, "--show-reasoning",
                                        help="Print the model's thinking (dimmed)"),
    history_file: Path | None = typer.Option(None, "--history-file",
                                             help=f"Readline history (default {DEFAULT_HISTORY} "
                                                  "when interactive)"),
    no_session: bool = typer.Option(False, "--no-session",
                                    help="No session: every call gets a fresh workspace"),
) -> None:
    """Chat with a local LLM whose tool calls run in sandboxd."""
    from sandboxd_client import Agent, SandboxClient

    if sandbox is not None:  # the name every other command spells --url
        typer.echo("sandboxd chat: --sandbox is deprecated; use --url", err=True)
        url = sandbox
    client = SandboxClient(url, socket=socket, token=token)
    wanted = _wanted_tools(client, tools)
    session_id = None if no_session else _new_session(client)
    interactive = sys.stdin.isatty()
    history_path = _history(history_file, interactive)

    agent = Agent(llm, model, sandbox=client, api_key=api_key, session=session_id,
                  auto_session=not no_session,
                  system_prompt=system, context_tokens=context_tokens)
    talk = _Conversation(agent, _Display(show_reasoning), wanted, interactive, dict(
        max_rounds=max_rounds, parallel_tool_calls=parallel, tool_timeout_s=tool_timeout))
    typer.echo(f"sandboxd chat: model {model} at {llm}; tools: {', '.join(wanted) or 'none'}"
               + (f"; session {session_id}" if session_id else "")
               + ". Ctrl-C cancels a turn, Ctrl-D quits.", err=True)
    try:
        talk.run()
    finally:
        _wind_down(client, session_id, history_path)
    if talk.failures and not interactive:
        raise typer.Exit(1)  # a scripted run (piped stdin) reports failed turns


def _new_session(client: Any) -> str:
    """A new sandboxd session for the chat's calls (exit 2 when none can be created)."""
    from sandboxd_client import SandboxError

    try:
        session_id: str = client.create_session().id
    except SandboxError as exc:
        _fail_closing(client, f"cannot create a session: {exc}")
    return session_id


def _history(history_file: Path | None, interactive: bool) -> Path | None:
    """The readline history file, loaded (``--history-file``, else the default one when
    interactive); None: no history."""
    if not interactive and history_file is None:
        return None
    path = (history_file or DEFAULT_HISTORY).expanduser()
    _setup_readline(path)
    return path


def _wind_down(client: Any, session_id: str | None, history_path: Path | None) -> None:
    """At the end of the chat: delete its session, close the client, save the history."""
    from sandboxd_client import SandboxError

    if session_id:
        with contextlib.suppress(SandboxError):
            client.delete_session(session_id)
    client.close()
    if history_path is not None:
        _save_readline(history_path)


def _wanted_tools(client: Any, tools: str | None) -> list[str]:
    """The tools to offer the model (``--tools``, else every one available to this client),
    or exit 2 naming one that is unknown or unavailable."""
    available, specs = _listed_tools(client)
    if not tools:
        return available
    wanted = [t.strip() for t in tools.split(",") if t.strip()]
    problem = _unusable(wanted, specs, available)
    if problem is not None:
        _fail_closing(client, problem)
    return wanted


def _listed_tools(client: Any) -> tuple[list[str], dict[str, Any]]:
    """(the names of the tools available to this client, every tool's spec by name), or
    exit 2 when sandboxd cannot be asked."""
    from sandboxd_client import SandboxError

    try:
        offered = client.tools("openai")
        specs = {t.name: t for t in client.tools()}
    except SandboxError as exc:
        _fail_closing(client, f"cannot use sandboxd at {client.socket or client.url}: {exc}")
    return [t["function"]["name"] for t in offered], specs


def _unusable(wanted: list[str], specs: dict[str, Any], available: list[str]) -> str | None:
    """Why the first of the ``--tools`` that cannot be offered cannot (unknown, or
    unavailable to this client); None when every one can."""
    for name in wanted:
        if name not in specs:
            return f"unknown tool {name!r} (tools: {', '.join(sorted(specs))})"
        if name not in available:
            return f"tool {name!r} is unavailable: {specs[name].unavailable_reason}"
    return None


class _Conversation:
    """The read-act loop: a line from the user is a slash command or a turn of the agent."""

    def __init__(self, agent: Any, display: _Display, wanted: list[str], interactive: bool,
                 options: dict[str, Any]) -> None:
        self.agent, self.display, self.wanted = agent, display, wanted
        self.interactive, self.options = interactive, options
        self.history: list[dict[str, Any]] = []
        self.failures = 0

    def run(self) -> None:
        while (text := self._read()) not in (None, "/exit", "/quit"):
            if text and not self.command(text):
                self.turn(text)

    def _read(self) -> str | None:
        """The user's next line, stripped ("" after a Ctrl-C); None at the end of input."""
        try:
            return input("you> " if self.interactive else "").strip()
        except EOFError:
            self.display.newline()
            return None
        except KeyboardInterrupt:
            self.display.write("\n(Ctrl-D or /exit to quit)\n")
            return ""

    def command(self, text: str) -> bool:
        """Handle a slash command; False when ``text`` is for the model (a path or a
        sentence starting with a slash goes to it too)."""
        if text == "/reset":
            self.history = []
            self.display.write("(new conversation)\n")
        elif text == "/tools":
            self.display.write(", ".join(self.wanted) + "\n")
        elif text == "/help":
            self.display.write(slash_help() + "\n")
        elif re.fullmatch(r"/[a-z]+", text):
            self.display.write(f"(unknown command {text}; /help lists them)\n")
        else:
            return False
        return True

    def turn(self, text: str) -> None:
        """One turn: the agent's rounds until it answers; Ctrl-C keeps what was said so far,
        an LLM error drops the question (counted: a scripted run exits 1)."""
        from sandboxd_client import LLMError

        display, history = self.display, self.history
        history.append({"role": "user", "content": text})
        added: list[dict[str, Any]] = []

        def on_message(message: dict[str, Any]) -> None:
            added.append(message)
            display.message(message)

        if self.interactive:
            display.write("bot> ")
        try:
            result = self.agent.act(history, self.wanted, on_message=on_message,
                                    on_fragment=display.fragment,
                                    on_tool_result=display.tool_result, **self.options)
        except KeyboardInterrupt:
            self._keep(added, {"role": "assistant", "content": "[interrupted by the user]"})
            display.write("[cancelled]\n")
            return
        except LLMError as exc:
            self.failures += 1
            self._keep(added, None)
            typer.echo(f"error: {exc}", err=True)
            return
        self.history = result.messages
        display.newline()
        if result.stop_reason != "answer":
            display.write(f"[stopped: {result.stop_reason.replace('_', ' ')}]\n")


    def _keep(self, added: list[dict[str, Any]], answer: dict[str, Any] | None) -> None:
        """After a turn that did not finish: keep the messages it added; a question left
        unanswered gets ``answer``, or is dropped when there is none."""
        self.history.extend(added)
        if self.history[-1].get("role") == "user":
            if answer is None:
                self.history.pop()
            else:
                self.history.append(answer)
        self.display.newline()


def _setup_readline(path: Path) -> None:
    try:
        import readline
    except ImportError:  # pragma: no cover - not on this platform
        return
    readline.set_history_length(1000)
    if path.exists():
        with contextlib.suppress(OSError):
            readline.read_history_file(os.fspath(path))


def _save_readline(path: Path) -> None:
    try:
        import readline
    except ImportError:  # pragma: no cover
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(os.fspath(path))
    except OSError:
        pass
