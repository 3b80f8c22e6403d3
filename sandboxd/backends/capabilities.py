"""What a backend may do beyond the core :class:`~sandboxd.backends.base.Backend`: optional
capabilities, each a small runtime-checkable protocol that a backend declares by subclassing
it (``class ContainerBackend(Backend, KernelLanguages, Pausable, ...)``).

A caller asks for a capability with its helper (:func:`kernel_host`, :func:`pausable`, ...),
which returns the backend as that capability or None; a backend without it is simply left out
(no kernel to restart, nothing to pause), so no backend carries no-op defaults for what it
cannot do. The protocols' bodies are docstrings only: a backend that declares one implements
every member (mypy refuses to build one that does not; ``tests/unit/test_backend_capabilities
.py`` states which backend declares what).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol, cast, runtime_checkable

from sandboxd.backends.base import PYTHON, Backend, KernelState, kernel_name


@runtime_checkable
class KernelHost(Protocol):
    """A backend that keeps a persistent Python kernel per session between its calls."""

    def kernel_sessions(self) -> AbstractSet[str]:
        """Ids of the sessions that have a live kernel on this backend now (the service caps
        their number host-wide: ``max_kernels``). Asked on every kernel call, for one
        session's membership or the count: a host with thousands of sessions answers with a
        view of what it keeps, not a copy."""

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's kernel, if it has one (the next session ``python`` call starts a
        fresh one; the workspace is kept). ``True`` when a kernel was ended. Idempotent."""

    def interrupt_kernel(self, session_id: str) -> bool:
        """Interrupt the ``python`` call that runs in the session's kernel now, if any: its
        code gets a ``KeyboardInterrupt``; the call ends ``killed`` (``cancelled``) and the
        kernel is kept when it comes back within ``kernel_interrupt_grace_s``
        (a runaway call need not cost the session its state).
        ``True`` when a call was running."""


@runtime_checkable
class KernelLanguages(KernelHost, Protocol):
    """A kernel host whose sessions may have a kernel per language (python, bash, ...), each
    lost or kept on its own. A kernel host without this capability keeps Python kernels only."""

    def session_kernels(self) -> set[tuple[str, str]]:
        """``(session id, language)`` of each live kernel on this backend now."""


@runtime_checkable
class Hibernating(Protocol):
    """A kernel host that puts idle kernels to sleep on disk: they are still the sessions'
    live kernels (:meth:`KernelHost.kernel_sessions` lists them) but hold no memory, so they
    do not count against ``max_kernels``; waking one is admitted as starting one is."""

    def hibernated_sessions(self) -> AbstractSet[str]:
        """Ids of the sessions whose kernel sleeps on disk now (a view, as
        :meth:`KernelHost.kernel_sessions`)."""


@runtime_checkable
class KernelCarrier(Protocol):
    """A backend that can carry a session kernel's state to the session's forks."""

    async def snapshot_kernel(self, session_id: str, limit: int,
                              deadline: float) -> KernelState | None:
        """The session's live kernel's state, pickled inside its sandbox (at most ``limit``
        bytes), for its forks; ``None`` when there is no live kernel to carry."""

    def seed_kernel(self, session_id: str, state: bytes) -> None:
        """Give a fork's session the state its first call's fresh kernel restores (inside
        its own sandbox) before it runs."""


@runtime_checkable
class Pausable(Protocol):
    """A backend that keeps a session's sandbox running between calls and can pause it idle
    (holding no CPU), as idle pausing does or a client asks."""

    def paused_sessions(self) -> set[str]:
        """Ids of the sessions whose sandbox is paused now: ``GET /v1/sessions/{id}`` says
        ``paused``."""

    async def pause_session(self, session_id: str) -> bool:
        """Pause the session's sandbox now: ``True`` when it is paused after this."""

    async def resume_session(self, session_id: str) -> bool:
        """Thaw the session's paused sandbox now (as its next call would): ``True`` when one
        was thawed."""


@runtime_checkable
class ImageBuilder(Protocol):
    """A backend that builds what its tools need (images) while the daemon serves."""

    def building(self) -> dict[str, dict[str, object]]:
        """What it is building, by name (``/readyz``): a build's ``state`` and progress."""


@runtime_checkable
class SelfHealing(Protocol):
    """A backend that rebuilds state of its own that vanished under the daemon (e.g. the
    container runner directory)."""

    #: why it is rebuilding now, or None. While it is set, the backend's unavailability makes
    #: the daemon unready even when the backend is optional
    healing: str | None


@runtime_checkable
class SessionKeeper(Protocol):
    """A backend whose session state can outlive the daemon (the container backend)."""

    adoption_failed: dict[str, str]  # after start: sessions whose kept state did not check out

    @property
    def adopting(self) -> bool:
        """After start: its re-adoption is still under way."""

    def expect_sessions(self, expected: dict[str, tuple[str, str, int | None]]) -> None:
        """Before start: the recovered sessions, ``id -> (client, workspace, uid)``."""

    async def keep_sessions(self, session_ids: set[str]) -> set[str]:
        """At a clean stop, before close: keep what it can of these sessions."""

    async def adopted(self, session_id: str | None = None) -> None:
        """After start: until the re-adoption of what the last stop kept has ended, or has
        settled ``session_id``'s (it runs while the daemon serves, within
        ``adopt_timeout_s``)."""


