"""The controller embedded in the gateway process, on the gateway's own
in-memory store (single node, no Redis)."""

from __future__ import annotations

import httpx

from controller.embedded import start_embedded
from controller.service import ControllerConfig
from gateway.app import create_app
from gateway.config import Settings

from .conftest import ADMIN_KEY
from .servers import serve, sim_replica, wait_for


async def test_embedded_controller_publishes_to_its_gateway():
    async with sim_replica("dspark-b8", "sim-e") as url:
        settings = Settings(replicas=[{"name": "sim-e", "url": url, "profile": "dspark-b8"}], admin_key=ADMIN_KEY,
                            allow_anonymous=True, policy_poll_s=0.2, health_interval_s=0.2)
        app = create_app(settings)  # no redis_url: embedded MemoryStore
        async with serve(app) as gw:
            state = app.state.gateway
            handle = start_embedded(state, ControllerConfig(tick_s=0.2, instance_id="embedded"))
            try:
                await wait_for(lambda: state.policies.version > 0, 10, what="embedded controller to publish")
                assert "*" in state.policies.policies
                async with httpx.AsyncClient(base_url=gw, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
                    text = (await http.get("/admin/controller/metrics")).text
                    assert "specgate_controller_is_leader 1.0" in text
                    status = (await http.get("/admin/controller")).json()
                    assert status["leader"] == "embedded"
            finally:
                await handle.stop()
            assert handle.task.done() and not handle.controller.is_leader


async def test_embed_in_app_starts_with_the_gateway_lifespan_and_stops_with_it():
    """The wiring `specgate gateway --embedded-controller` and `specgate up` use."""
    from controller.embedded import embed_in_app

    async with sim_replica("dspark-b8", "sim-l") as url:
        settings = Settings(replicas=[{"name": "sim-l", "url": url, "profile": "dspark-b8"}], admin_key=ADMIN_KEY,
                            allow_anonymous=True, policy_poll_s=0.2, health_interval_s=0.2)
        app = create_app(settings)
        embed_in_app(app, ControllerConfig(tick_s=0.2, instance_id="lifespan"))
        async with serve(app):
            state = app.state.gateway
            await wait_for(lambda: state.policies.version > 0, 10, what="embedded controller to publish")
            assert state.controller.is_leader
        assert not state.controller.is_leader
