"""Budget writes whose outcome is unknown, voided before they can count twice.

Why: a store call that times out may still run. The command was on its way,
or Redis executed it and the reply was lost. Measured on a real Redis: a
reservation sent while another client's `DEBUG SLEEP 1` held the server
timed out at 0.3 s, and the window counted it once the sleep ended.

The gateway's own bookkeeping then pays for the same thing again:
- a reservation that timed out is decided by `budget_failure_mode`, so in
  `local` mode its request is admitted locally and paid in at reconciliation;
- an adjustment, refund or reconciliation payment that timed out is queued
  and sent again.

So every budget write carries a unique op id (`Store.void_op`). One that
failed after it was sent is remembered here. A call the breaker refused
never reached the store and is not remembered.

Every such failure opens the breaker, so a recovery probe follows. The probe
voids each remembered write before it pays in what was admitted locally:
- a write that landed is undone;
- a write still on its way will apply nothing when it arrives.

A write older than its window's lifetime (twice the window) needs no voiding:
its charge has expired with the window, and so has its record.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from typing import Awaitable, Callable, TypeVar

from contract.store import Store

T = TypeVar("T")


class UncertainWrites:
    """The ids of budget writes sent whose outcome is unknown, oldest first."""

    def __init__(self, window_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._ops: deque[tuple[str, float]] = deque()  # (op id, when it was sent)

    def __len__(self) -> int:
        return len(self._ops)

    async def run(self, write: Callable[[str], Awaitable[T]], via: Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]) -> T:
        """`write(op)` under a fresh op id, through `via` (the guard's `call` or
        `bounded`); the op is remembered when the call fails once sent."""
        op = uuid.uuid4().hex
        sent = False

        async def send() -> T:
            nonlocal sent
            sent = True
            return await write(op)

        try:
            return await via(send)
        except BaseException:
            if sent:
                self._ops.append((op, self._clock()))
            raise

    async def void(self, store: Store, bounded: Callable[[Callable[[], Awaitable[bool]]], Awaitable[bool]]) -> tuple[int, int]:
        """Void every remembered write (each call through `bounded`); returns
        (writes voided, how many of them had landed). A call that fails
        raises, and the writes not yet voided stay for the next probe
        (voiding twice is harmless)."""
        voided = landed = 0
        expired = self._clock() - (2 * self.window_s + 1)
        while self._ops:
            op, sent_at = self._ops[0]
            if sent_at > expired:
                landed += bool(await bounded(lambda o=op: store.void_op(o, self.window_s)))
                voided += 1
            self._ops.popleft()
        return voided, landed
