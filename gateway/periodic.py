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

import httpx
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What an outage of a dependency (the store, a replica) raises: sockets,
# timeouts, the clients' own connection errors. Expected in operation, so
# logged as one line without a traceback; anything else is a bug and keeps it.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError, RedisConnectionError, RedisTimeoutError, httpx.TransportError)


def is_outage(exc: BaseException) -> bool:
    """An expected outage (the dependency is unreachable), not a bug."""
    return isinstance(exc, OUTAGE_ERRORS)


def log_failure(log: logging.Logger, what: str, exc: BaseException, note: str = "") -> None:
    """The one line a failure's start gets: the error's class for an
    outage, the traceback for anything unexpected."""
    message = f"{what} failed{note}"
    if is_outage(exc):
        log.warning(message, extra={"fields": {"error": type(exc).__name__, "detail": str(exc)[:200]}})
    else:
        log.error(message, exc_info=exc)


async def every(interval_s: float, body: Callable[[], Awaitable[None]], log: logging.Logger, what: str) -> None:
    """Run `body` every `interval_s` seconds (after the first wait) until cancelled;
    a failing round is logged and the loop goes on. Logged once per change of
    state, not once per round: an outage of the store (a policy poll every
    second) is one line when it starts and one when it ends -- not a
    screenful per minute, and no traceback for an outage (`log_failure`)."""
    failures = 0
    while True:
        await asyncio.sleep(interval_s)
        try:
            await body()
        except Exception as exc:  # noqa: BLE001 - see docstring
            failures += 1
            if failures == 1:
                log_failure(log, what, exc, " (further failures are not logged until it recovers)")
            else:
                log.debug("%s failed again: %s", what, type(exc).__name__)
            continue
        if failures:
            log.warning("%s recovered after %d failed rounds", what, failures)
            failures = 0


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
