"""Admin REST API under `/admin`: the controller's user interface.

The controller owns policies and overrides: this router reads what the
controller keeps in the store (last decision per tenant, bounded change
history, replica regimes, fleet plan) and writes overrides and the pause
flag, each audited (who/when/what) in a capped log. An override that pins a
tenant is applied to the published policy at once (through
`contract.overrides.apply_override`, the rule the decision uses too), so it
takes effect within one policy-propagation interval even if no controller
is running; the controller then keeps honouring it on every tick.

Every route requires `Authorization: Bearer <admin_key>`: a missing or wrong
key is 401, a *tenant's* API key is 403 (authenticated, not allowed), and
with no admin key configured the API is closed (401). Errors are
OpenAI-shaped (`contract.errors`) by the hosting app's handlers. A tenant the
gateway does not serve (`contract.policy.served_tenants`, plus `*`, the
default policy) is a 404 wherever a route names one: an override for a typo
would otherwise be accepted, audited and tracked by the controller forever.

Tenant drafters (`controller/rollout.py`): `POST /admin/tenants/{t}/canary`
starts a canary of a candidate drafter on a share of the tenant's requests,
`POST .../canary/abort` ends it without a verdict, `GET .../drafter` shows
the drafter in force, the rollout and, while a canary runs, both arms' live
statistics and the rule's current verdict. The controller's tick judges and
publishes; starts, aborts and its verdicts are all in the audit log.
`POST .../drafter/train` asks the controller to train the tenant's drafter
on its next tick (`controller/training.py`); the job shows under `training`.

The store keeps times as epoch seconds (cheap to compare and sort); every
response turns each `at` into ISO-8601 UTC (`2026-12-01T08:30:12.345Z`),
because people and log pipelines read these, not arithmetic.

The router is mounted by whoever hosts it -- the single-node process
(`specgate.node`, beside the gateway's routes) or the standalone controller
(`controller.admin_app`) -- which puts an `AdminHost` on `app.state.admin`:
the few things the API needs from its host, so the router never imports the
gateway.
"""

from __future__ import annotations

import hmac
import time
from datetime import datetime, timezone
from typing import Any, Protocol

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from contract.keys import (
    AUDIT_KEY,
    AUDIT_MAX,
    FLEET_PLAN_KEY,
    HISTORY_KEY,
    HISTORY_MAX,
    LAST_DECISIONS_KEY,
    LEADER_KEY,
    REPLICAS_KEY,
    STATUS_KEY,
)
from contract.overrides import (
    FleetShape,
    TenantOverride,
    apply_override,
    load_overrides,
    set_override,
)
from contract.policy import (
    DEFAULT_TENANT,
    PolicySet,
    SpeculationPolicy,
    load_policies,
    policy_changes,
    publish_policies,
    served_tenants,
)
from contract.settings import Settings
from contract.store import Store
from contract.telemetry import read_all

from . import rollout, training
from .audit import audit, is_paused, set_paused
from .service import history_entry

router = APIRouter(prefix="/admin")


class AdminHost(Protocol):
    """What the admin API needs from the process that serves it."""

    settings: Settings

    @property
    def store(self) -> Store | None: ...

    def is_tenant_key(self, authorization: bytes) -> bool:
        """Whether the header authenticates a tenant (so a 403, not a 401)."""
        ...

    def replicas(self) -> list[dict[str, Any]]:
        """Each replica as the host knows it (name first; health, load, ...)."""
        ...

    async def policies(self) -> PolicySet:
        """The published policy set as the host sees it now."""
        ...

    def policy_for(self, tenant: str, published: PolicySet) -> SpeculationPolicy:
        """The policy the tenant's requests get (config defaults included)."""
        ...

    @property
    def controller(self) -> Any | None:
        """The controller running in this process, if any."""
        ...


def _host(request: Request) -> AdminHost:
    return request.app.state.admin


