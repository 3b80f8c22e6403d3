"""``import sandboxd.client`` must not pull in the daemon's server stack."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["fastapi", "uvicorn", "starlette", "docker", "RestrictedPython", "psutil", "pyseccomp",
         "seccomp", "prometheus_client", "jsonschema", "yaml", "typer", "pydantic_settings",
         "sandboxd.api", "sandboxd.service", "sandboxd.backends", "sandboxd.policy",
         "sandboxd.config", "sandboxd.tools"]


def test_client_import_is_light() -> None:
    code = (
        "import json, sys\n"
        "import sandboxd.client\n"
        "from sandboxd_client import Agent, SandboxClient, AsyncSandboxClient\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
        "for h in heavy))\n"
        "print(json.dumps({'loaded': loaded, 'httpx': 'httpx' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    report = json.loads(out.stdout)
    assert report["httpx"] is True
    assert report["loaded"] == []
