"""Budget admission: batched reservations stay atomic and decide in order."""

from __future__ import annotations

import asyncio

import pytest

from gateway.accounting import Accounting, estimate_tokens
from gateway.config import TenantConfig
from gateway.store import MemoryStore


@pytest.fixture(params=["memory", "redis"])
async def store(request, redis_url, redis_prefix):
    if request.param == "memory":
        yield MemoryStore()
        return
    from gateway.store.redis_store import RedisStore

    s = RedisStore(redis_url, prefix=redis_prefix)
    yield s
    await s.close()


async def test_consume_windows_matches_one_by_one(store):
    limits = {"requests": 3, "tokens": 100}
    reqs = [("budget:a", {"requests": 1, "tokens": 40}, limits)] * 4 + [("budget:b", {"requests": 1, "tokens": 10}, limits)]
    decisions = await store.consume_windows(reqs, 60)
    assert [d.allowed for d in decisions] == [True, True, False, False, True]
    assert decisions[2].denied_field == "tokens"
    assert decisions[2].retry_after_s >= 1
    assert decisions[1].used == {"requests": 2.0, "tokens": 80.0}
    single = await store.consume_window("budget:a", {"requests": 1, "tokens": 1}, limits, 60)
    assert single.allowed and single.used["requests"] == 3.0


async def test_concurrent_reservations_never_overshoot(store):
    acc = Accounting(store, 60)
    tenant = TenantConfig(id="t", api_key_sha256="a" * 64, requests_per_minute=10)
    results = await asyncio.gather(*(acc.reserve(tenant, 5) for _ in range(50)))
    assert sum(1 for decision, _ in results if decision.allowed) == 10


async def test_unlimited_tenant_skips_the_store():
    class Exploding(MemoryStore):
        async def consume_windows(self, *a, **k):
            raise AssertionError("store must not be called")

    acc = Accounting(Exploding(), 60)
    decision, reserved = await acc.reserve(TenantConfig(id="t", api_key_sha256="a" * 64), 10)
    assert decision is None and reserved == 0


def test_estimate_tokens():
    assert estimate_tokens({"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 10}, 256) == 10 + 1 + 10
    assert estimate_tokens({"prompt": "abcd", "n": 2}, 100) == 1 + 1 + 200
    assert estimate_tokens({"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 8}]}], "max_completion_tokens": 3}, 9) == 2 + 1 + 3
