"""Builders shared by the decision's stage tests (real H200 + Qwen3-8B roofline)."""

from __future__ import annotations

from controller.costs import RooflineCost
from controller.decision import (
    DecisionConfig,
    FleetContext,
    GoodputModel,
    Optimizer,
    ReplicaInput,
    TenantView,
    fleet_context,
)

CODE, CHAT, POOR = 0.88, 0.55, 0.15  # conditional acceptance per position


def replica(batch, mix, profile="dspark-b16", block=16, adaptive=False, knobs=True, name="r1", **kw) -> ReplicaInput:
    return ReplicaInput(name, profile, block, adaptive, knobs, RooflineCost.for_names("h200", "qwen3-8b"), batch=batch,
                        context_tokens=1024, mix=mix, **kw)


def fleet(batch, mix, profile="dspark-b16", block=16, adaptive=False) -> list[ReplicaInput]:
    """A speculative replica plus an `off` pool."""
    return [replica(batch, mix, profile=profile, block=block, adaptive=adaptive),
            replica(batch, mix, profile="off", block=0, name="plain")]


def tenants(**acc) -> list[TenantView]:
    return [TenantView(t, a, 10_000) for t, a in acc.items()]


def context(reps, ts, state=None, cfg=None) -> FleetContext:
    return fleet_context(reps, ts, state or {}, cfg or DecisionConfig())


def optimizer(reps, ts, overrides=None, state=None, cfg=None) -> Optimizer:
    cfg = cfg or DecisionConfig()
    ctx = context(reps, ts, state, cfg)
    return Optimizer(ctx, ctx.goodput_model(), overrides or {}, cfg)


def model(acc=None, fleet_a=0.7, **kw) -> GoodputModel:
    return GoodputModel(acc or {"code": CODE, "chat": CHAT}, fleet_a, **kw)
