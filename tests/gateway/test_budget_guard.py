"""The budget path when its store fails, in isolation (no sockets): the
store breaker, the three `budget_failure_mode`s, the local share and its
reconciliation, logging once per state change, and the x-ratelimit headers."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from contract.keys import budget_key
from contract.settings import GatewaySettings, TenantConfig
from contract.store import MemoryStore, WindowDecision
from gateway.accounting import Accounting
from gateway.budget_guard import BudgetGuard, StoreBreaker, StoreDown
from gateway.local_budget import LocalBudget, local_share
from gateway.metrics import GatewayMetrics
from gateway.ratelimit_headers import format_reset, ratelimit_headers

TENANT = TenantConfig(id="t", api_key_sha256="a" * 64, requests_per_minute=20, tokens_per_minute=10_000)


class FlakyStore:
    """A MemoryStore that can be switched to refuse (ConnectionError) or to
    hang (never answer) every call, or lose the replies of some methods' calls
    (run, then time out); counts the calls that reached it."""

    def __init__(self, clock=None) -> None:
        self.inner = MemoryStore() if clock is None else MemoryStore(clock=clock)
        self.mode = "up"  # "up" | "refuse" | "hang"
        self.replies_lost: set[str] = set()  # methods that run, then time out
        self.calls = 0

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(target):
            return target

        async def call(*args, **kwargs):
            self.calls += 1
            if self.mode == "refuse":
                raise ConnectionError("refused")
            if self.mode == "hang":
                await asyncio.Event().wait()
            result = await target(*args, **kwargs)
            if name in self.replies_lost:
                raise TimeoutError("the call ran, its reply was lost")
            return result

        return call


@pytest.fixture
def budget_log(caplog):
    """caplog for the budget store's logger alone, whether or not the app's
    logging setup (which stops propagation) ran earlier in this process."""
    logger = logging.getLogger("specgate.gateway.budget_store")
    propagate, level = logger.propagate, logger.level
    logger.addHandler(caplog.handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield lambda: [r for r in caplog.records if r.name == logger.name]
    logger.removeHandler(caplog.handler)
    logger.propagate, logger.level = propagate, level


def settings(**kw) -> GatewaySettings:
    return GatewaySettings(**{"budget_store_timeout_s": 0.2, "budget_store_retry_s": 0.3, "instance_heartbeat_s": 0.1, **kw})


async def _window_requests(store: MemoryStore, tenant_id: str = "t") -> float:
    (d,) = await store.consume_windows([(budget_key(tenant_id), {"requests": 0, "tokens": 0}, {})], 60)
    return d.used["requests"]


# -- the breaker (pure) -------------------------------------------------------
def test_breaker_fails_fast_then_lets_one_probe_through():
    b = StoreBreaker(retry_s=2.0)
    assert b.try_call(0.0)
    assert b.failed(0.0) is True  # the change to down
    assert b.failed(0.1) is False  # further failures are not changes
    assert not b.try_call(1.0)  # fail fast
    assert b.retry_after_s(1.0) == 2.0  # retry_at = 2.1
    assert b.try_call(2.2)  # the probe
    assert not b.try_call(2.2)  # only one at a time
    b.failed(2.3)  # the probe failed: wait again
    assert not b.try_call(4.0) and b.try_call(4.4)
    assert b.recovered(4.5) == pytest.approx(4.5)
    assert b.up and b.try_call(4.5)


# -- the guard ------------------------------------------------------------------
async def test_hung_store_costs_one_timeout_then_nothing(budget_log):
    store = FlakyStore()
    guard = BudgetGuard(store, timeout_s=0.2, retry_s=30)
    store.mode = "hang"
    t0 = time.monotonic()
    with pytest.raises(StoreDown):
        await guard.call(lambda: store.hgetall("x"))
    assert time.monotonic() - t0 < 2.0  # bounded by the timeout, not by the store
    calls = store.calls
    for _ in range(50):
        with pytest.raises(StoreDown) as down:
            await guard.call(lambda: store.hgetall("x"))
        assert down.value.retry_after_s >= 1
    assert store.calls == calls  # failing fast: the store was not asked
    assert not guard.up
    assert [r.getMessage() for r in budget_log()] == ["budget store down"]
    assert all(r.exc_info is None for r in budget_log())  # no traceback


async def test_probe_reconciles_before_the_breaker_closes(budget_log):
    store = FlakyStore()
    guard = BudgetGuard(store, timeout_s=0.2, retry_s=0.05)
    seen_up = []

    async def reconcile():
        seen_up.append(guard.up)  # still down while reconciling
        return {"reconciled_requests": 3}

    guard.on_recover = reconcile
    store.mode = "refuse"
    for _ in range(3):  # down; a failing probe is no new state
        with pytest.raises(StoreDown):
            await guard.call(lambda: store.hgetall("x"))
        await asyncio.sleep(0.06)
    store.mode = "up"
    await asyncio.sleep(0.06)
    assert await guard.call(lambda: store.hgetall("x")) == {}
    assert guard.up and seen_up == [False]
    assert [r.getMessage() for r in budget_log()] == ["budget store down", "budget store back up"]


async def test_heartbeats_count_instances_and_detect_an_idle_outage():
    store = FlakyStore()
    metrics = GatewayMetrics()
    a = BudgetGuard(store, timeout_s=0.2, retry_s=0.1, heartbeat_s=0.1, metrics=metrics)
    b = BudgetGuard(store, timeout_s=0.2, retry_s=0.1, heartbeat_s=0.1)
    await a.beat()
    await b.beat()
    await a.beat()
    assert a.instances == 2 and metrics.gateway_instances._value.get() == 2
    store.mode = "refuse"
    await a.beat()  # no request needed to notice
    assert not a.up and metrics.budget_store_up._value.get() == 0
    assert a.instances == 2  # the count from before the outage is kept
    store.mode = "up"
    await asyncio.sleep(0.12)
    await a.beat()  # the heartbeat is the probe
    assert a.up and metrics.budget_store_up._value.get() == 1


# -- failure modes through Accounting ---------------------------------------------
async def test_deny_mode_raises_store_down_with_retry_after():
    store = FlakyStore()
    metrics = GatewayMetrics()
    acc = Accounting(store, 60, settings=settings(budget_failure_mode="deny"), metrics=metrics)
    store.mode = "refuse"
    with pytest.raises(StoreDown) as down:
        await acc.reserve(TENANT, 10)
    assert down.value.retry_after_s >= 1 and not acc.store_up
    assert metrics.child(metrics.budget_store_down_decisions, "deny", "refused")._value.get() == 1


async def test_allow_mode_admits_unmetered():
    store = FlakyStore()
    acc = Accounting(store, 60, settings=settings(budget_failure_mode="allow"))
    store.mode = "refuse"
    results = [await acc.reserve(TENANT, 10) for _ in range(50)]
    assert results == [(None, 0)] * 50  # no decision: nothing to settle or refund


async def test_local_mode_enforces_the_share_and_reconciles():
    store = FlakyStore()
    metrics = GatewayMetrics()
    acc = Accounting(store, 60, settings=settings(), metrics=metrics)  # local is the default
    acc.guard.instances = 4  # as the heartbeats would have reported
    assert (await acc.reserve(TENANT, 10))[0].allowed  # one through the store
    store.mode = "refuse"
    decisions = [(await acc.reserve(TENANT, 10))[0] for _ in range(10)]
    # 20 rpm / 4 instances, and the share counts the one this instance admitted through the store before
    assert [d.allowed for d in decisions] == [True] * 4 + [False] * 6
    denied = decisions[-1]
    assert denied.denied_field == "requests" and denied.retry_after_s >= 1
    assert denied.used["requests"] == pytest.approx(6 * 4)  # scaled back to the tenant's whole limit
    assert metrics.child(metrics.budget_store_down_decisions, "local", "admitted")._value.get() == 4
    store.mode = "up"
    await asyncio.sleep(0.35)
    await acc.guard.beat()  # probe -> reconcile -> up
    assert acc.store_up
    assert await _window_requests(store.inner) == 1 + 4  # what was admitted locally is in the shared window
    assert acc.local.take() == {}  # paid once


async def test_reconciliation_that_fails_is_kept_for_the_next_probe(budget_log):
    store = FlakyStore()
    acc = Accounting(store, 60, settings=settings())
    store.mode = "refuse"
    for _ in range(3):
        await acc.reserve(TENANT, 10)
    real_adjust = store.inner.adjust_window

    async def failing_adjust(*a, **k):
        raise ConnectionError("again")

    store.mode = "up"
    store.inner.adjust_window = failing_adjust
    for _ in range(2):  # two probes the store answers, two reconciliations that fail
        await asyncio.sleep(0.35)
        await acc.guard.beat()
        assert not acc.store_up
    store.inner.adjust_window = real_adjust
    await asyncio.sleep(0.35)
    await acc.guard.beat()
    assert acc.store_up and await _window_requests(store.inner) == 3
    # Why it stayed down although the store answered: said once per outage, no traceback.
    said = [(r.getMessage(), r.levelno) for r in budget_log()]
    assert said == [("budget store down", logging.WARNING),
                    ("budget store answered a probe; its reconciliation failed, kept for the next probe",
                     logging.WARNING),
                    ("budget store back up", logging.INFO)]
    assert budget_log()[1].fields["error"] == "ConnectionError"
    assert all(r.exc_info is None for r in budget_log())


async def test_settlements_and_refunds_wait_for_the_store():
    # The store's clock held inside one window: across a real minute boundary the sliding window would
    # read the same usage weighted by the previous window's share (0.994 request, seen once).
    store = FlakyStore(clock=lambda: 1_000_030.0)
    acc = Accounting(store, 60, settings=settings())
    (_, reserved) = await acc.reserve(TENANT, 100)
    store.mode = "refuse"
    await acc.reserve(TENANT, 100)  # opens the breaker
    acc.settle(TENANT, reserved, 30)  # -70 tokens, kept in memory
    acc.refund_request(TENANT, 100)
    await asyncio.sleep(0.01)
    await acc.flush_budgets()  # nothing sent while down, nothing lost
    store.mode = "up"
    await asyncio.sleep(0.35)
    await acc.guard.beat()
    await acc.flush_budgets()
    (d,) = await store.inner.consume_windows([(budget_key("t"), {"requests": 0, "tokens": 0}, {})], 60)
    # 1 + 1 (local, reconciled) - 1 (refund) requests; 100 + 100 - 70 - 100 tokens
    assert d.used == {"requests": 1.0, "tokens": 30.0}


async def test_a_telemetry_flush_that_failed_is_resent_as_it_was_and_counts_once():
    """A flush whose reply was lost had landed: the same batch goes again under
    its seq (and adds nothing), and what was recorded meanwhile follows in the
    next batch, so every request's telemetry is counted once."""
    from contract.telemetry import RequestSpecStats, read_all

    store = FlakyStore()
    acc = Accounting(store, 60, settings=settings())
    stats = RequestSpecStats(prompt_tokens=3, completion_tokens=5)
    acc.record("t", "r1", stats)
    store.replies_lost = {"hincr_once"}
    await acc.flush_telemetry()  # lands, then times out: the breaker opens
    assert not acc.store_up
    acc.record("t", "r1", stats)
    acc.record("t", "r2", stats)
    await acc.flush_telemetry()  # nothing goes out while the store is down
    store.replies_lost = set()
    await asyncio.sleep(0.35)
    await acc.guard.beat()  # the probe closes the breaker
    await acc.flush_telemetry()
    counters = {c.replica: c.values for c in await read_all(store.inner)}
    assert counters["r1"]["requests"] == 2 and counters["r1"]["completion_tokens"] == 10
    assert counters["r2"]["requests"] == 1


