"""Budget writes of unknown outcome (`gateway.budget_writes`), on the embedded store
and the real `BudgetGuard`: what is remembered, and what voiding does."""

from __future__ import annotations

import asyncio

import pytest

from contract.store import MemoryStore
from gateway.budget_guard import BudgetGuard, StoreDown
from gateway.budget_writes import UncertainWrites


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def charged(store: MemoryStore, key: str) -> float:
    return sum(fields.get("requests", 0.0) for (k, _), fields in store._windows.items() if k == key)


async def test_a_write_that_failed_once_sent_is_voided_and_its_charge_taken_back():
    store = MemoryStore(prefix="")
    guard = BudgetGuard(store, timeout_s=0.05, retry_s=60.0)
    writes = UncertainWrites(60)

    async def lands_then_hangs(op: str):
        await store.consume_windows([("b", {"requests": 1}, {"requests": 5})], 60, op)
        await asyncio.sleep(1)  # the reply never comes back in time

    with pytest.raises(StoreDown):
        await writes.run(lands_then_hangs, guard.call)
    assert len(writes) == 1 and charged(store, "b") == 1.0
    assert await writes.void(store, guard.bounded) == (1, 1)
    assert len(writes) == 0 and charged(store, "b") == 0.0


async def test_a_call_the_breaker_refused_is_not_remembered():
    store = MemoryStore(prefix="")
    guard = BudgetGuard(store, timeout_s=0.05, retry_s=60.0)
    guard.breaker.failed(guard._clock())  # down: calls fail fast without touching the store
    writes = UncertainWrites(60)
    with pytest.raises(StoreDown):
        await writes.run(lambda op: store.adjust_window("b", {"requests": 1}, 60, op), guard.call)
    assert len(writes) == 0 and charged(store, "b") == 0.0


async def test_voiding_a_write_that_never_arrived_keeps_it_from_applying_later():
    store = MemoryStore(prefix="")
    writes = UncertainWrites(60)
    ops: list[str] = []

    async def lost(op: str):
        ops.append(op)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await writes.run(lost, lambda send: send())
    assert await writes.void(store, lambda call: call()) == (1, 0)
    await store.adjust_window("b", {"requests": 1}, 60, ops[0])  # it arrives after all
    assert charged(store, "b") == 0.0


async def test_a_failed_void_keeps_the_rest_and_writes_past_their_window_are_dropped():
    clock = Clock()
    store = MemoryStore(prefix="")
    writes = UncertainWrites(60, clock=clock)

    async def fail(op: str):
        raise TimeoutError

    for _ in range(3):
        with pytest.raises(TimeoutError):
            await writes.run(fail, lambda send: send())
        clock.t += 50.0  # 150, 100 and 50 s old at the end: the first is past 2 windows + 1 s

    calls = 0

    async def bounded(call):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise TimeoutError  # the store failed again during the recovery
        return await call()

    with pytest.raises(TimeoutError):
        await writes.void(store, bounded)
    assert len(writes) == 1  # the expired one dropped unvoided, the next voided, the one that failed kept
    assert await writes.void(store, bounded) == (1, 0)
    assert len(writes) == 0
