"""What ``sandboxd serve`` imports before it serves: every test daemon (and every restart) pays
it, ~30x slower under the VM job's emulation, where CI runs it. The MCP SDK (a third of the import
time) waits for the first MCP request, the client package and httpx for a client command.
(The Docker SDK is loaded: the container backend connects to the engine at start.)"""

from __future__ import annotations

import pytest

from tests.support.imports import CLIENT_SHARED, loaded

SERVE_PATH = f"""
import json, sys, tempfile
import sandboxd.cli  # the command line, as `python -m sandboxd serve` loads it
sandboxd.cli.build()
from sandboxd.api.app import create_app
from sandboxd.config import Settings
with tempfile.TemporaryDirectory() as state:
    create_app(Settings(state_dir=state))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {{"mcp", "mcp_types",
      "httpx", "sandboxd_client"}} and m not in {sorted(CLIENT_SHARED)!r}
      or m.startswith("sandboxd.client") or m == "sandboxd.api.mcp.server")))
"""


def test_serve_path_leaves_the_heavy_libraries_for_later() -> None:
    assert loaded(SERVE_PATH) == []


@pytest.mark.parametrize(("module", "heavy"), [("sandboxd.api.mcp.server", "mcp"),
                                              ("sandboxd_client.sandbox", "httpx")])
def test_the_guard_sees_a_heavy_import(module: str, heavy: str) -> None:
    """The check above can fail: importing the MCP door loads the SDK, the client httpx."""
    assert heavy in loaded(f"import {module}\n" + SERVE_PATH)
