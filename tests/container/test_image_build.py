"""A daemon that builds its own missing images (setting ``build_images``, what ``make run``
sets): it serves ``python`` (restricted) at once, ``/readyz`` and a container tool's 503 name
the build and its step while it runs, and the tool works once the build is done, without a
restart. The build goes into a tag of this test's own (never the shared images other tests
use), with a sandbox uid of its own so that no cached layer makes it instant."""

from __future__ import annotations

import contextlib
import random
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from sandboxd.backends.container.build import ImageBuilds
from sandboxd.backends.container.config import ContainerConfig
from tests.support.daemon import running_daemon
from tests.support.wait import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "the daemon's own image build runs the same CLI on any host; the VM carries built images")]

STEP = re.compile(r"image (\S+) is being built \(step (\d+)/(\d+)\)")


@pytest.fixture
def own_tag(docker_client: Any) -> Iterator[str]:
    """An image name no other test uses, removed afterwards (the shared images stay)."""
    tag = f"sandboxd-test/build-{secrets.token_hex(4)}:latest"
    yield tag
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(tag, force=True)


@pytest.fixture
def state() -> Iterator[Path]:
    """A short state path (the runner's sockets live below it: 108 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-"))
    yield path / "state"
    shutil.rmtree(path, ignore_errors=True)


def test_a_daemon_without_its_image_builds_it_and_serves_meanwhile(
        tmp_path: Path, own_tag: str, state: Path, docker_client: Any) -> None:
    uid = str(random.randrange(20000, 29000))  # the image's user: a build no cache answers
    env = {"SANDBOXD_PYTHON_IMAGE": own_tag, "SANDBOXD_SHELL_IMAGE": own_tag,
           "SANDBOXD_SANDBOX_UID": uid, "SANDBOXD_SANDBOX_GID": uid,
           "SANDBOXD_BUILD_IMAGES": "python"}
    with running_daemon(tmp_path, env=env, state_dir=state) as d:
        ok = d.invoke("python", {"code": "print(6*7)"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["stdout"] == "42\n"

        def early_step() -> re.Match[str] | None:
            """/readyz names a step of the build with at least two more to go."""
            body = d.client.get("/readyz").json()
            reason = body["backends"]["container"].get("reason") or ""
            found = STEP.search(reason)
            assert body["images"][own_tag]["state"] != "failed", body
            return found if found and int(found[3]) - int(found[2]) >= 2 else None

        step = wait_until(early_step, timeout=600, what="the build's step on /readyz")
        assert step[1] == own_tag
        ready = d.client.get("/readyz").json()
        assert ready["ready"] is True  # python serves: the default backend is restricted
        assert "images" in ready["degraded"]
        assert ready["images"][own_tag]["profile"] == "python"

        refused = d.invoke("shell", {"command": "echo hi"})
        assert refused.status_code == 503, refused.text
        assert STEP.search(refused.json()["detail"])[1] == own_tag, refused.text

        def shell_works() -> bool:
            res = d.invoke("shell", {"command": "echo hi"})
            if res.status_code == 503:
                assert "is being built" in res.json()["detail"], res.text
                return False
            assert res.status_code == 200, res.text
            assert res.json()["stdout"] == "hi\n", res.text
            return True

        wait_until(shell_works, timeout=600, interval=0.5, what="shell after the build")
        done = d.client.get("/readyz").json()
        assert done["images"][own_tag]["state"] == "built", done
        assert "images" not in done["degraded"]
        assert "step: Step" in d.log()  # the build's progress is in the daemon's log
    image = docker_client.images.get(own_tag)
    assert image.attrs["Config"]["User"] == f"{uid}:{uid}"


async def test_a_failed_build_is_reported_never_retried(tmp_path: Path) -> None:
    """No engine at that address: the build fails, the 503's words say why, the builds end
    (no second attempt) and the backend was told once."""
    ended: list[str] = []
    config = ContainerConfig(state_dir=tmp_path, instance_name="t", python_image="p:1",
                             shell_image="p:1", build_profiles=("python",),
                             docker_url=f"unix://{tmp_path}/no-engine.sock")
    builds = ImageBuilds(config, lambda: ended.append("done"))
    builds.start()
    assert builds.unavailable("p:1") == "image p:1 is being built (waiting)"
    assert builds._task is not None
    await builds._task
    assert ended == ["done"]
    why = builds.unavailable("p:1")
    assert why is not None and why.startswith("the build of image p:1 failed: ")
    assert "the Docker engine is unreachable" in why
    assert builds.report()["p:1"]["state"] == "failed"
    assert builds.unavailable("other:1") is None
    await builds.close()