async def test_a_lease_keeps_serving_when_the_store_hangs():
    store = FlakyStore()
    acc = Accounting(store, 60, lease_fraction=0.1, lease_s=5, settings=settings())
    tenant = TenantConfig(id="t", api_key_sha256="a" * 64, requests_per_minute=1000)
    for _ in range(5):
        await acc.reserve(tenant, 1)
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the refill lands
    store.mode = "hang"
    t0 = time.monotonic()
    hits = [await acc.reserve(tenant, 1) for _ in range(10)]
    assert time.monotonic() - t0 < 1.0
    assert all(d.allowed for d, _ in hits)
    assert any(d.used for d, _ in hits)  # lease hits carry the last known window


# -- local share -----------------------------------------------------------------
def test_local_share():
    assert local_share(120, 2) == 60
    assert local_share(120, 0) == 120
    assert local_share(0, 3) == 0


async def test_local_ledger_forgets_admissions_older_than_a_window():
    clock = [1000.0]
    local = LocalBudget(60, clock=lambda: clock[0])
    await local.decide("t", 100, 0, 0, 1)
    clock[0] += 61
    await local.decide("t", 100, 0, 0, 1)
    assert local.take() == {"t": {"requests": 1, "tokens": 0}}


async def test_admissions_through_the_store_in_the_second_of_a_seed_still_count_in_the_next_outage():
    """A store blip (one request admitted locally: the seed runs), then more admitted through
    the store within the same second, then an outage: the local window holds all of them,
    so the share is not handed out again (CI saw 9 admitted of a share of 8 left)."""
    clock = [1000.2]
    local = LocalBudget(3600, clock=lambda: clock[0])
    for _ in range(3):
        local.note("t", 1, 0)
    assert (await local.decide("t", 20, 0, 0, 1)).allowed  # the blip: seeds the 3, counts 1
    clock[0] = 1000.7  # the same second
    for _ in range(8):
        local.note("t", 1, 0)  # the store is back
    clock[0] = 1001.5  # the outage
    admitted = [(await local.decide("t", 20, 0, 0, 1)).allowed for _ in range(15)]
    assert admitted.count(True) == 20 - 12


