"""Tenant drafter canaries end to end: admin API -> controller ticks -> published policy.

Real parts: Redis (127.0.0.1:6379), the controller (`Controller.tick`, run
tick by tick so each step can be checked), the standalone admin app over
loopback HTTP with httpx. SIMULATED: the replicas (drafters.sim.server, a
documented simulation of vLLM + DSpark) and the gateway's telemetry -- the
gateway routes a canary's share to the candidate's replicas (tested under
tests/gateway); here its per-request counters are written as it writes them
(`contract.telemetry.record_increments` of `increments_for`), from a noisy
per-request model of speculative decoding (`simulate_requests`).
"""

from __future__ import annotations

import contextlib
import random

import httpx
import pytest

from contract.keys import HISTORY_KEY
from contract.policy import load_policies
from contract.settings import Settings, hash_key
from contract.telemetry import RequestSpecStats, increments_for, record_increments
from controller.service import Controller
from tests.controller.conftest import ADMIN_KEY, TENANT_KEYS
from tests.controller.servers import controller_with_admin, sim_replica

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}", "X-Admin-User": "alice"}
CAPTURE = {"fraction": 0.5, "max_per_hour": 120}


def settings_for(urls: list[str], redis_url: str, prefix: str) -> Settings:
    """Two DSpark replicas: sim-0 serves the fleet's drafter, sim-1 the candidate `alpha-v2`.
    Tenant alpha opted in to capture in its config."""
    tenants = [{"id": t, "api_key_sha256": hash_key(k)} for t, k in TENANT_KEYS.items()]
    tenants[0]["speculation"] = {"capture": CAPTURE}
    return Settings(
        replicas=[{"name": "sim-0", "url": urls[0], "profile": "dspark-b8"},
                  {"name": "sim-1", "url": urls[1], "profile": "dspark-b8", "drafter": "alpha-v2"}],
        tenants=tenants, admin_key=ADMIN_KEY, redis_url=redis_url, redis_prefix=prefix,
        controller={"tick_s": 0.2, "instance_id": "ctl-a", "gpu": "h200", "model": "qwen3-8b",
                    "rollout": {"min_requests": 20, "confidence": 0.95, "max_goodput_loss": 0.1}},
    )


@contextlib.asynccontextmanager
async def rig(redis_url: str, prefix: str):
    """Sim replicas + settings + a controller on its own Redis connection + the admin app."""
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(sim_replica("dspark-b8", f"sim-{i}", seed=i)) for i in range(2)]
        settings = settings_for(urls, redis_url, prefix)
        store, ctl, http = await stack.enter_async_context(controller_with_admin(settings, redis_url, prefix, ADMIN))
        yield settings, store, ctl, http


async def simulate_requests(store, tenant: str, replica: str, n: int, rate: float, seed: int, step_ms: float = 20.0) -> None:
    """n finished requests of `tenant` on `replica`, as the gateway records them:
    per-request acceptance rate Beta-distributed around `rate`, 8-40 verification
    steps of up to 8 drafts accepted up to the first rejection, duration = steps x
    step time x lognormal noise."""
    rng = random.Random(seed)
    total: dict[str, float] = {}
    for _ in range(n):
        p = rng.betavariate(rate * 20, (1 - rate) * 20)
        steps = rng.randint(8, 40)
        accepted = 0
        for _ in range(steps):
            k = 0
            while k < 8 and rng.random() < p:
                k += 1
            accepted += k
        stats = RequestSpecStats(prompt_tokens=64, completion_tokens=steps + accepted, num_spec_steps=steps,
                                 num_draft_tokens=8 * steps, num_accepted_draft_tokens=accepted,
                                 duration_s=steps * step_ms / 1000 * rng.lognormvariate(0, 0.1))
        for key, value in increments_for(stats).items():
            total[key] = total.get(key, 0.0) + value
    await record_increments(store, tenant, replica, total)


async def policy(store, tenant: str):
    return (await load_policies(store)).policies[tenant]


async def history(store, tenant: str) -> list[dict]:
    return [h for h in await store.recent(HISTORY_KEY, 500) if h["tenant"] == tenant]


async def audit_actions(http: httpx.AsyncClient) -> list[tuple[str, str, str]]:
    r = await http.get("/admin/audit")
    return [(e["action"], e["target"], e["who"]) for e in r.json()["data"]]


