"""``open`` for user code: confined to the workspace, writes capped in size."""

from __future__ import annotations

import builtins
import os
from typing import IO, Any

from sandboxd.backends.restricted.lang.guards import expose, plain_str
from sandboxd.backends.restricted.lang.state import SandboxViolation
from sandboxd.protocol.rules import PathRefused, normalise_path


@expose()
class WorkspaceOpener:
    """``open`` confined to the workspace (paths as
    :func:`sandboxd.protocol.rules.normalise_path` accepts them, no symlinks leaving it), with a
    cap on the bytes a file may hold after writing
    (RLIMIT_FSIZE backs this)."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def resolve(self, path: Any) -> str:
        if isinstance(path, bytes):
            path = bytes(path).decode("utf-8", "surrogateescape")
        if isinstance(path, str):
            path = plain_str(path, "path")
        if not isinstance(path, str) or not path or "\x00" in path:
            raise SandboxViolation("open(): the path must be a non-empty string")
        try:  # the one workspace path rule (protocol.rules), then containment of the real path
            rel = normalise_path(path)
        except PathRefused as exc:
            raise SandboxViolation(f"open(): '{path}' is not allowed: {exc}") from None
        full = os.path.join(self.root, rel)
        real = os.path.realpath(full)
        root_real = os.path.realpath(self.root)
        if real != root_real and not real.startswith(root_real.rstrip("/") + "/"):
            raise SandboxViolation(f"open(): '{path}' leads outside the workspace")
        return real

    def __call__(
        self,
        file: Any,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        mode = plain_str(mode, "mode")
        if set(mode) - set("rwaxbt+"):
            raise ValueError(f"open(): invalid mode {mode!r}")
        real = self.resolve(file)
        if "b" not in mode and encoding is None:
            encoding = "utf-8"
        return _CappedFile(
            builtins.open(real, mode, buffering, encoding, errors, newline),
            self.max_bytes,
            str(file),
        )


@expose("write", "writelines", "read", "readline", "readlines", "seek", "tell", "flush",
        "close", "closed", "name", "mode")
class _CappedFile:
    """A file object whose writes cannot grow the file past the cap."""

    __slots__ = ("_f", "_max", "_name")

    def __init__(self, f: IO[Any], max_bytes: int, name: str) -> None:
        self._f = f
        self._max = max_bytes
        self._name = name

    def write(self, data: Any) -> int:
        if isinstance(data, str):
            data = plain_str(data, "data")
            size = len(data.encode("utf-8", "surrogateescape"))
        else:
            data = bytes(memoryview(data))
            size = len(data)
        if self._f.tell() + size > self._max:
            raise OSError(f"file '{self._name}' would exceed the size limit of {self._max} bytes")
        return self._f.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def read(self, *args: Any) -> Any:
        return self._f.read(*args)

    def readline(self, *args: Any) -> Any:
        return self._f.readline(*args)

    def readlines(self, *args: Any) -> Any:
        return self._f.readlines(*args)

    def seek(self, *args: Any) -> Any:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    @property
    def name(self) -> str:
        return self._name

    @property
    def mode(self) -> str:
        return self._f.mode

    def __iter__(self) -> Any:
        return iter(self._f)

    def __enter__(self) -> _CappedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()
