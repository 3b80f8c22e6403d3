"""A real daemon whose restricted workers run *unrestricted* Python for code that starts with
``#bypass`` - as if RestrictedPython had been escaped - with every process-layer confinement
(namespaces, uid, chroot, seccomp, rlimits, cgroup) exactly as in production.

How: a ``sitecustomize`` on the daemon's PYTHONPATH (tests only) adds, to the program the
daemon boots its zygote with, a wrapper around ``lang.run_user_code``. The bypassed code runs
with plain ``exec`` and real builtins; only modules the zygote pre-imported can be imported
(the worker is chrooted), and the policy refuses import statements of modules it does not
allow: ``ctypes``, ``os``, ``resource`` and ``time`` are handed in as globals instead.
Whatever the code assigns to ``result`` is the call's ``value``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.daemon import RunningDaemon, running_daemon

MARK = "#bypass\n"

_WRAPPER = '''
from sandboxd.backends.restricted import lang as _lang
_run_user_code = _lang.run_user_code
def _bypass(source, **kw):
    if not source.startswith(MARK):
        return _run_user_code(source, **kw)
    import ctypes, os, resource, time
    g = {"__name__": "__bypass__", "ctypes": ctypes, "os": os, "resource": resource,
         "time": time}
    try:
        exec(source, g)
    except BaseException as exc:
        return {"outcome": "error", "exit_code": 1, "message": repr(exc)[:500]}
    return {"outcome": "ok", "exit_code": 0, "value": g.get("result")}
_lang.run_user_code = _bypass
'''.replace("MARK", repr(MARK))

SITECUSTOMIZE = f'''
import sandboxd.backends.restricted.zygote_client as _zygote_client
_anchor = "from sandboxd.backends.restricted.zygote import main\\n"
assert _anchor in _zygote_client._BOOT
_zygote_client._BOOT = _zygote_client._BOOT.replace(_anchor, {_WRAPPER!r} + _anchor)
'''


@contextlib.contextmanager
def bypass_daemon(tmp_path: Path, **kwargs: object) -> Iterator[RunningDaemon]:
    """:func:`running_daemon` whose restricted workers honour :data:`MARK`."""
    site = tmp_path / "bypass-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(kwargs.pop("env", None) or {})  # type: ignore[call-overload]
    env["PYTHONPATH"] = str(site)
    with running_daemon(tmp_path, env=env, **kwargs) as daemon:  # type: ignore[arg-type]
        yield daemon