def require_admin(request: Request) -> str:
    """Returns the audit identity of the caller (X-Admin-User or 'admin', plus client address)."""
    host = _host(request)
    key = host.settings.admin_key
    raw = request.headers.get("authorization", "")
    scheme, _, presented = raw.partition(" ")
    presented = presented.strip()
    if key and scheme.lower() == "bearer" and hmac.compare_digest(presented.encode(), key.encode()):
        user = request.headers.get("x-admin-user", "admin")[:64]
        client = request.client.host if request.client else "?"
        return f"{user}@{client}"
    if scheme.lower() == "bearer" and presented and host.is_tenant_key(raw.encode("latin-1", "replace")):
        raise HTTPException(status_code=403, detail="tenant API keys cannot use the admin API")
    raise HTTPException(status_code=401, detail="admin key required: send 'Authorization: Bearer <admin_key>'")


def _store(request: Request) -> Store:
    store = _host(request).store
    if store is None:
        raise HTTPException(status_code=503, detail="store not started")
    return store


def iso_utc(ts: float) -> str:
    """Epoch seconds as ISO-8601 UTC with milliseconds and a `Z`."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _times(obj: Any) -> Any:
    """`obj` with every numeric `at` (at any depth) as ISO-8601 UTC: the one
    place the admin API turns the store's epoch seconds into times people read."""
    if isinstance(obj, dict):
        return {k: iso_utc(v) if k == "at" and isinstance(v, (int, float)) and not isinstance(v, bool) else _times(v)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_times(v) for v in obj]
    return obj


def _unknown_tenant(tenant: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"unknown tenant {tenant!r}: not a configured tenant (GET /admin/tenants lists them)")


def _addressable(request: Request) -> set[str]:
    """Tenants an admin may name: those the gateway serves, and `*` (the default policy)."""
    return {*served_tenants(_host(request).settings), DEFAULT_TENANT}


async def _known_tenants(request: Request) -> dict[str, dict[str, Any]]:
    host = _host(request)
    store = _store(request)
    last = await store.get_json(LAST_DECISIONS_KEY) or {}
    overrides = await load_overrides(store)
    published = await host.policies()
    tenants: dict[str, dict[str, Any]] = {}
    configured = {t.id: t for t in host.settings.tenants}
    for tenant in sorted(set(configured) | set(last) | set(overrides) | set(published.policies)):
        decision = last.get(tenant) or {}
        numbers = decision.get("numbers") or {}
        cfg = configured.get(tenant)
        policy = host.policy_for(tenant, published).model_dump(mode="json")
        # One reason per decision: when the latest decision is what is in
        # force (same behaviour, same source), it explains the policy and its
        # reason *is* the policy's reason. When it is not (paused, or an admin
        # pin published after it), the policy keeps the reason it was
        # published with and `applied` says the latest decision is not it.
        applied = bool(decision) and decision.get("applied", True) and _same_policy(decision.get("policy"), policy)
        if applied:
            policy["reason"] = decision.get("reason") or policy["reason"]
        tenants[tenant] = {
            "tenant": tenant,
            "configured": tenant in configured,
            "policy": policy,
            "override": overrides[tenant].model_dump(mode="json") if tenant in overrides else {"mode": "auto"},
            "measured_acceptance": numbers.get("acceptance"),
            "evidence_steps": numbers.get("evidence_steps"),
            "tpot_target_ms": cfg.tpot_target_ms if cfg else None,
            "last_decision": {
                "at": decision.get("at"),
                "applied": applied,
                "reason": decision.get("reason"),
                "numbers": numbers,
            }
            if decision
            else None,
        }
    return tenants


def _same_policy(a: dict | None, b: dict) -> bool:
    """Whether two policy documents act the same and were set by the same kind
    of author (the history's notion of a change, `policy_changes`)."""
    if a is None:
        return False
    try:
        return not policy_changes(SpeculationPolicy.model_validate(a), SpeculationPolicy.model_validate(b))
    except ValidationError:
        return False


