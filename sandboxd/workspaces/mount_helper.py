"""The mount helper process of :mod:`sandboxd.workspaces.quota` and the mount calls it makes.

Kept to the standard library's light modules (no ``logging``, ``subprocess``, ``ctypes.util``,
``pathlib``, and no ``json`` nor ``socket``: both pull in ``enum`` and ``re``, 1.4 MiB of the
helper's 4.5): the helper runs for as long as the daemon does, started as ``python -I -S`` with
only this module on its path, and every module it imports is memory it keeps for the
daemon's whole life (part of the daemon's fixed cost). Its wire format is therefore its own
(:func:`encode_request`)."""

from __future__ import annotations

import ctypes
import errno
import os
import sys

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOATIME = 0x400
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8
FS_SOURCE = b"sandboxd-workspace"

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        # the C library this interpreter is linked with (its symbols, without a search)
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


def mount_tmpfs(path: str | os.PathLike[str], *, size_bytes: int, inodes: int,
                owner: tuple[int, int] | None) -> None:
    """Mount a size- and inode-limited tmpfs on the (empty, daemon-made) directory ``path``."""
    opts = f"size={int(size_bytes)},nr_inodes={int(inodes)},mode=0700"
    if owner is not None:
        opts += f",uid={int(owner[0])},gid={int(owner[1])}"
    rc = _lib().mount(FS_SOURCE, os.fsencode(path), b"tmpfs",
                      MS_NOSUID | MS_NODEV | MS_NOATIME, opts.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {os.fspath(path)}: {os.strerror(err)}")


def unmount(path: str | os.PathLike[str]) -> None:
    """Unmount ``path``; lazily (``MNT_DETACH``) when a process still uses it (a worker of a
    crashed daemon, say): it leaves the mount table at once and is freed with its last user."""
    lib = _lib()
    target = os.fsencode(path)
    if lib.umount2(target, UMOUNT_NOFOLLOW) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EBUSY and lib.umount2(target, UMOUNT_NOFOLLOW | MNT_DETACH) == 0:
        return
    err = ctypes.get_errno() or err
    raise OSError(err, f"unmount {os.fspath(path)}: {os.strerror(err)}")


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _valid_name(name: object) -> bool:
    """A direct child of the workspaces directory that a workspace may be (no "..", no "/")."""
    return (isinstance(name, str) and 0 < len(name) <= 128 and set(name) <= _NAME_CHARS
            and not name.startswith("."))


#: one request or reply, at most (a SOCK_SEQPACKET message)
MAX_MESSAGE = 4096
_SEP = b"\0"


def encode_request(msg: dict[str, object]) -> bytes:
    """``key=value`` fields separated by NUL: values are ASCII strings without NUL, ints, or
    None (empty). Anything else is refused here (EINVAL), not guessed at."""
    fields = []
    for key, value in msg.items():
        if value is None:
            text = ""
        elif isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
        elif isinstance(value, str) and value.isascii() and "\0" not in value:
            text = value
        else:
            raise OSError(errno.EINVAL, f"malformed request field {key}")
        fields.append(f"{key}={text}".encode())
    return _SEP.join(fields)


def decode_request(raw: bytes) -> dict[str, str]:
    """The helper's parse of :func:`encode_request` (ValueError when malformed)."""
    msg: dict[str, str] = {}
    for field in raw.decode("ascii").split("\0"):
        key, _, value = field.partition("=")
        if not key or key in msg:
            raise ValueError("malformed field")
        msg[key] = value
    return msg


def encode_reply(err: int = 0, message: str = "") -> bytes:
    """``b"ok"``, or the errno and its message separated by NUL."""
    if not err:
        return b"ok"
    return f"{err}".encode() + _SEP + message.encode("utf-8", "replace")[:MAX_MESSAGE - 16]


def decode_reply(raw: bytes) -> tuple[int, str]:
    """``(0, "")`` for success, else ``(errno, message)`` (EIO when malformed)."""
    if raw == b"ok":
        return 0, ""
    code, _, message = raw.partition(_SEP)
    return (int(code) if code.isdigit() and int(code) > 0 else errno.EIO,
            message.decode("utf-8", "replace") or "mount helper error")


def _number(text: str | None) -> int:
    """A positive decimal integer field, else EINVAL."""
    if text is None or not text.isdigit() or len(text) > 20 or int(text) <= 0:
        raise OSError(errno.EINVAL, "bad mount limits")
    return int(text)


def _limits(msg: dict[str, str]) -> tuple[int, int, tuple[int, int] | None]:
    """A ``create`` request's size, inode limit and owner (EINVAL when malformed)."""
    uid = None if msg.get("uid", "") == "" else _number(msg.get("uid"))
    return (_number(msg.get("size")), _number(msg.get("inodes")),
            (uid, uid) if uid is not None else None)


def _mount_on(name: str, limits: tuple[int, int, tuple[int, int] | None], root_fd: int,
              root_dev: int) -> None:
    """Mount the workspace tmpfs on ``root/name``, an empty directory of the workspaces."""
    size, inodes, owner = limits
    dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                  dir_fd=root_fd)
    try:
        if os.fstat(dfd).st_dev != root_dev or os.listdir(dfd):
            raise OSError(errno.EBUSY, "not an empty directory of the workspaces")
        mount_tmpfs(f"/proc/self/fd/{dfd}", size_bytes=size, inodes=inodes, owner=owner)
    finally:
        os.close(dfd)


