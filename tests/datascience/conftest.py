"""Fixtures of the data-science profile tests: the real Docker engine (``docker_client``,
tests/conftest.py) and ``sandboxd/datascience:latest`` built from the current runner and
profile (``make images`` builds it; in CI a missing or stale image fails, never skips)."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.cli.images import PROFILES, images_dir, profile_digest, runner_digest
from tests.support.ci import require

PROFILE = PROFILES["datascience"]


@pytest.fixture(scope="session")
def datascience_image(docker_client: Any) -> str:
    """The data-science image's name, once it is known to be present and current."""
    import docker.errors

    assert PROFILE.tag is not None
    build = "run `sandboxd images build --offline --if-missing --profile datascience`"
    try:
        labels = docker_client.images.get(PROFILE.tag).labels
    except docker.errors.ImageNotFound:
        require(False, f"the image {PROFILE.tag} ({build})")
        raise
    current = (labels.get("sandboxd.runner.sha256") == runner_digest(images_dir())
               and labels.get("sandboxd.profile.sha256") == profile_digest(images_dir(), PROFILE))
    require(current, f"{PROFILE.tag} is older than the runner or its Dockerfile ({build})")
    return PROFILE.tag
