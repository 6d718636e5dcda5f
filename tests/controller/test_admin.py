"""Admin REST API on the real gateway app over loopback HTTP, real Redis, with
sim replicas (SIMULATION of vLLM + DSpark) and a running controller."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import httpx
import pytest
from openai import AsyncOpenAI

from contract.policy import load_policies
from tests.controller.conftest import ADMIN_KEY, TENANT_KEYS, running_controller, stack_factory  # noqa: F401 (fixture)
from tests.controller.servers import wait_for

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}", "X-Admin-User": "alice"}


async def test_admin_auth_401_and_403(stack_factory):
    async with stack_factory(["dspark-b8"]) as st:
        async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
            r = await http.get("/admin/tenants")
            assert r.status_code == 401
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            r = await http.get("/admin/tenants", headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = await http.get("/admin/tenants", headers={"Authorization": f"Bearer {TENANT_KEYS['alpha']}"})
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
            r = await http.put("/admin/tenants/alpha/override", json={"mode": "off"},
                               headers={"Authorization": f"Bearer {TENANT_KEYS['alpha']}"})
            assert r.status_code == 403
            assert (await load_policies(st.store)).version == 0  # nothing written
            r = await http.get("/admin/tenants", headers=ADMIN)
            assert r.status_code == 200
            assert {t["tenant"] for t in r.json()["data"]} >= {"alpha", "beta", "bulk"}


async def test_bad_override_is_a_400(stack_factory):
    async with stack_factory(["dspark-b8"]) as st:
        async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
            for body in ({"mode": "sideways"}, {"max_draft_min": 8, "max_draft_max": 2}, {"min_confidence_max": 1.5}):
                r = await http.put("/admin/tenants/alpha/override", json=body, headers=ADMIN)
                assert r.status_code == 400, body
                assert r.json()["error"]["message"]
            r = await http.put("/admin/tenants/alpha/override", content=b"{not json", headers={**ADMIN, "content-type": "application/json"})
            assert r.status_code == 400
            r = await http.get("/admin/tenants/nobody", headers=ADMIN)
            assert r.status_code == 404


async def test_override_wins_and_is_audited(stack_factory, redis_url, redis_prefix):
    async with stack_factory(["dspark-b8"]) as st:
        async with running_controller(st.settings, redis_url, redis_prefix) as (ctrl, ticks):
            alpha = AsyncOpenAI(base_url=st.gateway_url + "/v1", api_key=TENANT_KEYS["alpha"], max_retries=0, timeout=60)
            for _ in range(3):
                await alpha.chat.completions.create(
                    model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "[workload=code] hi"}], max_tokens=32
                )

            async def policy(tenant):
                return (await load_policies(st.store)).policies.get(tenant)

            await wait_for(lambda: _enabled(policy("alpha")), 10, what="controller enables alpha at low load")
            async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
                r = await http.put("/admin/tenants/alpha/override", json={"mode": "off", "note": "incident 42"}, headers=ADMIN)
                assert r.status_code == 200, r.text
                assert r.json()["applied"]["policy"]["enabled"] is False
                # Applied at once and kept by the controller on later ticks (it would choose "on").
                p = await policy("alpha")
                assert not p.enabled and p.source == "admin"
                n = len(ticks)
                await wait_for(lambda: len(ticks) >= n + 5, 10, what="five more controller ticks")
                p = await policy("alpha")
                assert not p.enabled and p.source == "admin", p
                gw = st.app.state.gateway
                await wait_for(lambda: not gw.policies.for_tenant("alpha").enabled, 5, what="gateway applies override")

                r = await http.get("/admin/tenants/alpha", headers=ADMIN)
                body = r.json()
                assert body["override"]["mode"] == "off" and body["override"]["by"].startswith("alice@")
                assert body["policy"]["enabled"] is False
                assert body["last_decision"]["reason"].startswith("admin override") or "holding" in body["last_decision"]["reason"]
                # One reason: the latest decision is the pin in force, so it is the policy's reason too.
                assert body["last_decision"]["applied"] is True
                assert body["policy"]["reason"] == body["last_decision"]["reason"]
                assert _recent_iso(body["override"]["at"]) and _recent_iso(body["last_decision"]["at"])
                # The pin is a published change: in the history, by the admin, with what changed.
                pins = (await http.get("/admin/decisions?tenant=alpha", headers=ADMIN)).json()["data"]
                pin = next(h for h in pins if h["by"].startswith("alice@"))
                assert pin["changes"]["enabled"] == [True, False] and pin["changes"]["source"][1] == "admin"
                assert body["measured_acceptance"] is not None

                audit = (await http.get("/admin/audit", headers=ADMIN)).json()["data"]
                entry = audit[0]
                assert entry["action"] == "override" and entry["target"] == "alpha"
                assert entry["who"].startswith("alice@") and _recent_iso(entry["at"])
                assert entry["detail"]["override"]["mode"] == "off"

                # Bounds: auto with max_draft_max=2 -> controller keeps alpha on but capped.
                r = await http.put("/admin/tenants/alpha/override", json={"mode": "auto", "max_draft_max": 2}, headers=ADMIN)
                assert r.status_code == 200
                await wait_for(lambda: _capped(policy("alpha"), 2), 10, what="controller re-enables alpha within the bound")

                # Back to auto: override removed, audited.
                r = await http.delete("/admin/tenants/alpha/override", headers=ADMIN)
                assert r.status_code == 200
                audit = (await http.get("/admin/audit?limit=10", headers=ADMIN)).json()["data"]
                assert [e["action"] for e in audit[:3]] == ["override", "override", "override"]
                assert audit[0]["detail"]["override"] == {"mode": "auto"}


async def test_pause_resume_replicas_history_and_metrics(stack_factory, redis_url, redis_prefix):
    async with stack_factory(["dspark-b8", "off"]) as st:
        async with running_controller(st.settings, redis_url, redis_prefix) as (ctrl, ticks):
            await wait_for(lambda: len(ticks) >= 3, 10, what="controller ticks")
            async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
                r = await http.get("/admin/replicas", headers=ADMIN)
                data = {d["name"]: d for d in r.json()["data"]}
                assert set(data) == {"sim-0", "sim-1"}
                for d in data.values():
                    assert d["regime"]["regime"] in ("memory-bound", "near-knee", "compute-bound")
                    assert "rho" in d["regime"] and "recommended_profile" in d["regime"]

                r = await http.post("/admin/controller/pause", headers=ADMIN)
                assert r.status_code == 200 and r.json()["paused"] is True
                version = (await load_policies(st.store)).version
                n = len(ticks)
                # Pin alpha off while paused: the admin write applies, the controller does not undo or add.
                await http.put("/admin/tenants/beta/override", json={"mode": "off"}, headers=ADMIN)
                await wait_for(lambda: len(ticks) >= n + 4, 10, what="ticks while paused")
                assert (await load_policies(st.store)).version == version + 1
                status = (await http.get("/admin/controller", headers=ADMIN)).json()
                assert status["paused"] is True and status["leader"] == "test-ctrl"
                last = (await http.get("/admin/tenants/beta", headers=ADMIN)).json()["last_decision"]
                assert last["reason"].startswith("paused")
                assert last["applied"] is False  # what it would do is not what is published

                r = await http.post("/admin/controller/resume", headers=ADMIN)
                assert r.json()["paused"] is False
                actions = [e["action"] for e in (await http.get("/admin/audit", headers=ADMIN)).json()["data"]]
                assert actions[:3] == ["resume", "override", "pause"]

                hist = (await http.get("/admin/decisions?limit=5", headers=ADMIN)).json()["data"]
                assert 1 <= len(hist) <= 5 and all("reason" in h and "numbers" in h for h in hist)
                assert all(_recent_iso(h["at"]) for h in hist)
                status = (await http.get("/admin/controller", headers=ADMIN)).json()
                assert _recent_iso(status["status"]["at"])
                r = await http.get("/admin/decisions?limit=100000", headers=ADMIN)
                assert r.status_code == 400

                plan = (await http.get("/admin/fleet-plan", headers=ADMIN)).json()
                assert plan["actuator"] == "recommend" and set(plan["replicas"]) == {"sim-0", "sim-1"}

            text = ctrl.metrics.render().decode()
            for name in ("specgate_controller_replica_rho", "specgate_controller_policy_enabled",
                         "specgate_controller_decisions_total", "specgate_controller_fleet_plan"):
                assert name in text, name


async def test_unknown_tenants_are_404_and_nothing_is_written(stack_factory):
    async with stack_factory(["dspark-b8"]) as st:
        async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
            for method, path, body in (
                ("PUT", "/admin/tenants/alpah/override", {"mode": "off"}),
                ("DELETE", "/admin/tenants/alpah/override", None),
                ("GET", "/admin/tenants/alpah", None),
                ("GET", "/admin/decisions?tenant=alpah", None),
            ):
                r = await http.request(method, path, json=body, headers=ADMIN)
                assert r.status_code == 404, (method, path, r.text)
                err = r.json()["error"]
                assert err["type"] == "not_found_error" and "alpah" in err["message"], err
            assert (await http.get("/admin/audit", headers=ADMIN)).json()["data"] == []
            assert (await load_policies(st.store)).version == 0
            # The configured tenants and `*` (the default policy) are addressable.
            for tenant in ("alpha", "*"):
                r = await http.put(f"/admin/tenants/{tenant}/override", json={"mode": "auto", "max_draft_max": 4}, headers=ADMIN)
                assert r.status_code == 200, r.text
                assert _recent_iso(r.json()["override"]["at"]) and _recent_iso(r.json()["audit"]["at"])


async def test_history_is_changes_only_with_one_reason_and_no_sentinels(stack_factory, redis_url, redis_prefix):
    """Drive the controller through first decisions and load, then read the
    admin API as an operator would: every history entry is a change of the
    published policy (with what changed), each tenant's policy reason is its
    latest decision's reason when that decision is in force, and no internal
    sentinel (1 << 20 for "no draft cap") leaks into any document."""
    async with stack_factory(["dspark-b8", "off"]) as st:
        async with running_controller(st.settings, redis_url, redis_prefix) as (ctrl, ticks):
            clients = {t: AsyncOpenAI(base_url=st.gateway_url + "/v1", api_key=k, max_retries=0, timeout=60)
                       for t, k in TENANT_KEYS.items()}
            for _ in range(2):
                await asyncio.gather(*(c.chat.completions.create(
                    model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": f"[workload={w}] hi"}], max_tokens=24)
                    for c, w in zip(clients.values(), ("code", "chat", "batch"))))
            await wait_for(lambda: len(ticks) >= 6, 15, what="controller ticks")
            async with httpx.AsyncClient(base_url=st.gateway_url, timeout=10) as http:
                tenants = (await http.get("/admin/tenants", headers=ADMIN)).json()["data"]
                hist = (await http.get("/admin/decisions?limit=500", headers=ADMIN)).json()["data"]
                texts = [json.dumps(tenants), json.dumps(hist)]
        assert hist, "first decisions publish, so the history has entries"
        seen: dict[str, dict] = {}
        for h in reversed(hist):  # oldest first
            assert h["changes"], h
            prev = seen.get(h["tenant"])
            if prev is not None:
                assert any(prev[f] != h["policy"][f] for f in h["changes"]), (prev, h)
                assert all(v[0] == prev[f] for f, v in h["changes"].items()), (prev, h)
            seen[h["tenant"]] = h["policy"]
        by_id = {t["tenant"]: t for t in tenants}
        assert {"alpha", "beta", "bulk"} <= set(by_id)
        for t in by_id.values():
            last = t["last_decision"]
            if last and last["applied"]:
                assert t["policy"]["reason"] == last["reason"], t
            if last:
                assert _recent_iso(last["at"])
                assert all(not k.isdigit() or int(k) < 1 << 20 for k in last["numbers"].get("smoothed_improvement", {}))
        for text in texts:
            assert str(1 << 20) not in text


def _recent_iso(value) -> bool:
    """An ISO-8601 UTC time (with the Z) within the last ten minutes."""
    assert isinstance(value, str) and value.endswith("Z"), value
    at = datetime.fromisoformat(value)
    return at.tzinfo is not None and abs((datetime.now(timezone.utc) - at).total_seconds()) < 600


async def _enabled(coro) -> bool:
    p = await coro
    return bool(p and p.enabled)


async def _capped(coro, cap: int) -> bool:
    p = await coro
    return bool(p and p.enabled and p.max_draft is not None and p.max_draft <= cap)


_ = asyncio
