"""Capture, the I/O half: the bounded queue of finished samples and the
workers that mirror them to the capture replica (`gateway.capture` has the
decisions).

Why a queue and a fixed set of workers, after the response: the tenant's
response must never wait on, or fail because of, the capture replica. A
sample is enqueued only once the client has everything, `offer` never
blocks (a full queue drops the sample and counts it), and at most
`capture.concurrency` capture requests are in flight, on an HTTP client of
their own (the capture replica's slowness cannot hold the connections the
serving replicas use). Each capture request is bounded by
`capture.timeout_s`; what it answers changes nothing but the counters.

The hourly budget (`max_per_hour`) holds for the whole fleet, not per
instance: each instance keeps its own exact window (`HourlyBudget`: asked on
the request path, where no store round trip may wait), and a worker takes
the sample from the tenant's shared window in the store
(`FleetCaptureBudget`, a sliding window of an hour) before sending it, so N
gateway instances, or one restarted, do not capture N times the budget.
While the store is down, the instance's own window is the bound.

Shutdown (`stop`): the queue gets `DRAIN_S` to empty, then the workers are
cancelled; samples still queued are counted `dropped_queue`, a request cut
in flight `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson

from contract.capture import CAPTURE_REQUEST_PREFIX, CaptureTarget, capture_request_body
from contract.policy import SpeculationPolicy
from contract.settings import UPSTREAM_KEEPALIVE_S

from .budget_guard import BudgetGuard, StoreDown
from .capture import (
    DROPPED_BUDGET,
    DROPPED_QUEUE,
    FAILED,
    HOUR_S,
    SENT,
    CapturePlan,
    HourlyBudget,
    sample_outcome,
    sampled,
    shape_refusal,
)
from .metrics import GatewayMetrics
from .upstream import Upstream, create_upstream, read_whole

log = logging.getLogger("specgate.gateway.capture")

# At shutdown, how long queued captures may still be sent before the workers are cancelled.
DRAIN_S = 5.0
# The store key of a tenant's fleet-wide capture window.
CAPTURE_WINDOW_KEY = "capture:window:"


class FleetCaptureBudget:
    """A tenant's captures in the last hour across every gateway instance:
    the store's sliding window (the one budgets use), through the budget
    guard (bounded wait, breaker). `__call__` takes one capture; False when
    the fleet is at the tenant's limit. A store that is down answers True:
    each instance's own window still bounds it (fail open, as budgets do by
    default)."""

    def __init__(self, guard: BudgetGuard) -> None:
        self.guard = guard

    async def __call__(self, tenant: str, limit: int) -> bool:
        store = self.guard.store
        try:
            decision = await self.guard.call(lambda: store.consume_window(
                CAPTURE_WINDOW_KEY + tenant, {"captures": 1}, {"captures": limit}, window_s=int(HOUR_S)))
        except StoreDown:
            return True
        return decision.allowed


class CaptureMirror:
    """One gateway instance's capture: decisions on the request path
    (`plan`, `finished`), the queue and the workers (`start`, `stop`)."""

    def __init__(self, target: CaptureTarget, metrics: GatewayMetrics, *, upstream: Upstream | None = None,
                 clock: Callable[[], float] = time.monotonic, draw: Callable[[], float] = random.random,
                 upstream_client: str = "aiohttp", connect_timeout_s: float = 2.0, keepalive_s: float = UPSTREAM_KEEPALIVE_S) -> None:
        self.target = target
        self.url = (target.url or "").rstrip("/")
        self.metrics = metrics
        self.clock = clock
        self.draw = draw
        self.budget = HourlyBudget()
        # The fleet-wide window (None: this instance is the fleet, e.g. the embedded store).
        self.fleet_budget: Callable[[str, int], Awaitable[bool]] | None = None
        self.queue: asyncio.Queue[tuple[CapturePlan, list[int], list[int]]] = asyncio.Queue(target.queue_size)
        self._upstream = upstream
        self._own_upstream = upstream is None
        self._client, self._connect_timeout_s, self._keepalive_s = upstream_client, connect_timeout_s, keepalive_s
        self._workers: list[asyncio.Task] = []
        metrics.capture_queue_depth.set_function(self.queue.qsize)

    # -- request path -------------------------------------------------------------
    def plan(self, tenant: str, label: str, policy: SpeculationPolicy, body: dict, endpoint: str, model: str) -> CapturePlan | None:
        """A capture candidate for this request, or None. A sampled request of
        a tenant at its hourly cap is counted `dropped_budget` here (no ids
        are asked for it)."""
        spec = policy.capture
        if spec is None:  # not opted in: never captured (and no draw taken)
            return None
        if not sampled(spec, self.url, self.draw()) or shape_refusal(body, endpoint) is not None:
            return None
        if not self.budget.has_room(tenant, spec.max_per_hour, self.clock()):
            self._count(label, DROPPED_BUDGET)
            return None
        return CapturePlan(tenant=tenant, label=label, model=model, limit=spec.max_per_hour)

    def finished(self, plan: CapturePlan, sample: tuple[list[int], list[int]] | None) -> str | None:
        """The request is complete (the client has its response): enqueue its
        sample or count why not. Never blocks. Returns the outcome so far
        (None: enqueued, or not a sample at all)."""
        if sample is None:
            return None
        prompt, completion = sample
        now = self.clock()
        outcome = sample_outcome(len(prompt) + len(completion), self.target.max_tokens_per_sample,
                                 self.budget.has_room(plan.tenant, plan.limit, now), self.queue.full())
        if outcome is not None:
            self._count(plan.label, outcome)
            return outcome
        self.budget.take(plan.tenant, plan.limit, now)
        self.queue.put_nowait((plan, prompt, completion))
        return None

    # -- workers ----------------------------------------------------------------
    def start(self) -> None:
        if self._upstream is None:
            self._upstream = create_upstream(self._client, self.target.concurrency, self._connect_timeout_s, self.target.timeout_s,
                                             self._keepalive_s)
        self._workers = [asyncio.ensure_future(self._worker()) for _ in range(self.target.concurrency)]

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), drain_s)
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers = []
        while not self.queue.empty():
            plan, _, _ = self.queue.get_nowait()
            self.queue.task_done()
            self._count(plan.label, DROPPED_QUEUE)
        if self._own_upstream and self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    async def _worker(self) -> None:
        while True:
            plan, prompt, completion = await self.queue.get()
            try:
                if self.fleet_budget is not None and not await self.fleet_budget(plan.tenant, plan.limit):
                    self._count(plan.label, DROPPED_BUDGET)
                    self.queue.task_done()
                    continue
                ok = await self._send(plan, prompt, completion)
            except asyncio.CancelledError:
                self._count(plan.label, FAILED)
                self.queue.task_done()
                raise
            except Exception:  # noqa: BLE001 - a capture must never take a worker down
                log.debug("capture request failed", exc_info=True)
                ok = False
            self._count(plan.label, SENT if ok else FAILED)
            if ok:
                self.metrics.child(self.metrics.capture_tokens, plan.label).inc(len(prompt) + len(completion))
            self.queue.task_done()

    async def _send(self, plan: CapturePlan, prompt: list[int], completion: list[int]) -> bool:
        model = self.target.model or plan.model
        body = orjson.dumps(capture_request_body(model, plan.tenant, prompt, completion))
        rid = f"{CAPTURE_REQUEST_PREFIX}{uuid.uuid4()}"
        headers = {"content-type": "application/json", "accept": "application/json", "x-request-id": rid}
        async with asyncio.timeout(self.target.timeout_s):
            resp = await self._upstream.post(self.url + "/v1/completions", body, headers, self.target.timeout_s)
            data = await read_whole(resp)
        if resp.status != 200:
            log.info("capture request refused", extra={"fields": {"request_id": rid, "status": resp.status,
                                                                  "error": data[:200].decode("utf-8", "replace")}})
            return False
        return True

    def _count(self, label: str, outcome: str) -> None:
        self.metrics.child(self.metrics.capture_requests, label, outcome).inc()
