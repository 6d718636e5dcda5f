"""The single-node composition (`specgate.node`): gateway + admin API +
controller in one process, on the gateway's own in-memory store (no Redis),
with the controller reading the gateway's scrapes instead of its own."""

from __future__ import annotations

import asyncio

import httpx

from contract.settings import Settings
from specgate.node import create_node_app
from tests.controller.conftest import ADMIN_KEY
from tests.controller.servers import serve, sim_replica, wait_for


def _settings(name: str, url: str) -> Settings:
    return Settings(
        replicas=[{"name": name, "url": url, "profile": "dspark-b8"}],
        admin_key=ADMIN_KEY,
        gateway={"policy_poll_s": 0.2, "health_interval_s": 0.2, "metrics_interval_s": 0.2},
        controller={"tick_s": 0.2, "instance_id": "embedded"},
    )


async def test_embedded_controller_starts_and_stops_with_the_lifespan_and_publishes_to_its_gateway():
    async with sim_replica("dspark-b8", "sim-e") as url:
        app = create_node_app(_settings("sim-e", url), controller=True)  # no redis_url: embedded MemoryStore
        async with serve(app) as gw:
            state = app.state.gateway
            controller = app.state.admin.controller
            await wait_for(lambda: state.policies.version > 0, 10, what="embedded controller to publish")
            assert "*" in state.policies.policies
            assert controller.is_leader and controller.snapshots is not None  # the gateway's scrapes, not its own
            await wait_for(lambda: controller.core.replicas.replicas.get("sim-e") is not None
                           and controller.core.replicas.replicas["sim-e"].samples > 0, 10, what="a replica sample")
            async with httpx.AsyncClient(base_url=gw, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
                text = (await http.get("/admin/controller/metrics")).text
                assert "specgate_controller_is_leader 1.0" in text
                # Each tick's decision is timed, wall and CPU (what it takes from shared cores).
                assert "specgate_controller_decide_seconds_count 0.0" not in text
                assert "specgate_controller_decide_seconds_count" in text and "specgate_controller_decide_cpu_seconds_total" in text
                status = (await http.get("/admin/controller")).json()
                assert status["leader"] == "embedded"
        assert not controller.is_leader


async def test_without_a_controller_the_admin_api_is_still_mounted():
    async with sim_replica("dspark-b8", "sim-n") as url:
        app = create_node_app(_settings("sim-n", url))
        async with serve(app) as gw:
            async with httpx.AsyncClient(base_url=gw, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
                assert (await http.get("/admin/tenants")).status_code == 200
                r = await http.get("/admin/controller/metrics")
                assert r.status_code == 404 and r.json()["error"]["message"] == "no controller runs in this process"


async def test_embedded_mode_puts_per_tenant_speculation_state_on_the_gateways_metrics():
    """No Redis, controller in-process: the gateway's own /metrics (no admin
    key) carries each served tenant's policy and measured acceptance length."""
    from prometheus_client.parser import text_string_to_metric_families

    async with sim_replica("dspark-b8", "sim-m") as url:
        app = create_node_app(_settings("sim-m", url), controller=True)
        async with serve(app) as gw:
            state = app.state.gateway
            await wait_for(lambda: state.policies.version > 0, 10, what="embedded controller to publish")
            async with httpx.AsyncClient(base_url=gw, timeout=30) as http:
                for _ in range(3):
                    r = await http.post("/v1/chat/completions", json={
                        "model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "[workload=code] hi"}],
                        "max_tokens": 32})
                    assert r.status_code == 200, r.text
                text = (await http.get("/metrics")).text
            values = {(s.name, s.labels.get("tenant")): s.value
                      for fam in text_string_to_metric_families(text) for s in fam.samples}
            policy = state.policy_view.for_tenant("anonymous")
            assert values[("specgate_tenant_speculation_enabled", "anonymous")] == (1.0 if policy.enabled else 0.0)
            cap = 0 if not policy.enabled else (-1 if policy.max_draft is None else policy.max_draft)
            assert values[("specgate_tenant_speculation_max_draft", "anonymous")] == cap
            assert values[("specgate_tenant_acceptance_length", "anonymous")] > 1.0


async def test_the_gateways_acceptance_gauge_and_the_controllers_estimate_are_one_number():
    """Issue 30 item 3: the acceptance length an operator reads on the
    gateway (`specgate_tenant_acceptance_length`) and the controller's
    (`specgate_controller_tenant_acceptance_length`, the number its decision
    records carry) come from one definition over the same responses and the
    same half-life: with one gateway they agree once the telemetry is in."""
    from prometheus_client.parser import text_string_to_metric_families

    def tenant_gauge(text: str, name: str) -> float | None:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and s.labels.get("tenant") == "anonymous":
                    return s.value
        return None

    async with sim_replica("dspark-b8", "sim-o") as url:
        app = create_node_app(_settings("sim-o", url), controller=True)
        async with serve(app) as gw:
            state = app.state.gateway
            await wait_for(lambda: state.policies.version > 0, 10, what="embedded controller to publish")
            async with httpx.AsyncClient(base_url=gw, timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
                for workload in ("code", "chat", "code", "chat"):  # two acceptance levels: the mean is not either's
                    r = await http.post("/v1/chat/completions", json={
                        "model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": f"[workload={workload}] hi"}],
                        "max_tokens": 48})
                    assert r.status_code == 200, r.text
                seen: dict[str, float | None] = {}

                async def agree() -> bool:
                    seen["gateway"] = tenant_gauge((await http.get("/metrics")).text, "specgate_tenant_acceptance_length")
                    seen["controller"] = tenant_gauge((await http.get("/admin/controller/metrics")).text,
                                                      "specgate_controller_tenant_acceptance_length")
                    return None not in seen.values() and abs(seen["gateway"] - seen["controller"]) <= 0.01 * seen["gateway"]

                for _ in range(100):  # the next ticks fold the flushed telemetry in
                    if await agree():
                        break
                    await asyncio.sleep(0.1)
                ctl = app.state.admin.controller.core.tenants.sums.get("anonymous")
                assert await agree(), (seen, state.metrics.recent_acceptance._sums, ctl and (ctl.accepted, ctl.steps))
                assert seen["gateway"] > 1.0
