"""The policy engine: YAML policy files, validation with file:line:column, decisions, reload.

Public interface: :class:`PolicyStore` (``load`` / ``reload`` / ``watch`` / ``tools_for`` /
``decide``) and :class:`PolicyError` (``.problems``: ``file:line:column: message`` lines).
``policies/default.yaml`` is the annotated example of the format; this is the reference.

Files
    Every ``*.yaml`` / ``*.yml`` file directly in the policies directory (not recursive, not
    hidden) is one policy. With no directory configured, the shipped ``policies/default.yaml``
    is used (``sandboxd/_data/policies`` in a wheel). The set is validated as a whole: a
    broken file, two policies with one name, or a client claimed by two policies refuses the
    whole set (at start-up: the daemon does not start; on reload: the previous set stays in
    force and ``policy_refused`` is audited with every problem).

Clients
    ``clients: [alice, bob]`` or ``clients: ["*"]``. A client (the name a token maps to; every
    caller is ``local`` without a tokens file) gets the policy that names it, else the ``"*"``
    policy, else nothing at all (every call denied, rule ``clients``).

Default deny; deny beats allow
    A tool not listed under ``tools`` / ``custom_tools`` (or ``enabled: false``) is denied
    (rule ``default_deny`` / ``tools.X.enabled``). For commands, imports and paths the deny
    list is checked first; then an allow entry must match; otherwise the call is denied with
    the allow list as the rule (``tools.shell.commands.allow``).

Rules named in decisions
    ``tools.python`` · ``tools.python.imports.allow`` / ``.deny[i]`` · ``tools.python.imports``
    (relative import) · ``tools.shell.commands.allow[i]`` (several joined by ``, `` when a
    line has several commands) / ``.allow`` / ``.deny[i]`` · ``tools.shell.operators`` ·
    ``tools.shell.deny_patterns[i]`` · ``tools.shell`` (unparseable line) ·
    ``tools.<file tool>.paths.allow[i]`` / ``.allow`` / ``.deny[i]`` / ``.paths`` (bad path)
    · ``tools.write_file.max_bytes`` · ``custom_tools.<name>`` / ``custom_tools.<name>.argv[i]``.
    ``LoadedPolicy.locate(rule)`` turns one into ``file:line:column``.

Limits
    ``limits:`` (policy) and ``tools.X.limits:`` hold ``timeout`` (``60s``, ``500ms``, ``5m``),
    ``memory`` / ``output`` (``256Mi``, ``1G``, bytes; ``output`` is one budget for stdout
    and stderr together), ``cpus``, ``pids`` and a ``max_`` of each. A tool's value falls
    back to the policy's, then to the built-in default (60 s,
    256 MiB, 1 CPU, 64 pids, 1 MiB output); it is capped by the tool's and the policy's
    maxima; a request can only lower it: effective = min(request, tool, policy maximum).
    A value above the maximum of the same block is a load error.

Network
    ``network: none`` (default) or the name of a Docker network, per policy or per tool;
    ``host`` and ``container:...`` are refused; the restricted backend never has one.

python
    ``backend: restricted | container``, ``imports: {allow, deny}``: module names; an entry
    admits the module and its submodules (``os`` covers ``os.path``); ``"*"`` in ``allow``
    admits any module. Imports are found up front in the code's AST (``import``, ``from``,
    literal ``__import__("x")`` / ``importlib.import_module("x")``); the backends enforce the
    same lists at run time (``ExecutionPlan.imports_allow`` / ``imports_deny``) with the same rule:
    :func:`sandboxd.protocol.rules.import_verdict` is its one definition (the container runner has a
    copy of that module, made by the image build).
    ``packages: {allow: [name, "name==1.2"]}``: what the ``install_packages`` tool (listed
    only when this list is not empty) may install from the admin's wheelhouse into a container
    session; names compared after PEP 503 normalisation (:mod:`sandboxd.policy.packages`).

shell
    ``backend: container``, ``commands: {allow, deny}`` (bare program names), ``operators``
    (default false), ``deny_patterns`` (regexes searched in the whole line, checked first).
    The line is tokenized with POSIX quoting (:mod:`sandboxd.policy.shell`); the program is
    a bare name or an absolute path in a system bin directory (``/usr/bin/ls`` is ``ls``);
    programs that run other programs (``env``, ``timeout``, ``xargs``, ...) have the wrapped
    program checked too; ``NAME=value`` prefixes and shell builtins (``cd``, ...) are refused.
    Known programs are hardened (:mod:`sandboxd.policy.programs`: git runs with options and
    an environment that repository content cannot override, and may execute only git's own
    helpers). The result is a :class:`~sandboxd.protocol.plan.Plan` that the backend executes as it
    is; no shell ever sees the line. Without operators the plan is one argv; ``$(...)``,
    backticks and process substitution are refused. With operators the line is split at
    ``|``, ``;``, ``&&``, ``||`` and newlines, with redirects to workspace files; every
    construct /bin/sh would read differently (comments, ``$`` expansions, globs, braces, ``~``,
    background ``&``, subshells, here-documents, keywords) is refused.

read_file / write_file / list_files
    Run in the daemon (``backend: workspace``). ``paths: {allow, deny}`` globs (``*``,
    ``**``, ``?``, ``[...]``; see :mod:`sandboxd.policy.paths`) match the normalised
    workspace-relative path (``./a//b`` -> ``a/b``, ``/workspace/a`` -> ``a``, root ``.``);
    other absolute paths, ``..``, control and invisible characters, spaces at either end of
    a name and non-NFC text are refused, never cleaned. The normalised path is carried on
    the decision (``Decision.path``) and is the path the backend opens. ``max_bytes`` caps
    file sizes (``ExecutionPlan.max_file_bytes``). The path check is on the requested name: the
    workspace backend must still refuse symlinks.

custom_tools
    ``<name>: {description, parameters (JSON Schema, type object), backend: container,
    argv: [...], image, network, limits, allow_option_values}``. Each ``{param}`` in an argv
    element is replaced by the argument's value (``str.format``; ``{{``/``}}`` are literal
    braces) and the element stays one argv element. An element whose optional parameter is
    absent (and has no ``default``) is dropped. A value beginning with ``-`` for an element
    that starts with the placeholder is refused unless ``allow_option_values: true``.
"""

from sandboxd.policy.loader import LoadedPolicy, PolicyError, PolicySet, load_file, load_set
from sandboxd.policy.store import PolicyStore, embedded_policies_dir

__all__ = [
    "LoadedPolicy",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "embedded_policies_dir",
    "load_file",
    "load_set",
]
