"""Tenants placed apart (decision/apart.py): where the model prices it, its
load accounting, its hysteresis, and what `decide()` publishes."""

from __future__ import annotations

import pytest

from contract.policy import SpeculationPolicy
from controller.decision import DecisionConfig, Placement, TenantState, apart, decide
from controller.decision.goodput import batch_shares

from .common import CODE, POOR, context, replica, tenants

CFG = DecisionConfig(placement=True)  # off by default (docs/controller.md, Tenants placed apart)
APART = (("code", ("r0",)), ("poor", ("r1",)))


def pair(batch=16.0, mix=None, healthy=(True, True), **kw):
    """Two knob-capable dspark-b16 replicas sharing the tenants' traffic."""
    mix = mix if mix is not None else {"code": 0.5, "poor": 0.5}
    return [replica(batch, dict(mix), name=n, healthy=h, **kw) for n, h in zip(("r0", "r1"), healthy)]


def prices(reps, ts, cfg=CFG):
    ctx = context(reps, ts, cfg=cfg)
    names, placed, loads = apart.placeable(ctx, cfg)
    return apart.prices(ctx, {}, cfg, apart.candidates(names, placed, loads.held()), names, loads)


def run(reps, ts, ticks, prev=None, start=0.0, cfg=CFG):
    """`ticks` one-second ticks of the stage; the placements they leave."""
    placement, out = prev or Placement(), []
    for i in range(ticks):
        placement = apart.step(placement, context(reps, ts, cfg=cfg), {}, cfg, start + i)
        out.append(placement)
    return out


def test_a_drafting_tenant_and_a_sampling_one_are_priced_higher_apart():
    got = prices(pair(), tenants(code=CODE, poor=POOR))
    assert set(got) == {(), APART}
    # Together every step verifies code's 16-token drafts and pays the drafter's pass for
    # poor's requests too; apart, poor's steps are the plain decode steps.
    assert got[APART] > 1.1 * got[()]


def test_tenants_with_one_acceptance_gain_nothing_apart():
    got = prices(pair(mix={"code": 0.5, "code2": 0.5}), tenants(code=CODE, code2=CODE))
    (split,) = [g for g in got if g]
    assert got[split] == pytest.approx(got[()], rel=1e-6)


def test_a_placement_keeps_every_tenants_requests():
    reps = pair(batch=12.0, mix={"code": 0.7, "poor": 0.3}, waiting=2.0)
    ctx = context(reps, tenants(code=CODE, poor=POOR))
    model = ctx.goodput_model()

    def requests(live):
        held = {"code": 0.0, "poor": 0.0}
        for r in live:
            total = sum(r.mix.values())
            shares = batch_shares({t: m / total for t, m in r.mix.items()}, model.evaluate(r, ctx.current).taus)
            for t in r.mix:
                held[t] += (r.batch + r.waiting) * shares[t]
        return held

    before = requests(ctx.live)
    loads = apart.tenant_loads(ctx, model)
    for groups in ((), APART):
        after = requests(apart.placed_fleet(ctx.live, loads, groups, ["r0", "r1"]))
        assert after == pytest.approx(before)
    placed = {r.name: r for r in apart.placed_fleet(ctx.live, loads, APART, ["r0", "r1"])}
    assert set(placed["r0"].mix) == {"code"} and set(placed["r1"].mix) == {"poor"}
    # code emits more tokens per step, so it holds fewer of the slots: its replica runs the smaller batch.
    assert placed["r0"].batch < placed["r1"].batch


def test_the_replicas_are_split_in_proportion_to_the_groups_load():
    names = ["r0", "r1", "r2", "r3"]
    groups = dict(apart.split_groups(names, ["b"], ["a", "c"], {"a": 1.0, "b": 3.0, "c": 0.0}))
    assert groups == {"a": ("r0",), "c": ("r0",), "b": ("r1", "r2", "r3")}
    # At least one replica each, however unequal.
    assert dict(apart.split_groups(names, ["a"], ["b"], {"a": 0.01, "b": 10.0}))["a"] == ("r0",)
    assert len(apart.candidates(names, ["a", "b", "c"], {"a": 1.0, "b": 1.0, "c": 1.0})) == 1 + 3


def test_groups_get_replicas_by_the_requests_they_hold_not_their_token_mass():
    """Half the tokens each, but code emits several a step, so poor holds most
    of the requests: apart, it gets three of four replicas (sized by token
    mass, two each, code's replicas would run a sixth of poor's batch)."""
    reps = [replica(16.0, {"code": 0.5, "poor": 0.5}, name=f"r{i}") for i in range(4)]
    ctx = context(reps, tenants(code=CODE, poor=POOR), cfg=CFG)
    names, placed, loads = apart.placeable(ctx, CFG)
    held = loads.held()
    assert held["poor"] > 2 * held["code"]
    (split,) = [g for g in apart.candidates(names, placed, held) if g]
    assert dict(split) == {"code": ("r0",), "poor": ("r1", "r2", "r3")}
    by_mass = apart.split_groups(names, ["code"], ["poor"], loads.tokens)
    assert dict(by_mass) == {"code": ("r0", "r1"), "poor": ("r2", "r3")}

    def spread(groups):
        batches = [r.batch for r in apart.placed_fleet(ctx.live, loads, groups, names)]
        return max(batches) / min(batches)

    assert spread(split) < 2.5 < 5.0 < spread(by_mass)  # 8.8 and 18.4 a replica, against 4.4 and 27.6


