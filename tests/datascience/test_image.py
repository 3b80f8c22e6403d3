"""``sandboxd images build --profile``: the data-science image's make-up and the CLI's
profile handling."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from sandboxd.cli.images import PROFILES, images_dir, runner_digest
from sandboxd.config import Settings


def images_build(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandboxd", "images", "build", *args],
                          capture_output=True, text=True, check=False, timeout=timeout)


def test_an_unknown_profile_is_one_clear_line() -> None:
    res = images_build("--profile", "datasience")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"sandboxd images build: unknown profile 'datasience' (known: {', '.join(PROFILES)})"]
    assert "Traceback" not in res.stderr + res.stdout


def test_if_missing_finds_the_image_current(datascience_image: str) -> None:
    res = images_build("--offline", "--if-missing", "--profile", "datascience", timeout=3600)
    assert res.returncode == 0, res.stderr
    assert f"{datascience_image} is up to date" in res.stdout, res.stdout


def test_the_image_keeps_the_sandbox_setup(docker_client: Any, datascience_image: str) -> None:
    image = docker_client.images.get(datascience_image)
    base = docker_client.images.get(Settings().python_image)
    config = image.attrs["Config"]
    assert config["User"] == base.attrs["Config"]["User"] == "10001:10001"
    assert config["WorkingDir"] == "/workspace"
    assert config["Entrypoint"] == base.attrs["Config"]["Entrypoint"]
    assert image.labels["sandboxd.profile"] == "datascience"
    # the runner the daemon expects (not necessarily the python image's: that one may be older)
    assert image.labels["sandboxd.runner.sha256"] == runner_digest(images_dir())


PROBE = """\
import json, os, warnings
warnings.simplefilter("error")  # any warning on import (e.g. an unwritable config dir) fails
import numpy, pandas, scipy, sklearn, matplotlib, matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3])
fig.savefig("/tmp/probe.png")
setuid = [os.path.join(d, f) for d, _, fs in os.walk("/usr") for f in fs
          if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f))
          and os.stat(os.path.join(d, f)).st_mode & 0o6000]
print(json.dumps({"backend": matplotlib.get_backend(), "configdir": matplotlib.get_configdir(),
                  "uid": os.getuid(), "setuid": setuid, "versions": {
                      m.__name__: m.__version__ for m in (numpy, pandas, scipy, sklearn,
                                                          matplotlib)}}))
"""


def test_the_stack_runs_as_the_sandbox_user_on_a_read_only_root(
        docker_client: Any, datascience_image: str) -> None:
    out = docker_client.containers.run(
        datascience_image, entrypoint=["python3", "-c", PROBE], remove=True,
        network_mode="none", read_only=True, cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        tmpfs={"/tmp": "rw,noexec,nosuid,nodev,size=64m,mode=1777"}, stderr=True)
    info = json.loads(out.decode().strip().splitlines()[-1])
    assert info["backend"].lower() == "agg" and info["configdir"] == "/tmp/matplotlib", info
    assert info["uid"] == 10001 and info["setuid"] == [], info
    assert set(info["versions"]) == {"numpy", "pandas", "scipy", "sklearn", "matplotlib"}
