"""The schedule stage: each drafting tenant's batch -> draft-length schedule, from the
goodput model at every batch size on the grid, jointly with the other tenants."""

from __future__ import annotations

from contract.knobs import schedule_cap
from controller.decision import DecisionConfig, Optimizer, fleet_context
from controller.decision.schedule import (
    context_at,
    joint_lengths,
    monotone,
    schedule_gain,
    schedule_gain_elsewhere,
    scheduled_proposals,
    schedules_stand,
    step_batch_weights,
    tenant_schedules,
)

from .test_decide import CHAT, CODE, POOR, fleet, replica, tenants


def optimizer(reps, views, cfg=DecisionConfig()):
    ctx = fleet_context(reps, views, {}, cfg)
    return Optimizer(ctx, ctx.goodput_model(), {}, cfg)


def test_monotone_never_drafts_longer_at_a_larger_batch():
    assert monotone([(1, 8), (2, 16), (4, 8), (8, 12), (16, 0), (32, 2)]) == ((8, 8),)
    assert monotone([(1, 16), (8, 4), (16, 4), (32, 2)]) == ((1, 16), (16, 4), (32, 2))


def test_monotone_keeps_the_zeros_below_the_first_drafting_batch():
    assert monotone([(1, 0), (2, 0), (4, 8), (8, 16), (16, 0), (32, 4)]) == ((2, 0), (8, 8))
    assert monotone([(1, 0), (4, 0)]) == ((4, 0),)


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


def test_schedules_stand_only_where_every_speculative_replica_applies_them_and_no_off_pool_exists():
    code = tenants(code=CODE)
    two = [replica(4, {"code": 1.0}), replica(4, {"code": 1.0}, name="r2")]
    assert schedules_stand(fleet_context(two, code, {}, DecisionConfig()), DecisionConfig())
    assert not schedules_stand(fleet_context(two, code, {}, DecisionConfig()), DecisionConfig(schedule_grid=None))
    assert not schedules_stand(fleet_context(fleet(4, {"code": 1.0}), code, {}, DecisionConfig()), DecisionConfig())
    mixed = [replica(4, {"code": 1.0}), replica(4, {"code": 1.0}, name="r2", knobs=False)]
    assert not schedules_stand(fleet_context(mixed, code, {}, DecisionConfig()), DecisionConfig())


def test_context_at_runs_every_replica_and_home_at_the_batch():
    reps = [replica(3, {"code": 1.0}, waiting=5), replica(200, {"code": 1.0}, name="r2")]
    ctx = fleet_context(reps, tenants(code=CODE), {}, DecisionConfig())
    at = context_at(ctx, 16)
    assert [(r.batch, r.waiting) for r in at.live] == [(16, 0.0), (16, 0.0)]
    assert [r.batch for r in at.homes["code"]] == [16, 16]
    assert at.knee == fleet_context([r for r in at.live], tenants(code=CODE), {}, DecisionConfig()).knee


def test_a_tenant_is_priced_at_the_same_batch_whatever_todays_load():
    """On/off is priced where drafting pays the tenant, so the tick's load moves
    neither its price nor its proposal."""
    views, cfg = tenants(code=CODE, chat=CHAT), DecisionConfig()
    light, _ = scheduled_proposals(optimizer([replica(2, {"code": 0.5, "chat": 0.5})], views), {}, cfg, ["code", "chat"])
    heavy, _ = scheduled_proposals(optimizer([replica(256, {"code": 0.5, "chat": 0.5})], views), {}, cfg, ["code", "chat"])
    for t in ("code", "chat"):
        assert light[t].best == heavy[t].best > 0
        assert light[t].table == heavy[t].table
        assert light[t].g_off < light[t].table[light[t].best]


def test_a_tenant_that_drafts_nowhere_is_priced_off():
    reps = [replica(8, {"poor": 1.0})]
    proposals, joint = scheduled_proposals(optimizer(reps, tenants(poor=POOR)), {}, DecisionConfig(), ["poor"])
    assert proposals["poor"].best == 0
    assert all(lengths.get("poor", 0) == 0 for lengths in joint.values())


def test_a_weak_tenant_beside_a_strong_one_drafts_shorter_and_nowhere_the_strong_one_does_not():
    """Where the strong tenant drafts, the weak one drafts too, shorter: the pass is
    paid anyway, and left at one token a step its requests would fill the batch
    (`goodput.batch_shares`)."""
    reps = [replica(8, {"code": 0.5, "chat": 0.5})]
    opt = optimizer(reps, tenants(code=CODE, chat=CHAT))
    proposals, joint = scheduled_proposals(opt, {}, DecisionConfig(), ["code", "chat"])
    assert proposals["code"].best > 0 and proposals["chat"].best > 0
    code_batches = [b for b, lengths in joint.items() if lengths["code"] > 0]
    chat_batches = [b for b, lengths in joint.items() if lengths["chat"] > 0]
    assert set(chat_batches) <= set(code_batches)
    assert all(joint[b]["chat"] <= joint[b]["code"] for b in code_batches)
    assert any(joint[b]["chat"] < joint[b]["code"] for b in code_batches)
    # The search is reused for the schedules when the same tenants draft.
    chosen = {"code": proposals["code"].best, "chat": proposals["chat"].best}
    assert tenant_schedules(opt, chosen, DecisionConfig(), joint) == tenant_schedules(opt, chosen, DecisionConfig())


