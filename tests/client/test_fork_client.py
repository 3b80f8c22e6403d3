"""The client's side of forks and capacity (``Session.fork``, ``fork_session``,
``capacity``), sync and async, against the daemon's app in process."""

from __future__ import annotations

import asyncio

from tests.client.conftest import InProcessTokenDaemon


def test_session_fork_and_capacity(inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client, client.session() as parent:
        assert parent.write_file("f.txt", "shared").status == "ok"
        forks = parent.fork(2)
        assert len(forks) == 2 and len({f.id for f in forks} | {parent.id}) == 3
        for fork in forks:
            assert fork.read_file("f.txt") == "shared"
            fork.close()  # deleted: made by this client
        made = client.fork_session(parent.id)
        assert made.parent == parent.id and not made.kernel_carried
        assert made.kernel_reason and "no live Python kernel" in made.kernel_reason
        client.delete_session(made.sessions[0].id)
        capacity = client.capacity()
        assert capacity["sessions"]["yours"] == 1 and capacity["full"] == []

    async def run() -> None:
        async with inproc_token_daemon.async_client() as client, client.session() as parent:
            (fork,) = await parent.fork()
            assert fork.id != parent.id
            await fork.close()
            assert (await client.capacity())["sessions"]["yours"] == 1

    asyncio.run(run())
