"""The shared-state contract of specgate.

Gateways, controllers and the admin API coordinate through a handful of
primitives rather than through domain-specific tables, so that the same
domain code runs against Redis (several processes, several hosts) and against
the embedded in-memory store (one process, no Redis) without branches.

Every primitive that must be atomic across gateway instances (the budget
window, the leader lock) is atomic in both implementations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class WindowDecision:
    """Outcome of an atomic check-and-consume against a sliding window.

    `used` holds, per field, the weighted usage *after* this call (or what it
    would have been had it been admitted, when denied).
    """

    allowed: bool
    retry_after_s: float
    used: Mapping[str, float]
    denied_field: str | None = None


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
    ) -> list[WindowDecision]:
        """Several `consume_window` calls decided in order, in one atomic round trip."""
        ...

    async def adjust_window(self, key: str, deltas: Mapping[str, int], window_s: int = 60) -> None: ...

    # -- leadership ---------------------------------------------------
    async def acquire_lock(self, key: str, owner: str, ttl_s: float) -> bool: ...
    async def release_lock(self, key: str, owner: str) -> None: ...
    async def lock_owner(self, key: str) -> str | None: ...

    # -- notifications ------------------------------------------------
    async def publish(self, channel: str, message: Any) -> None: ...
    def subscribe(self, channel: str) -> AsyncIterator[Any]: ...
