"""The container backend's engine client (:mod:`sandboxd.backends.container.dockerapi`) against
a real HTTP server on a unix socket that answers as told: what is an answer, what is no
answer, kept connections, and bounds. tests/container/test_dockerapi_engine.py runs it
against the real engine."""

from __future__ import annotations

import json
import os
import resource
import socket
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import dockerapi
from sandboxd.backends.container.dockerapi import APIError, Engine, EngineError, NoAnswer, NotFound
from tests.support.scripted_engine import ScriptedEngine, stop_listening


def _engine(srv: ScriptedEngine, **kwargs: Any) -> Engine:
    return Engine(f"unix://{srv.server_address}", **kwargs)


def test_a_json_answer_is_parsed_and_the_request_is_the_apis(server: ScriptedEngine) -> None:
    server.answer = lambda m, p, b: (201, "application/json", b'{"Id": "abc", "Warnings": []}')
    engine = _engine(server)
    assert engine.create({"Image": "img"}, "sb-1") == "abc"
    method, path, body = server.seen[-1]
    assert (method, path, json.loads(body)) == ("POST", "/containers/create?name=sb-1",
                                                {"Image": "img"})
    server.answer = lambda m, p, b: (200, "application/json", b'[{"Id": "a"}, {"Id": "b"}]')
    assert engine.container_ids("sandboxd.daemon=x y") == ["a", "b"]
    assert server.seen[-1][1] == ("/containers/json?all=1&filters=%7B%22label%22%3A+%5B%22"
                                  "sandboxd.daemon%3Dx+y%22%5D%7D")
    server.answer = lambda m, p, b: (204, "", b"")
    engine.remove("a/../b")  # an id is one path segment, whatever it holds
    engine.pause("c")
    assert [s[:2] for s in server.seen[-2:]] == [("DELETE", "/containers/a%2F..%2Fb?force=1&v=1"),
                                                ("POST", "/containers/c/pause")]
    server.answer = lambda m, p, b: (200, "application/json", b'{"Id": "sha256:1"}')
    assert engine.inspect_image("sandboxd/python:latest") == {"Id": "sha256:1"}
    assert server.seen[-1][1] == "/images/sandboxd/python:latest/json"
    engine.close()


def test_error_answers_carry_the_engines_explanation(server: ScriptedEngine) -> None:
    server.answer = lambda m, p, b: (404, "application/json",
                                     b'{"message": "No such container: nope"}')
    engine = _engine(server)
    with pytest.raises(NotFound) as found:
        engine.inspect_container("nope")
    assert found.value.status_code == 404
    assert found.value.explanation == "No such container: nope"
    assert "GET /containers/nope/json" in str(found.value)
    server.answer = lambda m, p, b: (409, "text/plain", b"  removal in progress\n")
    with pytest.raises(APIError) as refused:
        engine.remove("c")
    assert not isinstance(refused.value, NotFound)
    assert (refused.value.status_code, refused.value.explanation) == (409, "removal in progress")
    engine.close()


def test_answers_that_are_not_what_was_asked_for_are_errors(
        server: ScriptedEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(server)
    server.answer = lambda m, p, b: (200, "application/json", b'["a list"]')
    with pytest.raises(EngineError, match="not an object"):
        engine.inspect_container("c")
    server.answer = lambda m, p, b: (200, "application/json", b"{not json")
    with pytest.raises(EngineError, match="not JSON"):
        engine.inspect_container("c")
    monkeypatch.setattr(dockerapi, "MAX_ANSWER_BYTES", 1000)
    server.answer = lambda m, p, b: (200, "application/json", b'"' + b"x" * 2000 + b'"')
    with pytest.raises(EngineError, match="over 1000 bytes"):
        engine.inspect_container("c")
    server.answer = lambda m, p, b: (200, "application/json", b"{}")
    assert engine.inspect_container("c") == {}  # the over-long answer's connection was dropped
    engine.close()


def test_connections_are_kept_and_a_dropped_one_is_replaced(server: ScriptedEngine) -> None:
    engine = _engine(server)
    for _ in range(5):
        engine.ping()
    assert server.connections == 1
    server.close_after_answer = True  # the engine closes each connection after its answer
    for _ in range(3):
        engine.ping()  # the kept connection was closed: a fresh one, and no error
    assert server.connections > 1
    engine.close()


def test_no_engine_is_no_answer(tmp_path: Path) -> None:
    engine = Engine(f"unix://{tmp_path / 'missing.sock'}")
    with pytest.raises(NoAnswer, match="did not answer GET /_ping"):
        engine.ping()


def test_an_engine_that_never_answers_is_no_answer_after_the_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "mute.sock")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(path)
    mute.listen(1)  # accepts (the kernel's backlog) and never reads nor answers
    try:
        with pytest.raises(NoAnswer, match="timed out"):
            Engine(f"unix://{path}", timeout=0.2).ping()
    finally:
        mute.close()


def test_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    assert dockerapi.address(None).unix_path == "/var/run/docker.sock"
    assert dockerapi.address("unix:///run/user/1000/docker.sock").unix_path == (
        "/run/user/1000/docker.sock")
    tcp = dockerapi.address("tcp://127.0.0.1:2375")
    assert (tcp.unix_path, tcp.host, tcp.port, tcp.tls) == (None, "127.0.0.1", 2375, None)
    assert dockerapi.address("https://127.0.0.1").tls is not None
    monkeypatch.setenv("DOCKER_HOST", "unix:///srv/engine.sock")
    assert dockerapi.address(None).unix_path == "/srv/engine.sock"
    assert dockerapi.address("unix:///x.sock").unix_path == "/x.sock"  # the setting wins
    for bad in ("ssh://user@host", "tcp://", "unix://", "npipe:////./pipe/docker_engine"):
        with pytest.raises(ValueError, match="Docker engine address"):
            dockerapi.address(bad)


def test_connections_are_kept_with_descriptors_above_1024(server: ScriptedEngine) -> None:
    """A busy daemon holds many descriptors; a kept connection numbered above FD_SETSIZE is
    still checked (``poll``, not ``select``) and kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    spare = os.open(os.devnull, os.O_RDONLY)
    low = []
    try:
        while (fd := os.dup(spare)) < 1030:  # the connection's socket lands above 1024
            low.append(fd)
        os.close(fd)
        engine = _engine(server)
        for _ in range(4):
            engine.ping()
        assert server.connections == 1
        engine.close()
    finally:
        for fd in (*low, spare):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stopping_engine_is_seen_on_a_fresh_connection(server: ScriptedEngine) -> None:
    """A stopping engine closes its listener first and still answers on the connections it
    has: a kept connection cannot tell, a fresh one can."""
    engine = _engine(server)
    engine.ping()
    stop_listening(server)
    engine.ping()  # the kept connection is still answered
    with pytest.raises(NoAnswer, match="did not answer GET /_ping"):
        engine.ping(fresh=True)
    engine.close()
