"""Handing the C heap's free memory back to the kernel (the daemon's fixed
memory cost: what it holds while idle).

Start-up (imports, the app, the policy, the backends' first work) leaves freed blocks at the
top of glibc's heap that ``free`` keeps for later; ``malloc_trim(0)`` returns them (0.8 MiB
of an idle daemon, measured). Python's own small-object arenas are not affected."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("sandboxd.host.heap")


def trim() -> bool:
    """``malloc_trim(0)``: True when memory went back. False, quietly, without glibc."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and the like: nothing to trim this way
        return False
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    released = bool(fn(0))
    log.debug("malloc_trim after start-up: %s", "released" if released else "nothing to release")
    return released
