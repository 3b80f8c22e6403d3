"""A uid is free only when nothing runs as it: a session container whose removal the engine
has not confirmed keeps the session's uid under its own name after the session released it
(:meth:`UidPool.hold_also`), and the pool hands that uid to no one until it is released too."""

from __future__ import annotations

from sandboxd.host.uids import UidPool, UidPoolExhausted


def test_a_uid_held_twice_is_free_only_when_both_release_it() -> None:
    pool = UidPool(50000, 3)
    uid = pool.acquire("ses_a")
    pool.hold_also("sandboxd-box", uid)  # its container's removal is not confirmed
    pool.release("ses_a")  # the session ended
    others = {pool.acquire("ses_b"), pool.acquire("ses_c")}
    assert uid not in others and pool.in_use == 3
    try:
        pool.acquire("ses_d")
    except UidPoolExhausted:
        pass
    else:
        raise AssertionError("a uid still held by an unconfirmed container was handed out")
    pool.release("sandboxd-box")  # the engine confirmed the removal
    assert pool.acquire("ses_d") == uid


def test_keep_free_counts_uids_not_holders() -> None:
    pool = UidPool(50000, 4)
    uid = pool.acquire("ses_a")
    pool.hold_also("sandboxd-box", uid)
    # two holders of one uid leave three free: a session that must leave two free still fits
    assert pool.acquire("ses_b", keep_free=2) != uid
