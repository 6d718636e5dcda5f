"""The per-tenant state machine on synthetic proposals (no cost model involved)."""

from __future__ import annotations

import math

import pytest

from contract.policy import SpeculationPolicy
from controller.decision import FULL, DecisionConfig, TenantProposal, TenantState
from controller.decision import hysteresis as h

CFG = DecisionConfig(confirm_ticks=3, min_dwell_s=10.0)


def proposal(table, best=None, cur=None, share=1.0, evidence=10_000.0, pinned=None, allowed=None, slo_driven=False):
    best = max(table, key=table.get) if best is None else best
    return TenantProposal(
        tenant="t", best=best, table=table, g_off=table.get(0, 1.0), g_cur=table.get(cur, 0.0) if cur is not None else 0.0,
        share=share, slo_driven=slo_driven, slo_note="", evidence_steps=evidence, allowed=list(allowed or table),
        pinned=pinned,
    )


def held(k, since=0.0, **kw):
    return TenantState(k=k, since=since, policy=SpeculationPolicy(max_draft=k), **kw)


def test_first_decision_keeps_no_cap_unless_a_cap_earns_it():
    v = h.step(TenantState(), proposal({0: 90.0, 4: 101.0, FULL: 100.0}), CFG, now=0.0)
    assert v.chosen == FULL and "would gain only" in v.why and math.isinf(v.improvement)
    v = h.step(TenantState(), proposal({0: 90.0, 4: 120.0, FULL: 100.0}), CFG, now=0.0)
    assert v.chosen == 4 and v.why == "first decision"
    v = h.step(TenantState(), proposal({0: 90.0, 4: 101.0, FULL: 100.0}, pinned="auto"), CFG, now=0.0)
    assert v.chosen == 4  # an override's first decision is the proposal


def test_small_gain_holds_below_the_margin():
    table = {0: 90.0, 4: 102.0, 8: 100.0}
    v = h.step(held(8, smoothed=((0, 0.9), (4, 1.0), (8, 0.98))), proposal(table, cur=8), CFG, now=100.0)
    assert v.chosen == 8 and v.why.startswith("holding") and v.margin == CFG.retune_margin
    assert v.pending_k is None


def test_change_needs_confirmation_then_dwell():
    cfg = DecisionConfig(confirm_ticks=3, min_dwell_s=10.0, strong_margin=10.0)  # nothing counts as strong
    table = {0: 50.0, 4: 130.0, 8: 100.0}
    state = held(8, since=95.0, smoothed=((0, 50 / 130), (4, 1.0), (8, 100 / 130)))
    trace = []
    for now in range(96, 108):
        v = h.step(state, proposal(table, cur=state.k), cfg, now=float(now))
        policy = SpeculationPolicy(max_draft=v.chosen)
        state = h.remember(state, v, policy, None, 0.0, h.policy_changed(state, policy), float(now))
        trace.append((now, v.chosen, v.pending_count, v.why.split(":")[0]))
    assert trace[0] == (96, 8, 1, "pending k=4 (+30.0%)")
    assert trace[3][3].startswith("pending") and "dwell" in h.step(held(8, since=95.0), proposal(table, cur=8), cfg, 99.0).why
    changed_at = next(now for now, k, _, _ in trace if k == 4)
    assert changed_at == 105  # three confirmations long since, dwell 10 s from t=95
    assert state.since == 105.0 and state.pending_k is None


def test_pending_counts_consecutive_ticks_of_the_same_candidate():
    cfg = DecisionConfig(confirm_ticks=3, min_dwell_s=0.0, strong_margin=10.0)
    table = {0: 50.0, 4: 110.0, 8: 100.0}
    state = held(8, smoothed=((0, 50 / 110), (4, 1.0), (8, 100 / 110)))
    counts = []
    for i in range(3):
        v = h.step(state, proposal(table, cur=8), cfg, now=float(i))
        counts.append((v.chosen, v.pending_k, v.pending_count))
        state = TenantState(k=v.chosen, since=state.since, policy=state.policy, pending_k=v.pending_k,
                            pending_count=v.pending_count, smoothed=tuple(sorted(v.ema.items())))
    assert counts == [(8, 4, 1), (8, 4, 2), (4, None, 0)]


