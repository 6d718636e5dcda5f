"""Fleet plan, downtime loss and per-replica regimes on their own."""

from __future__ import annotations

import pytest

from contract.settings import DrafterSettings
from controller.decision import (
    plan_profiles,
    DecisionConfig,
    TenantState,
    downtime_loss,
    fleet_plan,
    operating_rho,
    replica_regimes,
)

from .common import CHAT, CODE, context, fleet, model, replica, tenants

CFG = DecisionConfig()
# Every replica can load a DSpark checkpoint proposing 16 tokens (controller.decision.drafter).
CFG_B16 = DecisionConfig(drafter=DrafterSettings(method="dspark", speculative_tokens=16))


def test_plan_recommends_a_drafter_for_an_idle_off_fleet_and_off_for_a_saturated_one():
    idle = [replica(1, {"code": 1.0}, profile="off", block=0, name=f"p{i}") for i in range(2)]
    profile, gain = fleet_plan(idle, {"code": 0, "*": 0}, model(), CFG_B16)
    assert profile in {p for p, b, _ in plan_profiles(idle, CFG_B16.drafter) if b > 0} and gain > 1.2
    # Without a drafter configured an off fleet has nothing to draft with: no plan.
    assert fleet_plan(idle, {"code": 0, "*": 0}, model(), CFG) == (None, 1.0)
    busy = [replica(256, {"chat": 1.0}, name=f"s{i}") for i in range(2)]
    profile, gain = fleet_plan(busy, {"chat": 16, "*": 16}, model(), CFG)
    assert profile == "off" and gain > 1.0
    assert fleet_plan([], {"*": 0}, model(), CFG) == (None, 1.0)


def test_a_tie_between_a_profile_and_its_adaptive_twin_goes_to_adaptive_verification():
    """The model prices adaptive verification as one verify limit for the batch, which the
    tenants' caps already give, so dspark-b4 and dspark-b4-av price the same; the engine's
    adaptive verification also adapts per step and per request, which the model cannot price."""
    cfg = DecisionConfig(drafter=DrafterSettings(method="dspark", speculative_tokens=16),
                         plan_configured_profiles_only=True)
    idle = [replica(8, {"code": 1.0}, profile="off", block=0, name=f"p{i}") for i in range(2)]
    plain = fleet_plan(idle, {"code": 0, "*": 0}, model(), cfg, frozenset({"off", "dspark-b4"}))
    both = fleet_plan(idle, {"code": 0, "*": 0}, model(), cfg, frozenset({"off", "dspark-b4", "dspark-b4-av"}))
    assert plain[0] == "dspark-b4" and plain[1] > 1.0
    assert both == ("dspark-b4-av", pytest.approx(plain[1], rel=1e-9))
    # A strictly better profile is not given up for a twin's tie: b8 beside b4's pair stays b8's if it wins.
    wider = fleet_plan(idle, {"code": 0, "*": 0}, model(), cfg,
                       frozenset({"off", "dspark-b4", "dspark-b4-av", "dspark-b8"}))
    b8 = fleet_plan(idle, {"code": 0, "*": 0}, model(), cfg, frozenset({"off", "dspark-b8"}))
    assert wider[0] == ("dspark-b8" if b8[1] > plain[1] * (1 + 1e-9) else "dspark-b4-av")


def test_plan_ignores_the_off_pool_routing():
    reps = fleet(8, {"code": 1.0})
    choice = {"code": 16, "*": 16}
    assert fleet_plan(reps, choice, model(off_pool=True), CFG) == fleet_plan(reps, choice, model(), CFG)


def test_downtime_is_cheap_memory_bound_and_dear_compute_bound():
    def loss(batch):
        live = [replica(batch, {"chat": 1.0}, name=f"r{i}") for i in range(3)]
        m = model()
        choice = {"chat": 0, "*": 0}
        occupied = {r.name: m.goodput(r, choice) * min(1.0, r.batch) for r in live}
        return downtime_loss(live, "r0", occupied, choice, m)

    assert loss(2) < 0.2
    assert loss(512) > 0.8
    assert downtime_loss([replica(4, {})], "r1", {"r1": 10.0}, {"*": 0}, model()) == 1.0  # nobody to take over
    assert downtime_loss(fleet(0, {}), "r1", {"r1": 0.0, "plain": 0.0}, {"*": 0}, model()) == 0.0  # idle: nothing lost


