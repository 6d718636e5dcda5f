"""Budgets when Redis fails, end to end: real gateways on loopback, a private
`redis-server` this test stops, restarts or `CLIENT PAUSE`s, the fake
backend as the replica. Also the `x-ratelimit-*` headers on the normal path.

Bounds on elapsed time here are generous ceilings that tell "fails fast"
from "waits out the connection pool" (5-10 s), not speed measurements."""

from __future__ import annotations

import logging
import re
import shutil
import time

import httpx
import pytest

from contract.settings import load_settings
from gateway.app import create_app
from testbed.procs import free_port

from tests.support.private_redis import PrivateRedis

from .conftest import KEYS, ServerThread, tenant, wait_for

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


@pytest.fixture
def private_redis(tmp_path):
    servers: list[PrivateRedis] = []

    def _start() -> PrivateRedis:
        s = PrivateRedis(tmp_path).start()
        servers.append(s)
        return s

    yield _start
    for s in servers:
        s.stop()


@pytest.fixture
def gateway_on():
    """A gateway on a given Redis URL (the shared `start_gateway` fixture pins the session's Redis)."""
    servers: list[ServerThread] = []

    def _start(redis_url: str, backend_url: str, tenants: list, **gateway):
        settings = load_settings(
            replicas=[{"url": backend_url}],
            tenants=tenants,
            redis_url=redis_url,
            redis_prefix="outage-test:",
            gateway={"health_interval_s": 30.0, "telemetry_flush_s": 0.1, "policy_poll_s": 0.5, **gateway},
        )
        app = create_app(settings)
        server = ServerThread(app, free_port()).start()
        server.state = app.state.gateway
        servers.append(server)
        return server

    yield _start
    for s in servers:
        s.stop()


@pytest.fixture
def budget_log(caplog):
    """The budget store's log lines from every gateway in this process."""
    logger = logging.getLogger("specgate.gateway.budget_store")
    propagate, level = logger.propagate, logger.level
    logger.addHandler(caplog.handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield lambda: [r.getMessage() for r in caplog.records if r.name == logger.name]
    logger.removeHandler(caplog.handler)
    logger.propagate, logger.level = propagate, level


def ask(url: str, key: str = "alpha", stream: bool = False, max_tokens: int = 4) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEYS[key]}"}, timeout=30)


def ready(url: str) -> tuple[int, dict]:
    r = httpx.get(url + "/ready", timeout=10)
    return r.status_code, r.json()


def parse_reset(value: str) -> float:
    """Inverse of the OpenAI duration format (`1m30.5s`, `20ms`)."""
    if value.endswith("ms"):
        return float(value[:-2]) / 1000
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)([hms])", value):
        total += float(number) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


# -- a hung store -----------------------------------------------------------------
def test_hung_store_fails_fast_with_503_and_retry_after_in_deny_mode(start_backend, private_redis, gateway_on, budget_log):
    store = private_redis()
    backend = start_backend()
    gw = gateway_on(store.url, backend.url, [tenant("alpha", requests_per_minute=100), tenant("beta")], budget_failure_mode="deny")
    assert ask(gw.url).status_code == 200
    status, body = ready(gw.url)
    assert (status, body["budget_store"]) == (200, "up")

    store.pause(6000)
    paused_at = time.monotonic()
    for _ in range(5):
        t0 = time.monotonic()
        r = ask(gw.url)
        assert time.monotonic() - t0 < 3.0  # one store timeout (0.5 s) at most, not the pool's 5-10 s
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "state_store_unavailable"
        assert int(r.headers["retry-after"]) >= 1
    assert ask(gw.url, key="beta").status_code == 200  # unlimited tenants need no store
    status, body = ready(gw.url)
    assert (status, body["budget_store"]) == (503, "down")  # deny: not ready without the store
    assert gw.state.metrics.budget_store_up._value.get() == 0

    # The pause ends: the next probe (a heartbeat, no traffic needed) closes the breaker.
    wait_for(lambda: ready(gw.url)[1]["budget_store"] == "up", timeout=6.0 + 10.0 - (time.monotonic() - paused_at))
    assert ask(gw.url).status_code == 200
    assert budget_log() == ["budget store down", "budget store back up"]  # not one line per request


