"""The service is composed, not mixed in: :class:`~sandboxd.service.Sandboxd` derives from
nothing and builds its parts (health, restarts, session operations, the execution of admitted
calls, the drain), each a plain class handed the service's own collaborators - one session
manager, one map of backends, one health - so no part reaches another through its host. The
front doors (``sandboxd/api``, ``sandboxd/cli``) only call what the service itself has."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from sandboxd.health.state import Health
from sandboxd.invoke.drain import Drain
from sandboxd.invoke.execute import Execution
from sandboxd.service import Sandboxd
from sandboxd.sessions.kernels import SessionService
from sandboxd.sessions.restarts import Restarts
from tests.support.inprocess import settings_from_env

ROOT = Path(__file__).resolve().parents[2] / "sandboxd"
#: how the front doors name the service
SERVICE = {"service", "self.service", "_service(request)", "self._service"}


@pytest.fixture
def service(tmp_path: Path) -> Sandboxd:
    return Sandboxd(settings_from_env(tmp_path / "state"), backends={})


def test_no_part_is_a_mixin() -> None:
    for cls in (Sandboxd, Health, Restarts, SessionService, Execution, Drain):
        assert cls.__bases__ == (object,), cls


def test_the_parts_share_the_service_s_collaborators(service: Sandboxd) -> None:
    parts = (service.health, service.restarts, service.session_ops, service.execution)
    assert all(p.sessions is service.sessions for p in parts)
    assert service.restarts.backends is service.backends
    assert service.session_ops.backends is service.backends
    assert service.session_ops.health is service.health is service.drains.health
    assert service.policy_listeners is service.health.policy_listeners
    assert not service.draining
    service.begin_drain()  # one flag: the health's, which the session operations read
    assert service.draining and service.health.draining


def _called_on_the_service() -> set[str]:
    names = set()
    for path in [*ROOT.joinpath("api").rglob("*.py"), *ROOT.joinpath("cli").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in SERVICE:
                names.add(node.attr)
    return names


def _opened_by_start() -> set[str]:
    """What :meth:`Sandboxd.start` sets (the audit log and its recorder touch the disk)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Sandboxd.start)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Attribute)}


def test_the_front_doors_call_only_what_the_service_has(service: Sandboxd) -> None:
    called = _called_on_the_service()
    assert {"create_session", "end_session", "readiness", "revoke_client",
            "session_view"} <= called  # the check sees the doors' calls
    missing = {n for n in called if not hasattr(service, n)}
    assert sorted(missing - _opened_by_start()) == []
