"""Probes: exploration while a tenant does not draft and its evidence is thin,
a hold-out while it drafts (when configured), none under an admin pin."""

from __future__ import annotations

import pytest

from contract.policy import ProbeSpec, SpeculationPolicy
from controller.decision import DecisionConfig, MeasuredGain
from controller.decision.probe import NEVER_DRAFT, cheap_batch, drafts, probe_spec, steady_probe

# Exploration is for a tenant switched off; with schedules the load alone never switches one
# off (it is priced where drafting pays, schedule.py), so these tests decide without them,
# as a fleet whose replicas do not apply schedules is decided.
NO_SCHEDULES = DecisionConfig(schedule_grid=None)

CFG = DecisionConfig(explore_share=0.05, explore_evidence_steps=200, holdout_share=0.1)


@pytest.mark.parametrize(
    "policy, expected",
    [
        (SpeculationPolicy(), True),
        (SpeculationPolicy(enabled=False, max_draft=0), False),
        (SpeculationPolicy(max_draft=0), False),
        (SpeculationPolicy(max_batch=0), False),
        (SpeculationPolicy(schedule=((8, 0), (16, 0))), False),
        (SpeculationPolicy(schedule=((8, 4), (16, 0))), True),
    ],
)
def test_drafts_is_whether_any_step_may_draft(policy, expected):
    assert drafts(policy) is expected


def test_the_cheap_batch_keeps_verify_tokens_under_the_smallest_knee():
    assert cheap_batch([40.0, 64.0], drafted_per_request=3.0) == 10  # 10 x (1 + 3) = 40 tokens
    assert cheap_batch([7.7], drafted_per_request=1.7) == 2
    assert cheap_batch([3.0], drafted_per_request=8.0) == 1  # never below one request
    assert cheap_batch([], drafted_per_request=2.0) == 1


def test_a_tenant_off_on_thin_evidence_explores_its_block_where_it_is_cheap():
    off = SpeculationPolicy(enabled=False, max_draft=0, source="controller")
    probe = probe_spec(off, acceptance_steps=50, block=8, cheap=6, cfg=CFG, profile="ngram-k8")
    assert probe == ProbeSpec(share=0.05, schedule=((6, 8),), profile="ngram-k8")
    assert probe_spec(off, acceptance_steps=500, block=8, cheap=6, cfg=CFG) is None  # enough evidence: no guess needed
    assert probe_spec(off, acceptance_steps=50, block=0, cheap=6, cfg=CFG) is None  # nothing speculates


def test_a_drafting_tenant_gets_the_configured_hold_out_and_an_admin_pin_none():
    on = SpeculationPolicy(max_draft=4, source="controller")
    assert probe_spec(on, acceptance_steps=50, block=8, cheap=6, cfg=CFG) == ProbeSpec(share=0.1, schedule=NEVER_DRAFT)
    assert probe_spec(on, 50, 8, 6, DecisionConfig(holdout_share=0.0)) is None
    pinned = SpeculationPolicy(enabled=False, max_draft=0, source="admin")
    assert probe_spec(pinned, acceptance_steps=0, block=8, cheap=6, cfg=CFG) is None


def test_the_probe_arm_follows_the_probes_schedule_and_may_reach_a_speculative_replica():
    off = SpeculationPolicy(enabled=False, max_draft=0, preferred_profile="off",
                            probe=ProbeSpec(share=0.05, schedule=((6, 8),), profile="ngram-k8"))
    arm = off.probe_arm()
    assert arm.enabled and arm.schedule == ((6, 8),) and arm.max_draft is None and arm.max_batch is None
    assert arm.preferred_profile == "ngram-k8" and arm.probe is None
    unnamed = off.model_copy(update={"probe": ProbeSpec(share=0.05, schedule=((6, 8),))}).probe_arm()
    assert unnamed.preferred_profile is None  # not steered to the off pool it could not draft on
    assert drafts(arm)
    on = SpeculationPolicy(max_draft=4, preferred_profile="ngram-k8", probe=ProbeSpec(share=0.1, schedule=NEVER_DRAFT))
    held = on.probe_arm()
    assert not drafts(held) and held.preferred_profile == "ngram-k8"  # same replicas, same steps
    assert held.vllm_xargs()["specgate_max_draft"] == 0


@pytest.mark.parametrize("share", [0.0, 0.6, -0.1])
def test_a_probe_share_is_a_small_positive_share(share):
    with pytest.raises(ValueError):
        ProbeSpec(share=share, schedule=((4, 8),))


# -- in decide(): published with the policy, reported beside the prediction --