# -- a stopped store, local mode ------------------------------------------------------
def test_stopped_store_local_mode_enforces_the_share_and_reconciles(start_backend, private_redis, gateway_on, budget_log):
    store = private_redis()
    backend = start_backend()
    tenants = [tenant("alpha", requests_per_minute=20), tenant("beta")]
    opts = {"instance_heartbeat_s": 0.2, "budget_store_retry_s": 0.5, "budget_window_s": 3600}
    gws = [gateway_on(store.url, backend.url, tenants, **opts) for _ in range(2)]
    wait_for(lambda: all(g.state.accounting.guard.instances == 2 for g in gws), timeout=10)

    store.stop()
    admitted = {}
    for g in gws:
        codes = []
        for _ in range(15):
            r = ask(g.url)
            codes.append(r.status_code)
            if r.status_code == 200:
                assert r.headers["x-ratelimit-limit-requests"] == "20"  # the tenant's limit, remaining scaled from the share
            else:
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                assert r.headers["x-ratelimit-remaining-requests"] == "0"
        admitted[g.url] = codes.count(200)
        status, body = ready(g.url)
        assert (status, body["budget_store"]) == (200, "down")  # local mode keeps serving: still ready
    assert list(admitted.values()) == [10, 10]  # each instance its share: 20 rpm / 2 instances

    store.start()  # an empty Redis: what it holds afterwards is what was reconciled
    wait_for(lambda: all(ready(g.url)[1]["budget_store"] == "up" for g in gws), timeout=10)
    client = store.client()
    try:
        keys = list(client.scan_iter(match="outage-test:budget:alpha:*"))
        assert sum(float(client.hget(k, "requests") or 0) for k in keys) == 20
    finally:
        client.close()
    assert ask(gws[0].url).status_code == 429  # the shared window is full: the next minute is not over-admitted
    assert budget_log().count("budget store down") == 2  # one line per instance, not per request
    assert budget_log().count("budget store back up") == 2


# -- allow mode, and a store dead from the start -----------------------------------------
def test_allow_mode_admits_unmetered_and_ready_reports_the_store(start_backend, gateway_on):
    backend = start_backend()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    gw = gateway_on(dead, backend.url, [tenant("alpha", requests_per_minute=2)], budget_failure_mode="allow", instance_heartbeat_s=0.2)
    wait_for(lambda: ready(gw.url)[1]["budget_store"] == "down", timeout=5)  # known before any request
    assert ready(gw.url)[0] == 200
    responses = [ask(gw.url) for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5  # over the limit of 2: unmetered
    assert not any("x-ratelimit-limit-requests" in r.headers for r in responses)  # nothing known to report
    m = gw.state.metrics
    assert m.child(m.budget_store_down_decisions, "allow", "admitted")._value.get() == 5


def test_local_mode_with_a_store_dead_from_the_start_enforces_the_whole_limit(start_backend, gateway_on):
    backend = start_backend()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    gw = gateway_on(dead, backend.url, [tenant("alpha", requests_per_minute=3)])
    codes = [ask(gw.url).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]  # no heartbeat ever seen: one instance, the whole limit


# -- x-ratelimit headers on the normal path ----------------------------------------
def test_ratelimit_headers_are_present_and_consistent(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}], [tenant("alpha", requests_per_minute=3, tokens_per_minute=1000)])
    r1, r2 = ask(gw.url), ask(gw.url, stream=True)
    for r, left in ((r1, "2"), (r2, "1")):
        assert r.status_code == 200
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.headers["x-ratelimit-remaining-requests"] == left
        assert r.headers["x-ratelimit-limit-tokens"] == "1000"
        assert 0 <= int(r.headers["x-ratelimit-remaining-tokens"]) < 1000
        assert 60 <= parse_reset(r.headers["x-ratelimit-reset-requests"]) <= 120  # this window's usage counts until the next one ends
    assert int(r2.headers["x-ratelimit-remaining-tokens"]) < int(r1.headers["x-ratelimit-remaining-tokens"])
    assert ask(gw.url).headers["x-ratelimit-remaining-requests"] == "0"
    denied = ask(gw.url)
    assert denied.status_code == 429
    assert denied.headers["x-ratelimit-remaining-requests"] == "0"
    retry = int(denied.headers["retry-after"])
    # The whole usage is in the current window: it fits again a third of the way into the next one.
    assert 1 <= retry <= parse_reset(denied.headers["x-ratelimit-reset-requests"]) + 1
    assert retry <= 90


def test_ratelimit_headers_on_lease_hits(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([{"url": backend.url}], [tenant("alpha", requests_per_minute=100_000)], budget_lease_fraction=0.01)
    acc = gw.state.accounting
    store_calls = 0
    send = acc._send_batch

    async def counting(batch):
        nonlocal store_calls
        store_calls += len(batch)
        await send(batch)

    acc._send_batch = counting  # per-request store decisions (lease hits skip it)
    with httpx.Client(timeout=10) as c:
        rs = [
            c.post(gw.url + "/v1/chat/completions", json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 2}, headers={"authorization": f"Bearer {KEYS['alpha']}"})
            for _ in range(40)
        ]
    assert all(r.status_code == 200 for r in rs)
    assert all(r.headers["x-ratelimit-limit-requests"] == "100000" for r in rs)
    assert all(int(r.headers["x-ratelimit-remaining-requests"]) < 100_000 for r in rs)
    assert store_calls < 40  # most were lease hits, and they carry the headers too


