"""pytest-xdist workers side by side (``make test``, ``TEST_WORKERS``): the sandbox uid range
each worker's in-process backends use, as each of the VM job's lanes has its own."""

from __future__ import annotations

from collections.abc import Mapping

from tests.support.daemon import TEST_UID_BASE

#: the default range's first uid (sandboxd.config) and the room each worker's range gets
FIRST_UID = 10100
STRIDE = 1000


def worker_uid_range(env: Mapping[str, str]) -> dict[str, str]:
    """``{"SANDBOXD_SANDBOX_UID_FIRST": ...}`` for xdist worker ``gwN`` (``PYTEST_XDIST_WORKER``)
    unless ``env`` names a range already (the VM's lanes do); nothing outside a worker."""
    worker = env.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or "SANDBOXD_SANDBOX_UID_FIRST" in env:
        return {}
    first = FIRST_UID + STRIDE * int(worker[2:])
    if first + STRIDE > TEST_UID_BASE:
        raise RuntimeError(f"xdist worker {worker}: its sandbox uid range would reach the test "
                           f"daemons' ({TEST_UID_BASE} up); run fewer workers (TEST_WORKERS)")
    return {"SANDBOXD_SANDBOX_UID_FIRST": str(first)}
