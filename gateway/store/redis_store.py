"""Redis-backed store (redis-py asyncio) for several gateways and controllers.

Atomicity comes from Lua: the sliding-window check-and-consume and the
lock-renew run as single scripts, so two gateway instances sharing one Redis
enforce one budget and one controller leader, whatever their interleaving.
Time for the windows is Redis' own `TIME`, so instances with skewed clocks
still agree on window boundaries.
"""

from __future__ import annotations

import math
from typing import Any, AsyncIterator, Mapping

import orjson
import redis.asyncio as aioredis

from .base import WindowDecision

# KEYS: none (keys are derived from ARGV[1] so that the window index is computed
# from Redis' clock). ARGV: base key, window seconds, then n triples of
# field, cost, limit.
_CONSUME_WINDOW = """
local base = ARGV[1]
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local index = math.floor(now / window)
local elapsed = (now - index * window) / window
local cur = base .. ':' .. index
local prev = base .. ':' .. (index - 1)
local used = {}
local n = (#ARGV - 2) / 3
for i = 0, n - 1 do
  local field = ARGV[3 + i * 3]
  local cost = tonumber(ARGV[4 + i * 3])
  local limit = tonumber(ARGV[5 + i * 3])
  local c = tonumber(redis.call('HGET', cur, field) or '0')
  local p = tonumber(redis.call('HGET', prev, field) or '0')
  local u = p * (1 - elapsed) + c + cost
  used[#used + 1] = field
  used[#used + 1] = tostring(u)
  if limit > 0 and cost > 0 and u > limit then
    return {0, tostring(elapsed), field, used}
  end
end
for i = 0, n - 1 do
  redis.call('HINCRBYFLOAT', cur, ARGV[3 + i * 3], ARGV[4 + i * 3])
end
redis.call('EXPIRE', cur, window * 2 + 1)
return {1, tostring(elapsed), '', used}
"""

_ADJUST_WINDOW = """
local base = ARGV[1]
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local index = math.floor(tonumber(t[1]) / window)
local cur = base .. ':' .. index
for i = 3, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', cur, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', cur, window * 2 + 1)
return 1
"""

_ACQUIRE_LOCK = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisStore:
    def __init__(self, url: str, prefix: str = "specgate:") -> None:
        self.prefix = prefix
        self.url = url
        self._redis = aioredis.from_url(url, decode_responses=False, health_check_interval=30)
        self._consume = self._redis.register_script(_CONSUME_WINDOW)
        self._adjust = self._redis.register_script(_ADJUST_WINDOW)
        self._acquire = self._redis.register_script(_ACQUIRE_LOCK)
        self._release = self._redis.register_script(_RELEASE_LOCK)

    def _k(self, key: str) -> str:
        return self.prefix + key

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    # -- plain values -------------------------------------------------
    async def get_json(self, key: str) -> Any | None:
        raw = await self._redis.get(self._k(key))
        return None if raw is None else orjson.loads(raw)

    async def set_json(self, key: str, value: Any, ttl_s: float | None = None) -> None:
        px = int(ttl_s * 1000) if ttl_s else None
        await self._redis.set(self._k(key), orjson.dumps(value), px=px)

    async def delete(self, key: str) -> None:
        await self._redis.delete(self._k(key))

    async def incr(self, key: str, amount: int = 1) -> int:
        return int(await self._redis.incrby(self._k(key), amount))

    # -- counters -----------------------------------------------------
    async def hincr(self, key: str, mapping: Mapping[str, float]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for field, amount in mapping.items():
                pipe.hincrbyfloat(self._k(key), field, float(amount))
            await pipe.execute()

    async def hgetall(self, key: str) -> dict[str, float]:
        raw = await self._redis.hgetall(self._k(key))
        return {k.decode(): float(v) for k, v in raw.items()}

    # -- sets and bounded logs ----------------------------------------
    async def sadd(self, key: str, *members: str) -> None:
        if members:
            await self._redis.sadd(self._k(key), *members)

    async def smembers(self, key: str) -> set[str]:
        return {m.decode() for m in await self._redis.smembers(self._k(key))}

    async def push_capped(self, key: str, value: Any, maxlen: int) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lpush(self._k(key), orjson.dumps(value))
            pipe.ltrim(self._k(key), 0, maxlen - 1)
            await pipe.execute()

    async def recent(self, key: str, n: int) -> list[Any]:
        return [orjson.loads(v) for v in await self._redis.lrange(self._k(key), 0, n - 1)]

    # -- admission ----------------------------------------------------
    async def consume_window(
        self,
        key: str,
        costs: Mapping[str, int],
        limits: Mapping[str, int],
        window_s: int = 60,
    ) -> WindowDecision:
        args: list[Any] = [self._k(key), window_s]
        for field, cost in costs.items():
            args += [field, int(cost), int(limits.get(field, 0))]
        allowed, elapsed, field, used_flat = await self._consume(args=args)
        elapsed_f = float(elapsed)
        used = {
            used_flat[i].decode(): float(used_flat[i + 1]) for i in range(0, len(used_flat), 2)
        }
        if int(allowed):
            return WindowDecision(True, 0.0, used)
        retry = max(1.0, math.ceil(window_s * (1.0 - elapsed_f)))
        return WindowDecision(False, retry, used, field.decode() or None)

    async def adjust_window(self, key: str, deltas: Mapping[str, int], window_s: int = 60) -> None:
        args: list[Any] = [self._k(key), window_s]
        for field, delta in deltas.items():
            args += [field, int(delta)]
        if len(args) > 2:
            await self._adjust(args=args)

    # -- leadership ---------------------------------------------------
    async def acquire_lock(self, key: str, owner: str, ttl_s: float) -> bool:
        return bool(await self._acquire(keys=[self._k(key)], args=[owner, int(ttl_s * 1000)]))

    async def release_lock(self, key: str, owner: str) -> None:
        await self._release(keys=[self._k(key)], args=[owner])

    async def lock_owner(self, key: str) -> str | None:
        raw = await self._redis.get(self._k(key))
        return None if raw is None else raw.decode()

    # -- notifications ------------------------------------------------
    async def publish(self, channel: str, message: Any) -> None:
        await self._redis.publish(self._k(channel), orjson.dumps(message))

    async def subscribe(self, channel: str) -> AsyncIterator[Any]:
        pubsub = self._redis.pubsub()
        await pubsub.subscribe(self._k(channel))
        try:
            async for item in pubsub.listen():
                if item.get("type") == "message":
                    yield orjson.loads(item["data"])
        finally:
            await pubsub.unsubscribe(self._k(channel))
            await pubsub.aclose()
