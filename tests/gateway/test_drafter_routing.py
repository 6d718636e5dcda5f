"""Tenant drafters through the real gateway (uvicorn on loopback, real Redis,
the fake OpenAI backend of tests/support as replicas): reserved replicas,
the canary split, promotion through a published policy, fallback."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from contract.policy import CanarySpec, SpeculationPolicy, publish_policies
from contract.routing import canary_arm

from .conftest import KEYS, tenant
from .test_policy_flow import wait_version

ALPHA = {"drafter": "alpha-v1", "canary": {"drafter": "alpha-v2", "share": 0.3}}


def fleet(start_backend, backends: dict | None = None):
    names = {"shared": None, "own": "alpha-v1", "cand": "alpha-v2", "other": "beta-v1"}
    started = {n: start_backend(name=n) for n in names}
    if backends is not None:
        backends.update(started)
    return [{"url": started[n].url, "name": n, "drafter": d} for n, d in names.items()]


async def served_by(gw, key: str, n: int, session: str | None = None, stream: bool = False) -> Counter:
    """Which replica served each of `n` requests (x-specgate-replica)."""
    seen: Counter = Counter()
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    if session is not None:
        headers["x-session-id"] = session
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": stream}
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(n):
            r = await c.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200
            seen[r.headers["x-specgate-replica"]] += 1
    return seen


async def test_reserved_replicas_serve_only_their_tenant_and_the_canary_gets_its_share(start_backend, start_gateway):
    replicas = await asyncio.to_thread(fleet, start_backend)
    gw = await asyncio.to_thread(start_gateway, replicas, [tenant("alpha", speculation=ALPHA), tenant("beta")])
    beta = await served_by(gw, "beta", 60)
    assert beta == Counter(shared=60)  # the shared replica only: never alpha's, never beta-v1's (no policy names it)
    alpha = await served_by(gw, "alpha", 300)
    assert set(alpha) == {"own", "cand"}  # the incumbent's replica or the candidate's; shared only as a fallback
    assert 0.2 < alpha["cand"] / 300 < 0.4  # request ids are random: a binomial draw around the 0.3 share
    policy = gw.state.policy_view.for_tenant("alpha")
    for i in range(8):  # a session stays in its arm, the one its id hashes to
        seen = await served_by(gw, "alpha", 4, session=f"conversation-{i}", stream=bool(i % 2))
        assert seen == Counter({"cand" if canary_arm(policy, f"conversation-{i}") else "own": 4})


async def test_promotion_and_fallback_follow_the_published_policy(start_backend, start_gateway, redis_store):
    backends: dict = {}
    replicas = await asyncio.to_thread(fleet, start_backend, backends)
    gw = await asyncio.to_thread(start_gateway, replicas, [tenant("alpha"), tenant("beta")])
    assert await served_by(gw, "alpha", 20) == Counter(shared=20)  # no drafter named: the shared fleet
    published = await publish_policies(redis_store, {"alpha": SpeculationPolicy(drafter="alpha-v2", source="controller")})
    await wait_version(gw, published.version)
    assert await served_by(gw, "alpha", 20) == Counter(cand=20)  # promoted: its replica preferred
    assert await served_by(gw, "beta", 20) == Counter(shared=20)
    # The promoted drafter's replica goes away: alpha falls back to the shared fleet (failover, no error).
    await asyncio.to_thread(backends["cand"].stop)
    assert await served_by(gw, "alpha", 10) == Counter(shared=10)
    # A canary with (nearly) every request in its arm, its replica down: served by the incumbent.
    published = await publish_policies(redis_store, {"alpha": SpeculationPolicy(
        drafter="alpha-v1", canary=CanarySpec(drafter="alpha-v2", share=0.999), source="controller")})
    await wait_version(gw, published.version)
    assert await served_by(gw, "alpha", 10) == Counter(own=10)


async def test_a_dead_preferred_replica_fails_over_to_the_shared_one(start_backend, start_gateway):
    """The replica is still marked healthy (no health check ran since it died): the
    request fails over within the gateway, down the ranked list, never to another tenant's replica."""
    backends: dict = {}
    replicas = await asyncio.to_thread(fleet, start_backend, backends)
    gw = await asyncio.to_thread(start_gateway, replicas, [tenant("alpha", speculation={"drafter": "alpha-v1"}),
                                                           tenant("beta")])
    assert await served_by(gw, "alpha", 5) == Counter(own=5)
    await asyncio.to_thread(backends["own"].stop)
    assert await served_by(gw, "alpha", 10) == Counter(shared=10)
    assert await served_by(gw, "beta", 5) == Counter(shared=5)
