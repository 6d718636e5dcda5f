"""Shared state: Redis when a URL is configured, the embedded store otherwise."""

from __future__ import annotations

from .base import Store, WindowDecision
from .memory import MemoryStore


def create_store(redis_url: str | None, prefix: str = "specgate:") -> Store:
    """Pick the implementation from configuration; both satisfy `Store`."""
    if redis_url:
        from .redis_store import RedisStore

        return RedisStore(redis_url, prefix=prefix)
    return MemoryStore(prefix=prefix)


__all__ = ["Store", "WindowDecision", "MemoryStore", "create_store"]
