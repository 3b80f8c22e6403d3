"""Policy files: parsing errors point at file:line:column; shipped policies are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.policy import PolicyError, PolicyStore, load_file, load_set
from sandboxd.policy.store import embedded_policies_dir
from tests.policy.helpers import write

REPO = Path(__file__).resolve().parents[2]


def problems_of(path: Path) -> list[str]:
    policy, problems = load_file(path, str(path))
    assert policy is None, "expected the file to be refused"
    return problems


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"
        tools: {}
        """)
    (problem,) = problems_of(p)
    assert problem.startswith(f"{p}:4:")
    assert "YAML syntax error" in problem


def test_unknown_and_wrong_keys_point_at_their_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"]
        tools:
          shell:
            backend: restricted
            comands: {allow: [ls]}
          pyhton: {}
        """)
    problems = problems_of(p)
    assert problems == [
        f"{p}:6:14: tools.shell.backend: Input should be 'container'",
        f"{p}:7:5: tools.shell: unknown key 'comands' (expected one of: enabled, limits, "
        "approve, backend, image, network, egress, commands, operators, deny_patterns)",
        f"{p}:8:3: tools: unknown key 'pyhton' (expected one of: python, shell, bash, "
        "javascript, typescript, read_file, write_file, list_files); "
        "admin-defined tools go under custom_tools",
    ]


def test_bad_values_are_located_precisely(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"]
        limits: {timeout: soon, memory: 256Mi}
        tools:
          shell:
            commands:
              allow: [ls, /bin/cat, true]
        """)
    problems = problems_of(p)
    assert any(s.startswith(f"{p}:4:19: limits.timeout: expected a duration") for s in problems)
    assert any(s.startswith(f"{p}:8:19: tools.shell.commands.allow[1]: '/bin/cat' is not a "
                            "valid program name") for s in problems)
    assert any(s.startswith(f"{p}:8:29: tools.shell.commands.allow[2]: Input should be a valid "
                            "string (YAML read true as bool: put it in quotes)") for s in problems)


def test_missing_required_keys_and_semantics(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """\
        name: bad
        limits:
          timeout: 600s
          max_timeout: 300s
        custom_tools:
          lint:
            description: x
            parameters: {type: object, properties: {path: {type: string}}}
            argv: [ruff, "{file}", "{path.name}"]
        """)
    problems = problems_of(p)
    joined = "\n".join(problems)
    assert f"{p}:1:1: (top level): missing required key 'version'" in joined
    assert f"{p}:1:1: (top level): missing required key 'clients'" in joined
    # semantic checks run only once the file is structurally valid
    p.write_text("version: 1\nclients: ['*']\n" + p.read_text())
    problems = problems_of(p)
    assert f"{p}:5:12: limits.timeout: timeout is above max_timeout of the same block" in problems
    assert any(s.startswith(f"{p}:11:18: custom_tools.lint.argv[1]: placeholder {{file}} names "
                            "no parameter") for s in problems)
    assert any(s.startswith(f"{p}:11:28: custom_tools.lint.argv[2]: placeholder {{path.name}} "
                            "must be a plain parameter name") for s in problems)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "dup.yaml", """\
        version: 1
        name: dup
        clients: ["*"]
        tools:
          shell: {commands: {allow: [ls]}}
          shell: {commands: {allow: [ls, curl]}}
        """)
    assert problems_of(p) == [f"{p}:6:3: duplicate key 'shell' (first defined on line 5)"]


def test_network_host_and_restricted_network_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "net.yaml", """\
        version: 1
        name: net
        clients: ["*"]
        network: host
        """)
    (problem,) = problems_of(p)
    assert problem.startswith(f"{p}:4:10: network: network 'host' is not allowed")
    p = write(tmp_path, "net.yaml", """\
        version: 1
        name: net
        clients: ["*"]
        tools:
          python: {backend: restricted, network: egress}
        """)
    (problem,) = problems_of(p)
    assert problem.startswith(f"{p}:5:42: tools.python.network: the restricted backend has no "
                              "network")


def test_empty_and_non_mapping_files(tmp_path: Path) -> None:
    p = write(tmp_path, "empty.yaml", "")
    assert problems_of(p)[0].startswith(f"{p}:1:1: empty policy file")
    p = write(tmp_path, "list.yaml", "- a\n- b\n")
    assert problems_of(p)[0].startswith(f"{p}:1:1: a policy file must be a mapping")


def test_set_conflicts_name_both_files(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "version: 1\nname: a\nclients: ['*']\n")
    write(tmp_path, "b.yaml", "version: 1\nname: a\nclients: ['*']\n")
    with pytest.raises(PolicyError) as info:
        load_set([(tmp_path / n, n) for n in ("a.yaml", "b.yaml")])
    assert info.value.problems == [
        "b.yaml:2:7: policy name 'a' is already used by a.yaml",
        "b.yaml:3:11: client '*' is already assigned to policy 'a' (a.yaml)",
    ]


def test_star_must_be_alone(tmp_path: Path) -> None:
    p = write(tmp_path, "b.yaml", "version: 1\nname: b\nclients: [alice, '*']\n")
    assert problems_of(p) == [f"{p}:3:10: clients: '*' must be the only entry when present"]


