"""The daemon's unix socket is never world-accessible, not even for a moment of the start
(sandboxd.cli.daemon): uvicorn gives a socket file it creates mode 0666 until the daemon sets
the configured mode, so the daemon leaves an owner-only socket file there first, whose mode
uvicorn keeps (asyncio replaces a socket file at the path)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import uvicorn.server

from sandboxd.cli.daemon import _owner_only_placeholder
from tests.support.wait import async_wait_until


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)  # what the daemon sets before it binds
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_placeholder_is_an_owner_only_socket_nobody_listens_on(tmp_path: Path,
                                                                   umask_077: None) -> None:
    path = tmp_path / "d.sock"
    _owner_only_placeholder(path)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert _mode(path) == 0o600
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client, \
            pytest.raises(ConnectionRefusedError):
        client.connect(str(path))


def test_a_stale_world_writable_socket_is_replaced(tmp_path: Path, umask_077: None) -> None:
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    os.chmod(path, 0o777)
    _owner_only_placeholder(path)
    assert _mode(path) == 0o600


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path: Path, umask_077: None) -> None:
    path = tmp_path / "d.sock"
    path.write_text("not a socket")
    _owner_only_placeholder(path)
    assert path.read_text() == "not a socket"


def _record_modes(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The modes every later ``os.chmod`` of ``path`` gives it, in order (the chmod is real;
    uvicorn's and the daemon's ``os`` are this ``os``)."""
    modes: list[int] = []
    real_chmod = os.chmod

    def chmod(target: object, mode: int, *args: object, **kwargs: object) -> None:
        if Path(str(target)) == path:
            modes.append(stat.S_IMODE(mode))
        real_chmod(target, mode, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "chmod", chmod)
    return modes


def _modes_uvicorn_sets(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every mode uvicorn's own start gives the socket file (its os.chmod calls), with a
    trivial app: the real bind, the real chmod."""
    modes = _record_modes(path, monkeypatch)

    async def app(scope: dict, receive: object, send: object) -> None:  # pragma: no cover
        pass

    async def start_and_stop() -> None:
        config = uvicorn.Config(app, uds=str(path), lifespan="off", log_level="error")
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)  # as Server._serve sets it
        await server.startup()
        assert server.started
        await server.shutdown()

    asyncio.run(start_and_stop())
    return modes


def test_uvicorn_alone_makes_it_world_writable(tmp_path: Path, umask_077: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the placeholder exists: without it, uvicorn's start sets 0666."""
    path = tmp_path / "d.sock"
    assert _modes_uvicorn_sets(path, monkeypatch) == [0o666]


def test_with_the_placeholder_uvicorn_keeps_it_owner_only(tmp_path: Path, umask_077: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.sock"
    _owner_only_placeholder(path)
    assert _modes_uvicorn_sets(path, monkeypatch) == [0o600]
    assert _mode(path) == 0o600


def test_the_daemons_start_never_gives_the_socket_more_than_its_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's own server class (sandboxd.cli.daemon.DrainingServer), started for real
    on a trivial app: every mode the socket file is given, in order, is owner-only until the
    configured one (0660 here), and the placeholder appears only after the lifespan."""
    from types import SimpleNamespace

    from sandboxd.cli.daemon import DrainingServer

    path = tmp_path / "d.sock"
    modes = _record_modes(path, monkeypatch)
    present_during_lifespan: list[bool] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "lifespan":
            message = await receive()  # type: ignore[operator]
            assert message["type"] == "lifespan.startup"
            present_during_lifespan.append(os.path.lexists(path))
            await send({"type": "lifespan.startup.complete"})  # type: ignore[operator]
            await receive()  # type: ignore[operator]
            await send({"type": "lifespan.shutdown.complete"})  # type: ignore[operator]

    settings = SimpleNamespace(uds_mode=0o660, uds_group=None)
    service = SimpleNamespace(settings=settings)
    config = uvicorn.Config(app, uds=str(path), lifespan="on", log_level="error")
    server = DrainingServer(config, service, 1.0)

    async def run() -> None:
        async def stop_once_started() -> None:
            await async_wait_until(lambda: server.started, timeout=30, interval=0.01,
                                   what="the server started")
            server.should_exit = True

        stopper = asyncio.create_task(stop_once_started())
        await server.serve()
        await stopper

    old_umask = os.umask(0o022)
    try:
        asyncio.run(asyncio.wait_for(run(), timeout=60))
    finally:
        os.umask(old_umask)
    assert present_during_lifespan == [False]
    assert modes == [0o600, 0o600, 0o660], [oct(m) for m in modes]
