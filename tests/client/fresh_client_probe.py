"""Run by the interpreter of a fresh virtualenv that has only the client distribution
(tests/client/test_distribution.py): what that client can do against a real daemon, printed as
one JSON line. Standard library and ``sandboxd_client`` only: nothing of the daemon is there.

argv: the daemon's URL, alice's token (calls, sessions), bob's token (rate limited)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx

from sandboxd_client import AsyncSandboxClient, RateLimited, SandboxClient, SandboxError

URL, ALICE, BOB = sys.argv[1:4]


class Counting(httpx.HTTPTransport):
    """The real transport, counting the requests it sends."""

    sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def sessions(report: dict[str, Any]) -> None:
    """A session made by one client, reached by id from another (sync and async): same
    Python variables, and closing an attached session leaves it open."""
    with SandboxClient(URL, token=ALICE) as maker, maker.session() as made:
        made.invoke("python", code="x = 6 * 7")
        with SandboxClient(URL, token=ALICE) as other:
            attached = other.attach(made.id)
            report["sync_attached"] = attached.invoke("python", code="print(x)").stdout
            attached.close()
            report["open_after_close"] = other.get_session(made.id).id == made.id

        async def attach_async() -> str:
            async with AsyncSandboxClient(URL, token=ALICE) as client:
                session = await client.attach(made.id)
                result = await session.invoke("python", code="x += 1; print(x)")
                await session.close()
                return result.stdout

        report["async_attached"] = asyncio.run(attach_async())
        report["kept"] = made.invoke("python", code="print(x)").stdout
    with SandboxClient(URL, token=ALICE) as client:
        try:
            client.attach(made.id)
        except SandboxError as exc:
            report["attach_deleted"] = type(exc).__name__


def rate_limit(report: dict[str, Any]) -> None:
    """Bob uses up his calls: the 429 is a typed error at once (no retry by default); with
    ``retries=2`` the client asks twice more, telling the hook each time, then raises."""
    counted = Counting()
    with SandboxClient(URL, token=BOB, transport=counted) as client:
        for calls in range(1, 100):
            try:
                client.tools()
            except RateLimited as exc:
                report["limited_after"] = calls
                report["limited_sent"] = counted.sent  # one request each: nothing retried
                report["retry_after"] = exc.retry_after
                break
    with SandboxClient(URL, token=BOB) as client:  # a streamed call hears it the same way
        try:
            list(client.invoke_stream("python", code="print(1)"))
        except RateLimited as exc:
            report["stream_retry_after"] = exc.retry_after
    hooked: list[tuple[str, int, float]] = []
    transport = Counting()
    with SandboxClient(URL, token=BOB, transport=transport, retries=2, max_retry_wait=0.01,
                       on_retry=lambda e, n, wait: hooked.append((type(e).__name__, n, wait))
                       ) as client:
        try:
            client.invoke("python", code="print(1)")
        except RateLimited as exc:
            report["bounded"] = {"error": type(exc).__name__, "hooked": hooked,
                                 "sent": transport.sent, "retry_after": exc.retry_after}


def main() -> None:
    report: dict[str, Any] = {}
    with SandboxClient(URL, token=ALICE) as client:
        report["call"] = client.invoke("python", code="print(6 * 7)").stdout
    sessions(report)
    rate_limit(report)
    print(json.dumps(report))


main()
