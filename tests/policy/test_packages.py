"""``tools.python.packages.allow`` (what ``install_packages`` may install): its
errors at file:line:col, PEP 503 names, the tool it enables and the decisions it makes."""

from __future__ import annotations

from pathlib import Path

from sandboxd.models import Decision
from sandboxd.policy.engine import policy_warnings
from sandboxd.policy.site import CallSite, at_site

from .helpers import decide, store_for, write
from .test_loading import problems_of

CONTAINER = """\
tools:
  python:
    backend: container
    imports: {allow: [json]}
    packages:
      allow: [Requests, "numpy==1.26.4", zope.interface]
"""


def test_bad_and_duplicate_entries_are_located(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"]
        tools:
          python:
            backend: container
            packages:
              allow: [ok, "-e git+https://x", "name>=1"]
        """)
    problems = problems_of(p)
    assert any(s.startswith(f"{p}:8:19: tools.python.packages.allow[1]: '-e git+https://x' is "
                            "not a package name") for s in problems), problems
    assert any(s.startswith(f"{p}:8:39: tools.python.packages.allow[2]: 'name>=1' is not a "
                            "package name") for s in problems), problems
    p = write(tmp_path, "dup.yaml", """\
        version: 1
        name: dup
        clients: ["*"]
        tools:
          python:
            backend: container
            packages:
              allow: [ok, zope_interface, Zope.Interface]
        """)
    assert problems_of(p) == [
        f"{p}:8:35: tools.python.packages.allow[2]: 'Zope.Interface' names the package of "
        "entry 1 again (names are compared after PEP 503 normalisation)"]


def test_allowed_names_compare_after_pep503_normalisation(tmp_path: Path) -> None:
    store = store_for(tmp_path, CONTAINER)
    for name in ("requests", "REQUESTS", "zope-interface", "Zope_Interface", "NumPy"):
        d = decide(store, "install_packages", {"packages": [name]})
        assert d.allowed, (name, d)
    d = decide(store, "install_packages", {"packages": ["numpy", "zope.interface"]})
    assert d.plan is not None and d.plan.argv is not None
    assert d.plan.argv[-2:] == ["numpy==1.26.4", "zope-interface"]  # the policy's pin
    assert "--no-index" in d.plan.argv and "--only-binary=:all:" in d.plan.argv
    assert d.plan.network is None
    d = decide(store, "install_packages", {"packages": ["requests", "urllib3", "idna"]})
    assert not d.allowed and d.rule == "tools.python.packages.allow"
    assert d.message == ("Installing `urllib3`, `idna` is not allowed here; allowed packages: "
                         "numpy==1.26.4, requests, zope-interface.")


def test_the_tool_exists_only_where_packages_are_allowed(tmp_path: Path) -> None:
    store = store_for(tmp_path, CONTAINER)
    names = [s.name for s in store.tools_for("local")]
    assert "install_packages" in names
    other = store_for(tmp_path / "other", "tools:\n  python: {backend: container}\n")
    assert "install_packages" not in [s.name for s in other.tools_for("local")]
    d = decide(other, "install_packages", {"packages": ["requests"]})
    assert not d.allowed and d.rule == "default_deny"
    assert "install_packages" in str(problems_of(write(tmp_path, "clash.yaml", """\
        version: 1
        name: clash
        clients: ["*"]
        custom_tools:
          install_packages: {description: x, argv: [pip, install]}
        """)))


def test_restricted_backend_refuses_naming_the_container_backend(tmp_path: Path) -> None:
    store = store_for(tmp_path, "tools:\n  python:\n    backend: restricted\n"
                                "    packages: {allow: [requests]}\n")
    d = decide(store, "install_packages", {"packages": ["requests"]})
    assert not d.allowed and d.rule == "tools.python.backend"
    assert "python runs on the restricted backend" in d.message
    assert d.message.endswith("use a policy whose python tool has backend: container.")
    warnings = policy_warnings(store.policies()[0])
    assert any("install_packages is refused on the restricted backend" in w
               for w in warnings), warnings


def test_a_session_and_a_wheelhouse_are_needed(tmp_path: Path) -> None:
    allowed = Decision(allowed=True, source="p.yaml", rule="tools.python.packages.allow")
    d = at_site("install_packages", allowed, CallSite(None, tmp_path))
    assert not d.allowed and "installs into a session" in d.message
    d = at_site("install_packages", allowed, CallSite("ses_1", None))
    assert not d.allowed and "no wheelhouse" in d.message
    d = at_site("install_packages", allowed, CallSite("ses_1", tmp_path / "not-yet"))
    assert not d.allowed and "wheelhouse does not exist" in d.message
    assert d.rule == "tools.python.packages" and d.plan is None
    assert at_site("install_packages", allowed, CallSite("ses_1", tmp_path)) is allowed
    assert at_site("python", allowed, CallSite(None, None)) is allowed
    # policy explain asks without a site: the policy file's own answer
    assert at_site("install_packages", allowed, None) is allowed


def test_the_service_asks_with_the_calls_site(tmp_path: Path) -> None:
    """The store passes the site to the engine: a call without a session is refused there."""
    store = store_for(tmp_path, CONTAINER)
    arguments = {"packages": ["requests"]}
    assert store.decide("alice", "install_packages", arguments, None).allowed
    d = store.decide("alice", "install_packages", arguments, None, CallSite(None, tmp_path))
    assert not d.allowed and "installs into a session" in d.message
