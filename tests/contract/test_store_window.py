"""The sliding window's Retry-After and reset times (both stores, one formula)
and the heartbeat primitive that counts live gateway instances."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis as sync_redis

from contract.store import MemoryStore
from contract.store.base import window_reset_s, window_retry_after_s
from contract.store.redis_store import RedisStore


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_retry_after_formula_cases():
    # 60 s window, limit 10, previous window full, nothing yet in this one, 0.5 in:
    # usage 10 * 0.5 + 1 = 6 fits already (not a denial); with 9 current it is
    # 10 * (1 - e) + 9 + 1 <= 10 only once the previous share is gone: at the end.
    assert window_retry_after_s(60, 0.5, 10, 9, 1, 10) == 30
    # Previous window full, current empty, 10 % in: needs 10 * (1 - e) <= 9, e >= 0.1 -> almost now.
    assert window_retry_after_s(60, 0.1, 10, 0, 1, 10) == 1
    # 5 % in: e >= 0.1 is 3 s away (the old end-of-window answer was 57 s).
    assert window_retry_after_s(60, 0.05, 10, 0, 1, 10) == 3
    # Current window full: fits again once 1/10 of it has decayed, 6 s into the next one.
    assert window_retry_after_s(60, 0.5, 0, 10, 1, 10) == 30 + 6
    # A cost above the limit never fits: the time the window is empty.
    assert window_retry_after_s(60, 0.5, 0, 0, 11, 10) == 90
    assert window_reset_s(60, 0.25, 3, 1) == 105
    assert window_reset_s(60, 0.25, 3, 0) == 45
    assert window_reset_s(60, 0.25, 0, 0) == 0


async def _memory_at(now: float, previous: int, current: int, window_s: int, limit: int) -> tuple[MemoryStore, Clock]:
    """A MemoryStore whose window `key` holds `previous` requests in the last
    window and `current` in this one, with its clock at `now`."""
    clock = Clock(now - window_s)
    store = MemoryStore(clock=clock)
    if previous:
        await store.adjust_window("k", {"requests": previous}, window_s)
    clock.t = now
    if current:
        await store.adjust_window("k", {"requests": current}, window_s)
    return store, clock


@pytest.mark.parametrize("elapsed", [0.0, 0.05, 0.3, 0.55, 0.9, 0.99])
@pytest.mark.parametrize(("previous", "current"), [(10, 0), (10, 5), (7, 3), (0, 10), (3, 10), (10, 10)])
async def test_memory_retry_after_is_the_earliest_whole_second(elapsed, previous, current):
    window_s, limit = 60, 10
    now = 1_000_000 * window_s + elapsed * window_s
    store, clock = await _memory_at(now, previous, current, window_s, limit)
    denied = await store.consume_window("k", {"requests": 1}, {"requests": limit}, window_s)
    if denied.allowed:
        return  # this state has room: nothing to retry
    retry = denied.retry_after_s
    assert retry >= 1 and retry == int(retry)
    # One second earlier (or now, when the answer is 1 s) is still denied ...
    early, clock_e = await _memory_at(now, previous, current, window_s, limit)
    clock_e.t = now + max(0.0, retry - 1)
    assert not (await early.consume_window("k", {"requests": 1}, {"requests": limit}, window_s)).allowed
    # ... and at the returned time it is admitted.
    clock.t = now + retry
    assert (await store.consume_window("k", {"requests": 1}, {"requests": limit}, window_s)).allowed


async def test_memory_reset_and_used_fields():
    store, _ = await _memory_at(60 * 1000 + 15, 4, 0, 60, 10)
    d = await store.consume_window("k", {"requests": 1, "tokens": 5}, {"requests": 10, "tokens": 100}, 60)
    assert d.allowed and d.used == {"requests": 4 * 0.75 + 1, "tokens": 5}
    assert d.reset_s == {"requests": 105.0, "tokens": 105.0}


async def test_redis_retry_after_matches_the_sliding_window(redis_url, redis_prefix):
    """Real time, a 4 s window: 4 requests fill one window; just after it
    rolls over a fifth is denied for about 1 s (the previous window's share
    must decay to 3), not for the 4 s to the window's end."""
    window_s, limits = 4, {"requests": 4}
    store = RedisStore(redis_url, prefix=redis_prefix)
    clock = sync_redis.Redis.from_url(redis_url)

    def redis_now() -> float:
        sec, usec = clock.time()
        return sec + usec / 1e6

    async def sleep_until_window_fraction(fraction: float) -> None:
        now = redis_now()
        start = (now // window_s + 1) * window_s
        await asyncio.sleep(start + fraction * window_s - now)

    try:
        await sleep_until_window_fraction(0.0)
        for _ in range(4):
            assert (await store.consume_window("w", {"requests": 1}, limits, window_s)).allowed
        await sleep_until_window_fraction(0.02)  # the next window, 80 ms in
        denied = await store.consume_window("w", {"requests": 1}, limits, window_s)
        assert not denied.allowed and denied.denied_field == "requests"
        assert denied.retry_after_s == 1  # exact: 0.92 s; the old answer was 4 s
        assert 3.5 < denied.reset_s["requests"] <= 4  # the previous window's share is gone at this window's end
        assert not (await store.consume_window("w", {"requests": 1}, limits, window_s)).allowed  # earlier: still denied
        await asyncio.sleep(denied.retry_after_s)
        assert (await store.consume_window("w", {"requests": 1}, limits, window_s)).allowed
    finally:
        clock.close()
        await store.close()


async def test_heartbeat_counts_live_members(store):
    """b counts until its last beat is a TTL old, then drops out -- never
    earlier. The TTL is long against a loaded machine's stalls (a 0.3 s TTL
    expired b between two calls under a parallel suite); the expiry is then
    waited for with a bound rather than slept to."""
    ttl = 2.0
    assert await store.heartbeat("hb", "a", ttl) == 1
    b_beat = time.monotonic()
    assert await store.heartbeat("hb", "b", ttl) == 2
    assert await store.heartbeat("hb", "a", ttl) == 2  # a beat again: still two
    await asyncio.sleep(0.2)
    assert await store.heartbeat("hb", "a", ttl) == 2
    deadline = b_beat + ttl + 10.0
    while (live := await store.heartbeat("hb", "a", ttl)) == 2:
        assert time.monotonic() < deadline, "b never expired"
        await asyncio.sleep(0.1)
    assert live == 1 and time.monotonic() - b_beat >= ttl * 0.95  # (the store's clock, not this one: a little slack)


def test_heartbeat_uses_the_stores_clock():
    clock = Clock(100.0)
    store = MemoryStore(clock=clock)
    assert asyncio.run(store.heartbeat("hb", "a", 6)) == 1
    clock.t = 105.0
    assert asyncio.run(store.heartbeat("hb", "b", 6)) == 2
    clock.t = 106.5
    assert asyncio.run(store.heartbeat("hb", "b", 6)) == 1


async def test_a_memory_batch_is_decided_on_one_clock_reading():
    """A batch reservation made just before a window boundary charges, and
    records for `void_op`, one window (Redis reads TIME once per script): a
    clock read per request would charge one window and record another, and
    voiding would then take the charge out of the wrong one."""
    readings = iter(119.998 + 0.001 * i for i in range(100))
    store = MemoryStore(clock=lambda: next(readings))
    reqs = [("b", {"requests": 1}, {"requests": 9})] * 3
    decisions = await store.consume_windows(reqs, 60, op="edge")
    assert [d.used["requests"] for d in decisions] == [1.0, 2.0, 3.0]  # one window, one elapsed share
    assert await store.void_op("edge", 60) is True
    assert all(v == 0.0 for window in store._windows.values() for v in window.values())
