"""The store contract, run against both implementations (real Redis and embedded)."""

from __future__ import annotations

import asyncio

import pytest

from contract.store.redis_store import RedisStore


async def test_json_values_and_ttl(store):
    assert await store.get_json("a") is None
    await store.set_json("a", {"x": [1, 2]})
    assert await store.get_json("a") == {"x": [1, 2]}
    await store.set_json("b", 1, ttl_s=0.05)
    await asyncio.sleep(0.12)
    assert await store.get_json("b") is None
    assert await store.incr("v") == 1
    assert await store.incr("v", 5) == 6


async def test_counters_sets_and_capped_log(store):
    await store.hincr("h", {"a": 1, "b": 2.5})
    await store.hincr("h", {"a": 2})
    assert await store.hgetall("h") == {"a": 3.0, "b": 2.5}
    await store.sadd("s", "x", "y")
    await store.sadd("s", "y")
    assert await store.smembers("s") == {"x", "y"}
    for i in range(5):
        await store.push_capped("log", {"i": i}, maxlen=3)
    assert await store.recent("log", 10) == [{"i": 4}, {"i": 3}, {"i": 2}]


async def test_window_admits_until_limit_then_denies_with_retry_after(store):
    limits = {"requests": 3, "tokens": 100}
    for _ in range(3):
        d = await store.consume_window("w", {"requests": 1, "tokens": 10}, limits)
        assert d.allowed
    d = await store.consume_window("w", {"requests": 1, "tokens": 10}, limits)
    assert not d.allowed and d.denied_field == "requests"
    # The window's whole usage is in the current window: it fits again a
    # third of the way into the next one (base.window_retry_after_s).
    assert 1 <= d.retry_after_s <= 2 * 60
    # A denied request consumed nothing.
    await store.adjust_window("w", {"requests": -1}, 60)
    assert (await store.consume_window("w", {"requests": 1, "tokens": 10}, limits)).allowed


async def test_window_is_atomic_under_concurrency(store):
    results = await asyncio.gather(
        *[store.consume_window("c", {"requests": 1}, {"requests": 10}) for _ in range(50)]
    )
    assert sum(r.allowed for r in results) == 10


async def test_lock_excludes_other_owner_until_ttl(store):
    assert await store.acquire_lock("L", "a", ttl_s=0.2)
    assert not await store.acquire_lock("L", "b", ttl_s=0.2)
    assert await store.acquire_lock("L", "a", ttl_s=0.2)  # renew
    assert await store.lock_owner("L") == "a"
    await asyncio.sleep(0.3)
    assert await store.acquire_lock("L", "b", ttl_s=1)
    await store.release_lock("L", "a")  # not the owner: no effect
    assert await store.lock_owner("L") == "b"
    await store.release_lock("L", "b")
    assert await store.lock_owner("L") is None


async def test_publish_reaches_subscriber(store):
    received = []

    async def listen():
        async for msg in store.subscribe("ch"):
            received.append(msg)
            return

    task = asyncio.create_task(listen())
    for _ in range(50):
        await store.publish("ch", {"version": 7})
        await asyncio.sleep(0.02)
        if received:
            break
    await asyncio.wait_for(task, 2)
    assert received == [{"version": 7}]


async def test_a_redis_restart_is_not_an_outage_for_pooled_connections(tmp_path):
    """A pooled connection that died with a restarted Redis is retried once on
    a fresh one: the first command after the restart succeeds instead of
    raising (which the gateway's budget guard would read as the store down)."""
    import shutil

    from tests.support.private_redis import PrivateRedis

    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    server = PrivateRedis(tmp_path).start()
    store = RedisStore(server.url, prefix="restart:")
    try:
        await store.set_json("k", 1)
        server.stop()
        server.start()
        assert await store.get_json("k") is None  # answered (the restarted Redis is empty), did not raise
        server.stop()
        with pytest.raises(Exception):
            await store.get_json("k")  # a real outage still fails
    finally:
        server.stop()
        await store.close()