# -- x-ratelimit headers -------------------------------------------------------
def test_format_reset_matches_openai():
    assert [format_reset(s) for s in (0, 0.02, 1, 1.5, 59.9994, 360, 90.5, 3723)] == [
        "0s", "20ms", "1s", "1.5s", "59.999s", "6m0s", "1m30.5s", "1h2m3s",
    ]


def test_ratelimit_headers_admitted_and_denied():
    ok = WindowDecision(True, 0.0, {"requests": 3.4, "tokens": 120.0}, None, {"requests": 90.0, "tokens": 90.0})
    h = dict(ratelimit_headers(ok, {"requests": 10, "tokens": 1000}, {"requests": 1, "tokens": 40}))
    assert h == {
        b"x-ratelimit-limit-requests": b"10", b"x-ratelimit-remaining-requests": b"6", b"x-ratelimit-reset-requests": b"1m30s",
        b"x-ratelimit-limit-tokens": b"1000", b"x-ratelimit-remaining-tokens": b"880", b"x-ratelimit-reset-tokens": b"1m30s",
    }
    # Denied on requests: what was left before it (nothing), tokens not evaluated.
    no = WindowDecision(False, 2.0, {"requests": 11.0}, "requests", {"requests": 70.0})
    h = dict(ratelimit_headers(no, {"requests": 10, "tokens": 1000}, {"requests": 1, "tokens": 40}))
    assert h == {b"x-ratelimit-limit-requests": b"10", b"x-ratelimit-remaining-requests": b"0", b"x-ratelimit-reset-requests": b"1m10s"}
    # No limit, no headers.
    assert ratelimit_headers(ok, {"requests": 0, "tokens": 0}, {}) == []


async def test_local_share_caps_a_large_estimate_like_the_shared_path():
    local = LocalBudget(60)
    d = await local.decide("t", 0, 1000, 900, 4)  # share 250 tokens; the estimate alone is larger
    assert d.allowed
    assert not (await local.decide("t", 0, 1000, 10, 4)).allowed  # and the share is spent