@router.get("/health")
async def admin_health(request: Request, who: str = Depends(require_admin)) -> dict:
    host = _host(request)
    return {"status": "ok", "replicas": host.replicas(), "policy_version": (await host.policies()).version}


@router.get("/tenants")
async def list_tenants(request: Request, who: str = Depends(require_admin)) -> dict:
    tenants = await _known_tenants(request)
    return _times({"object": "list", "data": list(tenants.values())})


@router.get("/tenants/{tenant}")
async def get_tenant(tenant: str, request: Request, who: str = Depends(require_admin)) -> dict:
    tenants = await _known_tenants(request)
    if tenant not in tenants:
        raise _unknown_tenant(tenant)
    return _times(tenants[tenant])


@router.put("/tenants/{tenant}/override")
async def put_override(
    tenant: str, request: Request, body: dict = Body(...), who: str = Depends(require_admin)
) -> dict:
    store = _store(request)
    if tenant not in _addressable(request):
        raise _unknown_tenant(tenant)
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
    live = [r.get("profile") for r in _host(request).replicas() if r.get("healthy") is not False]
    before = published.for_tenant(tenant)
    # The pin keeps the tenant's drafter, canary and capture opt-in; before the
    # controller has published anything for it, those are the config's.
    effective = _host(request).policy_for(tenant, published)
    base = before.model_copy(update={f: getattr(effective, f) for f in ("drafter", "canary", "capture")})
    pinned = apply_override(base, ov, FleetShape.of_profiles(live))
    if pinned is not None:
        result = await publish_policies(store, {**published.policies, tenant: pinned})
        applied = {"version": result.version, "policy": pinned.model_dump(mode="json")}
        change = history_entry(tenant, before, pinned, pinned.reason, time.time(), version=result.version, by=who)
        if change is not None:  # the decision history lists every published change, the admin's too
            await store.push_capped(HISTORY_KEY, change, HISTORY_MAX)
    entry = await audit(store, who, "override", tenant, {"override": ov.model_dump(mode="json"), "applied": applied})
    return _times({"tenant": tenant, "override": ov.model_dump(mode="json"), "applied": applied, "audit": entry})


