"""Sessions on the client side: :class:`SessionInfo` (what the daemon says of one) and
:class:`Session` / :class:`AsyncSession`, a session bound to its client, whose calls share
one workspace. One the client made (``client.session()``) is deleted on close; one it attached
to by id (``client.attach(id)``) is left to its owner (``delete()`` deletes it all the same)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from sandboxd_client.errors import ProblemError
from sandboxd_client.models import Result

if TYPE_CHECKING:
    from sandboxd_client.async_sandbox import AsyncSandboxClient
    from sandboxd_client.base import LimitsArg
    from sandboxd_client.events import StreamItem
    from sandboxd_client.sandbox import SandboxClient


@dataclass(frozen=True)
class SessionInfo:
    """A session as the daemon describes it."""

    id: str
    node: str | None = None  # the fleet node it lives on (docs/fleet.md)
    client: str | None = None
    created_at: float | str | None = None  # as the daemon sends it (epoch seconds)
    expires_at: float | str | None = None
    ttl_s: float | None = None
    workspace_bytes: int | None = None
    quota_bytes: int | None = None
    workspace_entries: int | None = None  # files and directories (inodes) in the workspace
    quota_entries: int | None = None
    #: ``{"live": bool, "backends": [...]}``: where the session's Python kernel lives
    kernel: dict[str, Any] | None = None
    #: its sandbox is paused, idle (holding no CPU; thawed by its next call)
    paused: bool | None = None
    #: after a restart: the backends whose kernel was ended
    restarted: list[str] | None = None
    interrupted: list[str] | None = None

    @property
    def kernel_live(self) -> bool:
        """Whether the session has a live Python kernel (variables kept) now."""
        return bool(self.kernel and self.kernel.get("live"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionInfo:
        """From the daemon's JSON, ignoring members this client does not know."""
        known: dict[str, Any] = {k: data.get(k) for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class ForkInfo:
    """What ``POST /v1/sessions/{id}/fork`` made: the new sessions, and whether the parent's
    Python state came with them (``kernel_carried``; ``kernel_reason`` says why not) and the
    names left out of it (``not_carried``: name -> why)."""

    parent: str
    sessions: list[SessionInfo]
    kernel_carried: bool
    kernel_reason: str | None = None
    not_carried: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForkInfo:
        kernel = data.get("kernel") or {}
        return cls(parent=str(data.get("parent")),
                   sessions=[SessionInfo.from_json(s) for s in data.get("sessions", [])],
                   kernel_carried=bool(kernel.get("carried")), kernel_reason=kernel.get("reason"),
                   not_carried={str(n.get("name")): str(n.get("why"))
                                for n in kernel.get("not_carried") or []})


class Session:
    """A daemon session bound to a :class:`SandboxClient`: calls share one workspace."""

    def __init__(self, client: SandboxClient, info: SessionInfo, *, owned: bool = True) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        #: deleted on close (made by this client); False: attached to by id, left open
        self.owned = owned
        self._closed = False

    def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
               limits: LimitsArg | None = None, **kwargs: Any) -> Result:
        """Run a tool in this session's workspace."""
        return self.client.invoke(tool, arguments, session=self.id, limits=limits, **kwargs)

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      limits: LimitsArg | None = None,
                      **kwargs: Any) -> Iterator[StreamItem]:
        """Run a tool in this session's workspace, its output as it is produced, then its
        Result (:meth:`SandboxClient.invoke_stream`)."""
        return self.client.invoke_stream(tool, arguments, session=self.id, limits=limits,
                                         **kwargs)

    def read_file(self, path: str, encoding: str = "utf-8") -> Any:
        """Content of a file of this session's workspace (``bytes`` with ``"base64"``)."""
        return self.client.read_file(path, session=self.id, encoding=encoding)  # type: ignore[call-overload]

    def write_file(self, path: str, content: str | bytes) -> Result:
        """Create or replace a file of this session's workspace (bytes: base64-encoded)."""
        return self.client.write_file(path, content, session=self.id)

    def upload(self, path: str, data: bytes | BinaryIO) -> Result:
        """Create or replace a workspace file with raw bytes or a binary file (streamed)."""
        return self.client.upload(self.id, path, data)

    def download(self, path: str) -> bytes:
        """The raw bytes of a workspace file."""
        return self.client.download(self.id, path)

    def list_files(self, path: str = ".") -> Any:
        """The entries of a directory of this session's workspace."""
        return self.client.list_files(path, session=self.id)

    def refresh(self) -> SessionInfo:
        """Re-read the session's description (usage, expiry)."""
        self.info = self.client.get_session(self.id)
        return self.info

    def restart(self) -> SessionInfo:
        """End the session's Python kernel: the next ``python`` call starts with fresh
        variables; the workspace files stay."""
        self.info = self.client.restart_session(self.id)
        return self.info

    def interrupt(self) -> SessionInfo:
        """Interrupt the call running in this session now (``KeyboardInterrupt``); its
        variables are kept when the interpreter comes back in time (``kernel.interrupted``
        on that call's result)."""
        self.info = self.client.interrupt_session(self.id)
        return self.info

    def fork(self, count: int = 1) -> list[Session]:
        """``count`` new sessions with a copy of this one's files, each a sandbox of its own
        (counted against this client's sessions; deleted on their close). The Python state is
        not carried yet: their first ``python`` call starts fresh (:class:`ForkInfo` says why:
        ``client.fork_session``)."""
        made = self.client.fork_session(self.id, count)
        return [Session(self.client, info, owned=True) for info in made.sessions]

    def close(self) -> None:
        """Done with the session: delete it when this client made it, else leave it open
        (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.owned:
            self.delete()

    def delete(self) -> None:
        """Delete the session and its workspace (an already expired session is fine)."""
        self._closed = True
        try:
            self.client.delete_session(self.id)
        except ProblemError as exc:
            if exc.status != 404:
                raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSession:
    """A daemon session bound to an :class:`AsyncSandboxClient`."""

    def __init__(self, client: AsyncSandboxClient, info: SessionInfo, *,
                 owned: bool = True) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        #: deleted on close (made by this client); False: attached to by id, left open
        self.owned = owned
        self._closed = False

    async def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                     limits: LimitsArg | None = None,
                     timeout: float | None = None, **kwargs: Any) -> Result:
        """Run a tool in this session's workspace (``timeout``: the HTTP wait, seconds)."""
        return await self.client.invoke(tool, arguments, session=self.id, limits=limits,
                                        timeout=timeout, **kwargs)

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      limits: LimitsArg | None = None,
                      **kwargs: Any) -> AsyncIterator[StreamItem]:
        """See :meth:`Session.invoke_stream` (``async for``)."""
        return self.client.invoke_stream(tool, arguments, session=self.id, limits=limits,
                                         **kwargs)

    async def read_file(self, path: str, encoding: str = "utf-8") -> Any:
        """Content of a file of this session's workspace (``bytes`` with ``"base64"``)."""
        return await self.client.read_file(path, session=self.id, encoding=encoding)

    async def write_file(self, path: str, content: str | bytes) -> Result:
        """Create or replace a file of this session's workspace (bytes: base64-encoded)."""
        return await self.client.write_file(path, content, session=self.id)

    async def upload(self, path: str, data: bytes | BinaryIO) -> Result:
        """Create or replace a workspace file with raw bytes or a binary file (streamed)."""
        return await self.client.upload(self.id, path, data)

    async def download(self, path: str) -> bytes:
        """The raw bytes of a workspace file."""
        return await self.client.download(self.id, path)

    async def list_files(self, path: str = ".") -> Any:
        """The entries of a directory of this session's workspace."""
        return await self.client.list_files(path, session=self.id)

    async def refresh(self) -> SessionInfo:
        """Re-read the session's description (usage, expiry)."""
        self.info = await self.client.get_session(self.id)
        return self.info

    async def restart(self) -> SessionInfo:
        """End the session's Python kernel (fresh variables next call; files stay)."""
        self.info = await self.client.restart_session(self.id)
        return self.info

    async def interrupt(self) -> SessionInfo:
        """Interrupt the call running in this session now (variables kept in time)."""
        self.info = await self.client.interrupt_session(self.id)
        return self.info

    async def fork(self, count: int = 1) -> list[AsyncSession]:
        """See :meth:`Session.fork`."""
        made = await self.client.fork_session(self.id, count)
        return [AsyncSession(self.client, info, owned=True) for info in made.sessions]

    async def close(self) -> None:
        """Done with the session: delete it when this client made it, else leave it open
        (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.owned:
            await self.delete()

    async def delete(self) -> None:
        """Delete the session and its workspace (an already expired session is fine)."""
        self._closed = True
        try:
            await self.client.delete_session(self.id)
        except ProblemError as exc:
            if exc.status != 404:
                raise

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
