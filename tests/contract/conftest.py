"""The store contract's fixture: every test taking `store` runs against both
implementations (real Redis and the embedded one)."""

from __future__ import annotations

import pytest

from contract.store import MemoryStore
from contract.store.redis_store import RedisStore


@pytest.fixture(params=["memory", "redis"])
async def store(request, redis_url, redis_prefix):
    if request.param == "memory":
        yield MemoryStore(prefix=redis_prefix)
        return
    s = RedisStore(redis_url, prefix=redis_prefix)
    yield s
    await s.close()