def _decide(evidence, batch=64, measured=None, cfg=None, state=None):
    from controller.acceptance_fit import Proposal
    from controller.decision import TenantView, decide

    from .test_cpu_curve import ngram_replica

    reps = [ngram_replica("r0", batch), ngram_replica("r1", batch)]
    views = [TenantView("greedy", 0.5, 10_000, proposal={"ngram": Proposal(0.38, 0.69)}, measured_gain=measured,
                        acceptance_steps=evidence),
             TenantView("temp1", 0.02, 10_000, proposal={"ngram": Proposal(0.2, 0.69)}, acceptance_steps=10_000)]
    return decide(reps, views, state or {}, {}, 0.0, cfg or NO_SCHEDULES)


def test_decide_publishes_an_exploration_probe_for_a_thin_tenant_it_switches_off():
    d = _decide(evidence=20)  # heavy load on the CPU curve: drafting does not pay, evidence thin
    greedy, temp1 = d.policies["greedy"], d.policies["temp1"]
    assert not drafts(greedy) and greedy.probe is not None
    (cheap, block), = greedy.probe.schedule
    assert block == 8 and cheap == 2  # knee ~7.7 tokens / (1 + 0.38 x 0.69 x 8) verified per request
    assert greedy.probe.share == DecisionConfig().explore_share and greedy.probe.profile == "ngram-k8"
    assert temp1.probe is None  # 10,000 speculation steps of its own: no guess to replace
    assert _decide(evidence=20, cfg=DecisionConfig(explore_share=0.0, schedule_grid=None)).policies["greedy"].probe is None


def test_exploration_once_on_runs_until_twice_the_threshold():
    first = _decide(evidence=150)
    assert first.policies["greedy"].probe is not None
    again = _decide(evidence=300, state=first.state)  # past the threshold, short of twice it
    assert again.policies["greedy"].probe is not None
    assert _decide(evidence=300).policies["greedy"].probe is None  # never exploring: 300 > 200


def test_the_record_puts_the_measured_gain_beside_the_models_prediction():
    measured = MeasuredGain(1.31, 800.0, 700.0)
    d = _decide(evidence=10_000, batch=1, measured=measured)
    rec = next(r for r in d.records if r.tenant == "greedy")
    gain = rec.numbers["measured_gain"]
    assert gain["measured"] == 1.31 and (gain["drafting_tokens"], gain["plain_tokens"]) == (800.0, 700.0)
    assert 1.0 < gain["predicted"] < 2.0  # a drafting request's tokens per step: 1 + 0.38 x ~1 accepted
    assert next(r for r in d.records if r.tenant == "temp1").numbers["measured_gain"] is None


def test_a_draw_below_the_share_is_the_probe_arm():
    policy = SpeculationPolicy(max_draft=4, probe=ProbeSpec(share=0.2, schedule=NEVER_DRAFT))
    arm, which = policy.draw(0.1)
    assert which == "probe" and arm == policy.probe_arm()
    assert policy.draw(0.2) == (policy, "policy") and policy.draw(0.9) == (policy, "policy")
    plain = SpeculationPolicy(max_draft=4)
    assert plain.draw(0.0) == (plain, None)


def test_a_probe_stays_while_its_cheap_batch_moves_less_than_twofold():
    old = ProbeSpec(share=0.05, schedule=((8, 8),), profile="ngram-k8")
    assert steady_probe(old, ProbeSpec(share=0.05, schedule=((16, 8),), profile="ngram-k8")) is old
    assert steady_probe(old, ProbeSpec(share=0.05, schedule=((4, 8),), profile="ngram-k8")) is old
    moved = ProbeSpec(share=0.05, schedule=((32, 8),), profile="ngram-k8")
    assert steady_probe(old, moved) is moved
    other = ProbeSpec(share=0.05, schedule=((8, 4),), profile="ngram-k8")
    assert steady_probe(old, other) is other and steady_probe(old, None) is None and steady_probe(None, old) is old



def test_exploration_drafts_no_longer_than_an_admins_bound():
    from contract.overrides import TenantOverride
    from controller.acceptance_fit import Proposal
    from controller.decision import TenantView, decide

    from .test_cpu_curve import ngram_replica

    reps = [ngram_replica("r0", 64), ngram_replica("r1", 64)]
    views = [TenantView("greedy", 0.5, 10_000, proposal={"ngram": Proposal(0.38, 0.69)}, acceptance_steps=20),
             TenantView("temp1", 0.02, 10_000, acceptance_steps=10_000)]
    bound = {"greedy": TenantOverride(max_draft_max=2)}
    first = decide(reps, views, {}, bound, 0.0, NO_SCHEDULES)  # the override moved it: an admin's act, no probe
    assert first.policies["greedy"].source == "admin" and first.policies["greedy"].probe is None
    d = decide(reps, views, first.state, bound, 1.0, NO_SCHEDULES)  # then the controller's, inside the bounds
    greedy = d.policies["greedy"]
    assert greedy.source == "controller" and not drafts(greedy)
    assert greedy.probe is not None and greedy.probe.schedule[-1][1] == 2
