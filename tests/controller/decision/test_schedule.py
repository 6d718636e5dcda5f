"""The schedule stage: each drafting tenant's batch -> draft-length schedule, from the
goodput model at every batch size on the grid, jointly with the other tenants."""

from __future__ import annotations

from contract.knobs import schedule_cap
from controller.decision import DecisionConfig, Optimizer, fleet_context
from controller.decision.schedule import joint_lengths, monotone, tenant_schedules

from .test_decide import CHAT, CODE, fleet, replica, tenants


def optimizer(reps, views, cfg=DecisionConfig()):
    ctx = fleet_context(reps, views, {}, cfg)
    return Optimizer(ctx, ctx.goodput_model(), {}, cfg)


def test_monotone_never_drafts_longer_at_a_larger_batch():
    assert monotone([(1, 8), (2, 16), (4, 8), (8, 12), (16, 0), (32, 2)]) == ((8, 8),)
    assert monotone([(1, 16), (8, 4), (16, 4), (32, 2)]) == ((1, 16), (16, 4), (32, 2))


def test_drafts_shrink_as_the_batch_grows_and_the_better_tenant_drafts_longer():
    reps = fleet(8, {"code": 0.5, "chat": 0.5})
    opt = optimizer(reps, tenants(code=CODE, chat=CHAT))
    schedules = tenant_schedules(opt, {"code": 16, "chat": 4, "*": 0}, DecisionConfig())
    assert set(schedules) == {"code", "chat"}
    code, chat = schedules["code"], schedules["chat"]
    assert schedule_cap(code, 1) >= schedule_cap(code, 64) and schedule_cap(code, 1) > 0
    assert schedule_cap(code, 512) <= 2 and schedule_cap(chat, 512) <= 2  # deep in the compute-bound regime
    for batch in (1, 2, 4, 8, 16, 32, 64, 128):
        assert schedule_cap(code, batch) >= schedule_cap(chat, batch), batch
    # Joint: each batch's lengths are a coordinate-ascent optimum against the others'.
    joint = joint_lengths(opt, {"code": 16, "chat": 4}, [1, 16, 128])
    assert set(joint) == {1, 16, 128} and all(set(v) == {"code", "chat"} for v in joint.values())


def test_a_tenant_that_is_off_gets_no_schedule_and_is_not_drafted_for():
    reps = fleet(8, {"code": 0.5, "chat": 0.5})
    opt = optimizer(reps, tenants(code=CODE, chat=CHAT))
    schedules = tenant_schedules(opt, {"code": 16, "chat": 0}, DecisionConfig())
    assert set(schedules) == {"code"}
    assert tenant_schedules(opt, {"code": 16}, DecisionConfig(schedule_grid=None)) == {}


def test_only_knob_capable_speculative_replicas_get_schedules():
    plain = [replica(4, {"code": 1.0}, knobs=False), replica(4, {"code": 1.0}, profile="off", block=0, name="off")]
    assert tenant_schedules(optimizer(plain, tenants(code=CODE)), {"code": 16}, DecisionConfig()) == {}