def test_operating_rho_prefers_measured_tokens_per_step():
    reps = [replica(8, {"code": 1.0}), replica(8, {"code": 1.0}, name="m", tokens_per_step=40.0)]
    ctx = context(reps, tenants(code=CODE))
    rho = operating_rho(ctx, ctx.goodput_model(), {"code": 16, "*": 16})
    assert rho["m"] == pytest.approx(40.0 / ctx.knee["m"])
    n = ctx.goodput_model().evaluate(reps[0], {"code": 16, "*": 16}).verify_tokens
    assert rho["r1"] == pytest.approx(n / ctx.knee["r1"])


def test_regimes_report_each_live_replica_at_the_decided_caps():
    reps = fleet(256, {"chat": 1.0}) + [replica(4, {}, name="down", healthy=False)]
    ctx = context(reps, tenants(chat=CHAT))
    state = {"chat": TenantState(k=0), "*": TenantState(k=0)}
    regimes = replica_regimes(ctx, ctx.goodput_model(), state, CFG)
    assert set(regimes) == {"r1", "plain"}
    r1 = regimes["r1"]
    assert r1.regime == "compute-bound" and r1.rho >= 1.0 and r1.predicted_goodput_tok_s > 0
    assert 0.0 <= r1.downtime_loss <= 1.0
    assert r1.recommended_profile in {"dspark-b16", "off"}
    assert (r1.recommended_gain == 1.0) == (r1.recommended_profile == r1.profile)


def test_plan_stays_within_the_methods_the_fleet_runs():
    """An ngram fleet has no drafter checkpoint: the plan weighs ngram sizes and off, never DSpark."""
    ngram = [replica(1, {"code": 1.0}, profile="ngram-k4", block=4, name=f"n{i}") for i in range(2)]
    labels = {p for p, _, _ in plan_profiles(ngram)}
    assert labels == {"off", "ngram-k2", "ngram-k4", "ngram-k8"}
    profile, _ = fleet_plan(ngram, {"code": 4, "*": 4}, model(), CFG)
    assert profile in labels
    off = [replica(1, {}, profile="off", block=0)]
    assert {p for p, _, _ in plan_profiles(off)} == {"off"}
    assert {p for p, _, _ in plan_profiles(off, CFG_B16.drafter)} >= {"dspark-b8", "dspark-b8-av", "dspark-b16-av"}


def test_the_fleet_is_priced_at_the_caps_its_policies_give_at_the_batch():
    """Under a schedule the decided cap is the one where drafting pays the tenant
    most; at today's batch its requests get the schedule's length there."""
    from contract.policy import SpeculationPolicy
    from controller.decision import FULL
    from controller.decision.fleet import caps_in_force

    scheduled = SpeculationPolicy(max_draft=8, schedule=((8, 8), (24, 2)))
    state = {
        "greedy": TenantState(k=8, policy=scheduled),
        "plain": TenantState(k=FULL, policy=SpeculationPolicy()),
        "off": TenantState(k=0, policy=SpeculationPolicy(enabled=False, max_draft=0)),
        "new": TenantState(k=4),
    }
    assert caps_in_force(state, 4) == {"greedy": 8, "plain": FULL, "off": 0, "new": 4}
    assert caps_in_force(state, 20.4) == {"greedy": 2, "plain": FULL, "off": 0, "new": 4}
    assert caps_in_force(state, 128)["greedy"] == 0


def test_a_restart_keeps_the_engines_k0_skips():
    from controller.decision.fleet import k0_skips_after_restart

    assert k0_skips_after_restart(replica(4, {}, profile="dspark-b8", block=8), "dspark")
    # The engine runs the stock pass for its current drafter: the same engine would for another.
    assert not k0_skips_after_restart(replica(4, {}, profile="dspark-b8", block=8, k0_skips_pass=False), "dspark")
    assert k0_skips_after_restart(replica(4, {}, profile="off", block=0), "dspark")
    # EAGLE never skips, which says nothing about the engine: restarted into DSpark it would.
    assert k0_skips_after_restart(replica(4, {}, profile="eagle3-k4", block=4, k0_skips_pass=False), "dspark")
    assert not k0_skips_after_restart(replica(4, {}, profile="dspark-b8", block=8), "eagle3")
