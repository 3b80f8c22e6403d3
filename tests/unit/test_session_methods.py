"""A session offers every per-call method of its client (``Session`` had no
``invoke_stream``, so one passed ``session=s.id`` to the client instead): each method of
``SandboxClient`` / ``AsyncSandboxClient`` that takes the session (a ``session`` parameter)
has a namesake on ``Session`` / ``AsyncSession`` that fills it in, and takes the same other
parameters."""

from __future__ import annotations

import inspect

import pytest

from sandboxd_client import AsyncSandboxClient, SandboxClient
from sandboxd_client.session import AsyncSession, Session


def _per_call(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in inspect.getmembers(cls, callable)
            if not name.startswith("_") and "session" in inspect.signature(fn).parameters}


@pytest.mark.parametrize(("client", "session"),
                         [(SandboxClient, Session), (AsyncSandboxClient, AsyncSession)])
def test_a_session_has_every_per_call_method_of_its_client(client: type, session: type) -> None:
    calls = _per_call(client)
    assert {"invoke", "invoke_stream", "read_file", "write_file", "list_files"} <= set(calls)
    for name, signature in calls.items():
        assert hasattr(session, name), f"{session.__name__} has no {name}()"
        theirs = [p for p in signature.parameters if p not in ("self", "session")]
        ours = [p for p in inspect.signature(getattr(session, name)).parameters if p != "self"]
        assert ours == theirs, (name, ours, theirs)


#: the client's methods that take the session's id, and the session's method for each
ON_THE_SESSION = {"get_session": "refresh", "restart_session": "restart",
                  "interrupt_session": "interrupt", "delete_session": "delete"}
#: ... and those whose twin takes the rest of the client method's arguments
WITH_ARGUMENTS = {"fork_session": "fork"}
#: the client's methods that take a session's id to make a Session of it (no twin)
MAKE_A_SESSION = {"attach"}


@pytest.mark.parametrize(("client", "session"),
                         [(SandboxClient, Session), (AsyncSandboxClient, AsyncSession)])
def test_a_session_has_every_method_of_its_client_on_a_session_id(client: type,
                                                                  session: type) -> None:
    """``get_session(id)`` is ``refresh()``, ``restart_session(id)`` ``restart()``... on
    both sessions (``AsyncSession`` had no ``refresh``); a new client method on a session id
    needs its session twin here."""
    on_id = {name for name, fn in inspect.getmembers(client, callable)
             if not name.startswith("_") and "session_id" in inspect.signature(fn).parameters}
    assert on_id == set(ON_THE_SESSION) | set(WITH_ARGUMENTS) | MAKE_A_SESSION, on_id
    for name, twin in WITH_ARGUMENTS.items():
        theirs = [p for p in inspect.signature(getattr(client, name)).parameters
                  if p not in ("self", "session_id")]
        ours = [p for p in inspect.signature(getattr(session, twin)).parameters if p != "self"]
        assert ours == theirs, (twin, ours, theirs)
        assert inspect.iscoroutinefunction(getattr(session, twin)) == \
            inspect.iscoroutinefunction(getattr(client, name)), twin
    for name, twin in ON_THE_SESSION.items():
        assert hasattr(session, twin), f"{session.__name__} has no {twin}() (for {name})"
        ours = [p for p in inspect.signature(getattr(session, twin)).parameters if p != "self"]
        assert ours == [], (twin, ours)
        assert inspect.iscoroutinefunction(getattr(session, twin)) == \
            inspect.iscoroutinefunction(getattr(client, name)), twin
