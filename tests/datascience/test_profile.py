"""`make run PROFILE=datascience` and the README's data-science example, as a newcomer runs
them (the README said to copy the policy and add a token; `make run` had neither, and
every tokenless example then answered 401): the daemon `make run` starts, and the README's own
Python block, taken from the README and run unchanged but for the port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.daemon import free_port, uid_range_env
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The Python block of the README's "Data analysis" section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Data analysis"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_make_run_datascience_serves_the_readme_example(datascience_image: str,
                                                        tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    # (its stop ends the example's sessions: no workspace mount outlives the test)
    env |= uid_range_env() | {"SANDBOXD_CONFIG": os.devnull,
                              "SANDBOXD_INSTANCE": f"dsprofile{port}",
                              "SANDBOXD_SESSIONS_SURVIVE_RESTART": "false"}
    log = tmp_path / "make-run.log"
    with open(log, "wb") as out:
        make = subprocess.Popen(
            ["make", "run", "PROFILE=datascience", f"PORT={port}", f"STATE={tmp_path / 'state'}"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=2) as client:
            def up() -> bool:
                assert make.poll() is None, log.read_text()
                return client.get("/healthz").status_code == 200

            wait_until(up, timeout=900, what="make run PROFILE=datascience serving",
                       ignore=(httpx.HTTPError,))
        code = readme_example().replace("http://127.0.0.1:8765", url)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=600, cwd=tmp_path)
    finally:
        # a Ctrl-C, as a user stops it: the daemon drains and exits (its mount helper,
        # which ignores it, unmounts the workspaces first; a SIGTERM would end it at once)
        os.killpg(make.pid, signal.SIGINT)
        make.wait(120)
    assert run.returncode == 0, run.stderr + log.read_text()[-2000:]
    out = run.stdout
    assert out.startswith("ok "), out
    for line in ("east      60", "north    270", "south    175", "640 x 480",
                 "[['text/html', 'text/plain']]"):
        assert line in out, out
    assert "b'\\x89PNG\\r\\n\\x1a\\n'" in out, out
    assert "policies/examples/datascience.yaml" in log.read_text()