def test_strong_turn_off_ignores_dwell_after_strong_ticks():
    table = {0: 200.0, 8: 100.0}
    state = held(8, since=99.0)
    v1 = h.step(state, proposal(table, cur=8), CFG, now=100.0)
    assert v1.chosen == 8 and v1.strong_k == 0 and v1.strong_count == 1
    state = TenantState(k=8, since=99.0, policy=state.policy, strong_k=v1.strong_k, strong_count=v1.strong_count,
                        smoothed=tuple(sorted(v1.ema.items())))
    v2 = h.step(state, proposal(table, cur=8), CFG, now=101.0)
    assert v2.chosen == 0 and "(strong)" in v2.why and v2.strong_count == 0
    assert v2.ema == {0: 1.0, 8: 0.5}  # smoothing restarts at a regime step


def test_override_that_excludes_the_current_cap_forces_the_proposal():
    v = h.step(held(8, since=99.0), proposal({0: 80.0, 4: 100.0}, cur=8, pinned="auto", allowed=[0, 4]), CFG, now=100.0)
    assert v.forced and v.chosen == 4 and v.why == "admin override (auto)"


def test_thin_evidence_widens_the_margin():
    table = {0: 50.0, 4: 104.0, 8: 100.0}
    thick = h.step(held(8), proposal(table, cur=8), CFG, now=100.0)
    thin = h.step(held(8), proposal(table, cur=8, evidence=10.0), CFG, now=100.0)
    assert thin.thin and thin.margin == pytest.approx(thick.margin + CFG.thin_extra_margin)


def _run(state, table, cfg, ticks, start=100.0, **kw):
    """Ticks of the state machine on one proposal; the verdicts."""
    out = []
    for i in range(ticks):
        now = start + i
        v = h.step(state, proposal(table, cur=state.k, **kw), cfg, now=now)
        policy = SpeculationPolicy(max_draft=v.chosen, enabled=v.chosen > 0)
        state = h.remember(state, v, policy, None, 0.0, h.policy_changed(state, policy), now)
        out.append(v)
    return out


def test_a_drafting_tenant_in_a_near_tie_turns_off_through_confirmation():
    # Drafting gains +1 % over off (inside both margins: off would need +3 %, on +5 %).
    table = {0: 100.0, 2: 101.0, 4: 100.5}
    ema = ((0, 100 / 101), (2, 1.0), (4, 100.5 / 101))
    vs = _run(held(2, since=0.0, smoothed=ema), table, CFG, ticks=3)
    assert [v.chosen for v in vs] == [2, 2, 0]
    assert vs[0].why == "pending k=0 (drafting gains +1.0% < the keep margin 2%): confirmation 1/3"
    assert vs[2].why == "k 2->0: drafting gains +1.0% < the keep margin 2% (smoothed, 3 ticks)"
    assert vs[0].margin == -CFG.keep_margin
    # Off, the same prices do not turn it on again (on needs +5 %): a band, not a flip-flop.
    off = TenantState(k=0, since=0.0, policy=SpeculationPolicy(enabled=False, max_draft=0), smoothed=ema)
    assert {v.chosen for v in _run(off, table, CFG, ticks=5)} == {0}
    # The dwell still holds it.
    assert [v.chosen for v in _run(held(2, since=95.0, smoothed=ema), table, CFG, ticks=3)] == [2, 2, 2]


def test_a_drafting_tenant_that_gains_the_keep_margin_keeps_drafting():
    table = {0: 100.0, 2: 103.0, 4: 101.0}
    ema = ((0, 100 / 103), (2, 1.0), (4, 101 / 103))
    vs = _run(held(2, since=0.0, smoothed=ema), table, CFG, ticks=4)
    assert {v.chosen for v in vs} == {2} and vs[-1].why.startswith("holding")
    # Per unit of its traffic share: +1.5 % of the fleet is +3 % of a half share.
    table = {0: 100.0, 2: 101.5}
    vs = _run(held(2, since=0.0, smoothed=((0, 100 / 101.5), (2, 1.0))), table, CFG, ticks=4, share=0.5)
    assert {v.chosen for v in vs} == {2}