#: (backend class, capability) -> declared: a class's declarations never change
_DECLARED: dict[tuple[type, type], bool] = {}


def declares(backend: object, capability: type) -> bool:
    """Whether ``backend``'s class declares ``capability`` (subclasses it): what ``isinstance``
    with the runtime-checkable protocol answers for every backend, as a capability is
    declared, without its walk of the protocol's members on every check (several per kernel
    call, ~10 us each on CPython 3.11)."""
    key = (type(backend), capability)
    found = _DECLARED.get(key)
    if found is None:
        found = _DECLARED[key] = capability in key[0].__mro__
    return found


def kernel_host(backend: Backend) -> KernelHost | None:
    """The backend as a :class:`KernelHost`, or None when it keeps no kernels."""
    return cast(KernelHost, backend) if declares(backend, KernelHost) else None


def kernel_carrier(backend: Backend) -> KernelCarrier | None:
    """The backend as a :class:`KernelCarrier`, or None when its forks start fresh."""
    return cast(KernelCarrier, backend) if declares(backend, KernelCarrier) else None


def pausable(backend: Backend) -> Pausable | None:
    """The backend as :class:`Pausable`, or None when it keeps nothing to pause."""
    return cast(Pausable, backend) if declares(backend, Pausable) else None


def image_builder(backend: Backend) -> ImageBuilder | None:
    """The backend as an :class:`ImageBuilder`, or None when it builds nothing."""
    return cast(ImageBuilder, backend) if declares(backend, ImageBuilder) else None


def self_healing(backend: Backend) -> SelfHealing | None:
    """The backend as :class:`SelfHealing`, or None when it never rebuilds state of its own."""
    return cast(SelfHealing, backend) if declares(backend, SelfHealing) else None


def hibernating(backend: Backend) -> Hibernating | None:
    """The backend as :class:`Hibernating`, or None when its kernels never sleep."""
    return cast(Hibernating, backend) if declares(backend, Hibernating) else None


def session_keeper(backend: Backend) -> SessionKeeper | None:
    """The backend as a :class:`SessionKeeper`, or None when its sessions end with the daemon."""
    return cast(SessionKeeper, backend) if declares(backend, SessionKeeper) else None


def _languages(backend: Backend) -> KernelLanguages | None:
    return cast(KernelLanguages, backend) if declares(backend, KernelLanguages) else None


def live_kernels(backend: Backend, *, resident: bool = False) -> set[tuple[str, str]]:
    """``(session id, language)`` of each live kernel on the backend now (none when it keeps
    no kernels; all Python on a kernel host without :class:`KernelLanguages`); ``resident``:
    only those in memory (a :class:`Hibernating` host's sleeping ones left out)."""
    if (multi := _languages(backend)) is not None:
        live = multi.session_kernels()
    else:
        host = kernel_host(backend)
        live = {(sid, PYTHON) for sid in host.kernel_sessions()} if host is not None else set()
    sleeper = hibernating(backend) if resident else None
    if sleeper is not None:
        asleep = sleeper.hibernated_sessions()
        live = {(sid, language) for sid, language in live
                if not (language == PYTHON and sid in asleep)}
    return live


def hibernated_kernels(backends: Mapping[str, Backend]) -> int:
    """How many kernels sleep on disk on the ``backends`` now."""
    return sum(len(h.hibernated_sessions()) for b in backends.values()
               if (h := hibernating(b)) is not None)


def kernel_languages(backend: Backend, session_id: str, *, resident: bool = False) -> list[str]:
    """The languages of the session's live kernels on the backend: :func:`live_kernels` of
    one session, in one look at the host's view (no scan of every session's kernels on a
    kernel host without languages)."""
    if (multi := _languages(backend)) is not None:
        languages = sorted(lang for sid, lang in multi.session_kernels() if sid == session_id)
    else:
        host = kernel_host(backend)
        languages = [PYTHON] if host is not None and session_id in host.kernel_sessions() else []
    sleeper = hibernating(backend) if resident and PYTHON in languages else None
    if sleeper is not None and session_id in sleeper.hibernated_sessions():
        languages.remove(PYTHON)
    return languages


def kernel_count(backend: Backend, *, resident: bool = False) -> int:
    """How many live kernels the backend has: ``len(live_kernels(backend, resident=...))``
    without building it (a kernel host's view and its sleepers' are counted)."""
    if declares(backend, KernelLanguages):
        return len(live_kernels(backend, resident=resident))
    host = kernel_host(backend)
    if host is None:
        return 0
    sleeper = hibernating(backend) if resident else None
    return len(host.kernel_sessions()) - (
        len(sleeper.hibernated_sessions()) if sleeper is not None else 0)


def kernel_names(backends: Mapping[str, Backend], session_id: str, *,
                 resident: bool = False) -> list[str]:
    """Names (:func:`~sandboxd.backends.base.kernel_name`) of the session's live kernels on
    the ``backends`` (``resident``: those in memory)."""
    return sorted(kernel_name(name, language) for name, backend in backends.items()
                  for language in kernel_languages(backend, session_id, resident=resident))


def kernel_backends(backends: Mapping[str, Backend], session_id: str) -> list[str]:
    """Names of the ``backends`` on which the session has a live kernel now."""
    return sorted(name for name, backend in backends.items()
                  if (host := kernel_host(backend)) is not None
                  and session_id in host.kernel_sessions())
