"""Fixtures of the container backend tests: a real Docker engine (tests/conftest.py's
``docker_client``: fails in CI when missing) and started backends with unique labels."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sandboxd.backends.container import ContainerBackend
from sandboxd.config import Settings
from sandboxd.models import Invocation, Limits, Result, ToolKind
from sandboxd.protocol.plan import ExecutionPlan, Plan
from tests.support.scale import time_bound

#: the identity the helpers below give their workspaces and calls (the daemon would take one
#: from its uid pool per call or session): the last uid of the default pool, adopted by the
#: backend's pool in :func:`run` so that no warm container gets it
SANDBOX_UID = Settings().sandbox_uid_first + Settings().sandbox_uid_count - 1


def make_settings(tmp: Path, **overrides: Any) -> Settings:
    """Settings with a private state dir and a unique instance label."""
    values: dict[str, Any] = {
        "state_dir": tmp / "state",
        "instance": f"t{secrets.token_hex(5)}",
        "warm_pool_size": 1,
    }
    values.update(overrides)
    return Settings(**values)


def workspace(base: Path, name: str = "ws") -> Path:
    """A workspace directory as the daemon makes it (owned by the sandbox user when root)."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    path.chmod(0o700)
    return path


#: a call's wall-clock limit unless the test gives one: 30 s in make test; 120 s under
#: emulation, where a container's creation beside the other lane's took over 30 s (CI's VM,
#: 2026-11-29: a session's first call ended in wall_timeout before its container started)
DEFAULT_CALL_S = time_bound(30.0, emulated_s=120.0)


async def run(backend: ContainerBackend, ws: Path, *, argv: list[str] | None = None,
              code: str | None = None, session: str | None = None, client: str = "tester",
              limits: Limits | None = None, timeout: float | None = None) -> Result:
    """One call through the backend, as the service would make it."""
    limits = limits or Limits(timeout_s=timeout or DEFAULT_CALL_S)
    uid = None
    if backend.uids is not None:
        assert backend.uids.adopt("tests", SANDBOX_UID)
        uid = SANDBOX_UID
    if code is not None:
        # as a policy with imports: {allow: ["*"]} sends it (the runner's rule is default deny)
        inv = Invocation(tool="python", client=client, session=session, workspace=ws,
                         arguments={"code": code}, uid=uid,
                         plan=ExecutionPlan(kind=ToolKind.python, limits=limits,
                                            imports_allow=("*",)))
    else:
        inv = Invocation(tool="shell", client=client, session=session, workspace=ws, uid=uid,
                         plan=ExecutionPlan(kind=ToolKind.command, limits=limits,
                                            command=Plan.single(argv) if argv else None))
    return await backend.run(inv, time.monotonic() + limits.timeout_s)


def labelled(docker_client: Any, instance: str) -> list[Any]:
    """Containers (any state) carrying this backend instance's daemon label."""
    return docker_client.containers.list(all=True, ignore_removed=True,
                                         filters={"label": f"sandboxd.daemon={instance}"})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(docker_client: Any, tmp_path_factory: pytest.TempPathFactory,
                  ) -> AsyncIterator[ContainerBackend]:
    """A started backend shared by a test module (warm pool of 1)."""
    tmp = tmp_path_factory.mktemp("container")
    b = ContainerBackend.from_settings(make_settings(tmp))
    await b.start()
    ok, why = b.availability()
    assert ok, why
    yield b
    await b.close()
    assert labelled(docker_client, b.config.instance_name) == []


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace(tmp_path)
