"""Exec restriction with Landlock: a command of a plan confined to the programs it may run
(git to its own helpers, say), enforced by the kernel in the command's process before exec."""

from __future__ import annotations

import ctypes
import os
import struct

from .base import find_program


def restrict_exec(allowed: list[str], path: str) -> str | None:
    """From now on, let this process (and what it starts) execute only the programs named in
    ``allowed`` (names looked up on ``path``) and files beneath its absolute directories, plus
    their ELF interpreters: a Landlock ruleset that handles only EXECUTE. Returns a message
    when the kernel cannot enforce it (the caller then refuses to run the command)."""
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    targets = []
    for entry in allowed:
        entry = str(entry)
        if entry.startswith("/"):
            if os.path.exists(entry):
                targets.append(entry)
            continue
        found = find_program(entry, path)
        if found is not None:
            targets.append(found)
            interp = _elf_interpreter(found)
            if interp:
                targets.append(interp)
    abi = syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # create_ruleset VERSION
    if abi < 1:
        return (f"the kernel cannot confine it to {', '.join(map(str, allowed))} "
                f"(Landlock: {os.strerror(ctypes.get_errno())})")
    attr = ctypes.c_uint64(1)  # handled_access_fs = EXECUTE
    ruleset = syscall(444, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock: {os.strerror(ctypes.get_errno())}"

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    try:
        for target in targets:
            tfd = os.open(target, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneath(1, tfd)
                if syscall(445, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                           ctypes.c_uint32(0)) != 0:
                    return f"Landlock rule for {target}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(tfd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return f"no_new_privs: {os.strerror(ctypes.get_errno())}"
        if syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"Landlock: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return None


def _elf_interpreter(path: str) -> str | None:
    """The PT_INTERP path of an ELF executable (its dynamic loader), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] not in (1, 2):
                return None
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                (phoff,) = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                (phoff,) = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            for i in range(min(phnum, 64)):
                fh.seek(phoff + i * phentsize)
                ph = fh.read(phentsize)
                if len(ph) < 8 or struct.unpack_from(end + "I", ph, 0)[0] != 3:  # PT_INTERP
                    continue
                if head[4] == 2:
                    offset, size = struct.unpack_from(end + "Q", ph, 8)[0], struct.unpack_from(
                        end + "Q", ph, 32)[0]
                else:
                    offset, size = struct.unpack_from(end + "I", ph, 4)[0], struct.unpack_from(
                        end + "I", ph, 16)[0]
                fh.seek(offset)
                return fh.read(min(size, 4096)).rstrip(b"\0").decode() or None
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None
