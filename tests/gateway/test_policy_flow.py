"""Tenant speculation policy: store -> gateway watcher -> routing and vllm_xargs."""

from __future__ import annotations

import asyncio

import httpx

from contract.policy import ProbeSpec, SpeculationPolicy, publish_policies

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


async def test_placed_tenants_go_to_their_replicas_and_fail_over_when_those_are_down(start_backend, start_gateway, redis_store):
    r0 = await asyncio.to_thread(start_backend, name="r0", spec=True, knobs=True)
    r1 = await asyncio.to_thread(start_backend, name="r1", spec=True, knobs=True)
    gw = await asyncio.to_thread(start_gateway, [{"url": r0.url, "name": "r0", "profile": "dspark-b8"},
                                                 {"url": r1.url, "name": "r1", "profile": "dspark-b8"}])
    v = await publish_policies(redis_store, {"alpha": SpeculationPolicy(placement=("r1",), source="controller"),
                                             "beta": SpeculationPolicy(placement=("r0",), source="controller")})
    await wait_version(gw, v.version)
    # Load ties would send both to r0 (by name): each tenant's placement wins.
    for _ in range(3):
        assert (await post(gw)).headers["x-specgate-replica"] == "r1"
        assert (await post(gw, key="beta")).headers["x-specgate-replica"] == "r0"
    # A placement is a preference: with r1 gone, alpha is served by r0.
    await asyncio.to_thread(r1.stop)
    response = await post(gw)
    assert response.status_code == 200 and response.headers["x-specgate-replica"] == "r0"


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


async def test_a_policy_schedule_reaches_replicas_that_honour_it_and_its_envelope_the_rest(
        start_backend, start_gateway, redis_store):
    new = await asyncio.to_thread(start_backend, name="new", knobs="max_draft,max_batch,schedule")
    old = await asyncio.to_thread(start_backend, name="old", knobs="max_draft,max_batch")
    gw_new = await asyncio.to_thread(start_gateway, [{"url": new.url, "name": "new"}])
    gw_old = await asyncio.to_thread(start_gateway, [{"url": old.url, "name": "old"}])
    published = await publish_policies(
        redis_store, {"alpha": SpeculationPolicy(schedule=((4, 6), (32, 2)), source="controller")})
    await wait_version(gw_new, published.version)
    await wait_version(gw_old, published.version)

    assert (await post(gw_new)).status_code == 200
    assert backend_requests(new)[-1]["body"]["vllm_xargs"] == {
        "specgate_max_draft": 6, "specgate_max_batch": 32, "specgate_schedule": [4, 6, 32, 2]}
    # A client's own schedule lowers the policy's pointwise, never raises it.
    await post(gw_new, vllm_xargs={"specgate_schedule": [2, 8, 16, 1]})
    assert backend_requests(new)[-1]["body"]["vllm_xargs"]["specgate_schedule"] == [2, 6, 16, 1]
    # A plugin that predates schedules gets the envelope: it stops where the schedule stops.
    await post(gw_old)
    assert backend_requests(old)[-1]["body"]["vllm_xargs"] == {"specgate_max_draft": 6, "specgate_max_batch": 32}
    # A malformed schedule is a 400 naming the field; no replica sees it.
    seen = len(backend_requests(new))
    for bad in ([4, 6, 2, 1], [4], [[4, 6]], [4, 65]):
        r = await post(gw_new, vllm_xargs={"specgate_schedule": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "vllm_xargs.specgate_schedule", r.text
        assert "specgate_schedule" in r.json()["error"]["message"]
    assert len(backend_requests(new)) == seen


async def test_a_probe_sends_a_random_share_of_requests_under_its_schedule(start_backend, start_gateway, redis_store):
    """A tenant switched off explores: about `share` of its requests go to the
    speculative replica (not the `off` pool its policy prefers) under the
    probe's schedule; the rest follow the policy. Drawn per request."""
    spec = await asyncio.to_thread(start_backend, name="spec", spec=True, knobs="max_draft,max_batch,schedule")
    off = await asyncio.to_thread(start_backend, name="off")
    gw = await asyncio.to_thread(
        start_gateway, [{"url": spec.url, "name": "spec", "profile": "ngram-k8"}, {"url": off.url, "name": "off", "profile": "off"}]
    )
    probe = ProbeSpec(share=0.5, schedule=((6, 8),), profile="ngram-k8")
    v = await publish_policies(redis_store, {"alpha": SpeculationPolicy(enabled=False, max_draft=0, preferred_profile="off",
                                                                         probe=probe, source="controller")})
    await wait_version(gw, v.version)
    replicas = [(await post(gw)).headers["x-specgate-replica"] for _ in range(60)]
    probed = replicas.count("spec")
    assert 10 <= probed <= 50, replicas  # 30 expected; this bound fails once in ~10^5 runs of a fair draw
    for request in backend_requests(spec):
        assert request["body"]["vllm_xargs"] == {"specgate_max_draft": 8, "specgate_max_batch": 6, "specgate_schedule": [6, 8]}
    assert all("vllm_xargs" not in r["body"] for r in backend_requests(off))  # an off replica honours no knobs
