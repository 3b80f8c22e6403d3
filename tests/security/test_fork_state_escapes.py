"""The unpickler a fork's kernel restores its parent's state with (``lang.carry``) admits only
what the parent's honest pickler writes for user state: a crafted state (what a parent that
escaped its language layer could send) naming any other host callable, a function on other
globals or an unknown reference is refused whole, and nothing of it is left in the namespace.
What it restores runs with the sandbox's guarded builtins, never the host's. The real
unpickler, in process: the daemon only relays these bytes, so no API can send crafted ones."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import cloudpickle
import pytest

from sandboxd.backends.restricted import lang
from sandboxd.backends.restricted.frames import REPORT_SLACK
from sandboxd.backends.restricted.lang import carry
from sandboxd.backends.restricted.lang.files import WorkspaceOpener
from sandboxd.backends.restricted.lang.modules import ImportHook
from sandboxd.protocol.call import WorkerReport


def _run(code: str, namespace: dict[str, Any], tmp: str) -> dict[str, Any]:
    return lang.run_user_code(code, imports_allow=["math"], imports_deny=[], workspace=tmp,
                              output_bytes=65536, max_file_bytes=1024,
                              emit=lambda kind, data: None, namespace=namespace)


def _fresh(tmp: str) -> tuple[dict[str, Any], ImportHook]:
    hook = ImportHook(["math"], [])
    namespace: dict[str, Any] = {}
    lang.refresh_namespace(namespace, lang.make_globals(
        hook, WorkspaceOpener(tmp, 1024), None))  # type: ignore[arg-type]
    return namespace, hook


class _Call:
    """Pickles as a call of ``func`` with ``args`` (what a crafted state would hold)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> Any:
        return self.func, self.args


CRAFTED = [
    pytest.param({"x": _Call(os.system, "true")}, id="os.system"),
    pytest.param({"x": _Call(getattr, [], "__class__")}, id="builtins.getattr"),
    pytest.param({"x": _Call(eval, "1")}, id="builtins.eval"),
    pytest.param({"x": _Call(__import__, "os")}, id="builtins.__import__"),
    pytest.param({"x": _Call(carry._cp.subimport, "os")}, id="cloudpickle.subimport"),
    pytest.param({"x": _Call(carry._cp._make_function, compile("1", "f", "eval"), {}, "f",
                             None, None)}, id="function-on-other-globals"),
    pytest.param({"_getattr_": 1}, id="a-trusted-name"),
]


@pytest.mark.parametrize("state", CRAFTED)
def test_a_crafted_state_is_refused_whole(state: dict[str, Any], tmp_path: Any) -> None:
    namespace, hook = _fresh(str(tmp_path))
    before = dict(namespace)
    blob = cloudpickle.dumps({"kept": 1, **state}, protocol=5)
    with pytest.raises((pickle.UnpicklingError, TypeError)):
        carry.restore(namespace, blob, hook)
    assert namespace == before  # nothing half-restored


def test_restored_functions_use_the_sandbox_builtins_and_the_forks_globals(
        tmp_path: Any) -> None:
    parent: dict[str, Any] = {}
    assert _run("import math\nlimit = 3\ndef f():\n    return [limit, open, math.floor(2.5)]\n"
                "m = [].append", parent, str(tmp_path))["outcome"] == "ok"
    blob, not_carried, error = carry.snapshot(parent, ImportHook(["math"], []), 1 << 20)
    assert blob is not None and error is None
    assert set(not_carried) == {"m"} and "host" in not_carried["m"]
    fork, hook = _fresh(str(tmp_path))
    assert sorted(carry.restore(fork, bytes(blob), hook)) == ["f", "limit", "math"]
    report = _run("limit = 9\nr = f()\n[r[0], type(r[1]).__name__, r[2]]", fork, str(tmp_path))
    assert report["value"] == [9, "WorkspaceOpener", 2], report
    assert fork["f"].__builtins__ is fork["__builtins__"]
    assert "eval" not in fork["__builtins__"]


def test_a_namespace_of_many_uncarriable_names_keeps_its_report_bounded(tmp_path: Any) -> None:
    """Thousands of generators (long names too) are reported within the report's bounds:
    the kernel never breaks its protocol, which would cost the parent its kernel."""
    parent: dict[str, Any] = {}
    code = f"for i in range(5000):\n    pass\n{'g' * 300} = (i for i in [])\n" + "".join(
        f"gen{i} = (i for i in [])\n" for i in range(5000))
    assert _run(code, parent, str(tmp_path))["outcome"] == "ok"
    blob, not_carried, error = carry.snapshot(parent, ImportHook(["math"], []), 1 << 20)
    assert blob is not None and error is None and len(not_carried) == 5001
    shown = carry.reported(not_carried)
    report = WorkerReport(outcome="ok", not_carried=shown)
    assert WorkerReport.from_wire(report.to_wire()) == report
    assert len(shown) == carry.MAX_REPORTED + 1 and "4745 more" in shown["..."]
    assert len(json.dumps(report.to_wire())) < REPORT_SLACK
