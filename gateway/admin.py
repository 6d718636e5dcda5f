"""Admin REST API under `/admin` (included by the gateway app).

Every route requires `Authorization: Bearer <admin_key>`: a missing or wrong
key is 401, a *tenant's* API key is 403 (authenticated, not allowed), and
with no admin key configured the API is closed (401). Errors are
OpenAI-shaped through the gateway's exception handlers.

The API reads what the controller (standalone or embedded) keeps in the
store — last decision per tenant, bounded change history, replica regimes,
fleet plan — and writes overrides and the pause flag, each audited
(who/when/what) in a capped log. An override that pins a tenant on/off is
also applied to the published policy at once, so it takes effect within one
policy-propagation interval even if no controller is running; the
controller then keeps honouring it on every tick.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from pydantic import ValidationError

from controller.overrides import (
    AUDIT_KEY,
    FLEET_PLAN_KEY,
    HISTORY_KEY,
    HISTORY_MAX,
    LAST_DECISIONS_KEY,
    LEADER_KEY,
    REPLICAS_KEY,
    STATUS_KEY,
    TenantOverride,
    audit,
    is_paused,
    load_overrides,
    set_override,
    set_paused,
)

from .speculation_policy import DEFAULT_TENANT, SpeculationPolicy, load_policies, publish_policies

router = APIRouter(prefix="/admin")


def require_admin(request: Request) -> str:
    """Returns the audit identity of the caller (X-Admin-User or 'admin', plus client address)."""
    state = request.app.state.gateway
    key = state.settings.admin_key
    raw = request.headers.get("authorization", "")
    scheme, _, presented = raw.partition(" ")
    presented = presented.strip()
    if key and scheme.lower() == "bearer" and hmac.compare_digest(presented.encode(), key.encode()):
        user = request.headers.get("x-admin-user", "admin")[:64]
        host = request.client.host if request.client else "?"
        return f"{user}@{host}"
    if scheme.lower() == "bearer" and presented:
        auth = state.tenants.authenticate(raw.encode("latin-1", "replace"))
        if auth.tenant is not None:
            raise HTTPException(status_code=403, detail="tenant API keys cannot use the admin API")
    raise HTTPException(status_code=401, detail="admin key required: send 'Authorization: Bearer <admin_key>'")


def _store(request: Request):
    store = request.app.state.gateway.store
    if store is None:
        raise HTTPException(status_code=503, detail="gateway store not started")
    return store


async def _known_tenants(request: Request) -> dict[str, dict[str, Any]]:
    state = request.app.state.gateway
    store = _store(request)
    last = await store.get_json(LAST_DECISIONS_KEY) or {}
    overrides = await load_overrides(store)
    tenants: dict[str, dict[str, Any]] = {}
    configured = {t.id: t for t in state.settings.tenants}
    for tenant in sorted(set(configured) | set(last) | set(overrides) | set(state.policies.policies)):
        decision = last.get(tenant) or {}
        numbers = decision.get("numbers") or {}
        cfg = configured.get(tenant)
        tenants[tenant] = {
            "tenant": tenant,
            "policy": state.policy_view.for_tenant(tenant).model_dump(mode="json"),
            "override": overrides[tenant].model_dump(mode="json") if tenant in overrides else {"mode": "auto"},
            "measured_acceptance": numbers.get("acceptance"),
            "evidence_steps": numbers.get("evidence_steps"),
            "tpot_target_ms": cfg.tpot_target_ms if cfg else None,
            "last_decision": {
                "at": decision.get("at"),
                "reason": decision.get("reason"),
                "numbers": numbers,
            }
            if decision
            else None,
        }
    return tenants


@router.get("/health")
async def admin_health(request: Request, who: str = Depends(require_admin)) -> dict:
    state = request.app.state.gateway
    return {"status": "ok", "replicas": [r.describe() for r in state.registry], "policy_version": state.policies.version}


@router.get("/tenants")
async def list_tenants(request: Request, who: str = Depends(require_admin)) -> dict:
    tenants = await _known_tenants(request)
    return {"object": "list", "data": list(tenants.values())}


@router.get("/tenants/{tenant}")
async def get_tenant(tenant: str, request: Request, who: str = Depends(require_admin)) -> dict:
    tenants = await _known_tenants(request)
    if tenant not in tenants:
        raise HTTPException(status_code=404, detail=f"unknown tenant {tenant!r}")
    return tenants[tenant]


def _pinned_policy(current: SpeculationPolicy, ov: TenantOverride) -> SpeculationPolicy | None:
    """The policy an override implies right now, or None if the controller should decide."""
    if ov.mode == "off":
        return SpeculationPolicy(enabled=False, max_draft=0, reason="admin override: off", source="admin")
    if ov.mode == "on" or not ov.is_noop:
        enabled = True if ov.mode == "on" else current.enabled
        if not enabled:
            return None
        k = current.max_draft if current.enabled and current.max_draft else (ov.max_draft_max or ov.max_draft_min)
        if k is not None:
            if ov.max_draft_min is not None:
                k = max(k, ov.max_draft_min)
            if ov.max_draft_max is not None:
                k = min(k, ov.max_draft_max)
        theta = current.min_confidence if current.enabled else None
        if theta is not None or ov.min_confidence_min is not None:
            theta = theta or 0.0
            if ov.min_confidence_min is not None:
                theta = max(theta, ov.min_confidence_min)
            if ov.min_confidence_max is not None:
                theta = min(theta, ov.min_confidence_max)
        return SpeculationPolicy(
            enabled=True,
            preferred_profile=current.preferred_profile if current.enabled else None,
            max_draft=k,
            min_confidence=theta,
            # Pinned on means on at any load; bounds alone keep the controller's load threshold.
            max_batch=current.max_batch if current.enabled and ov.mode != "on" else None,
            reason=f"admin override: {ov.mode}",
            source="admin",
        )
    return None


@router.put("/tenants/{tenant}/override")
async def put_override(
    tenant: str, request: Request, body: dict = Body(...), who: str = Depends(require_admin)
) -> dict:
    store = _store(request)
    if tenant != DEFAULT_TENANT and not tenant.strip():
        raise HTTPException(status_code=400, detail="tenant must be non-empty")
    try:
        ov = TenantOverride.model_validate({**{k: v for k, v in body.items() if k not in ("by", "at")}})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPException(status_code=400, detail=f"{field}: {first['msg']}") from None
    ov = ov.model_copy(update={"by": who, "at": time.time()})
    await set_override(store, tenant, ov)
    applied = None
    published = await load_policies(store)
    pinned = _pinned_policy(published.for_tenant(tenant), ov)
    if pinned is not None:
        result = await publish_policies(store, {**published.policies, tenant: pinned})
        applied = {"version": result.version, "policy": pinned.model_dump(mode="json")}
    entry = await audit(store, who, "override", tenant, {"override": ov.model_dump(mode="json"), "applied": applied})
    return {"tenant": tenant, "override": ov.model_dump(mode="json"), "applied": applied, "audit": entry}


@router.delete("/tenants/{tenant}/override")
async def delete_override(tenant: str, request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    await set_override(store, tenant, TenantOverride(mode="auto"))
    entry = await audit(store, who, "override", tenant, {"override": {"mode": "auto"}})
    return {"tenant": tenant, "override": {"mode": "auto"}, "audit": entry}


@router.get("/replicas")
async def list_replicas(request: Request, who: str = Depends(require_admin)) -> dict:
    state = request.app.state.gateway
    regimes = await _store(request).get_json(REPLICAS_KEY) or {}
    data = []
    for r in state.registry:
        desc = r.describe() if hasattr(r, "describe") else {"name": r.name}
        data.append({**desc, "regime": regimes.get(r.name)})
    known = {d.get("name") for d in data}
    data.extend({"name": n, "regime": reg} for n, reg in regimes.items() if n not in known)
    return {"object": "list", "data": data}


@router.get("/decisions")
async def decision_history(
    request: Request,
    limit: int = Query(100, ge=1, le=HISTORY_MAX),
    tenant: str | None = None,
    who: str = Depends(require_admin),
) -> dict:
    history = await _store(request).recent(HISTORY_KEY, HISTORY_MAX if tenant else limit)
    if tenant:
        history = [h for h in history if h.get("tenant") == tenant][:limit]
    return {"object": "list", "data": history}


@router.get("/audit")
async def audit_log(request: Request, limit: int = Query(100, ge=1, le=1000), who: str = Depends(require_admin)) -> dict:
    return {"object": "list", "data": await _store(request).recent(AUDIT_KEY, limit)}


@router.get("/controller")
async def controller_status(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    return {
        "leader": await store.lock_owner(LEADER_KEY),
        "paused": await is_paused(store),
        "status": await store.get_json(STATUS_KEY),
        "fleet_plan": await store.get_json(FLEET_PLAN_KEY),
        "policy_version": request.app.state.gateway.policies.version,
    }


@router.get("/fleet-plan")
async def get_fleet_plan(request: Request, who: str = Depends(require_admin)) -> dict:
    return await _store(request).get_json(FLEET_PLAN_KEY) or {"actuator": None, "replicas": {}}


@router.post("/controller/pause")
async def pause(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    await set_paused(store, True, who)
    entry = await audit(store, who, "pause", None, {})
    return {"paused": True, "audit": entry}


@router.post("/controller/resume")
async def resume(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    await set_paused(store, False, who)
    entry = await audit(store, who, "resume", None, {})
    return {"paused": False, "audit": entry}


@router.get("/controller/metrics")
async def embedded_metrics(request: Request, who: str = Depends(require_admin)):
    """The embedded controller's own metrics (standalone ones serve --metrics-port)."""
    from fastapi.responses import Response

    controller = getattr(request.app.state.gateway, "controller", None)
    if controller is None:
        raise HTTPException(status_code=404, detail="no controller embedded in this gateway")
    return Response(controller.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
