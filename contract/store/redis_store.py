"""Redis-backed store (redis-py asyncio) for several gateways and controllers.

Atomicity comes from Lua: the sliding-window check-and-consume and the
lock-renew run as single scripts, so two gateway instances sharing one Redis
enforce one budget and one controller leader, whatever their interleaving.
Time for the windows is Redis' own `TIME`, so instances with skewed clocks
still agree on window boundaries.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Mapping, Sequence

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from .base import OP_RECORD_PREFIX, WindowDecision, window_reset_s, window_retry_after_s

# Check-and-consume for one or several requests in one script call (one round
# trip, one command to encode and parse): what a busy gateway sends when several
# requests arrive in the same event-loop tick. Each request is decided
# independently, in order. Keys are derived from the base keys so that the
# window index is computed from Redis' clock. Per request it returns {allowed,
# elapsed, denied field or '', used} with `used` flat quadruples (field,
# weighted usage incl. cost, previous, current): Retry-After and the reset
# times are computed from those raw values in Python by the same functions the
# embedded store uses (`base.window_retry_after_s`, `base.window_reset_s`).
# `1e-9` is `base.WINDOW_SLACK`.
# ARGV: window seconds, the call's record key ('' for none: see `_VOID_OP`),
# then per request: base key, n fields (at least one), n triples of field,
# cost, limit. With a record key the call runs once: run again (a client's
# retry) it returns the first answer; voided, it charges nothing and denies
# every request.
_CONSUME_WINDOWS = """
local window = tonumber(ARGV[1])
local record = ARGV[2]
if record ~= '' then
  local seen = redis.call('HGET', record, 'out')
  if seen then
    return cjson.decode(seen)
  end
  if redis.call('HEXISTS', record, 'void') == 1 then
    local out = {}
    local i = 3
    while i <= #ARGV do
      out[#out + 1] = {0, '0', '', {}}
      i = i + 2 + tonumber(ARGV[i + 1]) * 3
    end
    return out
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local index = math.floor(now / window)
local elapsed = (now - index * window) / window
local out = {}
local charges = {}
local i = 3
while i <= #ARGV do
  local base = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local first = i + 2
  i = first + n * 3
  local cur = base .. ':' .. index
  local prev = base .. ':' .. (index - 1)
  local used = {}
  local denied = ''
  local fields = {}
  for j = 0, n - 1 do
    fields[j + 1] = ARGV[first + j * 3]
  end
  local cs = redis.call('HMGET', cur, unpack(fields))
  local ps = redis.call('HMGET', prev, unpack(fields))
  for j = 0, n - 1 do
    local field = fields[j + 1]
    local cost = tonumber(ARGV[first + 1 + j * 3])
    local limit = tonumber(ARGV[first + 2 + j * 3])
    local c = tonumber(cs[j + 1] or '0') or 0
    local p = tonumber(ps[j + 1] or '0') or 0
    local u = p * (1 - elapsed) + c + cost
    used[#used + 1] = field
    used[#used + 1] = tostring(u)
    used[#used + 1] = tostring(p)
    used[#used + 1] = tostring(c)
    if limit > 0 and cost > 0 and u > limit + 1e-9 then
      denied = field
      break
    end
  end
  if denied == '' then
    for j = 0, n - 1 do
      redis.call('HINCRBYFLOAT', cur, ARGV[first + j * 3], ARGV[first + 1 + j * 3])
      charges[#charges + 1] = cur
      charges[#charges + 1] = ARGV[first + j * 3]
      charges[#charges + 1] = ARGV[first + 1 + j * 3]
    end
    redis.call('EXPIRE', cur, window * 2 + 1)
    out[#out + 1] = {1, tostring(elapsed), '', used}
  else
    out[#out + 1] = {0, tostring(elapsed), denied, used}
  end
end
if record ~= '' then
  redis.call('HSET', record, 'out', cjson.encode(out), 'charges', cjson.encode(charges))
  redis.call('EXPIRE', record, window * 2 + 1)
end
return out
"""

# ARGV: base key, window seconds, the call's record key ('' for none), then
# field, delta pairs. With a record key it applies once (never once voided).
_ADJUST_WINDOW = """
local base = ARGV[1]
local window = tonumber(ARGV[2])
local record = ARGV[3]
if record ~= '' and redis.call('EXISTS', record) == 1 then
  return 0
end
local t = redis.call('TIME')
local index = math.floor(tonumber(t[1]) / window)
local cur = base .. ':' .. index
local charges = {}
for i = 4, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', cur, ARGV[i], ARGV[i + 1])
  charges[#charges + 1] = cur
  charges[#charges + 1] = ARGV[i]
  charges[#charges + 1] = ARGV[i + 1]
end
redis.call('EXPIRE', cur, window * 2 + 1)
if record ~= '' then
  redis.call('HSET', record, 'charges', cjson.encode(charges))
  redis.call('EXPIRE', record, window * 2 + 1)
end
return 1
"""

# A call's record (`consume_windows` / `adjust_window` with an `op`): the
# window fields it changed, each by how much. Voiding takes them back out of
# the windows still alive (a window gone has taken its charge with it) and
# marks the record void, so a call still on its way applies nothing.
# ARGV: the record key, its lifetime in seconds where it had none.
# Returns 1 where the call had applied, 0 where not, 2 where voided before.
_VOID_OP = """
local record = ARGV[1]
if redis.call('HEXISTS', record, 'void') == 1 then
  return 2
end
local raw = redis.call('HGET', record, 'charges')
redis.call('HSET', record, 'void', '1')
if not raw then
  redis.call('EXPIRE', record, tonumber(ARGV[2]))
  return 0
end
local c = cjson.decode(raw)
for i = 1, #c, 3 do
  if redis.call('EXISTS', c[i]) == 1 then
    redis.call('HINCRBYFLOAT', c[i], c[i + 1], -tonumber(c[i + 2]))
  end
end
return 1
"""

# `hincr_once`: the writer's last applied seq, then every hash's increments.
# ARGV: the seq key, seq, its lifetime in ms, then per hash: key, n fields, n
# field, amount pairs. Returns 1 where applied, 0 where that seq had been.
_HINCR_ONCE = """
local seq = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', ARGV[1]) or '0')
if seq <= last then
  redis.call('PEXPIRE', ARGV[1], ARGV[3])
  return 0
end
local i = 4
while i <= #ARGV do
  local key = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  for j = i + 2, i + 2 * n, 2 do
    redis.call('HINCRBYFLOAT', key, ARGV[j], ARGV[j + 1])
  end
  i = i + 2 + 2 * n
end
redis.call('SET', ARGV[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: the sorted set of members by last beat (Redis' own clock, so skewed
# hosts agree). ARGV: member, seconds after which a silent member is gone.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local live = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%.6f', now), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.6f', now - live))
redis.call('PEXPIRE', KEYS[1], math.ceil(live * 1000) + 1000)
return redis.call('ZCARD', KEYS[1])
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


def _decision(row: list[Any], window_s: int, costs: Mapping[str, int], limits: Mapping[str, int]) -> WindowDecision:
    allowed, elapsed_raw, field, flat = row
    elapsed = float(elapsed_raw)
    used: dict[str, float] = {}
    raw: dict[str, tuple[float, float]] = {}
    for i in range(0, len(flat), 4):
        name = flat[i].decode()
        used[name] = float(flat[i + 1])
        raw[name] = (float(flat[i + 2]), float(flat[i + 3]))
    if int(allowed):
        reset = {f: window_reset_s(window_s, elapsed, p, c + int(costs[f])) for f, (p, c) in raw.items()}
        return WindowDecision(True, 0.0, used, None, reset)
    denied = field.decode() or None
    reset = {f: window_reset_s(window_s, elapsed, p, c) for f, (p, c) in raw.items()}
    retry = 1.0
    if denied is not None:
        p, c = raw[denied]
        retry = window_retry_after_s(window_s, elapsed, p, c, int(costs[denied]), int(limits.get(denied, 0)))
    return WindowDecision(False, retry, used, denied, reset)


class RedisStore:
    def __init__(self, url: str, prefix: str = "specgate:", max_connections: int = 64) -> None:
        self.prefix = prefix
        self.url = url
        # A blocking pool: under a burst, callers wait for a connection
        # instead of failing with "Too many connections". A pooled connection
        # that died with a Redis restart fails its next command; one immediate
        # retry (on a fresh connection) keeps that from reading as an outage
        # (the soak saw the budget store flap "down" for seconds after Redis
        # came back). A real outage still fails: the reconnect is refused.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=5,
            health_check_interval=30,
            socket_connect_timeout=2,
            socket_keepalive=True,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )
        self._redis = aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes it
        self._consume_many = self._redis.register_script(_CONSUME_WINDOWS)
        self._adjust = self._redis.register_script(_ADJUST_WINDOW)
        self._void = self._redis.register_script(_VOID_OP)
        self._hincr_once = self._redis.register_script(_HINCR_ONCE)
        self._heartbeat = self._redis.register_script(_HEARTBEAT)
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

    async def hincr_once(self, seq_key: str, seq: int, increments: Mapping[str, Mapping[str, float]], ttl_s: float) -> bool:
        args: list[Any] = [self._k(seq_key), int(seq), max(1, int(ttl_s * 1000))]
        for key, mapping in increments.items():
            args += [self._k(key), len(mapping)]
            for field, amount in mapping.items():
                args += [field, repr(float(amount))]
        return int(await self._hincr_once(args=args)) == 1

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
        (decision,) = await self.consume_windows([(key, costs, limits)], window_s)
        return decision

    async def consume_windows(
        self,
        requests: Sequence[tuple[str, Mapping[str, int], Mapping[str, int]]],
        window_s: int = 60,
        op: str | None = None,
    ) -> list[WindowDecision]:
        """`consume_window` for several (key, costs, limits) in one atomic call."""
        if not requests:
            return []
        args: list[Any] = [window_s, self._record(op)]
        for key, costs, limits in requests:
            args += [self._k(key), len(costs)]
            for field, cost in costs.items():
                args += [field, int(cost), int(limits.get(field, 0))]
        rows = await self._consume_many(args=args)
        return [_decision(row, window_s, costs, limits) for row, (_, costs, limits) in zip(rows, requests)]

    async def adjust_window(self, key: str, deltas: Mapping[str, int], window_s: int = 60, op: str | None = None) -> None:
        args: list[Any] = [self._k(key), window_s, self._record(op)]
        for field, delta in deltas.items():
            args += [field, int(delta)]
        if len(args) > 3:
            await self._adjust(args=args)

    async def void_op(self, op: str, window_s: int = 60) -> bool:
        return int(await self._void(args=[self._record(op), window_s * 2 + 1])) == 1

    def _record(self, op: str | None) -> str:
        """The key of a call's record (`_VOID_OP`); '' for a call made without an op."""
        return "" if op is None else self._k(OP_RECORD_PREFIX + op)

    # -- liveness -----------------------------------------------------
    async def heartbeat(self, key: str, member: str, live_s: float) -> int:
        return int(await self._heartbeat(keys=[self._k(key)], args=[member, float(live_s)]))

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