def test_the_keep_margin_never_exceeds_the_on_margin_nor_acts_where_others_decide():
    cfg = DecisionConfig(confirm_ticks=1, min_dwell_s=0.0, keep_margin=0.5, on_margin=0.05)
    assert h.keep_margin(cfg) == 0.05
    table, ema = {0: 100.0, 2: 104.0}, ((0, 100 / 104), (2, 1.0))
    assert _run(held(2, smoothed=ema), table, cfg, ticks=1)[0].chosen == 0
    assert _run(held(2, smoothed=((0, 100 / 106), (2, 1.0))), {0: 100.0, 2: 106.0}, cfg, ticks=1)[0].chosen == 2
    near = {0: 100.0, 2: 101.0}
    assert _run(held(2, smoothed=ema), near, cfg, ticks=1, evidence=10.0)[0].chosen == 2  # thin: exploration measures it
    assert _run(held(2, smoothed=ema), near, cfg, ticks=1, slo_driven=True, best=2)[0].chosen == 2  # a TPOT target chose it
    assert _run(held(2, smoothed=ema), near, cfg, ticks=1, pinned="auto")[0].chosen == 2  # an admin's bounds
    assert _run(held(2, smoothed=ema), near, cfg, ticks=1, allowed=[2])[0].chosen == 2  # off not allowed
    assert _run(held(2, smoothed=ema), near, DecisionConfig(confirm_ticks=1, min_dwell_s=0.0, keep_margin=0.0),
                ticks=1)[0].chosen == 2  # keep_margin 0: the old band (off needs +3 %)


