"""Programs that run other programs, and the hardening the policy applies to those it knows.

An allowlist of programs only means something if an allowed program cannot be made to run a
program the list does not allow. Many can, and some do it because of *files* the sandboxed code
can write, not only because of their arguments:

* interpreters and shells run whatever code they are given: ``python3``, ``perl``, ``ruby``,
  ``node``, ``php``, ``lua``, ``sh``/``bash``/``dash``/``zsh``/``ksh``, ``busybox``;
* ``awk``/``gawk`` (``system()``), ``sed`` (GNU ``e``), ``find`` (``-exec``), ``xargs``,
  ``env``, ``make``, ``vim``/``vi``, ``less`` (``!cmd``, ``LESSOPEN``), ``tar``
  (``--to-command``, ``--use-compress-program``), ``ssh``;
* ``git``: repository configuration and attributes name programs that git runs through
  ``/bin/sh``: ``core.fsmonitor``, hooks (``core.hooksPath``, ``.git/hooks``), pagers,
  editors, ``core.sshCommand``, credential helpers, ``diff.external``, textconv, diff, merge
  and filter drivers (``clean``/``smudge``/``process`` selected by ``.gitattributes``),
  ``!`` aliases, GPG programs and ``ext::`` transports. A ``.git`` *file* (``gitdir: g``)
  moves the repository, and its configuration, to any directory the code can write.

:data:`RUNS_OTHERS` lists them for ``sandboxd policy check`` warnings. The wrappers among them
(``env``, ``timeout``, ``xargs``, ...) are handled by the shell check: the program they run is
checked too. :data:`HARDENED` is applied by the policy engine to every command whose program
(or a program a wrapper runs) it lists, in ``shell`` lines and admin-defined tools alike:

* ``options`` are inserted right after the program name, where the user's arguments cannot
  override them (git: ``-c key=value`` for every configuration key that names a program, and
  ``-c alias.<subcommand>=`` so that no alias can stand in for the subcommand);
* ``env`` is added to the command's environment (git: no system or global configuration -
  ``$HOME`` is the workspace -, no prompts, no protocols but ``file``);
* ``exec_only``: the process may execute only these programs - git and git's own helpers -,
  enforced by the kernel (Landlock) in the sandbox, so that even a driver that no option can
  switch off (a filter defined in repository config and selected by ``.gitattributes``) fails
  to start. Where the kernel cannot enforce it, the command is refused rather than run
  unconfined;
* ``check`` refuses arguments that would undo the hardening (git: ``-c``, ``--config-env``,
  ``--exec-path`` before the subcommand).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

RUNS_OTHERS = {
    "python": "an interpreter", "python3": "an interpreter", "perl": "an interpreter",
    "ruby": "an interpreter", "node": "an interpreter", "php": "an interpreter",
    "lua": "an interpreter", "sh": "a shell", "bash": "a shell", "dash": "a shell",
    "zsh": "a shell", "ksh": "a shell", "busybox": "a multi-call shell",
    "awk": "able to run commands (system())", "gawk": "able to run commands (system())",
    "sed": "able to run commands (GNU sed 'e')", "find": "able to run commands (-exec)",
    "xargs": "able to run commands", "env": "able to run commands",
    "make": "able to run commands", "vim": "able to run commands", "vi": "able to run commands",
    "less": "able to run commands", "tar": "able to run commands (--to-command)",
    "ssh": "a network client", "curl": "a network client", "wget": "a network client",
    "nc": "a network client",
}


@dataclass(frozen=True)
class Hardening:
    """How the policy runs one known program (see the module docstring)."""

    options: Callable[[list[str]], list[str]]  # args after the program -> options to insert
    env: Mapping[str, str] = field(default_factory=dict)
    exec_only: tuple[str, ...] = ()
    check: Callable[[list[str], bool], str | None] = lambda args, extended: None


# git: every configuration key that names a program git would run, set so that it runs none
GIT_CONFIG = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("core.alternateRefsCommand", ""),
)
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ALLOW_PROTOCOL": "file",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "false",
    "GIT_SEQUENCE_EDITOR": "false",
    "GIT_ASKPASS": "false",
    "SSH_ASKPASS": "false",
    "GIT_SSH_COMMAND": "false",
}
# global options a user may give before the subcommand (those with a value: the value follows)
_GIT_FLAGS = {"--no-pager", "-P", "-p", "--paginate", "--no-replace-objects", "--bare",
              "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs",
              "--icase-pathspecs", "--no-optional-locks", "--version", "-v", "--help", "-h",
              "--html-path", "--man-path", "--info-path"}
_GIT_VALUED = {"-C", "--git-dir", "--work-tree", "--namespace"}
#: how many of git's args each global option takes up: a flag itself, a valued one its value too
_GIT_WIDTH = {**dict.fromkeys(_GIT_FLAGS, 1), **dict.fromkeys(_GIT_VALUED, 2)}
#: the valued options that may also be written ``--option=value`` (``-C`` may not)
_GIT_JOINED = _GIT_VALUED - {"-C"}


def _git_option_width(arg: str) -> int:
    """How many of git's args the global option ``arg`` takes up: 1 for a flag or an
    ``--option=value``, 2 for an option and its value; 0 for an option not allowed here."""
    name = arg.split("=", 1)[0]
    if name != arg:
        return 1 if name in _GIT_JOINED else 0
    return _GIT_WIDTH.get(arg, 0)


def git_subcommand(args: list[str]) -> tuple[int | None, str | None]:
    """(index in ``args`` of git's subcommand or None, a refusal or None)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            return i, None
        width = _git_option_width(arg)
        if not width:
            return None, (f"the git option `{arg.split('=', 1)[0]}` is not allowed here (git "
                          "runs with repository configuration that cannot start programs)")
        i += width
    return None, None


def _git_options(args: list[str]) -> list[str]:
    options = ["--no-pager"]
    for key, value in GIT_CONFIG:
        options += ["-c", f"{key}={value}"]
    sub, _ = git_subcommand(args)
    if sub is not None:
        options += ["-c", f"alias.{args[sub]}="]
    return options


def _git_check(args: list[str], extended: bool) -> str | None:
    sub, refusal = git_subcommand(args)
    if refusal is None and sub is None and extended:
        refusal = "give git its subcommand here: arguments added by a wrapper cannot be checked"
    return refusal


HARDENED: dict[str, Hardening] = {
    "git": Hardening(options=_git_options, env=GIT_ENV,
                     exec_only=("git", "/usr/lib/git-core", "/usr/libexec/git-core"),
                     check=_git_check),
}
# wrappers that add arguments of their own choosing to the program they run
EXTENDING_WRAPPERS = {"xargs", "watch"}
