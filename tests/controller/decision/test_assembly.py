"""Policy assembly: routing, admin overrides through contract.overrides, reason and record."""

from __future__ import annotations

import pytest

from contract.overrides import TenantOverride, apply_override
from contract.policy import CanarySpec, CaptureSpec, SpeculationPolicy
from controller.decision import FULL, Carried, TenantProposal, TenantView, decide
from controller.decision import assembly as a
from controller.decision import hysteresis as h

from .common import CODE, context, fleet, replica, tenants


def verdict(chosen, forced=False, why="holding"):
    return h.Verdict(8, chosen, why, forced, 0.1, {8: 0.0}, 0.05, False, None, 0, None, 0, {})


def prop(table=None, slo_note=""):
    table = table or {0: 100.0, 4: 150.0, 8: 160.0}
    return TenantProposal("code", 8, table, table[0], table[8], 0.5, False, slo_note, 10_000.0, list(table), None)


MIXED = [replica(4, {}, profile="dspark-b4", block=4, name="b4"), replica(4, {}, profile="dspark-b16", block=16, name="b16"),
         replica(4, {}, profile="off", block=0, name="plain")]


def test_policy_routes_to_the_smallest_block_that_fits():
    ctx = context(MIXED, [])
    assert a.speculation_policy(4, None, ctx, 32) == SpeculationPolicy(preferred_profile="dspark-b4", max_draft=4, max_batch=32)
    assert a.speculation_policy(8, 0.2, ctx, None).preferred_profile == "dspark-b16"
    assert a.speculation_policy(FULL, None, ctx, None).max_draft is None  # no cap: the replica's block
    off = a.speculation_policy(0, 0.3, ctx, 32)
    assert off == SpeculationPolicy(enabled=False, preferred_profile="off", max_draft=0)
    lone = context([replica(4, {})], [])
    assert a.speculation_policy(4, None, lone, None).preferred_profile is None  # one profile: nothing to prefer
    assert a.speculation_policy(0, None, lone, None).preferred_profile is None  # no off pool to route to


@pytest.mark.parametrize(
    "ov",
    [None, TenantOverride(), TenantOverride(mode="auto", max_draft_max=8, min_confidence_min=0.1),
     TenantOverride(mode="on", max_draft_min=2, min_confidence_max=0.3)],
)
def test_override_agrees_with_apply_override_inside_the_bounds(ov):
    ctx = context(fleet(4, {}), [])
    policy = a.speculation_policy(4, a.clamp_floor(0.4, ov, 4), ctx, 48)
    out = a.with_override(policy, ov, ctx)
    expected = apply_override(policy, ov) or policy
    assert out.behaviour() == expected.behaviour()


def test_pinned_on_drops_the_load_threshold():
    ctx = context(fleet(4, {}), [])
    out = a.with_override(a.speculation_policy(4, None, ctx, 48), TenantOverride(mode="on"), ctx)
    assert out.enabled and out.max_batch is None and out.max_draft == 4


def test_where_the_decision_keeps_its_fleet_knowledge():
    """The three documented differences from a bare apply_override."""
    ctx = context(fleet(4, {}), [])
    off = a.with_override(a.speculation_policy(0, None, ctx, None), TenantOverride(mode="off"), ctx)
    assert not off.enabled and off.preferred_profile == "off"  # apply_override alone: None
    assert apply_override(off, TenantOverride(mode="off")).preferred_profile is None
    no_spec = context([replica(4, {}, profile="off", block=0)], [])
    stay = a.with_override(a.speculation_policy(0, None, no_spec, None), TenantOverride(mode="on"), no_spec)
    assert not stay.enabled  # apply_override alone: enabled, on a fleet that cannot draft
    big = TenantOverride(mode="on", max_draft_min=20)
    capped = a.with_override(a.speculation_policy(16, None, ctx, None), big, ctx)
    assert capped.max_draft == 16  # apply_override alone: 20, above every block


def test_floor_clamp_goes_through_the_override_and_only_while_drafting():
    ov = TenantOverride(min_confidence_min=0.2, min_confidence_max=0.5)
    assert a.clamp_floor(None, ov, 4) == 0.2
    assert a.clamp_floor(0.7, ov, 4) == 0.5
    assert a.clamp_floor(0.3, None, 4) == 0.3
    assert a.clamp_floor(None, ov, 0) is None


