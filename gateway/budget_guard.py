"""Every store call of the budget path, bounded and behind a breaker.

Why: a budget check sits in front of every budgeted request. A dead store
must cost a request nothing, and a hung one (`CLIENT PAUSE`, a stalled
network) at most `budget_store_timeout_s` once, not the 5-10 s of the
connection pool's own waits on every request. So each call runs under
`asyncio.timeout`; a failure or timeout opens the breaker, and for
`budget_store_retry_s` every call fails fast with `StoreDown` without
touching the store. Then one call (a request's, or the heartbeat's, so
recovery needs no traffic) probes; when it succeeds, `on_recover` (the
reconciliation of what was admitted locally) runs before the breaker closes,
so no request takes the shared path before the shared window is whole.

The heartbeat also tells this instance how many gateway instances are live
(`heartbeat`, a sorted set of instance -> last beat in the store), which
sizes its local share during an outage, and detects an outage with no
traffic at all (so `/ready` and `specgate_budget_store_up` tell the truth).

Logging: one line when the store goes down, one when it is back, and one
the first time in an outage that the store answers a probe but the
reconciliation fails (the store then looks up and the gateway still says
down: the line says why); never one per request or per probe, never a
traceback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from redis.exceptions import RedisError

from contract.store import Store

from .periodic import log_failure

log = logging.getLogger("specgate.gateway.budget_store")

T = TypeVar("T")

INSTANCES_KEY = "gateway:instances"  # sorted set: gateway instance id -> last heartbeat (store clock)
LIVE_BEATS = 3  # an instance silent for this many heartbeats is no longer counted

# What a store call can fail with: the client's own errors, sockets, our timeout.
STORE_ERRORS = (RedisError, OSError, TimeoutError)


class StoreDown(Exception):
    """The budget store is not answering; `retry_after_s`: when the next probe may."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("budget store unavailable")
        self.retry_after_s = retry_after_s


@dataclass
class StoreBreaker:
    """Up, or down until `retry_at`, then one probe at a time. Pure state:
    the caller brings the clock."""

    retry_s: float
    up: bool = True
    retry_at: float = 0.0
    probing: bool = False
    down_since: float = 0.0

    def try_call(self, now: float) -> bool:
        """May a store call go out now? While down, only one probe, once due."""
        if self.up:
            return True
        if self.probing or now < self.retry_at:
            return False
        self.probing = True
        return True

    def failed(self, now: float) -> bool:
        """A call failed; True when this is the change from up to down."""
        went_down = self.up
        if went_down:
            self.down_since = now
        self.up, self.probing, self.retry_at = False, False, now + self.retry_s
        return went_down

    def probe_ended(self) -> None:
        self.probing = False

    def recovered(self, now: float) -> float:
        """The probe (and the reconciliation) succeeded: up again; returns how long it was down."""
        self.up, self.probing = True, False
        return now - self.down_since

    def retry_after_s(self, now: float) -> float:
        """Whole seconds (at least 1) a client should wait before the store may answer again."""
        return float(max(1, math.ceil(self.retry_at - now)))


def instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class BudgetGuard:
    def __init__(
        self,
        store: Store,
        timeout_s: float = 0.5,
        retry_s: float = 2.0,
        heartbeat_s: float = 2.0,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.breaker = StoreBreaker(retry_s)
        self.metrics = metrics
        self._clock = clock
        self.instance = instance_id()
        self.instances = 1  # live gateway instances, as last seen in the store (at least 1)
        # Called after a successful probe, before the breaker closes; returns
        # fields for the "back up" log line. Raising keeps the store down.
        self.on_recover: Callable[[], Awaitable[dict]] | None = None
        self._said_reconcile_failed = False  # this outage's reconciliation failure is logged
        self._task: asyncio.Task | None = None
        self._set_up_gauge(True)

    @property
    def up(self) -> bool:
        return self.breaker.up

    def retry_after_s(self) -> float:
        return self.breaker.retry_after_s(self._clock())

    async def bounded(self, op: Callable[[], Awaitable[T]]) -> T:
        """One store call under the timeout, the breaker left alone."""
        async with asyncio.timeout(self.timeout_s):
            return await op()

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run `op` (one store call) bounded, or raise `StoreDown` at once
        while the breaker is open. A successful probe reconciles, then closes
        the breaker; `op`'s result stands even when the reconciliation fails
        (its effect on the store is real)."""
        breaker = self.breaker
        if not breaker.try_call(self._clock()):
            raise StoreDown(self.retry_after_s())
        probe = not breaker.up
        try:
            result = await self.bounded(op)
        except STORE_ERRORS as exc:
            self._failed(exc)
            raise StoreDown(self.retry_after_s()) from None
        except BaseException:
            if probe:
                breaker.probe_ended()
            raise
        if probe:
            await self._recover()
        return result

    async def _recover(self) -> None:
        try:
            fields = await self.on_recover() if self.on_recover is not None else {}
        except STORE_ERRORS as exc:
            self._failed(exc)
            if not self._said_reconcile_failed:
                self._said_reconcile_failed = True
                log.warning(
                    "budget store answered a probe; its reconciliation failed, kept for the next probe",
                    extra={"fields": {"error": type(exc).__name__, "retry_s": self.breaker.retry_s}},
                )
            return
        except BaseException:
            self.breaker.probe_ended()
            raise
        down_s = self.breaker.recovered(self._clock())
        self._said_reconcile_failed = False
        self._set_up_gauge(True)
        log.info("budget store back up", extra={"fields": {"down_s": round(down_s, 1), **fields}})

    def _failed(self, exc: BaseException) -> None:
        if self.breaker.failed(self._clock()):
            self._set_up_gauge(False)
            log.warning(
                "budget store down",
                extra={"fields": {"error": type(exc).__name__, "retry_s": self.breaker.retry_s, "instances": self.instances}},
            )

    def _set_up_gauge(self, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.budget_store_up.set(1 if up else 0)

    # -- heartbeats -------------------------------------------------------
    async def beat(self) -> None:
        """One heartbeat; it doubles as the probe while the store is down."""
        try:
            n = await self.call(lambda: self.store.heartbeat(INSTANCES_KEY, self.instance, LIVE_BEATS * self.heartbeat_s))
        except StoreDown:
            return  # keep the count seen before the outage
        self.instances = max(1, int(n))
        if self.metrics is not None:
            self.metrics.gateway_instances.set(self.instances)

    async def _beat_forever(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception as exc:  # a bug in one beat must not end the loop
                log_failure(log, "budget store heartbeat", exc)
            await asyncio.sleep(self.heartbeat_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._beat_forever())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
