"""What one hand-off to the audit writer thread costs (one is paid per record): a future answered by
a thread fed through a :class:`queue.SimpleQueue` (as :mod:`sandboxd.audit.thread` does),
against the same future answered on the event loop itself (the baseline of the same run).

    python bench/profiles/audit_handoff.py [--rounds 20000]

A py-spy ``--gil`` profile of the daemon puts ~10 % of its samples on the ``put`` line of
``AuditThread.run``; this measures the line's real CPU."""

from __future__ import annotations

import argparse
import asyncio
import queue
import threading
import time
from typing import Any


def _answer(q: queue.SimpleQueue[Any]) -> None:
    while (item := q.get()) is not None:
        loop, future = item
        loop.call_soon_threadsafe(future.set_result, None)


async def _rounds(n: int, q: queue.SimpleQueue[Any]) -> None:
    loop = asyncio.get_running_loop()
    for label, thread in (("hand-off to a thread", True), ("answered on the loop", False)):
        cpu0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        for _ in range(n):
            future = loop.create_future()
            if thread:
                q.put((loop, future))
            else:
                loop.call_soon(future.set_result, None)
            await future
        per = 1e6 / n
        print(f"{label}: loop thread CPU {(time.thread_time() - cpu0) * per:.1f} us, "
              f"process CPU {(time.process_time() - proc0) * per:.1f} us, "
              f"wall {(time.perf_counter() - wall0) * per:.1f} us per round trip")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20000)
    args = ap.parse_args()
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    worker = threading.Thread(target=_answer, args=(q,), daemon=True)
    worker.start()
    asyncio.run(_rounds(args.rounds, q))
    q.put(None)
    worker.join()


if __name__ == "__main__":
    main()