# -- a store restarted empty ------------------------------------------------------------
def test_store_restarted_empty_does_not_forget_what_was_admitted(start_backend, private_redis, gateway_on, budget_log):
    """Issue 33: a tenant admitted 12 times before the outage must not get a
    fresh window from an empty Redis, nor a fresh local share during the outage."""
    store = private_redis()
    backend = start_backend()
    tenants = [tenant("alpha", requests_per_minute=20)]
    gw = gateway_on(store.url, backend.url, tenants, instance_heartbeat_s=0.2, budget_store_retry_s=0.5, budget_window_s=3600)
    wait_for(lambda: gw.state.accounting._epoch is not None, timeout=10)  # the restart marker was read
    assert [ask(gw.url).status_code for _ in range(12)] == [200] * 12

    store.stop()
    during = [ask(gw.url).status_code for _ in range(15)]
    assert during.count(200) == 8  # the local window starts from the 12 admitted through the store
    store.start()  # empty: no persistence
    wait_for(lambda: ready(gw.url)[1]["budget_store"] == "up", timeout=10)
    client = store.client()
    try:
        keys = list(client.scan_iter(match="outage-test:budget:alpha:*"))
        assert sum(float(client.hget(k, "requests") or 0) for k in keys) == 20  # before and during, paid in again
    finally:
        client.close()
    assert [ask(gw.url).status_code for _ in range(5)] == [429] * 5


def test_quick_empty_restart_is_caught_by_the_heartbeat(start_backend, private_redis, gateway_on):
    """A restart between two heartbeats opens no breaker; the marker still tells."""
    store = private_redis()
    backend = start_backend()
    gw = gateway_on(store.url, backend.url, [tenant("alpha", requests_per_minute=20)], instance_heartbeat_s=0.2, budget_window_s=3600)
    wait_for(lambda: gw.state.accounting._epoch is not None, timeout=10)
    assert [ask(gw.url).status_code for _ in range(15)] == [200] * 15
    client = store.client()
    try:
        client.flushall()  # what a restart without persistence leaves
        wait_for(lambda: sum(float(client.hget(k, "requests") or 0) for k in client.scan_iter(match="outage-test:budget:alpha:*")) == 15, timeout=10)
    finally:
        client.close()
    codes = [ask(gw.url).status_code for _ in range(10)]
    assert codes == [200] * 5 + [429] * 5


# -- a reservation that timed out but ran -----------------------------------------------
def test_a_reservation_that_timed_out_but_ran_is_not_paid_twice(start_backend, private_redis, gateway_on, budget_log):
    """Redis, busy when a reservation was sent, ran it after the gateway had
    timed out and admitted the request locally. The recovery probe voids the
    late write before paying in the local admission: the window counts each
    admitted request once (without voiding it counted the stalled one twice)."""
    store = private_redis()
    backend = start_backend()
    # Heartbeats and policy polls far apart: the stalled reservation is the one store call
    # in flight, on a pooled connection already open (a new one would wait for the stall
    # in its handshake, before the command is sent). So requests are the only probes.
    gw = gateway_on(store.url, backend.url, [tenant("alpha", requests_per_minute=100)],
                    instance_heartbeat_s=30.0, policy_poll_s=30.0, budget_store_retry_s=0.5, budget_window_s=3600)
    client = store.client()

    def charged() -> float:
        return sum(float(client.hget(k, "requests") or 0) for k in client.scan_iter(match="outage-test:budget:alpha:*"))

    admitted = 0

    def admit() -> None:
        nonlocal admitted
        assert ask(gw.url).status_code == 200
        admitted += 1

    try:
        admit()  # through the store (its scripts are loaded now)
        time.sleep(0.3)  # the request's telemetry is flushed before the stall
        stall = store.stall(2.0)  # returns once the server has stopped answering
        admit()  # the reservation times out: admitted locally
        assert ready(gw.url)[1]["budget_store"] == "down"
        stall.join(10)
        wait_for(lambda: charged() == 2, timeout=10)  # the stall ended and the sent reservation ran

        # Each request may probe: the probe voids the late write, then pays in the local
        # admissions. Asked until the store is up, since on a loaded machine one probe's
        # reconciliation can itself time out (its writes are then voided and paid by the next).
        def recovered() -> bool:
            admit()
            return ready(gw.url)[1]["budget_store"] == "up"

        wait_for(recovered, timeout=15, interval=0.5)
        assert charged() == admitted  # each request counted once
        voided = gw.state.metrics.budget_writes_voided
        assert voided.labels("true")._value.get() >= 1
        assert budget_log() == ["budget store down", "budget store back up"]
    finally:
        client.close()