@router.delete("/tenants/{tenant}/override")
async def delete_override(tenant: str, request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    if tenant not in _addressable(request) and tenant not in await load_overrides(store):
        raise _unknown_tenant(tenant)  # (a stale override of a tenant since removed can still be deleted)
    await set_override(store, tenant, TenantOverride(mode="auto"))
    entry = await audit(store, who, "override", tenant, {"override": {"mode": "auto"}})
    return _times({"tenant": tenant, "override": {"mode": "auto"}, "audit": entry})


@router.get("/replicas")
async def list_replicas(request: Request, who: str = Depends(require_admin)) -> dict:
    regimes = await _store(request).get_json(REPLICAS_KEY) or {}
    data = [{**desc, "regime": regimes.get(desc["name"])} for desc in _host(request).replicas()]
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
    """Published policy changes, newest first: each entry is one tenant's
    policy changing (`changes`: field -> [before, after]), by the controller
    or by an admin pin; decisions that held are not listed."""
    if tenant is not None and tenant not in _addressable(request) and tenant not in await _known_tenants(request):
        raise _unknown_tenant(tenant)
    history = await _store(request).recent(HISTORY_KEY, HISTORY_MAX if tenant else limit)
    if tenant:
        history = [h for h in history if h.get("tenant") == tenant][:limit]
    return _times({"object": "list", "data": history})


@router.get("/audit")
async def audit_log(request: Request, limit: int = Query(100, ge=1, le=AUDIT_MAX), who: str = Depends(require_admin)) -> dict:
    return _times({"object": "list", "data": await _store(request).recent(AUDIT_KEY, limit)})


@router.get("/controller")
async def controller_status(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    return _times({
        "leader": await store.lock_owner(LEADER_KEY),
        "paused": await is_paused(store),
        "status": await store.get_json(STATUS_KEY),
        "fleet_plan": await store.get_json(FLEET_PLAN_KEY),
        "policy_version": (await _host(request).policies()).version,
    })


@router.get("/fleet-plan")
async def get_fleet_plan(request: Request, who: str = Depends(require_admin)) -> dict:
    return _times(await _store(request).get_json(FLEET_PLAN_KEY) or {"actuator": None, "replicas": {}})


@router.post("/controller/pause")
async def pause(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    await set_paused(store, True, who)
    entry = await audit(store, who, "pause", None, {})
    return _times({"paused": True, "audit": entry})


@router.post("/controller/resume")
async def resume(request: Request, who: str = Depends(require_admin)) -> dict:
    store = _store(request)
    await set_paused(store, False, who)
    entry = await audit(store, who, "resume", None, {})
    return _times({"paused": False, "audit": entry})


@router.get("/controller/metrics")
async def embedded_metrics(request: Request, who: str = Depends(require_admin)):
    """The in-process controller's own metrics (a standalone one also serves --metrics-port)."""
    controller = _host(request).controller
    if controller is None:
        raise HTTPException(status_code=404, detail="no controller runs in this process")
    return Response(controller.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


# -- tenant drafters: canary, abort, state (controller/rollout.py) ----------------
def _served_tenant(request: Request, tenant: str) -> None:
    if tenant not in served_tenants(_host(request).settings):
        raise _unknown_tenant(tenant)


def _rollout_json(r: rollout.Rollout | None) -> dict | None:
    """A rollout as the API shows it: the per-replica baseline counters are bookkeeping."""
    return r.model_dump(mode="json", exclude={"baseline"}) if r is not None else None


@router.post("/tenants/{tenant}/canary")
async def start_canary(
    tenant: str, request: Request, body: dict = Body(...), who: str = Depends(require_admin)
) -> dict:
    """Start a canary of drafter `drafter` for the tenant on `share` of its
    requests (default `controller.rollout.share`). The controller publishes it
    on its next tick and judges it every tick after (controller/decision/rollout.py)."""
    store = _store(request)
    _served_tenant(request, tenant)
    settings = _host(request).settings
    cfg = settings.controller.rollout
    drafter = body.get("drafter")
    if not isinstance(drafter, str) or not drafter.strip():
        raise HTTPException(status_code=400, detail="drafter: a drafter id (replicas[].drafter) is required")
    share = body.get("share")
    share = cfg.share if share is None else share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
        raise HTTPException(status_code=400, detail="share: must be a number strictly between 0 and 1")
    unknown = set(body) - {"drafter", "share", "note"}
    if unknown:
        raise HTTPException(status_code=400, detail=f"{sorted(unknown)[0]}: unknown field (drafter, share, note)")
    if not cfg.enabled:
        raise HTTPException(status_code=400, detail="canaries are off: controller.rollout.enabled is false")
    docs = await rollout.load(store)
    try:
        doc = rollout.start(
            docs.get(tenant, rollout.TenantDrafters()), drafter.strip(), float(share), now=time.time(), by=who,
            replicas=settings.replicas, baseline=rollout.baseline_of(await read_all(store), tenant),
        )
    except rollout.RolloutRefused as exc:
        raise HTTPException(status_code=exc.status, detail=str(exc)) from None
    await rollout.save_one(store, tenant, doc)
    detail = {"drafter": doc.rollout.drafter, "share": doc.rollout.share, "note": str(body.get("note") or "")[:500]}
    entry = await audit(store, who, "canary_start", tenant, detail)
    return _times({"tenant": tenant, "rollout": _rollout_json(doc.rollout), "audit": entry})


@router.post("/tenants/{tenant}/canary/abort")
async def abort_canary(
    tenant: str, request: Request, body: dict | None = Body(None), who: str = Depends(require_admin)
) -> dict:
    """End the tenant's running canary without a verdict (409 when none runs);
    its drafter may be tried again later. The next tick clears it from the policy."""
    store = _store(request)
    _served_tenant(request, tenant)
    note = str((body or {}).get("note") or "")[:500] if isinstance(body, dict) else ""
    docs = await rollout.load(store)
    try:
        doc = rollout.abort(docs.get(tenant, rollout.TenantDrafters()), now=time.time(), by=who, note=note)
    except rollout.RolloutRefused as exc:
        raise HTTPException(status_code=exc.status, detail=str(exc)) from None
    await rollout.save_one(store, tenant, doc)
    entry = await audit(store, who, "canary_abort", tenant, {"drafter": doc.rollout.drafter, "note": note})
    return _times({"tenant": tenant, "rollout": _rollout_json(doc.rollout), "audit": entry})


@router.post("/tenants/{tenant}/drafter/train")
async def request_training(
    tenant: str, request: Request, body: dict | None = Body(None), who: str = Depends(require_admin)
) -> dict:
    """Ask the controller to train the tenant's drafter from its captured
    samples on its next tick (controller/training.py), regardless of how many
    new samples there are; 409 when training is off or a job of the tenant runs,
    400 when the tenant has not opted in to capture."""
    store = _store(request)
    _served_tenant(request, tenant)
    settings = _host(request).settings
    if not settings.controller.training.enabled:
        raise HTTPException(status_code=409, detail="drafter training is off: controller.training.enabled is false")
    tenant_cfg = next((t for t in settings.tenants if t.id == tenant), None)
    if tenant_cfg is None or tenant_cfg.speculation is None or tenant_cfg.speculation.capture is None:
        raise HTTPException(status_code=400, detail=f"tenant {tenant!r} has not opted in to capture (speculation.capture): no samples to train on")
    note = str((body or {}).get("note") or "")[:500] if isinstance(body, dict) else ""
    doc = (await training.load(store)).get(tenant, training.TenantTraining())
    if doc.job is not None and doc.job.running:
        raise HTTPException(status_code=409, detail=f"training job {doc.job.id} of {tenant!r} is running")
    doc = training.request(doc, who, time.time())
    await training.save_one(store, tenant, doc)
    entry = await audit(store, who, "training_request", tenant, {"note": note})
    return _times({"tenant": tenant, "requested_by": who, "audit": entry})


@router.get("/tenants/{tenant}/drafter")
async def tenant_drafter(tenant: str, request: Request, who: str = Depends(require_admin)) -> dict:
    """The tenant's drafter story: the drafter in force, rolled-back ids, the
    latest rollout and, while a canary runs, both arms' live statistics and
    the rule's current verdict (what the next tick would decide)."""
    store = _store(request)
    _served_tenant(request, tenant)
    host = _host(request)
    doc = (await rollout.load(store)).get(tenant, rollout.TenantDrafters())
    arms = verdict = None
    r = doc.rollout
    if r is not None and r.running:
        counters = await read_all(store)
        candidate, incumbent = rollout.arms(r, tenant, counters, host.settings.replicas)
        arms = {"candidate": {"replicas": rollout.serving(host.settings.replicas, r.drafter), **candidate.to_json()},
                "incumbent": incumbent.to_json()}
        v = rollout.verdict_for(doc, tenant, counters, host.settings.replicas, host.settings.controller.rollout, time.time())
        verdict = {"verdict": v.verdict, "reason": v.reason, "numbers": v.numbers} if v else None
    policy = host.policy_for(tenant, await host.policies())
    return _times({
        "tenant": tenant,
        "drafter": doc.drafter,
        "state": r.state if r is not None else None,
        "rolled_back": doc.rolled_back,
        "rollout": _rollout_json(r),
        "arms": arms,
        "verdict": verdict,
        "published": {"drafter": policy.drafter, "canary": policy.canary.model_dump(mode="json") if policy.canary else None},
        "past": [_rollout_json(p) for p in doc.past],
        "training": (await training.load(store)).get(tenant, training.TenantTraining()).model_dump(mode="json"),
    })
