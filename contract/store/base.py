"""The shared-state contract of specgate.

Gateways, controllers and the admin API coordinate through a handful of
primitives rather than through domain-specific tables, so that the same
domain code runs against Redis (several processes, several hosts) and against
the embedded in-memory store (one process, no Redis) without branches.

Every primitive that must be atomic across gateway instances (the budget
window, the leader lock) is atomic in both implementations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class WindowDecision:
    """Outcome of an atomic check-and-consume against a sliding window.

    `used` holds, per field, the weighted usage *after* this call (or what it
    would have been had it been admitted, when denied). `reset_s` holds, per
    field decided, the seconds until the window counts none of the usage it
    holds now (`window_reset_s`): OpenAI's `x-ratelimit-reset-*`. When
    denied, `retry_after_s` is the earliest whole second at which this same
    request fits (`window_retry_after_s`).
    """

    allowed: bool
    retry_after_s: float
    used: Mapping[str, float]
    denied_field: str | None = None
    reset_s: Mapping[str, float] = field(default_factory=dict)


OP_RECORD_PREFIX = "op:"  # a voidable call's record (`Store.void_op`), under the store's prefix
WINDOW_SLACK = 1e-9  # usage may exceed a limit by this much (float noise) and still fit


# -- the sliding window's arithmetic, shared by both stores -------------------
# A window of `window_s` seconds counts `previous * (1 - elapsed) + current`,
# `elapsed` being the fraction of the current window gone by. Both stores hand
# their raw (previous, current, elapsed) to these functions, so Redis and the
# embedded store give the same answers by construction, not by two copies of
# one formula kept in step.


def window_retry_after_s(window_s: float, elapsed: float, previous: float, current: float, cost: float, limit: float) -> float:
    """Earliest whole second (at least 1) from now at which `cost` more fits
    under `limit`, assuming no other traffic.

    Why not the end of the window: the previous window's share decays
    linearly, so a request denied at 54 s into a window is often admitted
    again within a second; and at the end of the window the usage counted is
    all of `current`, so the window's end is not even always early enough.
    The weighted usage only falls with time; the first moment it is low
    enough is found in closed form, first within the current window, else in
    the next one (where `current` becomes the decaying part). Both stores
    compare with `WINDOW_SLACK`, so float noise at the returned second cannot
    deny what this formula admits."""
    room_now = limit - current - cost
    if room_now >= 0:
        if previous <= 0:
            seconds = 0.0
        else:  # previous * (1 - e) <= room_now
            seconds = max(0.0, (1.0 - room_now / previous) - elapsed) * window_s
    else:
        room_next = limit - cost
        to_next = (1.0 - elapsed) * window_s
        if room_next < 0:  # never fits: the best answer is when the window is empty
            seconds = to_next + window_s
        elif current <= 0:
            seconds = to_next
        else:  # current * (1 - f) <= room_next, in the next window
            seconds = to_next + max(0.0, 1.0 - room_next / current) * window_s
    return float(max(1, math.ceil(seconds)))


def window_reset_s(window_s: float, elapsed: float, previous: float, current: float) -> float:
    """Seconds until the window counts none of its present usage, i.e. is
    back to its initial state (OpenAI's meaning of `x-ratelimit-reset-*`):
    what is in the current window counts until the end of the next one."""
    if current > 0:
        return (2.0 - elapsed) * window_s
    if previous > 0:
        return (1.0 - elapsed) * window_s
    return 0.0


@runtime_checkable
class Store(Protocol):
    """Primitives over a namespaced key space. Keys are relative to `prefix`."""

    prefix: str

    async def ping(self) -> bool: ...
    async def close(self) -> None: ...

    # -- plain values -------------------------------------------------
    async def get_json(self, key: str) -> Any | None: ...
    async def set_json(self, key: str, value: Any, ttl_s: float | None = None) -> None: ...
    async def delete(self, key: str) -> None: ...
    async def incr(self, key: str, amount: int = 1) -> int: ...

    # -- counters -----------------------------------------------------
    async def hincr(self, key: str, mapping: Mapping[str, float]) -> None: ...
    async def hgetall(self, key: str) -> dict[str, float]: ...

    async def hincr_once(self, seq_key: str, seq: int, increments: Mapping[str, Mapping[str, float]], ttl_s: float) -> bool:
        """`hincr` every key's increments, atomically, unless `seq` is not above
        the last one applied under `seq_key`; True when applied. Why: a flush
        that timed out may have run, and one resent under the same `seq` then
        counts once (a counter cannot be voided: one going down reads as a
        reset). A writer's seqs rise and it has one call out at a time; the
        store keeps only the last, for `ttl_s` after that writer's last call."""
        ...

    # -- sets and bounded logs ----------------------------------------
    async def sadd(self, key: str, *members: str) -> None: ...
    async def smembers(self, key: str) -> set[str]: ...
    async def push_capped(self, key: str, value: Any, maxlen: int) -> None: ...
    async def recent(self, key: str, n: int) -> list[Any]: ...

    # -- admission ----------------------------------------------------
    async def consume_window(
        self,
        key: str,
        costs: Mapping[str, int],
        limits: Mapping[str, int],
        window_s: int = 60,
    ) -> WindowDecision: ...

    async def consume_windows(
        self,
        requests: Sequence[tuple[str, Mapping[str, int], Mapping[str, int]]],
        window_s: int = 60,
        op: str | None = None,
    ) -> list[WindowDecision]:
        """Several `consume_window` calls decided in order, in one atomic round trip.
        `op`: a unique id that makes the call idempotent and voidable (`void_op`)."""
        ...

    async def adjust_window(self, key: str, deltas: Mapping[str, int], window_s: int = 60, op: str | None = None) -> None:
        """Add `deltas` to the current window; `op` as for `consume_windows`."""
        ...

    async def void_op(self, op: str, window_s: int = 60) -> bool:
        """Undo the window writes of the call made with `op` and keep it from
        ever applying (a call whose caller gave up may still run later: a
        timeout says nothing about whether the store executed it). True when
        it had applied. Why: a budget write that timed out is paid again by
        the caller's own bookkeeping (local admission, re-queued adjustments);
        voiding it first keeps the window from counting it twice. The
        call's record lasts as long as its window does (`window_s` x 2)."""
        ...

    # -- liveness -----------------------------------------------------
    async def heartbeat(self, key: str, member: str, live_s: float) -> int:
        """Record `member`'s beat now (store clock), forget members silent for
        `live_s`, and return how many are live (this one included)."""
        ...

    # -- leadership ---------------------------------------------------
    async def acquire_lock(self, key: str, owner: str, ttl_s: float) -> bool: ...
    async def release_lock(self, key: str, owner: str) -> None: ...
    async def lock_owner(self, key: str) -> str | None: ...

    # -- notifications ------------------------------------------------
    async def publish(self, channel: str, message: Any) -> None: ...
    def subscribe(self, channel: str) -> AsyncIterator[Any]: ...