def test_placed_apart_after_confirmation_and_a_tie_keeps_it():
    ts = tenants(code=CODE, poor=POOR)
    ticks = run(pair(), ts, CFG.confirm_ticks)
    assert all(p.groups == () for p in ticks[:-1])
    assert ticks[0].pending == APART and ticks[-2].pending_count == CFG.confirm_ticks - 1
    assert ticks[-1].groups == APART and ticks[-1].since == CFG.confirm_ticks - 1 and ticks[-1].gain > 0.1
    # Tenants of one acceptance price the same apart and together: a tie keeps the
    # placement in force (only the margin moves it), long past the dwell too.
    same = tenants(code=CODE, poor=CODE)
    held = run(pair(), same, 5, prev=ticks[-1], start=100.0)
    assert all(p.groups == APART and p.pending is None for p in held)


def test_back_together_when_sharing_beats_the_placement_by_the_margin_past_the_dwell():
    ts = tenants(code=CODE, poor=POOR)
    placed = run(pair(), ts, CFG.confirm_ticks)[-1]
    heavy = pair(batch=64.0)  # compute-bound: the model prices sharing higher
    assert prices(heavy, ts)[()] > (1 + CFG.placement_margin) * prices(heavy, ts)[APART]
    early = run(heavy, ts, CFG.confirm_ticks + 2, prev=placed, start=placed.since + 1)
    assert all(p.groups == APART for p in early)  # inside the dwell, while it is confirmed
    assert early[-1].pending == () and early[-1].pending_count == CFG.confirm_ticks + 2
    late = run(heavy, ts, 1, prev=early[-1], start=placed.since + CFG.placement_dwell_s)[0]
    assert late.groups == () and late.since == placed.since + CFG.placement_dwell_s


def test_a_placement_whose_replicas_are_gone_ends_at_once():
    ts = tenants(code=CODE, poor=POOR)
    placed = run(pair(), ts, CFG.confirm_ticks)[-1]
    three = pair() + [replica(16.0, {"code": 0.5, "poor": 0.5}, name="r2")]
    three[1] = replica(16.0, {"code": 0.5, "poor": 0.5}, name="r1", healthy=False)
    after = run(three, ts, 1, prev=placed, start=placed.since + 1)[0]
    assert after.groups != APART and after.since == placed.since + 1


@pytest.mark.parametrize("why", ["disabled", "off pool", "one replica", "two profiles", "no schedules", "one tenant"])
def test_no_placement_where_it_does_not_apply(why):
    ts, cfg = tenants(code=CODE, poor=POOR), CFG
    reps = pair()
    if why == "disabled":
        cfg = DecisionConfig()  # the default
    elif why == "off pool":
        reps.append(replica(16.0, {"code": 0.5, "poor": 0.5}, profile="off", block=0, name="plain"))
    elif why == "one replica":
        reps = reps[:1]
    elif why == "two profiles":
        reps[1] = replica(16.0, {"code": 0.5, "poor": 0.5}, profile="dspark-b8", block=8, name="r1")
    elif why == "no schedules":
        cfg = DecisionConfig(placement=True, schedule_grid=None)
    else:
        reps = pair(mix={"code": 0.995, "poor": 0.005})  # poor holds under MIN_SHARE of the requests
    assert apart.placeable(context(reps, ts, cfg=cfg), cfg) is None
    assert all(p == Placement() for p in run(reps, ts, CFG.confirm_ticks + 1, cfg=cfg))


def test_decide_publishes_the_placement_and_says_why():
    reps, ts = pair(), tenants(code=CODE, poor=POOR)
    state: dict[str, TenantState] = {}
    placement = None
    for now in range(CFG.confirm_ticks):
        d = decide(reps, ts, state, {}, float(now), CFG, None, placement)
        state, placement = d.state, d.placement
    assert d.placement.groups == APART
    assert d.policies["code"].placement == ("r0",) and d.policies["poor"].placement == ("r1",)
    assert "placed apart on r1" in d.policies["poor"].reason
    assert {r.tenant for r in d.changes} >= {"code", "poor"}  # a placement is part of what requests get
    assert d.policies["*"].placement is None
    # A controller taking over adopts what the published policies carry.
    adopted = Placement.from_policies(d.policies, 7.0)
    assert adopted.groups == APART and adopted.since == 7.0
    assert Placement.from_policies({"a": SpeculationPolicy()}, 7.0) == Placement()