def _handle(raw: bytes, root_fd: int, root_dev: int) -> None:
    """One request: ``create`` makes the directory and mounts the tmpfs on it (the directory
    goes again when the mount fails); ``remove`` unmounts it (when mounted) and removes the
    then empty directory; ``umount`` only unmounts (the daemon's threads then remove what the
    workspace held below the mount point). A workspace's start and end in one exchange each,
    none of its file system work in the daemon (no daemon CPU
    or thread for each step of a call's workspace)."""
    msg = decode_request(raw)
    name = msg.get("name")
    if not isinstance(name, str) or not _valid_name(name):
        raise OSError(errno.EINVAL, "not a workspace name")
    op = msg.get("op")
    if op == "create":
        limits = _limits(msg)  # refused before the mkdir
        os.mkdir(name, 0o700, dir_fd=root_fd)
        try:
            _mount_on(name, limits, root_fd, root_dev)
        except BaseException:
            os.rmdir(name, dir_fd=root_fd)
            raise
    elif op == "umount":
        unmount(f"/proc/self/fd/{root_fd}/{name}")
    elif op == "remove":
        try:
            unmount(f"/proc/self/fd/{root_fd}/{name}")
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a mount point (any more)
                raise
        os.rmdir(name, dir_fd=root_fd)  # ENOTEMPTY: files of an unmounted one, not ours to walk
    else:
        raise OSError(errno.EINVAL, "unknown operation")


def _answer(sock_fd: int, root_fd: int, root_dev: int) -> bool:
    """Read one request from ``sock_fd`` and answer it; False when the daemon is gone."""
    raw = os.read(sock_fd, MAX_MESSAGE)  # one message of the SOCK_SEQPACKET pair
    if not raw:
        return False
    reply = encode_reply()
    try:
        _handle(raw, root_fd, root_dev)
    except OSError as exc:
        reply = encode_reply(exc.errno or errno.EIO, exc.strerror or str(exc))
    except (ValueError, TypeError):
        reply = encode_reply(errno.EINVAL, "malformed request")
    os.write(sock_fd, reply)
    return True


def _helper_serve(sock_fds: list[int], root_fd: int) -> None:
    """Answer requests on every socket, each in its order, until the daemon is gone (EOF on
    any of them)."""
    import select  # a C module: no enum, no re

    root_dev = os.fstat(root_fd).st_dev
    while True:
        ready, _, _ = select.select(sock_fds, [], [])
        for fd in ready:
            if not _answer(fd, root_fd, root_dev):
                return


def helper_main() -> None:
    """Entry point of the mount helper process: argv[1] its ends of the socket pairs (comma
    separated: the daemon's threads use one, its event loop the other), argv[2] a descriptor
    of the workspaces directory."""
    # the C module: ``signal`` builds enums of its constants (0.7 MiB)
    import _signal  # type: ignore[import-not-found]

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a Ctrl-C of the daemon's terminal
    _helper_serve([int(fd) for fd in sys.argv[1].split(",")], int(sys.argv[2]))


def helper_argv(package_parent: str, sock_fds: list[int], root_fd: int) -> list[str]:
    """The helper's command line: an isolated interpreter without ``site`` (no environment, no
    site-packages) that finds only the package at ``package_parent``."""
    boot = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from sandboxd.workspaces.mount_helper import helper_main; helper_main()")
    return [sys.executable, "-I", "-S", "-c", boot, ",".join(map(str, sock_fds)), str(root_fd)]