async def test_a_better_drafter_is_promoted_through_a_canary_and_stays(redis_url, redis_prefix):
    async with rig(redis_url, redis_prefix) as (settings, store, ctl, http):
        assert await ctl.tick() is not None
        alpha = await policy(store, "alpha")
        assert alpha.capture is not None and alpha.capture.fraction == 0.5 and alpha.capture.max_per_hour == 120
        assert alpha.canary is None and alpha.drafter is None
        assert (await policy(store, "beta")).capture is None  # not opted in: never captured

        # Before the canary: an earlier, poor drafter ran on sim-1 for alpha. The
        # canary counts from its start, so none of this may count for alpha-v2.
        await simulate_requests(store, "alpha", "sim-1", 60, 0.2, seed=1)
        await simulate_requests(store, "alpha", "sim-0", 50, 0.5, seed=2)

        r = await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2", "share": 0.3})
        assert r.status_code == 200, r.text
        assert r.json()["rollout"]["state"] == "canary" and r.json()["audit"]["who"].startswith("alice@")
        # Refusals: one canary at a time, a drafter no replica serves, a tenant nobody serves, a bad share.
        r2 = await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})
        assert r2.status_code == 409 and "running" in r2.json()["error"]["message"]
        assert (await http.post("/admin/tenants/beta/canary", json={"drafter": "nobody-serves-it"})).status_code == 400
        assert (await http.post("/admin/tenants/zed/canary", json={"drafter": "alpha-v2"})).status_code == 404
        assert (await http.post("/admin/tenants/beta/canary", json={"drafter": "alpha-v2", "share": 1.5})).status_code == 400
        assert (await http.post("/admin/tenants/beta/canary", json={})).status_code == 400

        await ctl.tick()
        alpha = await policy(store, "alpha")
        assert alpha.canary is not None and (alpha.canary.drafter, alpha.canary.share) == ("alpha-v2", 0.3)
        assert alpha.capture is not None and alpha.drafter is None
        started = (await history(store, "alpha"))[0]
        assert "canary" in started["changes"] and started["reason"].startswith("canary alpha-v2 (share 0.3) started by alice@")

        # Too little evidence yet: the canary waits.
        await simulate_requests(store, "alpha", "sim-1", 10, 0.8, seed=3)
        await simulate_requests(store, "alpha", "sim-0", 30, 0.5, seed=4)
        await ctl.tick()
        assert (await policy(store, "alpha")).canary is not None
        d = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert d["state"] == "canary" and d["verdict"]["verdict"] == "wait"
        assert d["arms"]["candidate"]["al_requests"] == 10 and d["arms"]["candidate"]["replicas"] == ["sim-1"]
        assert d["arms"]["incumbent"]["al_requests"] == 30  # the 50 before the start are not counted

        # Both arms past min_requests; the trained drafter is clearly better.
        await simulate_requests(store, "alpha", "sim-1", 30, 0.8, seed=5)
        await simulate_requests(store, "alpha", "sim-0", 90, 0.5, seed=6)
        await simulate_requests(store, "beta", "sim-0", 50, 0.3, seed=7)  # another tenant's traffic is not an arm
        d = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert d["verdict"]["verdict"] == "promote", d["verdict"]
        assert d["arms"]["incumbent"]["al_requests"] == 120

        await ctl.tick()
        alpha = await policy(store, "alpha")
        assert alpha.drafter == "alpha-v2" and alpha.canary is None
        assert alpha.capture is not None and alpha.capture.fraction == 0.5
        promoted = (await history(store, "alpha"))[0]
        assert set(promoted["changes"]) >= {"drafter", "canary"}
        assert promoted["changes"]["drafter"] == [None, "alpha-v2"]
        assert promoted["reason"].startswith("drafter alpha-v2 promoted: candidate better: acceptance ")
        actions = await audit_actions(http)
        assert ("canary_promote", "alpha", "controller:ctl-a") in actions
        assert ctl.metrics.registry.get_sample_value("specgate_controller_canary_verdicts_total", {"verdict": "promote"}) == 1.0
        assert any(x[:2] == ("canary_start", "alpha") and x[2].startswith("alice@") for x in actions)
        d = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert d["drafter"] == "alpha-v2" and d["state"] == "promoted" and d["verdict"] is None
        assert d["rollout"]["stats"]["candidate"]["al_requests"] == 40 and d["published"]["drafter"] == "alpha-v2"
        # Already in force: no second canary of it.
        assert (await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})).status_code == 400

        # Later ticks keep it, with no new history entry for alpha.
        n = len(await history(store, "alpha"))
        for _ in range(3):
            await ctl.tick()
        assert (await policy(store, "alpha")).drafter == "alpha-v2"
        assert len(await history(store, "alpha")) == n

        # An admin pin changes speculation, not the tenant's drafter or capture opt-in.
        r = await http.put("/admin/tenants/alpha/override", json={"mode": "off"})
        assert r.status_code == 200
        pinned = await policy(store, "alpha")
        assert not pinned.enabled and pinned.drafter == "alpha-v2" and pinned.capture is not None
        await ctl.tick()
        pinned = await policy(store, "alpha")
        assert not pinned.enabled and pinned.source == "admin" and pinned.drafter == "alpha-v2" and pinned.capture is not None


