"""The container backend's engine client against the real engine: what the engine answers for
what is not there, a container created from the backend's own create request, found by its
label, and removed (tests/unit/test_dockerapi.py covers the transport with a scripted
server)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import engine
from sandboxd.backends.container.config import ContainerConfig
from sandboxd.backends.container.dockerapi import APIError, Engine, NotFound
from sandboxd.config import Settings
from tests.support.wait import wait_until

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "the engine client's requests and the engine's answers: the same Debian docker.io on any "
    "host; what the engine then runs is test_confinement's and test_limits' in the VM")]


def test_missing_things_are_not_found(docker_client: Any) -> None:
    client = Engine()
    client.ping()
    with pytest.raises(NotFound, match="No such container"):
        client.inspect_container(f"sandboxd-missing-{secrets.token_hex(4)}")
    with pytest.raises(NotFound) as image:
        client.inspect_image(f"sandboxd/missing-{secrets.token_hex(4)}:latest")
    assert "No such image" in image.value.explanation
    client.close()


def test_a_container_from_the_backends_request(docker_client: Any, tmp_path: Path) -> None:
    settings = Settings()
    instance = f"t{secrets.token_hex(5)}"
    config = ContainerConfig(state_dir=tmp_path, instance_name=instance,
                             python_image=settings.python_image,
                             shell_image=settings.shell_image)
    rundir = tmp_path / "run"
    rundir.mkdir()
    spec = engine.Spec(name=f"sandboxd-{instance}", image=settings.python_image,
                       shape=engine.Shape(64 << 20, 500_000_000, 16), rundir=rundir,
                       role="probe", invocation="inv", workspace=None)
    client = engine.connect(config)
    cid = engine.create_and_start(client, config, engine.load_seccomp(config), spec)
    try:
        info = client.inspect_container(cid)
        host = info["HostConfig"]
        assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (64 << 20, 500_000_000,
                                                                         16)
        assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
        assert host["NetworkMode"] == "none" and info["Config"]["User"] == "10001:10001"
        assert engine.ours(client, instance) == [cid]
        # its runner finds no key in the runner directory and exits: the update waits for
        # that (an update that meets a container as it stops is refused by containerd)
        wait_until(lambda: not engine.is_running(client, cid), timeout=60,
                   what="the runner, given no key, exited")
        engine.update_shape(client, cid, engine.Shape(96 << 20, 250_000_000, 20))
        assert client.inspect_container(cid)["HostConfig"]["Memory"] == 96 << 20
        with pytest.raises(APIError) as taken:  # the name is taken: an answer, not NotFound
            engine.create_and_start(client, config, "{}", spec)
        assert taken.value.status_code == 409
    finally:
        assert engine.destroy(client, cid)
    assert engine.ours(client, instance) == []
    assert not engine.is_running(client, cid)
    client.close()
