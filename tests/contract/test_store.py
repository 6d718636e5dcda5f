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


async def test_increments_under_a_seq_apply_once(store):
    """`hincr_once`: a resent call (same seq) changes nothing; a newer seq
    applies, an older one does not; seqs are kept per seq key."""
    batch = {"c1": {"a": 1, "b": 0.5}, "c2": {"a": 2}}
    assert await store.hincr_once("seq:w1", 1, batch, 60) is True
    assert await store.hincr_once("seq:w1", 1, batch, 60) is False
    assert await store.hgetall("c1") == {"a": 1.0, "b": 0.5} and await store.hgetall("c2") == {"a": 2.0}
    assert await store.hincr_once("seq:w1", 2, {"c1": {"a": 10}}, 60) is True
    assert await store.hincr_once("seq:w1", 1, {"c1": {"a": 100}}, 60) is False
    assert await store.hincr_once("seq:w2", 1, {"c1": {"a": 100}}, 60) is True  # another writer
    assert await store.hgetall("c1") == {"a": 111.0, "b": 0.5}


async def test_a_writers_seq_is_forgotten_after_its_ttl(store):
    assert await store.hincr_once("seq:ttl", 5, {"c3": {"a": 1}}, 0.05) is True
    await asyncio.sleep(0.12)
    assert await store.hincr_once("seq:ttl", 1, {"c3": {"a": 1}}, 60) is True  # a new writer's seqs start over
    assert await store.hgetall("c3") == {"a": 2.0}


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


async def _charged(store, key: str) -> dict[str, float]:
    """What the window under `key` holds now (current + previous, as raw counts)."""
    if isinstance(store, RedisStore):
        raw = store._redis
        keys = [k async for k in raw.scan_iter(match=store._k(key) + ":*")]
        out: dict[str, float] = {}
        for k in keys:
            for f, v in (await raw.hgetall(k)).items():
                out[f.decode()] = out.get(f.decode(), 0.0) + float(v)
        return out
    out = {}
    for (k, _), fields in store._windows.items():
        if k == key:
            for f, v in fields.items():
                out[f] = out.get(f, 0.0) + v
    return out


async def test_a_write_made_with_an_op_applies_once_and_voiding_takes_it_back(store):
    """A budget write with an op id is idempotent (a client's retry of a call
    whose reply was lost returns the first answer, charging nothing more), and
    `void_op` undoes what it did."""
    req = [("v", {"requests": 1, "tokens": 10}, {"requests": 5, "tokens": 0})]
    first = await store.consume_windows(req, 60, op="c1")
    again = await store.consume_windows(req, 60, op="c1")
    assert first[0].allowed and again[0].allowed and again[0].used == first[0].used
    await store.adjust_window("v", {"tokens": 7}, 60, op="a1")
    await store.adjust_window("v", {"tokens": 7}, 60, op="a1")
    assert await _charged(store, "v") == {"requests": 1.0, "tokens": 17.0}

    assert await store.void_op("c1", 60) is True
    assert await store.void_op("c1", 60) is False  # voided before: nothing more to undo
    assert await store.void_op("a1", 60) is True
    assert await _charged(store, "v") == {"requests": 0.0, "tokens": 0.0}
    # A denied request charged nothing, so voiding it undoes nothing.
    full = [("v", {"requests": 9}, {"requests": 5})]
    assert not (await store.consume_windows(full, 60, op="c2"))[0].allowed
    assert await store.void_op("c2", 60) is True  # it ran; its charges were none
    assert await _charged(store, "v") == {"requests": 0.0, "tokens": 0.0}


async def test_a_write_voided_before_it_arrives_applies_nothing(store):
    """Voiding a write the store never saw makes it a no-op should it still
    arrive (a command held up in a socket)."""
    assert await store.void_op("late", 60) is False
    (d,) = await store.consume_windows([("w2", {"requests": 1}, {"requests": 5})], 60, op="late")
    assert not d.allowed
    await store.adjust_window("w2", {"tokens": 5}, 60, op="late")
    assert await _charged(store, "w2") in ({}, {"requests": 0.0, "tokens": 0.0})
    assert (await store.consume_windows([("w2", {"requests": 1}, {"requests": 5})], 60, op="fresh"))[0].allowed


async def test_a_reservation_that_timed_out_can_land_and_voiding_takes_it_back(tmp_path):
    """Why writes carry op ids: a real Redis, busy when the reservation was
    sent, runs it after its client gave up. The window then holds a charge the
    gateway does not know of; voiding removes it."""
    import shutil

    from tests.support.private_redis import PrivateRedis

    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    server = PrivateRedis(tmp_path).start()
    store = RedisStore(server.url, prefix="late:")
    req = [("b", {"requests": 1}, {"requests": 5})]
    try:
        await store.consume_windows([("warm", {"requests": 1}, {"requests": 5})], 60)  # the script is loaded: EVALSHA runs
        stall = await asyncio.to_thread(server.stall, 1.5)  # returns once the server has stopped answering
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await store.consume_windows(req, 60, op="t1")
        await asyncio.to_thread(stall.join, 10)
        for _ in range(100):  # the stall ended: the sent command runs
            if (await _charged(store, "b")).get("requests"):
                break
            await asyncio.sleep(0.05)
        assert await _charged(store, "b") == {"requests": 1.0}  # it landed, though its caller timed out
        assert await store.void_op("t1", 60) is True
        assert await _charged(store, "b") == {"requests": 0.0}
    finally:
        await store.close()
        server.stop()


async def test_increments_that_timed_out_can_land_and_their_resend_counts_once(tmp_path):
    """Why telemetry flushes carry a seq: a real Redis, busy when the
    increments were sent, runs them after their client gave up; the writer
    sends the same batch again under the same seq, and it counts once."""
    import shutil

    from tests.support.private_redis import PrivateRedis

    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    server = PrivateRedis(tmp_path).start()
    store = RedisStore(server.url, prefix="late:")
    batch = {"c": {"requests": 2.0, "spec_steps": 7.0}}
    try:
        await store.hincr_once("seq:gw", 1, {"warm": {"requests": 1.0}}, 60)  # the script is loaded: EVALSHA runs
        stall = await asyncio.to_thread(server.stall, 1.5)  # returns once the server has stopped answering
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await store.hincr_once("seq:gw", 2, batch, 60)
        await asyncio.to_thread(stall.join, 10)
        assert await store.hincr_once("seq:gw", 2, batch, 60) is False  # it had landed: the resend adds nothing
        assert await store.hgetall("c") == {"requests": 2.0, "spec_steps": 7.0}
    finally:
        await store.close()
        server.stop()
