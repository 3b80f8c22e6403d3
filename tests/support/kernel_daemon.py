"""A real daemon for the session-kernel tests (the container backend's python and bash kernels,
and any language's after them): its instance label, and the HTTP calls those tests make
(a session, one call of a tool, its end), as one client or as one of several."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.access.tokens import add_token
from tests.support.daemon import RunningDaemon, running_daemon

#: how long a test waits for one call's answer (a fresh container under emulation is slow)
HTTP_TIMEOUT_S = 180


@dataclass
class KernelDaemon:
    """A daemon with the container backend, its instance label (``sandboxd.daemon``: every
    container it made carries it) and its clients' tokens (none: the daemon's own client)."""

    d: RunningDaemon
    instance: str
    keys: dict[str, str] = field(default_factory=dict)

    def auth(self, who: str | None = None) -> dict[str, str]:
        """The headers of client ``who`` (None: the daemon's default client)."""
        return {} if who is None else {"Authorization": f"Bearer {self.keys[who]}"}

    def session(self, who: str | None = None) -> str:
        """A new session's id."""
        r = self.d.client.post("/v1/sessions", json={}, headers=self.auth(who))
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])

    def call(self, tool: str, code: str, session: str | None = None, *,
             who: str | None = None, timeout_s: float | None = None,
             **body: Any) -> dict[str, Any]:
        """One call of ``tool`` with ``code`` (``body``: more of the request, ``limits``
        among it; ``timeout_s`` joins them); its result object."""
        payload: dict[str, Any] = {"arguments": {"code": code}, **body}
        if timeout_s is not None:
            payload["limits"] = {**payload.get("limits", {}), "timeout_s": timeout_s}
        if session is not None:
            payload["session"] = session
        r = self.d.client.post(f"/v1/tools/{tool}/invoke", json=payload,
                               headers=self.auth(who), timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def py(self, code: str, session: str | None = None, **kw: Any) -> dict[str, Any]:
        """One python call; its result object."""
        return self.call("python", code, session, **kw)

    def close(self, session: str, who: str | None = None) -> None:
        """End the session."""
        r = self.d.client.delete(f"/v1/sessions/{session}", headers=self.auth(who))
        assert r.status_code == 204, r.text


@contextmanager
def kernel_daemon(tmp: Path, policy: str, prefix: str, env: Mapping[str, str],
                  clients: tuple[str, ...] = ()) -> Iterator[KernelDaemon]:
    """A daemon under ``policy`` (one file) with ``env``, its instance named ``prefix`` and
    a random tail, and a token per name in ``clients`` (the first is the daemon's default
    client then). The caller checks the instance's containers gone after it."""
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "kernels.yaml").write_text(policy)
    tokens = tmp / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in clients}
    instance = f"{prefix}{secrets.token_hex(4)}"
    env = {**env, "SANDBOXD_INSTANCE": instance}
    if keys:
        env["SANDBOXD_TOKENS_FILE"] = str(tokens)
    with running_daemon(tmp, policies_dir=policies, env=env,
                        token=keys[clients[0]] if keys else None) as d:
        yield KernelDaemon(d, instance, keys)
