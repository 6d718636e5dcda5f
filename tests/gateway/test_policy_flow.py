"""Tenant speculation policy: store -> gateway watcher -> routing and vllm_xargs."""

from __future__ import annotations

import asyncio

import httpx

from contract.policy import SpeculationPolicy, publish_policies

from .conftest import KEYS, backend_requests, tenant


async def post(gw, key="alpha", **extra):
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
    async with httpx.AsyncClient() as c:
        return await c.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEYS[key]}"})


async def wait_version(gw, version, timeout=15.0):
    for _ in range(int(timeout / 0.05)):
        if gw.state.policies.version >= version:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("gateway did not pick up policy version %d" % version)


async def test_policy_knobs_only_for_knob_capable_replicas(start_backend, start_gateway, redis_store):
    knob = await asyncio.to_thread(start_backend, name="knob", spec=True, knobs=True)
    plain = await asyncio.to_thread(start_backend, name="plain", spec=True)
    gw_k = await asyncio.to_thread(start_gateway, [{"url": knob.url, "name": "knob", "profile": "dspark-b8"}])
    gw_p = await asyncio.to_thread(start_gateway, [{"url": plain.url, "name": "plain", "profile": "dspark-b8"}])
    published = await publish_policies(redis_store, {"alpha": SpeculationPolicy(max_draft=2, min_confidence=0.4, source="controller")})
    await wait_version(gw_k, published.version)
    await wait_version(gw_p, published.version)

    assert (await post(gw_k)).status_code == 200
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 2, "specgate_min_confidence": 0.4}
    # The client may ask for less speculation, never more.
    await post(gw_k, vllm_xargs={"specgate_max_draft": 1})
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"]["specgate_max_draft"] == 1
    await post(gw_k, vllm_xargs={"specgate_max_draft": 9, "specgate_min_confidence": 0.1})
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 2, "specgate_min_confidence": 0.4}
    # Other tenants have no policy: nothing added.
    await post(gw_k, key="beta")
    assert "vllm_xargs" not in backend_requests(knob)[-1]["body"]
    # A replica without the extension gets pool routing only.
    await post(gw_p)
    assert "vllm_xargs" not in backend_requests(plain)[-1]["body"]
    # Bad client knobs are rejected before any replica sees them.
    seen = len(backend_requests(knob))
    bad = await post(gw_k, vllm_xargs={"specgate_max_draft": -3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vllm_xargs.specgate_max_draft"
    assert len(backend_requests(knob)) == seen


async def test_disabled_policy_routes_to_off_pool_and_updates_live(start_backend, start_gateway, redis_store):
    spec = await asyncio.to_thread(start_backend, name="spec", spec=True)
    off = await asyncio.to_thread(start_backend, name="off")
    gw = await asyncio.to_thread(
        start_gateway, [{"url": spec.url, "name": "spec", "profile": "dspark-b8"}, {"url": off.url, "name": "off", "profile": "off"}]
    )
    # Ties on load go by name: "off" < "spec", so start with a preference for the spec pool.
    v1 = await publish_policies(redis_store, {"*": SpeculationPolicy(preferred_profile="dspark-b8")})
    await wait_version(gw, v1.version)
    assert (await post(gw)).headers["x-specgate-replica"] == "spec"
    v2 = await publish_policies(redis_store, {"alpha": SpeculationPolicy(enabled=False, reason="low acceptance"), "*": SpeculationPolicy(preferred_profile="dspark-b8")})
    await wait_version(gw, v2.version)
    assert (await post(gw)).headers["x-specgate-replica"] == "off"
    assert (await post(gw, key="beta")).headers["x-specgate-replica"] == "spec"


async def test_config_default_policy_applies_until_controller_publishes(start_backend, start_gateway, redis_store):
    knob = await asyncio.to_thread(start_backend, name="knob", knobs=True)
    tenants = [tenant("alpha", speculation={"max_draft": 3, "source": "config"}), tenant("beta")]
    gw = await asyncio.to_thread(start_gateway, [{"url": knob.url, "name": "knob"}], tenants)
    await post(gw)
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 3}
    v = await publish_policies(redis_store, {"alpha": SpeculationPolicy(max_draft=1, source="controller")})
    await wait_version(gw, v.version)
    await post(gw)
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 1}


async def test_policy_poll_fallback_without_pubsub(start_backend, start_gateway, redis_store):
    """A policy written without a notification (missed message) is still picked up by polling."""
    from contract.policy import POLICIES_KEY, POLICIES_VERSION_KEY, PolicySet

    knob = await asyncio.to_thread(start_backend, name="knob", knobs=True)
    gw = await asyncio.to_thread(start_gateway, [{"url": knob.url, "name": "knob"}])
    version = await redis_store.incr(POLICIES_VERSION_KEY)
    silent = PolicySet(version=version, policies={"alpha": SpeculationPolicy(max_draft=5)})
    await redis_store.set_json(POLICIES_KEY, silent.model_dump(mode="json"))
    await wait_version(gw, version)
    await post(gw)
    assert backend_requests(knob)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 5}
