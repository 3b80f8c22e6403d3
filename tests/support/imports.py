"""What a fresh interpreter imported: the one way tests ask (import cost is start-up time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def loaded(code: str) -> list[str]:
    """Run ``python -c code`` (no configuration file) and return the JSON list its last line
    of output prints (the code prints the names of the modules it asks about)."""
    env = {**os.environ, "SANDBOXD_CONFIG": os.devnull}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    return list(json.loads(out.stdout.splitlines()[-1]))


#: the thin client's modules a daemon (or the stdio bridge) may load: the package itself (its
#: names load on first use), its deadline idiom and its answer models (the daemon's build on
#: them); any other ``sandboxd_client`` module is the client's machinery (httpx, the agent)
CLIENT_SHARED = frozenset({"sandboxd_client", "sandboxd_client.deadline",
                           "sandboxd_client.models", "sandboxd_client.output_items"})
