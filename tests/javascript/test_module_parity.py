"""One table of module rule cases through both enforcement points of the javascript tools, over
HTTP: the policy engine (a module named literally: the call is refused before it runs) and the
kernel's ``require`` (the same name computed at run time, hidden from the engine). Both must
reach the same decision (:func:`sandboxd.languages.javascript.verdict` is the engine's rule and
the kernel is handed its lists)."""

from __future__ import annotations

import json

import pytest

from sandboxd.languages.javascript import verdict

from .conftest import Daemon

pytestmark = pytest.mark.timeout(300)

#: (tool, module, admitted): the test policy denies os for javascript, and typescript's allow
#: lifts the built-in denial of worker_threads
CASES = [
    ("javascript", "path", True), ("javascript", "node:path", True),
    ("javascript", "fs/promises", True), ("javascript", "util", True),
    ("javascript", "os", False), ("javascript", "node:os", False),
    ("javascript", "child_process", False), ("javascript", "node:child_process", False),
    ("javascript", "http", False), ("javascript", "net", False), ("javascript", "vm", False),
    ("javascript", "worker_threads", False), ("typescript", "worker_threads", True),
    ("typescript", "os", True), ("typescript", "dgram", False),
]


@pytest.mark.parametrize(("tool", "module", "admitted"), CASES)
def test_the_engine_and_the_kernel_agree(daemon: Daemon, tool: str, module: str,
                                         admitted: bool) -> None:
    deny = ["os"] if tool == "javascript" else []
    allow = ["*"] if tool == "javascript" else ["*", "worker_threads"]
    assert verdict(module, allow, deny)[0] is admitted
    literal = daemon.call(tool, f"typeof require({json.dumps(module)})")
    hidden = daemon.call(tool, f"typeof require({json.dumps(list(module))}.join(''))")
    if admitted:
        assert literal["status"] == "ok" and literal["value"] == "object", literal
        assert hidden["status"] == "ok" and hidden["value"] == "object", hidden
    else:
        assert literal["status"] == "denied", literal
        assert literal["policy"]["rule"].startswith(f"tools.{tool}.modules"), literal
        assert hidden["status"] == "error", hidden
        assert hidden["message"].startswith(f"ModuleNotAllowed: module '{module}'"), hidden
