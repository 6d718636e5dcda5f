"""Fixtures for controller tests: a gateway + sim replicas + controller stack on real Redis."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest

from contract.settings import Settings, hash_key

ADMIN_KEY = "admin-secret-key"
TENANT_KEYS = {"alpha": "sk-alpha-0001", "beta": "sk-beta-0002", "bulk": "sk-bulk-0003"}


def make_settings(replicas: list[dict], redis_url: str, prefix: str, tpot: dict[str, float] | None = None, **kw) -> Settings:
    tpot = tpot or {}
    return Settings(
        replicas=replicas,
        tenants=[
            {"id": t, "api_key_sha256": hash_key(k), "tpot_target_ms": tpot.get(t)} for t, k in TENANT_KEYS.items()
        ],
        admin_key=ADMIN_KEY,
        redis_url=redis_url,
        redis_prefix=prefix,
        gateway={"health_interval_s": 0.2, "metrics_interval_s": 0.2, "policy_poll_s": 0.2, "telemetry_flush_s": 0.1},
        **kw,
    )


@dataclass
class Stack:
    settings: Settings
    gateway_url: str
    app: object
    store: object
    ticks: list = field(default_factory=list)


@pytest.fixture
def stack_factory(redis_url, redis_prefix):
    """async with stack_factory(replica_profiles) as stack: gateway + sim replicas (+ controller if asked)."""
    from contract.store.redis_store import RedisStore
    from specgate.node import create_node_app

    from .servers import serve, sim_replica

    @contextlib.asynccontextmanager
    async def factory(profiles: list[str], tpot: dict[str, float] | None = None, **sim_kw):
        async with contextlib.AsyncExitStack() as stack:
            replicas = []
            for i, profile in enumerate(profiles):
                url = await stack.enter_async_context(sim_replica(profile, f"sim-{i}", seed=i, **sim_kw))
                replicas.append({"name": f"sim-{i}", "url": url, "profile": profile})
            settings = make_settings(replicas, redis_url, redis_prefix, tpot)
            store = RedisStore(redis_url, prefix=redis_prefix)
            stack.push_async_callback(store.close)
            app_store = RedisStore(redis_url, prefix=redis_prefix)
            stack.push_async_callback(app_store.close)
            app = create_node_app(settings, store=app_store)
            url = await stack.enter_async_context(serve(app))
            yield Stack(settings, url, app, store)

    return factory


@contextlib.asynccontextmanager
async def running_controller(settings: Settings, redis_url: str, prefix: str, **cfg):
    """A Controller on its own Redis connection with short ticks; yields (controller, ticks list)."""
    import asyncio

    from contract.store.redis_store import RedisStore
    from controller.service import Controller

    store = RedisStore(redis_url, prefix=prefix)
    ticks: list = []
    # Dwells scaled to the 0.2 s ticks (the defaults are 30 s and 60 s): a schedule changed by
    # the tests' own load steps is published within seconds, as a minute is on a live fleet.
    decision = {"min_dwell_s": 1.0, "schedule_dwell_s": 2.0, **cfg.pop("decision", {})}
    # The replicas are SIMULATED H200 + Qwen3-8B: an operator who knows the
    # hardware names it as the step-cost prior; the curve is still learned
    # from the replicas' /metrics (tests/controller/test_step_cost*.py cover
    # learning with no preset at all).
    section = {"tick_s": 0.2, "instance_id": "test-ctrl", "gpu": "h200", "model": "qwen3-8b", **cfg,
               "decision": decision}
    controller = Controller(settings.model_copy(update={"controller": settings.controller.model_validate(section)}), store,
                            on_tick=ticks.append)
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        yield controller, ticks
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, timeout=10)
        finally:
            await store.close()
