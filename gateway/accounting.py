"""Tenant budgets and per-request telemetry, with the store I/O batched.

Budgets: each request atomically reserves 1 request and an *estimate* of its
tokens (prompt characters / 4 + max_tokens) through `store.consume_window`
before it is proxied, so concurrent requests on any number of gateway
instances cannot overshoot together. When it finishes, the difference
between the actual usage and the estimate is returned with `adjust_window`.
Adjustments only ever make later admission more accurate, so they are summed
per tenant and flushed every `flush_s` instead of costing a Redis round trip
per request.

Telemetry: `spec_telemetry` counters are additive, so per-(tenant, replica)
increments are summed in memory and flushed every `telemetry_flush_s`
(and on shutdown): the controller differentiates counters over tens of
seconds, and a Redis round trip per request would cost more than the rest of
the gateway's work.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from .config import TenantConfig
from .spec_telemetry import RequestSpecStats, increments_for, record_increments
from .store import Store, WindowDecision

log = logging.getLogger("specgate.gateway.accounting")


def estimate_tokens(body: dict[str, Any], default_max_tokens: int) -> int:
    """Upper-bound-ish token estimate for admission (corrected afterwards)."""
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                c = m.get("content")
                if isinstance(c, str):
                    chars += len(c)
                elif isinstance(c, list):
                    for part in c:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            chars += len(part["text"])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list):
        for p in prompt:
            chars += len(p) if isinstance(p, str) else (len(p) * 4 if isinstance(p, list) else 0)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        max_tokens = default_max_tokens
    n = body.get("n") if isinstance(body.get("n"), int) and body.get("n", 1) > 0 else 1
    return chars // 4 + 1 + max_tokens * n


def budget_key(tenant_id: str) -> str:
    return f"budget:{tenant_id}"


class Accounting:
    def __init__(self, store: Store, window_s: int, flush_s: float = 0.05, telemetry_flush_s: float = 0.5) -> None:
        self.store = store
        self.window_s = window_s
        self.flush_s = flush_s
        self.telemetry_flush_s = telemetry_flush_s
        self._adjust: dict[str, int] = defaultdict(int)
        self._telemetry: dict[tuple[str, str], dict[str, float]] = {}
        self._tasks: list[asyncio.Task] = []
        self._pending: list = []
        self._flush_scheduled = False
        self._batch_in_flight = False
        self.max_batch = 256
        self._inflight_batches: set[asyncio.Task] = set()

    # -- budgets ------------------------------------------------------
    async def reserve(self, tenant: TenantConfig, estimate: int) -> tuple[WindowDecision | None, int]:
        """Reserve; returns (decision or None when unlimited, tokens reserved).

        Reservations issued in the same event-loop tick are sent together
        (`store.consume_windows`: one script call, still decided one by one
        in arrival order), which is what keeps Redis-checked budgets cheap
        at thousands of requests per second."""
        rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
        if not rpm and not tpm:
            return None, 0
        tokens = min(estimate, tpm) if tpm else 0
        future = asyncio.get_running_loop().create_future()
        self._pending.append((budget_key(tenant.id), {"requests": 1, "tokens": tokens}, {"requests": rpm, "tokens": tpm}, future))
        if not self._flush_scheduled and not self._batch_in_flight:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_batch)
        decision = await future
        return decision, tokens if decision.allowed else 0

    def _start_batch(self) -> None:
        """Send everything queued as one call. While a batch is in flight new
        reservations queue up and go in the next one, so batches grow with
        load and one idle request still goes out at once."""
        self._flush_scheduled = False
        if self._batch_in_flight or not self._pending:
            return
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        self._batch_in_flight = True
        task = asyncio.ensure_future(self._send_batch(batch))
        self._inflight_batches.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task) -> None:
        self._inflight_batches.discard(task)
        self._batch_in_flight = False
        if self._pending:
            self._start_batch()

    async def _send_batch(self, batch) -> None:
        try:
            decisions = await self.store.consume_windows([(k, c, l) for k, c, l, _ in batch], self.window_s)
        except BaseException as exc:
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("budget check cancelled"))
            if not isinstance(exc, Exception):
                raise
            return
        for (*_, fut), decision in zip(batch, decisions):
            if not fut.done():
                fut.set_result(decision)

    def settle(self, tenant: TenantConfig, reserved: int, actual: int) -> None:
        if tenant.tokens_per_minute and actual != reserved:
            self._adjust[tenant.id] += actual - reserved

    def refund_request(self, tenant: TenantConfig, reserved: int) -> None:
        """Give back a reservation for a request that never reached a replica."""
        if tenant.requests_per_minute or tenant.tokens_per_minute:
            asyncio.ensure_future(self._refund(tenant.id, reserved))

    async def _refund(self, tenant_id: str, reserved: int) -> None:
        try:
            await self.store.adjust_window(budget_key(tenant_id), {"requests": -1, "tokens": -reserved}, self.window_s)
        except Exception:
            log.warning("budget refund failed", extra={"fields": {"tenant": tenant_id}})

    # -- telemetry ----------------------------------------------------
    def record(self, tenant_id: str, replica: str, stats: RequestSpecStats) -> None:
        acc = self._telemetry.setdefault((tenant_id, replica), {})
        for k, v in increments_for(stats).items():
            acc[k] = acc.get(k, 0.0) + v

    # -- flushing -----------------------------------------------------
    async def flush_budgets(self) -> None:
        if not self._adjust:
            return
        pending, self._adjust = self._adjust, defaultdict(int)
        for tenant_id, delta in pending.items():
            if delta:
                await self.store.adjust_window(budget_key(tenant_id), {"tokens": delta}, self.window_s)

    async def flush_telemetry(self) -> None:
        if not self._telemetry:
            return
        pending, self._telemetry = self._telemetry, {}
        for (tenant_id, replica), inc in pending.items():
            await record_increments(self.store, tenant_id, replica, inc)

    async def flush(self) -> None:
        await self.flush_budgets()
        await self.flush_telemetry()

    async def _loop(self, interval: float, body) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await body()
            except Exception:
                log.exception("accounting flush failed")

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(self.flush_s, self.flush_budgets)),
            asyncio.create_task(self._loop(self.telemetry_flush_s, self.flush_telemetry)),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        try:
            await self.flush()
        except Exception:
            log.exception("final accounting flush failed")
