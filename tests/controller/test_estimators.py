"""Estimators: acceptance fitting, decay and shrinkage toward the fleet mean,
online knee refinement."""

from __future__ import annotations

import pytest

from controller.acceptance_fit import draft_length, expected_accepted, fit_conditional_acceptance
from controller.costs import ReplicaCost
from controller.estimators import TenantEstimator
from controller.signals import TenantSample


@pytest.mark.parametrize("a,k", [(0.5, 4), (0.8, 8), (0.9, 3.5)])
def test_fit_inverts_expected_accepted(a, k):
    steps = 1000.0
    accepted = steps * expected_accepted(a, k)
    assert fit_conditional_acceptance(steps, steps * k, accepted) == pytest.approx(a, abs=1e-3)


def test_draft_length_cut_by_confidence():
    assert draft_length(0.8, 8, None) == 8
    assert draft_length(0.8, 8, 0.5) == 3  # 0.8^3 = 0.51 >= 0.5 > 0.8^4
    assert draft_length(0.8, 2, 0.5) == 2
    assert draft_length(0.8, 0, 0.1) == 0


def _sample(tenant, steps, a, k=4, replica="r"):
    return TenantSample(tenant, replica, {
        "requests": steps / 50, "completion_tokens": steps * 2, "prompt_tokens": steps, "num_spec_steps": steps,
        "num_draft_tokens": steps * k, "num_accepted_draft_tokens": steps * expected_accepted(a, k),
    })


def test_thin_tenant_is_shrunk_toward_fleet_and_thick_one_is_not():
    est = TenantEstimator(half_life_s=300, prior_steps=100)
    est.update([_sample("big", 20_000, 0.6), _sample("thin", 5, 0.95), _sample("thick", 20_000, 0.9)])
    fleet = est.fleet_acceptance()
    thin, n_thin = est.acceptance("thin")
    thick, _ = est.acceptance("thick")
    assert n_thin == 5
    assert abs(thin - fleet) < abs(0.95 - fleet) * 0.2  # mostly the fleet's value
    assert thick == pytest.approx(0.9, abs=0.01)


def test_decay_has_the_configured_half_life():
    est = TenantEstimator(half_life_s=300)
    est.update([_sample("t", 1000, 0.7)])
    est.decay(300)
    assert est.sums["t"].steps == pytest.approx(500)


def test_new_evidence_moves_a_decayed_estimate():
    est = TenantEstimator(half_life_s=300, prior_steps=10)
    est.update([_sample("t", 5000, 0.5)])
    est.decay(1800)  # six half-lives: old data weighs 1/64
    est.update([_sample("t", 5000, 0.9)])
    assert est.acceptance("t")[0] > 0.85


def test_knee_refines_from_observed_step_times():
    cost = ReplicaCost.for_names("h200", "qwen3-8b")
    knee0 = cost.knee_tokens(64, 1000)
    # A machine whose compute is 30 % slower than the roofline's prior.
    slow = ReplicaCost.for_names("h200", "qwen3-8b")
    slow.compute_scale = 1.3
    for _ in range(40):
        observed = slow.step_time_s(64, 600, 0, 1000)
        cost.observe(64, 600, 0, 1000, observed)
    assert cost.compute_scale == pytest.approx(1.3, rel=0.05)
    assert cost.knee_tokens(64, 1000) < knee0