async def test_promotion_survives_a_restart_and_a_leader_failover(redis_url, redis_prefix):
    from contract.store.redis_store import RedisStore

    async with rig(redis_url, redis_prefix) as (settings, store, ctl, http):
        await ctl.tick()
        assert (await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})).status_code == 200
        await ctl.tick()
        await simulate_requests(store, "alpha", "sim-1", 40, 0.8, seed=11)
        await simulate_requests(store, "alpha", "sim-0", 120, 0.45, seed=12)
        await ctl.tick()
        assert (await policy(store, "alpha")).drafter == "alpha-v2"
        n = len(await history(store, "alpha"))

        # A standby waits while ctl-a leads, takes over once ctl-a stops, and keeps the drafter.
        other = RedisStore(redis_url, prefix=redis_prefix)
        section = settings.controller.model_copy(update={"instance_id": "ctl-b"})
        standby = Controller(settings.model_copy(update={"controller": section}), other)
        try:
            assert await standby.tick() is None
            await ctl.close()
            for _ in range(3):
                assert await standby.tick() is not None
            alpha = await policy(store, "alpha")
            assert alpha.drafter == "alpha-v2" and alpha.canary is None and alpha.capture is not None
            assert len(await history(store, "alpha")) == n  # no flip, nothing to record
        finally:
            await standby.close()
            await other.close()


async def test_a_worse_drafter_is_rolled_back_and_never_retried(redis_url, redis_prefix):
    async with rig(redis_url, redis_prefix) as (settings, store, ctl, http):
        await ctl.tick()
        assert (await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2", "share": 0.2})).status_code == 200
        await ctl.tick()
        assert (await policy(store, "alpha")).canary is not None
        assert ctl.metrics.registry.get_sample_value("specgate_controller_canaries_running") == 1.0
        await simulate_requests(store, "alpha", "sim-1", 30, 0.35, seed=21)
        await simulate_requests(store, "alpha", "sim-0", 100, 0.6, seed=22)
        await ctl.tick()
        alpha = await policy(store, "alpha")
        assert alpha.canary is None and alpha.drafter is None and alpha.capture is not None
        assert ctl.metrics.registry.get_sample_value("specgate_controller_canary_verdicts_total", {"verdict": "rollback"}) == 1.0
        assert ctl.metrics.registry.get_sample_value("specgate_controller_canaries_running") == 0.0
        ended = (await history(store, "alpha"))[0]
        assert ended["changes"]["canary"][1] is None
        assert ended["reason"].startswith("canary alpha-v2 rolled back: candidate not better: acceptance ")
        assert ("canary_rollback", "alpha", "controller:ctl-a") in await audit_actions(http)
        d = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert d["state"] == "rolled_back" and d["rolled_back"] == ["alpha-v2"] and d["drafter"] is None
        r = await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})
        assert r.status_code == 400 and "rolled back" in r.json()["error"]["message"]


async def test_an_aborted_canary_is_cleared_and_may_run_again(redis_url, redis_prefix):
    async with rig(redis_url, redis_prefix) as (settings, store, ctl, http):
        await ctl.tick()
        assert (await http.post("/admin/tenants/alpha/canary/abort")).status_code == 409  # none runs
        assert (await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})).status_code == 200
        await ctl.tick()
        assert (await policy(store, "alpha")).canary is not None
        r = await http.post("/admin/tenants/alpha/canary/abort", json={"note": "replica maintenance"})
        assert r.status_code == 200 and r.json()["rollout"]["state"] == "aborted"
        await ctl.tick()
        assert (await policy(store, "alpha")).canary is None
        assert (await history(store, "alpha"))[0]["reason"].startswith("canary alpha-v2 aborted by alice@")
        assert ("canary_abort", "alpha") in [a[:2] for a in await audit_actions(http)]
        r = await http.post("/admin/tenants/alpha/canary", json={"drafter": "alpha-v2"})
        assert r.status_code == 200
        d = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert d["state"] == "canary" and [p["state"] for p in d["past"]] == ["aborted"]


async def test_an_override_made_while_the_controller_decides_is_not_undone_by_that_tick(redis_url, redis_prefix):
    """The admin API publishes a pin at once; a tick that loaded the overrides
    before it and publishes after it must not put the tenant back (seen once
    in tests/controller/test_admin.py: the pin undone for a tick)."""
    async with rig(redis_url, redis_prefix) as (settings, store, ctl, http):
        assert await ctl.tick() is not None
        assert (await policy(store, "alpha")).enabled
        lead = ctl._lead

        async def admin_pins_alpha_then_lead() -> bool:  # between the decision and its publication
            r = await http.put("/admin/tenants/alpha/override", json={"mode": "off", "note": "incident"})
            assert r.status_code == 200 and r.json()["applied"]["policy"]["enabled"] is False, r.text
            return await lead()

        ctl._lead = admin_pins_alpha_then_lead
        assert await ctl.tick() is None  # decided without the pin: not published
        pinned = await policy(store, "alpha")
        assert not pinned.enabled and pinned.source == "admin"
        ctl._lead = lead
        assert await ctl.tick() is not None
        after = await policy(store, "alpha")
        assert not after.enabled and after.source == "admin"
