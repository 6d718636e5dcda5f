"""Background loops of the gateway (health checks, /metrics scrapes, budget
and telemetry flushes, policy polls), started and stopped one way.

Why one helper: each loop must survive a failing round (a Redis blip, a bug
in one round must not end future checks) and stop promptly at shutdown;
written once, no loop forgets either.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable


async def every(interval_s: float, body: Callable[[], Awaitable[None]], log: logging.Logger, what: str) -> None:
    """Run `body` every `interval_s` seconds (after the first wait) until cancelled;
    a failing round is logged and the loop goes on."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await body()
        except Exception:  # noqa: BLE001 - see docstring
            log.exception("%s failed", what)


class Loops:
    """A set of background tasks stopped together."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task] = []

    def start(self, *coroutines: Awaitable[None]) -> None:
        self._tasks += [asyncio.ensure_future(c) for c in coroutines]

    async def stop(self) -> None:
        """Cancel every task and wait for it; a task's own error is not re-raised at shutdown."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
