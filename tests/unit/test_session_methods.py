"""A session offers every per-call method of its client (issue 29: ``Session`` had no
``invoke_stream``, so one passed ``session=s.id`` to the client instead): each method of
``SandboxClient`` / ``AsyncSandboxClient`` that takes the session (a ``session`` parameter)
has a namesake on ``Session`` / ``AsyncSession`` that fills it in, and takes the same other
parameters."""

from __future__ import annotations

import inspect

import pytest

from sandboxd.client import AsyncSandboxClient, SandboxClient
from sandboxd.client.session import AsyncSession, Session


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
