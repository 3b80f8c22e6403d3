"""Shared fixtures: a real daemon subprocess, and a real Docker engine (never skipped in CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.support.daemon as daemons
from tests.support import flaky
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon
from tests.support.workers import worker_uid_range

# A host's /etc/sandboxd/sandboxd.yaml (an installed service) must not change what tests get.
os.environ.setdefault("SANDBOXD_CONFIG", os.devnull)
# pytest-xdist workers (make test runs two): each worker's in-process backends get their own
# sandbox uid range, as the VM job's lanes do (tests/vm/guest/test-suite.sh), below the
# ranges test daemons claim host-wide (TEST_UID_BASE up, tests/support/daemon.py)
os.environ.update(worker_uid_range(os.environ))
# test daemons are forked from a server that made their imports once (tests/support/cli.py)
daemons.FORKED = True


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    """A real ``sandboxd serve`` on a free port with the default policy."""
    with running_daemon(tmp_path) as d:
        yield d


@pytest.fixture(scope="module")
def module_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One real daemon (default policy) shared by a module's tests that leave it as they
    found it: a daemon start costs 20-60 s under emulation in the modern-host VM job. A module
    opts in by overriding ``daemon`` with it (tests/api/test_api.py)."""
    with running_daemon(tmp_path_factory.mktemp("daemon")) as d:
        yield d


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[InProcessDaemon]:
    """The daemon's app in this process, on scripted backends (tests/support/inprocess.py):
    for tests of the HTTP, client and MCP surface, which need no real backend. Its calls
    print nothing unless the test sets ``inproc.python.script``."""
    with inprocess_daemon(tmp_path) as d:
        yield d


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    """A docker.DockerClient connected to a running engine with the sandbox images built."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        require(False, f"a running Docker engine ({exc})")
        raise
    from sandboxd.config import Settings

    image = Settings().python_image
    try:
        client.images.get(image)
    except Exception:
        require(False, f"the sandbox image {image} (run `sandboxd images build --offline`)")
    yield client
    client.close()


# Per-directory markers, so that one backend's whole suite runs alone:
#   pytest -m restricted    pytest -m container    pytest -m docker    pytest -m scripted
#   pytest -m fleet
_DIRECTORY_MARKERS = {"restricted": ("restricted",), "container": ("container", "docker"),
                      "faults": ("docker",), "scripted": ("scripted",), "fleet": ("fleet",)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its directory, and ``docker`` when it uses the Docker engine."""
    tests_dir = Path(__file__).parent
    for item in items:
        try:
            directory = Path(item.path).relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        for name in _DIRECTORY_MARKERS.get(directory, ()):
            item.add_marker(name)
        if "docker_client" in getattr(item, "fixturenames", ()) and \
                item.get_closest_marker("docker") is None:
            item.add_marker("docker")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Reruns are remembered, to be named at the end (tests/support/flaky.py)."""
    flaky.note(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """``FLAKY: <test id>`` for every test that passed only on its rerun (or failed twice)."""
    flaky.summary(terminalreporter)
