"""The zygote's ``fork()``: libc's, without Python's at-fork handlers.

``os.fork()`` runs every handler registered with ``os.register_at_fork`` - ``threading``
rebuilds its locks and thread table, ``logging`` its handlers' locks, ``random`` reseeds -
and each of them touches objects the zygote shares with every worker: measured, a bare
worker then owns about 0.8 MiB more private memory (copied pages) than after libc's
``fork()``, and the zygote itself diverges by as much again at every fork. None of it is
needed here: the zygote is single-threaded (:func:`check_single_threaded`, at its start),
so no lock can be held by another thread at the fork; the forking thread keeps the GIL
across the call (``PyDLL``: the call does not release it), and glibc's own ``pthread_atfork``
handlers (malloc's locks, OpenSSL's fork detection) still run. What a worker does need of
them, it redoes itself (:func:`after_fork_in_worker`).
"""

from __future__ import annotations

import ctypes
import os
import sys

#: libc through ``PyDLL``: the GIL is held across ``fork()``, as ``os.fork()`` holds it
_LIBC = ctypes.PyDLL(None, use_errno=True)
_LIBC.fork.restype = ctypes.c_int
_LIBC.fork.argtypes = []


def check_single_threaded() -> None:
    """Refuse to go on in a process with more than one thread: a bare ``fork()`` there could
    copy a lock another thread holds."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise RuntimeError(f"the zygote must be single-threaded to fork; it has {len(threads)}")


def fork() -> int:
    """``fork(2)`` through libc: 0 in the child, the child's pid in the parent."""
    pid = int(_LIBC.fork())
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def after_fork_in_worker() -> None:
    """What a worker needs of the skipped handlers: its own ``random`` sequence (sibling
    sandboxes must not draw the same numbers). ``tempfile`` reseeds itself on a new pid."""
    module = sys.modules.get("random")
    if module is not None:
        module.seed()