def test_a_schedule_is_priced_where_it_acts_now():
    """`schedule_gain`: two schedules that draft alike at the batches the replicas
    run now gain nothing over each other, however they differ at other loads;
    where they differ now, the fleet's goodput says which pays."""
    views = tenants(code=CODE, chat=CHAT)
    opt = optimizer([replica(4, {"code": 0.5, "chat": 0.5})], views)
    others = {"chat": ((4, 4),)}
    old, far = ((8, 8), (64, 2)), ((8, 8), (512, 2))  # they differ from 64 requests a step on
    assert schedule_gain(opt, "code", old, far, others, load=4.0) == 0.0
    # At 4 requests a step (2..8 on the grid) drafting 8 beats drafting nothing, and its gain is the
    # reverse of the loss of going back, both per unit of code's share of the traffic.
    none = ((1, 0),)
    up, down = schedule_gain(opt, "code", none, old, others, 4.0), schedule_gain(opt, "code", old, none, others, 4.0)
    assert up > 0.05 > 0 > down
    # Compute-bound (512 requests a step): the same lengths lose there.
    deep = optimizer([replica(512, {"code": 0.5, "chat": 0.5})], views)
    assert schedule_gain(deep, "code", ((1, 0),), ((512, 8),), {"chat": 0}, load=512.0) < 0


def test_the_steps_a_replica_runs_lie_around_its_mean_batch():
    """`step_batch_weights`: a Poisson batch around the mean, each grid batch collecting
    the steps from the grid batch below it (exclusive) up to it."""
    grid = list(DecisionConfig().schedule_grid)
    at64 = step_batch_weights(grid, 64.0)
    assert abs(sum(at64.values()) - 1.0) < 1e-9
    assert 0.45 < at64[64] < 0.6 and 0.4 < at64[96] < 0.55 and at64.get(48, 0.0) < 0.05
    assert not {b for b in at64 if b <= 32 or b >= 128}  # 4 standard deviations away
    assert max(step_batch_weights(grid, 1.0), key=step_batch_weights(grid, 1.0).get) == 1
    assert step_batch_weights(grid, 10_000.0) == {512: 1.0}  # above the grid: its last entry


def test_a_schedule_is_priced_by_the_steps_that_run_where_it_differs():
    """Two schedules that differ only at 24 requests a step (17..24 on the grid), at a
    mean of 24: about half the steps run there, so today's gain is that share of the gain
    at 24 -- not a fifth of it, as a plain mean over 12..48 on the grid counted it (a
    gain of +27 % at 24 came out at +5 %, the retune margin)."""
    opt = optimizer([replica(24, {"code": 0.8, "chat": 0.2})], tenants(code=CODE, chat=CHAT))
    old, new = ((16, 4),), ((16, 4), (24, 4))
    at24 = schedule_gain_elsewhere(opt, "code", old, new, {"chat": 0})
    gain = schedule_gain(opt, "code", old, new, {"chat": 0}, load=24.0)
    share = step_batch_weights(list(DecisionConfig().schedule_grid), 24.0)[24]
    assert at24 > 0.2 and abs(gain - share * at24) < 1e-9 and gain > 0.4 * at24


def test_a_schedule_s_gain_elsewhere_is_its_largest_at_any_one_batch():
    """`schedule_gain_elsewhere`: where two schedules run alike today (2 requests a step)
    but one stops drafting at 16 requests and the other drafts 4 tokens up to 32 beside
    chat drafting as much (the pass is paid), the largest gain at one batch is the
    second's at 24..32; the reverse change gains nowhere."""
    views = tenants(code=CODE, chat=CHAT)
    opt = optimizer([replica(2, {"code": 0.5, "chat": 0.5})], views)
    others = {"chat": ((16, 4), (32, 4))}
    stops, goes_on = ((16, 4),), ((16, 4), (32, 4))
    assert schedule_gain(opt, "code", stops, goes_on, others, load=2.0) == 0.0
    elsewhere = schedule_gain_elsewhere(opt, "code", stops, goes_on, others)
    assert elsewhere >= DecisionConfig().strong_margin
    assert schedule_gain_elsewhere(opt, "code", goes_on, stops, others) <= 0.0 < elsewhere