def test_client_claimed_twice(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "version: 1\nname: a\nclients: [alice]\n")
    write(tmp_path, "b.yaml", "version: 1\nname: b\nclients: [bob, alice]\n")
    with pytest.raises(PolicyError) as info:
        load_set([(tmp_path / n, n) for n in ("a.yaml", "b.yaml")])
    assert info.value.problems == [
        "b.yaml:3:16: client 'alice' is already assigned to policy 'a' (a.yaml)"]


@pytest.mark.parametrize("name", ["default.yaml", "strict.yaml", "examples/datascience.yaml",
                                  "examples/custom-tools.yaml"])
def test_shipped_policies_are_valid(name: str) -> None:
    policy, problems = load_file(REPO / "policies" / name)
    assert problems == []
    assert policy is not None


def test_shipped_policy_directory_loads_as_a_set() -> None:
    store = PolicyStore(REPO / "policies")
    store.load()
    assert store.clients() == {"untrusted": "strict", "*": "default"}
    assert [t.name for t in store.tools_for("untrusted")] == ["python"]


def test_embedded_default_is_found_and_named_by_its_shipped_path() -> None:
    assert (embedded_policies_dir() / "default.yaml").is_file()
    store = PolicyStore(None)
    store.load()
    decision = store.decide("local", "python", {"code": "1 + 1"}, None)
    assert decision.allowed
    assert (decision.source, decision.rule) == ("policies/default.yaml", "tools.python")
    assert decision.backend == "restricted"
    assert [t.name for t in store.tools_for("local")] == [
        "python", "shell", "read_file", "write_file", "list_files", "git_status"]
    backends = {t.name: t.backend for t in store.tools_for("local")}
    assert backends["shell"] == "container" and backends["read_file"] == "workspace"


@pytest.mark.parametrize("missing", [False, True])
def test_empty_or_missing_directory_serves_the_embedded_default(
    tmp_path: Path, missing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh install (empty /etc/sandboxd/policies) starts on the embedded default and says
    so; a policy file added later replaces it on the next reload."""
    d = tmp_path / ("absent" if missing else "")
    store = PolicyStore(d)
    with caplog.at_level("WARNING", logger="sandboxd.policy"):
        store.load()
    assert [p.source for p in store.policies()] == ["policies/default.yaml"]
    assert "embedded default policy" in caplog.text and str(d) in caplog.text
    d.mkdir(exist_ok=True)
    write(d, "only.yaml", "version: 1\nname: only\nclients: ['*']\ntools:\n  python: {}\n")
    assert store.reload()
    assert [p.source for p in store.policies()] == [str(d / "only.yaml")]


def test_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    p = write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    (problem,) = problems_of(p)
    assert problem == f"{p}:1:1: document too large (more than 100000 nodes)"


def test_locate_rules(tmp_path: Path) -> None:
    policy, _ = load_file(REPO / "policies" / "default.yaml", "policies/default.yaml")
    assert policy is not None
    text = (REPO / "policies" / "default.yaml").read_text().splitlines()
    where = policy.locate("tools.shell.commands.deny[2]")
    _, line, col = where.split(":")
    assert text[int(line) - 1][int(col) - 1:].startswith("nc,")
    assert policy.locate("default_deny") == "policies/default.yaml"
    store = PolicyStore(None)
    store.load()
    assert store.locate("local", "tools.shell.commands.deny[2]") == where
    assert policy.locate("custom_tools.git_status").endswith(":" + str(
        next(i for i, t in enumerate(text, 1) if t.strip().startswith("git_status:"))) + ":3")


def test_shipped_python_imports_exist_in_the_restricted_backend() -> None:
    """A module the policy allows but the restricted backend lacks would fail at run time
    ("allowed by the policy but not available"): the shipped policies must not promise it."""
    from sandboxd.backends.restricted.lang.module_allowlist import MODULES

    for name in ("default.yaml", "strict.yaml"):
        policy, _ = load_file(REPO / "policies" / name)
        assert policy is not None and policy.spec.tools.python is not None
        assert policy.spec.tools.python.backend == "restricted"
        missing = set(policy.spec.tools.python.imports.allow) - set(MODULES)
        assert not missing, f"{name}: not available in the restricted backend: {missing}"


def test_a_module_the_restricted_backend_lacks_is_an_error_at_its_entry(tmp_path: Path) -> None:
    """A regression: `zlib` allowed for the restricted backend passed `policy check`, `explain` said
    allow and the tool description promised it, then the call failed at run time."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nname: p\nclients: ['*']\ntools:\n  python:\n    imports:\n"
                    "      allow: [math, zlib, collections.abc, '*']\n")
    policy, problems = load_file(path)
    assert policy is None
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}:7:21: tools.python.imports.allow[1]: 'zlib' cannot "
                                  "be imported by the restricted backend"), problems
    assert "use backend: container" in problems[0]
    path.write_text(path.read_text().replace("  python:\n", "  python:\n    backend: container\n"))
    assert load_file(path)[1] == []  # a container has zlib
