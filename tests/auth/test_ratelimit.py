"""Per-client rate limiting (token bucket)."""

from __future__ import annotations

import threading
import time

from sandboxd.auth import RateLimiter


def test_off() -> None:
    limiter = RateLimiter(0)
    assert all(limiter.check("a") is None for _ in range(10_000))


def test_burst_then_retry_after_per_client() -> None:
    limiter = RateLimiter(60)  # one per second, bursts of 60
    assert all(limiter.check("a") is None for _ in range(60))
    wait = limiter.check("a")
    assert wait is not None and 0 < wait <= 1.0
    assert limiter.check("b") is None  # other clients are not affected


def test_refills_over_time() -> None:
    limiter = RateLimiter(600)  # ten per second
    while limiter.check("a") is None:
        pass
    wait = limiter.check("a")
    assert wait is not None and wait <= 0.1
    time.sleep(wait + 0.05)
    assert limiter.check("a") is None


def test_thread_safe_exact_count() -> None:
    limiter = RateLimiter(1000)
    allowed = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal allowed
        for _ in range(500):
            if limiter.check("a") is None:
                with lock:
                    allowed += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 2000 attempts in well under a second: the burst (1000) plus what refilled meanwhile
    assert 1000 <= allowed < 1500
