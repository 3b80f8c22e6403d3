"""The order ``make test``'s workers take test files in: the longest first.

pytest-xdist (``--dist loadfile``) hands each worker one file at a time, in the order of the
collection; by default it reorders files by their number of tests, so a file of a few long
tests (a Dockerfile build, daemon restarts) came last and ran alone at the end while the
other workers had nothing left. The Makefile turns that reordering off
(``--no-loadscope-reorder``) and every worker's collection puts the files below first, longest
first (each worker sorts the same way: xdist requires identical collections); the rest keep
their order. Measured from a ``make test`` run's junit XML (the sum of each file's test
times); a file not listed just runs after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

#: test files (relative to the repository) taking 12 s or more in ``make test``, longest first:
#: the sums of their tests' times in a run at 579d3b4 (4 workers; 1287 s of tests in all)
LONGEST: tuple[str, ...] = (
    "tests/security/test_workspace_limits.py",  # 58 s
    "tests/policy/test_shell_differential.py",  # 53 s
    "tests/container/test_kernel.py",  # 52 s
    "tests/container/test_kernel_trust.py",  # 41 s
    "tests/container/test_lifecycle.py",  # 36 s
    "tests/service/test_dockerfile.py",  # 34 s
    "tests/service/test_unit_confinement.py",  # 32 s
    "tests/security/test_kernel_escapes.py",  # 32 s
    "tests/api/test_cli.py",  # 30 s
    "tests/container/test_kernel_interrupt.py",  # 30 s
    "tests/faults/test_contract.py",  # 29 s
    "tests/mcp/test_session_caps.py",  # 26 s
    "tests/mcp/test_mcp.py",  # 22 s
    "tests/restricted/test_kernel.py",  # 21 s
    "tests/fleet/test_routing.py",  # 19 s
    "tests/faults/test_docker.py",  # 19 s
    "tests/mcp/test_revisions.py",  # 18 s
    "tests/faults/test_zygote.py",  # 18 s
    "tests/security/test_kernel_trust.py",  # 17 s
    "tests/client/test_chat_cli.py",  # 16 s
    "tests/container/test_restart_sessions.py",  # 16 s
    "tests/auth/test_revocation.py",  # 15 s
    "tests/fleet/test_rolling_restart.py",  # 15 s
    "tests/restricted/test_kernel_interrupt.py",  # 15 s
    "tests/security/test_restricted_escapes.py",  # 15 s
    "tests/mcp/test_inspector.py",  # 15 s
    "tests/faults/test_disks.py",  # 15 s
    "tests/docs/test_examples.py",  # 14 s
    "tests/policy/test_cli.py",  # 14 s
    "tests/api/test_fuzz.py",  # 13 s
    "tests/container/test_http.py",  # 12 s
    "tests/container/test_live_daemon.py",  # 12 s
    "tests/unit/test_xdist_workers.py",  # 12 s
)


def longest_first(items: Sequence[pytest.Item], root: Path) -> list[pytest.Item]:
    """``items`` with the files of :data:`LONGEST` first, in its order (a stable sort: the
    tests of a file keep theirs, other files keep the collection's)."""
    rank = {path: i for i, path in enumerate(LONGEST)}

    def key(item: pytest.Item) -> int:
        try:
            path = Path(item.path).relative_to(root).as_posix()
        except ValueError:
            return len(LONGEST)
        return rank.get(path, len(LONGEST))

    return sorted(items, key=key)
