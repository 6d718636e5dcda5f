"""Embedded in-memory store: the single-process default when no Redis URL is set.

It mirrors `RedisStore` semantics exactly (sliding windows weighted by the
previous window, lock TTLs, capped logs, pub/sub fan-out) so that code tested
against one behaves the same against the other.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from .base import WINDOW_SLACK, WindowDecision, window_reset_s, window_retry_after_s


@dataclass
class _OpRecord:
    """A voidable call: until when it is kept, the window fields it changed
    ((key, window index), field, amount), its answer where it consumed, void."""

    expires: float
    charges: list[tuple[tuple[str, int], str, float]]
    decisions: tuple[WindowDecision, ...] | None = None
    void: bool = False


class MemoryStore:
    def __init__(self, prefix: str = "specgate:", clock: Callable[[], float] = time.time) -> None:
        self.prefix = prefix
        self._clock = clock
        self._values: dict[str, tuple[Any, float | None]] = {}
        self._hashes: dict[str, dict[str, float]] = defaultdict(dict)
        self._sets: dict[str, set[str]] = defaultdict(set)
        self._logs: dict[str, deque[Any]] = {}
        self._windows: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
        self._subscribers: dict[str, set[asyncio.Queue[Any]]] = defaultdict(set)
        self._beats: dict[str, dict[str, float]] = {}
        self._ops: dict[str, _OpRecord] = {}  # calls made with an `op` (see `void_op`)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        for queues in self._subscribers.values():
            for queue in queues:
                queue.put_nowait(_CLOSED)

    # -- plain values -------------------------------------------------
    def _live(self, key: str) -> Any | None:
        item = self._values.get(key)
        if item is None:
            return None
        value, expires = item
        if expires is not None and expires <= self._clock():
            del self._values[key]
            return None
        return value

    async def get_json(self, key: str) -> Any | None:
        return copy.deepcopy(self._live(key))

    async def set_json(self, key: str, value: Any, ttl_s: float | None = None) -> None:
        expires = self._clock() + ttl_s if ttl_s else None
        self._values[key] = (copy.deepcopy(value), expires)

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)
        self._hashes.pop(key, None)
        self._sets.pop(key, None)
        self._logs.pop(key, None)

    async def incr(self, key: str, amount: int = 1) -> int:
        value = int(self._live(key) or 0) + amount
        self._values[key] = (value, None)
        return value

    # -- counters -----------------------------------------------------
    async def hincr(self, key: str, mapping: Mapping[str, float]) -> None:
        bucket = self._hashes[key]
        for field, amount in mapping.items():
            bucket[field] = bucket.get(field, 0.0) + float(amount)

    async def hgetall(self, key: str) -> dict[str, float]:
        return dict(self._hashes.get(key, {}))

    async def hincr_once(self, seq_key: str, seq: int, increments: Mapping[str, Mapping[str, float]], ttl_s: float) -> bool:
        last = int(self._live(seq_key) or 0)
        applied = seq > last
        if applied:
            for key, mapping in increments.items():
                await self.hincr(key, mapping)
        self._values[seq_key] = (max(seq, last), self._clock() + ttl_s)
        return applied

    # -- sets and bounded logs ----------------------------------------
    async def sadd(self, key: str, *members: str) -> None:
        self._sets[key].update(members)

    async def smembers(self, key: str) -> set[str]:
        return set(self._sets.get(key, set()))

    async def push_capped(self, key: str, value: Any, maxlen: int) -> None:
        log = self._logs.setdefault(key, deque(maxlen=maxlen))
        if log.maxlen != maxlen:
            log = self._logs[key] = deque(log, maxlen=maxlen)
        log.appendleft(copy.deepcopy(value))

    async def recent(self, key: str, n: int) -> list[Any]:
        return [copy.deepcopy(v) for v in list(self._logs.get(key, ()))[:n]]

    # -- admission ----------------------------------------------------
    def _window_usage(self, key: str, window_s: int, now: float) -> tuple[int, float, dict[str, float], dict[str, float]]:
        index = int(now // window_s)
        elapsed = (now - index * window_s) / window_s
        current = self._windows[(key, index)]
        previous = self._windows.get((key, index - 1), {})
        # Drop windows older than the previous one so memory stays bounded.
        for stale in [k for k in self._windows if k[0] == key and k[1] < index - 1]:
            del self._windows[stale]
        return index, elapsed, current, previous

    async def consume_window(
        self,
        key: str,
        costs: Mapping[str, int],
        limits: Mapping[str, int],
        window_s: int = 60,
    ) -> WindowDecision:
        return self._consume_at(key, costs, limits, window_s, self._clock())

    def _consume_at(self, key: str, costs: Mapping[str, int], limits: Mapping[str, int], window_s: int, now: float) -> WindowDecision:
        _, elapsed, current, previous = self._window_usage(key, window_s, now)
        used: dict[str, float] = {}
        seen: dict[str, tuple[float, float]] = {}
        for field, cost in costs.items():
            p, c = seen[field] = previous.get(field, 0.0), current.get(field, 0.0)
            used[field] = p * (1.0 - elapsed) + c + cost
            limit = limits.get(field, 0)
            if limit > 0 and cost > 0 and used[field] > limit + WINDOW_SLACK:
                reset = {f: window_reset_s(window_s, elapsed, p_, c_) for f, (p_, c_) in seen.items()}
                retry = window_retry_after_s(window_s, elapsed, p, c, cost, limit)
                return WindowDecision(False, retry, used, field, reset)
        for field, cost in costs.items():
            current[field] = current.get(field, 0.0) + cost
        reset = {f: window_reset_s(window_s, elapsed, p_, c_ + costs[f]) for f, (p_, c_) in seen.items()}
        return WindowDecision(True, 0.0, used, None, reset)

    async def consume_windows(
        self,
        requests: Sequence[tuple[str, Mapping[str, int], Mapping[str, int]]],
        window_s: int = 60,
        op: str | None = None,
    ) -> list[WindowDecision]:
        record = self._record(op)
        if record is not None and record.decisions is not None:
            return list(record.decisions)  # run again: the first answer
        if record is not None and record.void:
            return [WindowDecision(False, 1.0, {}) for _ in requests]
        now = self._clock()  # one clock for the whole call, as the script reads TIME once
        index = int(now // window_s)
        out = [self._consume_at(key, costs, limits, window_s, now) for key, costs, limits in requests]
        if op is not None:
            charges = [((key, index), f, c) for (key, costs, _), d in zip(requests, out) if d.allowed for f, c in costs.items()]
            self._ops[op] = _OpRecord(now + window_s * 2 + 1, charges, tuple(out))
        return out

    async def adjust_window(self, key: str, deltas: Mapping[str, int], window_s: int = 60, op: str | None = None) -> None:
        if self._record(op) is not None:
            return  # applied before, or voided
        now = self._clock()
        index, _, current, _ = self._window_usage(key, window_s, now)
        for field, delta in deltas.items():
            current[field] = current.get(field, 0.0) + delta
        if op is not None:
            self._ops[op] = _OpRecord(now + window_s * 2 + 1, [((key, index), f, d) for f, d in deltas.items()])

    async def void_op(self, op: str, window_s: int = 60) -> bool:
        record = self._record(op)
        if record is None:
            self._ops[op] = _OpRecord(self._clock() + window_s * 2 + 1, [], void=True)
            return False
        if record.void:
            return False
        record.void = True
        for window, field, amount in record.charges:
            if window in self._windows:  # a window gone took its charge with it
                self._windows[window][field] = self._windows[window].get(field, 0.0) - amount
        return True

    def _record(self, op: str | None) -> _OpRecord | None:
        """The live record of a call made with `op` (as Redis' expiring hash)."""
        if op is None:
            return None
        now = self._clock()
        while self._ops:  # oldest first (insertion order): drop the expired front
            first = next(iter(self._ops))
            if self._ops[first].expires > now:
                break
            del self._ops[first]
        return self._ops.get(op)

    # -- liveness -----------------------------------------------------
    async def heartbeat(self, key: str, member: str, live_s: float) -> int:
        now = self._clock()
        beats = self._beats.setdefault(key, {})
        beats[member] = now
        for stale in [m for m, t in beats.items() if t < now - live_s]:
            del beats[stale]
        return len(beats)

    # -- leadership ---------------------------------------------------
    async def acquire_lock(self, key: str, owner: str, ttl_s: float) -> bool:
        holder = self._live(key)
        if holder is not None and holder != owner:
            return False
        self._values[key] = (owner, self._clock() + ttl_s)
        return True

    async def release_lock(self, key: str, owner: str) -> None:
        if self._live(key) == owner:
            del self._values[key]

    async def lock_owner(self, key: str) -> str | None:
        return self._live(key)

    # -- notifications ------------------------------------------------
    async def publish(self, channel: str, message: Any) -> None:
        for queue in list(self._subscribers.get(channel, ())):
            queue.put_nowait(copy.deepcopy(message))

    async def subscribe(self, channel: str) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._subscribers[channel].add(queue)
        try:
            while True:
                message = await queue.get()
                if message is _CLOSED:
                    return
                yield message
        finally:
            self._subscribers[channel].discard(queue)


_CLOSED = object()
