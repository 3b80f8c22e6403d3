"""Per-client rate limiting: at most N calls in any 60 seconds (sliding window)."""

from __future__ import annotations

import threading

from sandboxd.access.ratelimit import RateLimiter


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off() -> None:
    limiter = RateLimiter(0)
    assert all(limiter.check("a") is None for _ in range(10_000))


def test_limit_then_retry_after_per_client() -> None:
    clock = Clock()
    limiter = RateLimiter(60, clock=clock)
    for _ in range(60):
        assert limiter.check("a") is None
        clock.now += 0.01
    wait = limiter.check("a")
    # the oldest call leaves the window 60 s after it was admitted
    assert wait is not None and abs(wait - (60 - 0.6)) < 1e-6
    assert limiter.check("b") is None  # other clients are not affected


def test_the_limit_means_what_it_says_in_any_minute() -> None:
    """600/min admits 600 calls in the first minute, not a burst plus a refill."""
    clock = Clock()
    limiter = RateLimiter(600, clock=clock)
    admitted = 0
    for _ in range(6000):  # 100 attempts per second for 60 s
        if limiter.check("a") is None:
            admitted += 1
        clock.now += 0.01
    assert admitted == 600


def test_sliding_window_frees_calls_as_they_age() -> None:
    clock = Clock()
    limiter = RateLimiter(3, clock=clock)
    for step in (0.0, 10.0, 20.0):
        clock.now = 1000.0 + step
        assert limiter.check("a") is None
    clock.now = 1059.9
    assert limiter.check("a") is not None
    clock.now = 1060.0  # the first call is now 60 s old
    assert limiter.check("a") is None
    assert limiter.check("a") is not None


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
    assert allowed == 1000  # 2000 attempts within a minute: exactly the limit


def test_idle_clients_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(5, clock=clock)
    limiter.MAX_CLIENTS = 10
    for i in range(10):
        limiter.check(f"c{i}")
    clock.now += 61
    limiter.check("new")
    assert len(limiter._calls) == 1