def test_reason_source_and_record():
    ctx = context(fleet(4, {}), [])
    p = prop(slo_note="SLO 5ms: k=8")
    pol = a.tenant_policy(ctx, verdict(8), p, None, None, 32, {"r1": 0.4, "plain": 0.2}, CODE)
    assert pol.source == "controller"
    assert pol.reason == "holding; rho=0.40 (memory-bound); a=0.88; gain_vs_off=1.60; SLO 5ms: k=8"
    bounded = TenantOverride(max_draft_max=8)
    assert a.tenant_policy(ctx, verdict(8), p, bounded, None, 32, {}, CODE).source == "controller"
    assert a.tenant_policy(ctx, verdict(8, forced=True), p, bounded, None, 32, {}, CODE).source == "admin"
    assert a.tenant_policy(ctx, verdict(8), p, TenantOverride(mode="on"), None, 32, {}, CODE).source == "admin"
    rec = a.record(3.0, True, pol, verdict(8), p, TenantView("code", CODE, 10_000), None, 0.0, {"r1": 0.4}, 12.3456)
    assert rec.tenant == "code" and rec.at == 3.0 and rec.reason == pol.reason
    n = rec.numbers
    assert n["k"] == "8" and n["gain_vs_off"] == 1.6 and n["theta_star"] is None and n["max_batch"] == 32
    assert n["goodput_by_k"] == {"0": 100.0, "4": 150.0, "8": 160.0} and n["predicted_tpot_ms"] == 12.346
    assert a.gain_vs_off(verdict(4), prop({0: 0.0, 4: 1.0, 8: 2.0})) == 1.0  # nothing to compare against


def test_record_names_the_uncapped_draft_full_never_its_sentinel():
    """The admin API shows `numbers` as they are: no `1048576` key or value for "no cap"."""
    v = h.Verdict(0, 0, "pending", False, 0.1, {0: 0.0, 4: 0.02, FULL: 0.05}, 0.05, False, FULL, 2, None, 0, {})
    pol = SpeculationPolicy(enabled=False, max_draft=0)
    rec = a.record(3.0, False, pol, v, prop(), TenantView("code", CODE, 10_000), None, 0.0, {}, 10.0)
    assert rec.numbers["smoothed_improvement"] == {"0": 0.0, "4": 0.02, "full": 0.05}
    assert rec.numbers["pending"] == ["full", 2]
    assert str(FULL) not in repr(rec.numbers)


# -- what the policy carries: drafter, canary, capture opt-in ------------------

def test_carry_sets_drafter_canary_and_capture_and_explains_a_move():
    base = SpeculationPolicy(enabled=True, max_draft=4, reason="holding k=4")
    c = Carried(drafter="d2", canary=None, capture=CaptureSpec(fraction=0.1), note="drafter d2 promoted: better")
    moved = a.carry(base, c, prev=SpeculationPolicy(drafter=None, canary=CanarySpec(drafter="d2")))
    assert (moved.drafter, moved.canary, moved.capture) == ("d2", None, CaptureSpec(fraction=0.1))
    assert moved.reason == "drafter d2 promoted: better; holding k=4" and moved.max_draft == 4
    # Same drafter and canary as before: the note is old news, the reason stays the decision's.
    held = a.carry(base, c, prev=moved)
    assert held.reason == "holding k=4" and held.capture == CaptureSpec(fraction=0.1)
    # Nothing carried: a policy published without them (e.g. after a rollback clears the canary).
    bare = a.carry(base, None, prev=moved)
    assert (bare.drafter, bare.canary, bare.capture) == (None, None, None)


def test_decide_publishes_the_carried_fields_and_an_override_keeps_them():
    c = {"code": Carried(drafter="code-v3", canary=CanarySpec(drafter="code-v4", share=0.2),
                         capture=CaptureSpec(fraction=0.25, max_per_hour=10), note="canary code-v4 (share 0.2) started by x")}
    for ov in ({}, {"code": TenantOverride(mode="off")}, {"code": TenantOverride(mode="on", max_draft_max=2)}):
        d = decide(fleet(4, {"code": 1.0}), tenants(code=CODE), {}, ov, now=0.0, carried=c)
        p = d.policies["code"]
        assert (p.drafter, p.canary, p.capture) == ("code-v3", c["code"].canary, c["code"].capture), ov
        assert p.reason.startswith("canary code-v4 (share 0.2) started by x")
    # The override rule alone keeps them too (the admin API publishes its pins through it).
    p = apply_override(SpeculationPolicy(drafter="d", capture=CaptureSpec(fraction=0.5)), TenantOverride(mode="off"))
    assert p is not None and not p.enabled and p.drafter == "d" and p.capture == CaptureSpec(fraction=0.5)


def test_acceptance_label_names_each_priced_method():
    assert a.acceptance_label(0.876) == "0.88"
    assert a.acceptance_label({"dspark": 0.876}) == "0.88"
    assert a.acceptance_label({"ngram": 0.414, "dspark": 0.876}) == "dspark:0.88/ngram:0.41"
