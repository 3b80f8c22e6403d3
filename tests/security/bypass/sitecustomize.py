"""Test-only: emulate a bypassed language layer in a *real* daemon.

A daemon started with this directory on ``PYTHONPATH`` (see ``test_worker_frames.py``) starts
its zygote with one extra line: user code that begins with ``#unrestricted`` is run with plain
``exec`` (no RestrictedPython) inside the fully confined worker, with ``emit`` (the worker's
frame writer), ``fd`` (its result socket), ``os``, ``struct`` and ``time`` in scope (no
import statement: the policy refuses those before anything runs) - as if the code had escaped
the language layer. Everything else (zygote, confinement, the daemon's reader) is the real
thing. The zygote itself runs with ``-E``, so this file cannot reach it except through the
daemon.
"""

from __future__ import annotations

_PATCH = '''
from sandboxd.backends.restricted import lang as _lang
_real_run = _lang.run_user_code
def _bypassed(source, *, emit, **kw):
    if not source.startswith("#unrestricted"):
        return _real_run(source, emit=emit, **kw)
    import os, struct, time
    scope = {"emit": emit, "fd": emit.__closure__[0].cell_contents, "os": os,
             "struct": struct, "time": time}
    exec(source, scope)
    return scope.get("report", {"outcome": "ok", "exit_code": 0, "value": None})
_lang.run_user_code = _bypassed
'''

try:
    from sandboxd.backends.restricted import zygote_client as _zygote_client

    _zygote_client._BOOT = _zygote_client._BOOT.replace("main(cfg)\n", _PATCH + "main(cfg)\n")
except Exception as exc:  # pragma: no cover - makes a broken harness visible in the log
    import sys

    print(f"bypass sitecustomize failed: {exc!r}", file=sys.stderr)
