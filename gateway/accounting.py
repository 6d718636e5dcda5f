"""Tenant budgets and per-request telemetry, with the store I/O batched.

Budgets: each request atomically reserves 1 request and an *estimate* of its
tokens (prompt characters / 4 + max_tokens) through `store.consume_window`
before it is proxied, so concurrent requests on any number of gateway
instances cannot overshoot together. When it finishes, the difference
between the actual usage and the estimate is returned with `adjust_window`.
Adjustments only ever make later admission more accurate, so they are summed
per tenant and flushed every `flush_s` instead of costing a Redis round trip
per request.

Leases: at a few requests per second and up, a Redis round trip per request
is most of the latency the gateway adds. So an instance may *lease* a small
slice of a tenant's budget: one atomic `consume_window` of N requests and T
tokens, made in the background, after which requests are admitted locally
from the slice. Every admitted request is still paid for in Redis before it
is admitted, so instances sharing one Redis never admit more than the limit
together. A lease is sized to about `lease_s` of this instance's recent
traffic, never more than `lease_fraction` of the tenant's per-minute limits
(tenants with small limits never lease and are decided per request, exactly
as before), is refilled in the background when half used, and what is left
of it is returned to the window (`adjust_window`) when it expires after
`lease_s` without traffic or when the gateway stops. A lease that does not
fit (near the limit) is simply not granted; requests then take the
per-request path, so denials and `Retry-After` are decided as before.

Store failures (`budget_guard`): every store call here is bounded by
`budget_store_timeout_s` and goes through the guard's breaker, so a dead or
hung store costs a request nothing beyond one timeout. While it is down,
`budget_failure_mode` decides: `deny` (503 + Retry-After), `allow` (admit
unmetered: `reserve` returns no decision, nothing is settled), or `local`
(each instance enforces its share of every limit, `local_budget`, and pays
what it admitted into the shared window when the store is back, before the
breaker closes). Leases keep serving from what they hold (it is paid for);
refills fail fast. Adjustments, refunds and telemetry that cannot reach the
store wait in memory and go out once it answers again. A budget write that
failed once sent may still have run; the recovery voids it before anything
is paid again (`budget_writes`).

A store that comes back empty (restarted without persistence) is told apart
from one that kept its data by a marker, `EPOCH_KEY`: the first instance to
find it missing writes a new one, and every instance that sees it change
pays into the shared window what it admitted within the last window, before
the outage as well as during it (`local_budget`'s second ledger). Checked
on every recovery probe and every heartbeat, so a restart quick enough to
open no breaker is caught too.

Telemetry: `spec_telemetry` counters are additive, so per-(tenant, replica)
increments are summed in memory and flushed every `telemetry_flush_s`
(and on shutdown), one call per flush: the controller differentiates counters
over tens of seconds, and a Redis round trip per request would cost more than
the rest of the gateway's work. A flush that failed is sent again as it was,
under its sequence number, so one that timed out but landed counts once
(`contract.telemetry.record_flush`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import defaultdict
from typing import Any

from contract.keys import budget_key
from contract.settings import GatewaySettings, TenantConfig
from contract.store import Store, WindowDecision
from contract.telemetry import RequestSpecStats, add_increments, record_flush

from .budget_guard import BudgetGuard, StoreDown
from .budget_writes import UncertainWrites
from .local_budget import LocalBudget
from .periodic import Loops, every, log_failure

log = logging.getLogger("specgate.gateway.accounting")

# The budget store's restart marker (see the module docstring): its value
# changes exactly when the store lost its data. Held for ten years: no TTL
# may make a live store look emptied.
EPOCH_KEY = "budget:epoch"
_EPOCH_TTL_S = 10 * 365 * 86400.0


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


_LEASE_HIT = WindowDecision(True, 0.0, {})


class _View:
    """The last store decision seen for a tenant: what a lease hit can tell
    the client about the shared window (see `Accounting.lease_view`)."""

    __slots__ = ("at", "used", "reset_s", "aged", "aged_s")

    def __init__(self, at: float, decision: WindowDecision) -> None:
        self.at, self.used, self.reset_s = at, decision.used, decision.reset_s
        self.aged: WindowDecision | None = None  # the view as of `aged_s` whole seconds after `at`
        self.aged_s = -1


class _Lease:
    """This instance's pre-paid slice of one tenant's window budget."""

    __slots__ = ("requests", "tokens", "expires", "refilling", "retry_at", "arrivals", "since", "avg_tokens")

    def __init__(self, now: float) -> None:
        self.requests = 0
        self.tokens = 0
        self.expires = 0.0
        self.refilling = False
        self.retry_at = 0.0  # after a refused lease, no new attempt before this
        self.arrivals = 0
        self.since = now
        self.avg_tokens = 0.0


def lease_size(rpm: int, tpm: int, rate_per_s: float, avg_tokens: float, lease_s: float, fraction: float) -> tuple[int, int] | None:
    """(requests, tokens) to lease, or None when this tenant should not lease.

    Pure: about `lease_s` of recent traffic, at most `fraction` of each
    per-minute limit, and at least two requests' worth (a lease of one saves
    nothing)."""
    if fraction <= 0 or lease_s <= 0:
        return None
    want = max(2, math.ceil(rate_per_s * lease_s))
    if rpm:
        cap = math.floor(rpm * fraction)
        if cap < 2:
            return None
        want = min(want, cap)
    tokens = 0
    if tpm:
        per = max(1.0, avg_tokens)
        cap_t = math.floor(tpm * fraction)
        if cap_t < 2 * per:
            return None
        tokens = min(cap_t, math.ceil(want * per * 1.5))
        want = min(want, max(2, int(tokens // per)))
    return want if rpm else 0, tokens


class Accounting:
    def __init__(
        self,
        store: Store,
        window_s: int,
        flush_s: float = 0.05,
        telemetry_flush_s: float = 0.5,
        lease_fraction: float = 0.0,
        lease_s: float = 1.0,
        settings: GatewaySettings | None = None,
        metrics: Any = None,
    ) -> None:
        """`settings` supplies the store failure behaviour (`budget_*`,
        `instance_heartbeat_s`); defaults when omitted. `metrics`: the app's
        `GatewayMetrics`, or None."""
        g = settings if settings is not None else GatewaySettings()
        self.store = store
        self.failure_mode = g.budget_failure_mode
        self.metrics = metrics
        self.guard = BudgetGuard(
            store, g.budget_store_timeout_s, g.budget_store_retry_s, g.instance_heartbeat_s, metrics=metrics
        )
        self.guard.on_recover = self._reconcile
        self.local = LocalBudget(window_s)
        self.writes = UncertainWrites(window_s)
        self._views: dict[str, _View] = {}
        # tenant id -> (the decision its last x-ratelimit headers were built from, those headers)
        self.headers_cache: dict[str, tuple[WindowDecision, list[tuple[bytes, bytes]]]] = {}
        self.lease_fraction = lease_fraction
        self.lease_s = lease_s
        self._leases: dict[str, _Lease] = {}
        self._lease_tasks: set[asyncio.Task] = set()
        self.window_s = window_s
        self.flush_s = flush_s
        self.telemetry_flush_s = telemetry_flush_s
        self._adjust: dict[str, int] = defaultdict(int)
        self._adjust_requests: dict[str, int] = defaultdict(int)
        self._telemetry: dict[tuple[str, str], dict[str, float]] = {}
        # A telemetry batch whose call failed, under its seq: resent as it is (`flush_telemetry`).
        self._telemetry_unsent: tuple[int, dict[tuple[str, str], dict[str, float]]] | None = None
        self._telemetry_seq = 0
        self._loops = Loops()
        self._pending: list = []
        self._flush_scheduled = False
        self._batch_in_flight = False
        self.max_batch = 256
        self._inflight_batches: set[asyncio.Task] = set()
        self._epoch: str | None = None  # the restart marker as last seen; None: not yet read

    # -- budgets ------------------------------------------------------
    async def reserve(self, tenant: TenantConfig, estimate: int) -> tuple[WindowDecision | None, int]:
        """Reserve; returns (decision or None when unlimited, tokens reserved).

        Reservations issued in the same event-loop tick are sent together
        (`store.consume_windows`: one script call, still decided one by one
        in arrival order), which is what keeps Redis-checked budgets cheap
        at thousands of requests per second. With a live lease for the
        tenant (see the module docstring) the request is admitted from it
        without any store call."""
        rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
        if not rpm and not tpm:
            return None, 0
        tokens = min(estimate, tpm) if tpm else 0
        if self.lease_fraction > 0:
            lease = self._leases.get(tenant.id)
            now = time.monotonic()
            if lease is None:
                lease = self._leases[tenant.id] = _Lease(now)
            lease.arrivals += 1
            lease.avg_tokens = tokens if lease.avg_tokens == 0 else 0.9 * lease.avg_tokens + 0.1 * tokens
            hit = now < lease.expires and (not rpm or lease.requests >= 1) and (not tpm or lease.tokens >= tokens)
            if hit:
                if rpm:
                    lease.requests -= 1
                lease.tokens -= tokens
            self._maybe_refill(tenant, lease, now)
            if hit:
                return self.lease_view(tenant.id, now), tokens
        future = asyncio.get_running_loop().create_future()
        self._pending.append((budget_key(tenant.id), {"requests": 1, "tokens": tokens}, {"requests": rpm, "tokens": tpm}, future))
        if not self._flush_scheduled and not self._batch_in_flight:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_batch)
        try:
            decision = await future
        except StoreDown as down:
            return await self._decide_store_down(tenant, tokens, down)
        if self.lease_fraction > 0:
            self._views[tenant.id] = _View(time.monotonic(), decision)
        if decision.allowed:
            self.local.note(tenant.id, 1, tokens)
            return decision, tokens
        return decision, 0

    @property
    def store_up(self) -> bool:
        """The budget store answers (the breaker is closed); /ready reports it."""
        return self.guard.up

    async def _decide_store_down(self, tenant: TenantConfig, tokens: int, down: StoreDown) -> tuple[WindowDecision | None, int]:
        """The request's budget decision while the store is down, by
        `budget_failure_mode`; `StoreDown` goes on to the caller under `deny`."""
        mode = self.failure_mode
        if mode == "deny":
            self._count_down(mode, "refused")
            raise down
        if mode == "allow":
            self._count_down(mode, "admitted")
            return None, 0  # unmetered, like an unlimited tenant: nothing to settle
        decision = await self.local.decide(tenant.id, tenant.requests_per_minute, tenant.tokens_per_minute, tokens, self.guard.instances)
        self._count_down(mode, "admitted" if decision.allowed else "denied")
        return decision, tokens if decision.allowed else 0

    def _count_down(self, mode: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.child(self.metrics.budget_store_down_decisions, mode, outcome).inc()

    def lease_view(self, tenant_id: str, now: float) -> WindowDecision:
        """A lease hit's decision for the `x-ratelimit-*` headers: the shared
        window as of this instance's last store decision for the tenant (its
        last lease refill), aged by the time since. Approximate: it misses
        what other instances admitted since, and counts this instance's
        unspent lease as used."""
        view = self._views.get(tenant_id)
        if view is None:
            return _LEASE_HIT
        # One decision per whole second of age (resets are quoted to the
        # second here): the same object request after request, so the admit
        # stage reuses the headers it built from it (the hot path).
        age = int(now - view.at)
        if view.aged is None or view.aged_s != age:
            view.aged_s = age
            view.aged = WindowDecision(True, 0.0, view.used, None, {f: max(0.0, float(math.ceil(r - age))) for f, r in view.reset_s.items()})
        return view.aged

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
            requests = [(k, c, l) for k, c, l, _ in batch]
            decisions = await self._consume(requests)
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

    async def _consume(self, requests) -> list[WindowDecision]:
        """One voidable batch reservation (`budget_writes`) through the breaker."""
        return await self.writes.run(lambda op: self.store.consume_windows(requests, self.window_s, op), self.guard.call)

    async def _adjust_window(self, tenant_id: str, deltas: dict[str, int], via) -> None:
        """One voidable adjustment of a tenant's window (`budget_writes`),
        through `via`: the guard's `call`, or `bounded` inside a recovery."""
        await self.writes.run(lambda op: self.store.adjust_window(budget_key(tenant_id), deltas, self.window_s, op), via)

    # -- leases -------------------------------------------------------
    def _maybe_refill(self, tenant: TenantConfig, lease: _Lease, now: float) -> None:
        if lease.refilling or now < lease.retry_at:
            return
        rate = lease.arrivals / max(0.05, now - lease.since)
        size = lease_size(tenant.requests_per_minute, tenant.tokens_per_minute, rate, lease.avg_tokens, self.lease_s, self.lease_fraction)
        if size is None:
            return
        want_r, want_t = size
        low = (
            now >= lease.expires - self.lease_s / 2
            or (want_r and lease.requests * 2 <= want_r)
            or (want_t and lease.tokens * 2 <= want_t)
        )
        if not low:
            return
        # Top up to the target, never beyond: what an instance holds stays
        # bounded by about `lease_s` of its traffic.
        need_r = max(0, want_r - lease.requests)
        need_t = max(0, want_t - lease.tokens)
        if not need_r and not need_t:
            lease.expires = now + self.lease_s  # still in use, still full
            return
        lease.refilling = True
        lease.arrivals, lease.since = 0, now
        task = asyncio.ensure_future(self._refill(tenant, lease, need_r, need_t))
        self._lease_tasks.add(task)
        task.add_done_callback(self._lease_tasks.discard)

    async def _refill(self, tenant: TenantConfig, lease: _Lease, want_r: int, want_t: int) -> None:
        """One atomic reservation of the whole slice; nothing is consumed
        when it does not fit."""
        rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
        slice_ = [(budget_key(tenant.id), {"requests": want_r, "tokens": want_t}, {"requests": rpm, "tokens": tpm})]
        try:
            (decision,) = await self._consume(slice_)
        except StoreDown:
            lease.retry_at = time.monotonic() + self.lease_s  # the guard logged the outage once
            return
        except Exception:
            lease.retry_at = time.monotonic() + self.lease_s
            log.warning("budget lease failed", extra={"fields": {"tenant": tenant.id}})
            return
        finally:
            lease.refilling = False
        now = time.monotonic()
        self._views[tenant.id] = _View(now, decision)
        if not decision.allowed:
            lease.retry_at = now + self.lease_s
            return
        if now >= lease.expires:
            self._return_lease(tenant.id, lease)
        self.local.note(tenant.id, want_r, want_t)
        lease.requests += want_r
        lease.tokens += want_t
        lease.expires = now + self.lease_s

    def _return_lease(self, tenant_id: str, lease: _Lease) -> None:
        """Give what is left of an expired slice back to the shared window."""
        r, t = lease.requests, lease.tokens
        lease.requests = lease.tokens = 0
        if r or t:
            self._adjust_requests[tenant_id] -= r
            self._adjust[tenant_id] -= t

    def expire_leases(self, now: float | None = None, all_: bool = False) -> None:
        now = time.monotonic() if now is None else now
        for tenant_id, lease in self._leases.items():
            if (all_ or now >= lease.expires) and (lease.requests or lease.tokens):
                self._return_lease(tenant_id, lease)

    def settle(self, tenant: TenantConfig, reserved: int, actual: int) -> None:
        if not tenant.tokens_per_minute or actual == reserved:
            return
        delta = actual - reserved
        lease = self._leases.get(tenant.id) if self._leases else None
        if lease is not None and time.monotonic() < lease.expires:
            # Tokens reserved but not used are already paid for in the window:
            # they go back into this instance's live lease (and, with it, back
            # to the window when it expires) instead of costing a Redis call.
            # An overrun is taken from the lease as far as it reaches.
            take = delta if delta < 0 else min(delta, lease.tokens)
            lease.tokens -= take
            delta -= take
        if delta:
            self._adjust[tenant.id] += delta

    def refund_request(self, tenant: TenantConfig, reserved: int) -> None:
        """Give back a reservation for a request that never reached a replica."""
        if tenant.requests_per_minute or tenant.tokens_per_minute:
            asyncio.ensure_future(self._refund(tenant.id, reserved))

    async def _refund(self, tenant_id: str, reserved: int) -> None:
        """At once when the store answers (the next request may need the
        room); otherwise queued with the other adjustments."""
        try:
            await self._adjust_window(tenant_id, {"requests": -1, "tokens": -reserved}, self.guard.call)
        except StoreDown:
            self._adjust_requests[tenant_id] -= 1
            self._adjust[tenant_id] -= reserved
        except Exception:
            log.warning("budget refund failed", extra={"fields": {"tenant": tenant_id}})

    async def _reconcile(self) -> dict:
        """Pay what was admitted locally during the outage into the shared
        window (the guard runs this after a successful probe, before the
        breaker closes). First the writes whose outcome the outage left
        unknown are voided (`budget_writes`): what they did is paid again
        from this instance's own books. Repeats until nothing is owed, since
        requests keep being admitted locally while it runs; what fails is
        kept for the next probe."""
        emptied = await self.guard.bounded(self._store_emptied)
        voided, landed = await self.writes.void(self.store, self.guard.bounded)
        if voided and self.metrics is not None:
            self.metrics.child(self.metrics.budget_writes_voided, "true").inc(landed)
            self.metrics.child(self.metrics.budget_writes_voided, "false").inc(voided - landed)
        tenants = requests = tokens = 0
        while True:
            owed = self.local.take(emptied)
            emptied = False
            if not owed:
                return {"reconciled_tenants": tenants, "reconciled_requests": requests, "reconciled_tokens": tokens,
                        "voided_writes": voided, "voided_landed": landed}
            while owed:
                tenant_id, deltas = next(iter(owed.items()))
                try:
                    await self._adjust_window(tenant_id, deltas, self.guard.bounded)
                except BaseException:
                    self.local.give_back(owed)
                    raise
                del owed[tenant_id]
                tenants += 1
                requests += deltas.get("requests", 0)
                tokens += deltas.get("tokens", 0)

    async def _store_emptied(self) -> bool:
        """Read (writing it first when missing) the store's restart marker;
        True when it changed since last read: the store lost its data."""
        await self.store.acquire_lock(EPOCH_KEY, uuid.uuid4().hex, _EPOCH_TTL_S)
        epoch = await self.store.lock_owner(EPOCH_KEY)
        seen, self._epoch = self._epoch, epoch
        emptied = seen is not None and epoch != seen
        if emptied:
            log.warning("budget store came back empty; paying in this instance's window", extra={"fields": {"window_s": self.window_s}})
        return emptied

    async def watch_epoch(self) -> None:
        """One heartbeat's check of the restart marker while the store is up
        (while it is down, the recovery probe checks it); an emptied store
        gets this instance's window paid in again."""
        if not self.guard.up:
            return
        try:
            emptied = await self.guard.call(self._store_emptied)
        except StoreDown:
            return
        if emptied:
            owed = self.local.take(emptied=True)
            # Paid in with the ordinary adjustments (`flush_budgets`), which wait out a failing store.
            for tenant_id, deltas in owed.items():
                self._adjust_requests[tenant_id] += deltas["requests"]
                self._adjust[tenant_id] += deltas["tokens"]

    # -- telemetry ----------------------------------------------------
    def record(self, tenant_id: str, replica: str, stats: RequestSpecStats) -> None:
        add_increments(self._telemetry.setdefault((tenant_id, replica), {}), stats)

    # -- flushing -----------------------------------------------------
    async def flush_budgets(self) -> None:
        """Send the summed adjustments; while the store is down they stay
        here (and what a failing call did not send is put back)."""
        if self._leases:
            self.expire_leases()
        if (not self._adjust and not self._adjust_requests) or not self.guard.up:
            return
        pending, self._adjust = self._adjust, defaultdict(int)
        pending_r, self._adjust_requests = self._adjust_requests, defaultdict(int)
        tenants = list(set(pending) | set(pending_r))
        for i, tenant_id in enumerate(tenants):
            deltas = {}
            if pending_r.get(tenant_id):
                deltas["requests"] = pending_r[tenant_id]
            if pending.get(tenant_id):
                deltas["tokens"] = pending[tenant_id]
            if not deltas:
                continue
            try:
                await self._adjust_window(tenant_id, deltas, self.guard.call)
            except StoreDown:
                for rest in tenants[i:]:
                    self._adjust_requests[rest] += pending_r.get(rest, 0)
                    self._adjust[rest] += pending.get(rest, 0)
                return

    async def flush_telemetry(self) -> None:
        """Send what is summed here as one batch under the next seq. One whose
        call failed is kept as it is and sent again under its seq first (it
        may have landed: `record_flush` then applies it once); increments
        arriving meanwhile wait for the next batch. One batch per call: a
        busy gateway that flushed again whenever more had arrived during the
        round trip would flush back to back."""
        if self._telemetry_unsent is not None and not await self._send_telemetry():
            return
        if not self._telemetry or not self.guard.up:
            return
        self._telemetry_seq += 1
        self._telemetry_unsent = (self._telemetry_seq, self._telemetry)
        self._telemetry = {}
        await self._send_telemetry()

    async def _send_telemetry(self) -> bool:
        """The unsent batch, under its seq; kept when the store is down."""
        if not self.guard.up:
            return False
        seq, batch = self._telemetry_unsent
        try:
            await self.guard.call(lambda: record_flush(self.store, self.guard.instance, seq, batch))
        except StoreDown:
            return False
        self._telemetry_unsent = None
        return True

    async def flush(self) -> None:
        await self.flush_budgets()
        await self.flush_telemetry()

    def start(self) -> None:
        self.guard.start()
        self._loops.start(
            every(self.flush_s, self.flush_budgets, log, "budget flush"),
            every(self.telemetry_flush_s, self.flush_telemetry, log, "telemetry flush"),
            every(self.guard.heartbeat_s, self.watch_epoch, log, "budget store restart check"),
        )

    async def stop(self) -> None:
        for t in list(self._lease_tasks):
            try:
                await asyncio.wait_for(t, 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                pass
        self.expire_leases(all_=True)
        await self._loops.stop()
        await self.guard.stop()
        try:
            await self.flush()
        except Exception as exc:
            log_failure(log, "final accounting flush", exc)
