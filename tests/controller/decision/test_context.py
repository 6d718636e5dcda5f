"""The fleet context: what every stage reads about this tick."""

from __future__ import annotations

from controller.decision import FULL, DecisionConfig, TenantState, TenantView

from .common import CHAT, CODE, context, fleet, replica


def test_default_tenant_gets_the_evidence_weighted_acceptance():
    ctx = context(fleet(4, {"a": 1.0}), [TenantView("a", CODE, 300), TenantView("b", CHAT, 100)])
    assert ctx.fleet_a == (CODE * 300 + CHAT * 100) / 400
    assert ctx.acc["*"] == ctx.fleet_a and set(ctx.tenants) == {"a", "b", "*"}
    assert context(fleet(4, {}), [TenantView("a", CODE, 0)]).fleet_a == 0.7  # no evidence


def test_caps_stop_below_the_largest_block_then_full():
    reps = [replica(4, {}, profile="dspark-b8", block=8), replica(4, {}, profile="off", block=0, name="p")]
    ctx = context(reps, [], cfg=DecisionConfig(draft_caps=(2, 4, 8, 16)))
    assert ctx.caps == [2, 4, FULL] and ctx.max_block == 8 and ctx.off_pool
    assert context([replica(4, {}, profile="off", block=0)], []).caps == []


def test_unhealthy_replicas_are_left_out_and_state_seeds_the_current_choice():
    reps = [replica(4, {"a": 1.0}), replica(4, {"a": 1.0}, name="down", healthy=False)]
    ctx = context(reps, [TenantView("a", CODE, 1)], state={"a": TenantState(k=4, theta=0.2)})
    assert [r.name for r in ctx.live] == ["r1"]
    assert ctx.current == {"a": 4, "*": FULL} and ctx.thetas == {"a": 0.2, "*": None}
    assert set(ctx.knee) == {"r1"} and ctx.knee["r1"] > 0


def test_homes_are_where_traffic_went_plus_speculative_replicas():
    reps = [replica(4, {"a": 1.0}, profile="off", block=0, name="plain-a"), replica(4, {"b": 1.0}, profile="off", block=0, name="plain-b"),
            replica(4, {}, name="spec")]
    ctx = context(reps, [TenantView("a", CODE, 1), TenantView("c", CODE, 1, shares={"plain-b": 1.0})])
    assert [r.name for r in ctx.homes["a"]] == ["plain-a", "spec"]
    assert [r.name for r in ctx.homes["c"]] == ["plain-b", "spec"]
    only_off = context(reps[:2], [TenantView("z", CODE, 1)])
    assert [r.name for r in only_off.homes["z"]] == ["plain-a", "plain-b"]  # nowhere yet: the whole fleet