def test_floor_smoothing_holds_small_and_early_moves():
    v_same = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    prev = TenantState(k=8, theta=0.3, since=0.0, policy=SpeculationPolicy(), theta_ema=0.3)
    theta, ema = h.smooth_floor(prev, v_same, 0.4, CFG, now=100.0)
    assert ema == pytest.approx(0.2 * 0.4 + 0.8 * 0.3) and theta == 0.3  # moved < theta_min_change
    theta, _ = h.smooth_floor(prev, v_same, 0.9, DecisionConfig(smoothing=1.0), now=100.0)
    assert theta == 0.9
    theta, _ = h.smooth_floor(prev, v_same, 0.9, DecisionConfig(smoothing=1.0), now=1.0)
    assert theta == 0.3  # early: within dwell
    v_new = h.Verdict(8, 4, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.smooth_floor(prev, v_new, 0.42, CFG, now=1.0) == (0.4, 0.42)  # new cap: fresh, on the grid
    assert h.smooth_floor(prev, v_new, 0.0, CFG, now=1.0) == (None, 0.0)


def test_max_batch_within_a_factor_of_two_keeps_the_old_one():
    prev = TenantState(k=8, policy=SpeculationPolicy(max_batch=32))
    same = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    cfg = DecisionConfig()
    assert h.steady_max_batch(prev, same, 48, 4.0, cfg, 0.0) == 32
    assert h.steady_max_batch(prev, same, 96, 4.0, cfg, 0.0) == 96  # past the dwell (since = -inf)
    assert h.steady_max_batch(prev, same, None, 4.0, cfg, 0.0) is None
    moved = h.Verdict(8, 4, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_max_batch(prev, moved, 48, 4.0, cfg, 0.0) == 48


def test_max_batch_above_the_load_waits_for_the_dwell_and_below_it_acts_at_once():
    cfg = DecisionConfig(min_dwell_s=30.0)
    prev = TenantState(k=8, since=100.0, policy=SpeculationPolicy(max_batch=16))
    same = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    # Both 16 and 4 / none lie above a load of 1: within the dwell the old one stays.
    assert h.steady_max_batch(prev, same, 4 * 16, 1.0, cfg, now=110.0) == 16
    assert h.steady_max_batch(prev, same, None, 1.0, cfg, now=110.0) == 16
    assert h.steady_max_batch(prev, same, 4, 1.0, cfg, now=140.0) == 4  # dwell over
    # A threshold below today's load changes what the next step does: at once.
    assert h.steady_max_batch(prev, same, 6, 12.0, cfg, now=110.0) == 6


def test_remember_restarts_dwell_on_change_only():
    prev = TenantState(k=8, since=5.0, policy=SpeculationPolicy(max_draft=8), provisional=True)
    v = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, True, None, 0, None, 0, {4: 0.5, 8: 1.0})
    same = h.remember(prev, v, prev.policy, None, 0.0, False, now=50.0)
    assert same.since == 5.0 and same.provisional and same.smoothed == ((4, 0.5), (8, 1.0)) and same.theta_ema == 0.0
    new_policy = SpeculationPolicy(max_draft=8, min_confidence=0.2)
    assert h.policy_changed(prev, new_policy)
    moved = h.remember(prev, v, new_policy, 0.2, 0.2, True, now=50.0)
    assert moved.since == 50.0 and moved.provisional  # thin evidence: not protected by dwell
    off = h.Verdict(8, 0, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.remember(prev, off, SpeculationPolicy(enabled=False), None, 0.3, True, now=50.0).theta_ema is None


def test_a_changed_schedule_waits_for_its_dwell_unless_drafting_turns_on_or_off():
    cfg = DecisionConfig(schedule_dwell_s=60.0)
    old, new = ((4, 8), (32, 2)), ((8, 8), (32, 2))
    prev = TenantState(k=8, since=100.0, policy=SpeculationPolicy(max_draft=8, schedule=old))
    same = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, same, new, cfg, now=130.0) == old  # inside the dwell: the one in force acts
    assert h.steady_schedule(prev, same, new, cfg, now=160.0) == new
    assert h.steady_schedule(prev, same, None, cfg, now=130.0) is None  # none wanted (an SLO's cap, no grid)
    # Where schedules stand, a tenant held on whose search drafts nowhere keeps the one in force
    # (the load threshold in its place flipped with every near-tie), until it turns off or an admin moves it.
    assert h.steady_schedule(prev, same, None, cfg, now=500.0, stand=True) == old
    turned_off = h.Verdict(8, 0, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, turned_off, None, cfg, now=130.0, stand=True) is None
    retuned = h.Verdict(8, 4, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, retuned, new, cfg, now=130.0) == old  # a retune at today's batch is not news
    forced = h.Verdict(8, 4, "", True, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, forced, new, cfg, now=130.0) == new
    was_off = TenantState(k=0, since=100.0, policy=SpeculationPolicy(enabled=False, max_draft=0))
    on = h.Verdict(0, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(was_off, on, new, cfg, now=101.0) == new


def test_past_its_dwell_a_changed_schedule_must_gain_the_retune_margin_where_it_acts_now():
    cfg = DecisionConfig(schedule_dwell_s=60.0, retune_margin=0.05)
    old, new = ((4, 8), (32, 2)), ((8, 8), (32, 2))
    prev = TenantState(k=8, since=100.0, policy=SpeculationPolicy(max_draft=8, schedule=old))
    same = h.Verdict(8, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.0) == old  # the same steps today
    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.049) == old
    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.05) == new
    assert h.steady_schedule(prev, same, new, cfg, now=130.0, gain=0.1) == old  # the dwell still holds
    assert h.steady_schedule(prev, same, new, cfg, now=130.0, gain=cfg.strong_margin) == new  # unless the gain is strong
    # Turning on or off, and an admin's move, publish at once whatever the gain.
    forced = h.Verdict(8, 4, "", True, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(prev, forced, new, cfg, now=130.0, gain=0.0) == new
    was_off = TenantState(k=0, since=100.0, policy=SpeculationPolicy(enabled=False, max_draft=0))
    on = h.Verdict(0, 8, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    assert h.steady_schedule(was_off, on, new, cfg, now=101.0, gain=0.0) == new


def test_past_its_dwell_a_schedule_that_differs_strongly_elsewhere_is_published():
    """The requests admitted when the load moves keep the schedule they were sent, so a
    difference at another load as large as the strong margin is published once the dwell
    has passed, though the two run alike today; a smaller one (a grid step of noise) is
    not, and the gain elsewhere is not asked inside the dwell or where today's gain decides."""
    cfg = DecisionConfig(schedule_dwell_s=60.0, retune_margin=0.05, strong_margin=0.15)
    old, new = ((16, 4),), ((16, 4), (32, 4))
    prev = TenantState(k=4, since=100.0, policy=SpeculationPolicy(max_draft=4, schedule=old))
    same = h.Verdict(4, 4, "", False, 0.0, {}, 0.0, False, None, 0, None, 0, {})
    asked: list[float] = []

    def elsewhere(value: float):
        def gain() -> float:
            asked.append(value)
            return value
        return gain

    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.0, elsewhere=elsewhere(0.15)) == new
    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.0, elsewhere=elsewhere(0.149)) == old
    assert asked == [0.15, 0.149]
    assert h.steady_schedule(prev, same, new, cfg, now=130.0, gain=0.0, elsewhere=elsewhere(9.0)) == old
    assert h.steady_schedule(prev, same, new, cfg, now=160.0, gain=0.06, elsewhere=elsewhere(0.0)) == new
    assert asked == [0.15, 0.149]
