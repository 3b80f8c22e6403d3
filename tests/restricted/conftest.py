"""Fixtures for the restricted backend: a real backend (real zygote, workers, cgroups) driven
from synchronous tests through an event loop running in a background thread."""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.restricted import RestrictedBackend
from sandboxd.config import Settings
from sandboxd.models import Invocation, Limits, Result, ToolKind
from sandboxd.protocol.plan import ExecutionPlan
from tests.support.plan import with_limits

DEFAULT_IMPORTS = [
    "math", "json", "re", "datetime", "statistics", "itertools", "functools", "collections",
    "random", "string", "decimal", "fractions",
]


class BackendHarness:
    """A started :class:`RestrictedBackend` and helpers to run code through it."""

    def __init__(self, state_dir: Path, instance: str) -> None:
        self.state_dir = state_dir
        self.settings = Settings(state_dir=state_dir, instance=instance)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.backend = RestrictedBackend.from_settings(self.settings)
        # one identity of the backend's uid pool for every call of the harness (the daemon
        # gives each call its own: tests/security/test_isolation.py)
        pool = self.backend.uids
        self.uid = pool.acquire("test-harness") if pool is not None else None
        self.call(self.backend.start())

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def workspace(self) -> Path:
        ws = self.state_dir / "workspaces" / secrets.token_hex(6)
        ws.mkdir(parents=True)
        if self.uid is not None:
            os.chown(ws, self.uid, self.uid)
        return ws

    def invocation(self, code: str, workspace: Path | None = None,
                   imports: list[str] | None = None, deny: list[str] | None = None,
                   max_file_bytes: int = 1024 * 1024) -> Invocation:
        return Invocation(
            tool="python", client="test", workspace=workspace or self.workspace(),
            arguments={"code": code}, uid=self.uid,
            plan=ExecutionPlan(
                kind=ToolKind.python,
                imports_allow=tuple(DEFAULT_IMPORTS if imports is None else imports),
                imports_deny=tuple(deny or []), max_file_bytes=max_file_bytes),
        )

    def run(self, code: str, *, workspace: Path | None = None, timeout_s: float = 10,
            imports: list[str] | None = None, deny: list[str] | None = None,
            max_file_bytes: int = 1024 * 1024, **limits: Any) -> Result:
        inv = self.invocation(code, workspace, imports, deny, max_file_bytes)
        lim = Limits(timeout_s=timeout_s, **limits)
        return self.call(self.backend.run(with_limits(inv, lim), time.monotonic() + timeout_s))

    def close(self) -> None:
        self.call(self.backend.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendHarness]:
    """One real backend per test module (its zygote is shared by the module's tests)."""
    state = tmp_path_factory.mktemp("restricted-state")
    os.chmod(state, 0o755)
    h = BackendHarness(state, f"t{secrets.token_hex(5)}")
    assert h.backend.availability() == (True, None)
    try:
        yield h
    finally:
        h.close()
