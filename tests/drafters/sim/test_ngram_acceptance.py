"""The ngram acceptance model: it reproduces the bed figures it was fitted to, and its shape is
prompt lookup's (proposals now and then, copies accepted whole or left early), not a drafter chain."""

import numpy as np
import pytest

from drafters import acceptance as acc
from drafters.sim import ngram_acceptance as ng


def test_every_workload_has_an_ngram_behaviour_from_one_of_the_two_bed_tenants():
    assert set(ng.PRESETS) == set(acc.WORKLOADS)
    for name in ng.GREEDY_WORKLOADS:
        assert ng.get_preset(name).bed == "greedy"
    for name in ng.SAMPLED_WORKLOADS:
        assert ng.get_preset(name).bed == "temp1"
    assert ng.get_preset("MT_Bench").name == "mt-bench"
    with pytest.raises(KeyError, match="unknown workload"):
        ng.get_preset("poetry")


def test_the_greedy_bed_figures_are_reproduced():
    """Acceptance length 2.75 alone, 0.66 accepted and 2.09 drafted per request-step at K=8."""
    p = ng.BED_PRESETS["greedy"]
    accepted, drafted = ng.greedy_bed_rates()
    assert accepted == pytest.approx(0.662, abs=0.001) and drafted == pytest.approx(2.092, abs=0.001)
    assert 1 + ng.accepted_per_proposal(p, 8) == pytest.approx(2.75, abs=1e-6)
    assert ng.expected_tokens_per_step(p, 8) - 1 == pytest.approx(accepted, abs=1e-6)
    assert ng.expected_draft_tokens(p, 8) == pytest.approx(drafted, abs=1e-6)
    assert 0.3 < p.propose_rate < 0.5  # a greedy request proposes in fewer than half of its steps
    assert ng.accepted_per_proposal(p, 8) / ng.drafted_per_proposal(p, 8) == pytest.approx(0.32, abs=0.01)


def test_the_sampled_bed_proposes_less_and_accepts_almost_nothing():
    greedy, temp1 = ng.BED_PRESETS["greedy"], ng.BED_PRESETS["temp1"]
    assert 1 + ng.accepted_per_proposal(temp1, 8) <= 1.01  # acceptance length 1.00 [1.00..1.01]
    assert temp1.propose_rate < 0.6 * greedy.propose_rate
    # the mixed phases (equal in-flight shares) drafted 1.6 tokens per request-step
    mixed = 0.5 * (ng.expected_draft_tokens(greedy, 8) + ng.expected_draft_tokens(temp1, 8))
    assert mixed == pytest.approx(ng.MIXED_DRAFTED_PER_STEP, abs=1e-6)


def test_fit_preset_inverts_its_targets():
    p = ng.fit_preset("x", proposals_per_step=0.5, drafted_tokens=3.0, accepted_tokens=1.2, partial_continue=0.3, k=4)
    assert ng.drafted_per_proposal(p, 4) == pytest.approx(3.0, abs=1e-6)
    assert ng.accepted_per_proposal(p, 4) == pytest.approx(1.2, abs=1e-6)
    assert ng.expected_draft_tokens(p, 4) == pytest.approx(1.5, abs=1e-6)


def test_whole_match_shape_is_u_shaped_not_a_decaying_chain():
    p = ng.get_preset("code")
    dist = ng.accepted_distribution(p, 8)
    assert dist.sum() == pytest.approx(1.0) and len(dist) == 9
    # most copies part ways at once, the next largest group is accepted in full (a copy of 8 or more)
    assert dist[0] == max(dist) and dist[8] > max(dist[3:8])
    assert dist[8] == pytest.approx(p.whole_match * p.continue_rate ** 7)
    # a cap truncates the copy: accepted in full up to the cap whenever the target agrees that far
    capped = ng.accepted_distribution(p, 8, cap=2)
    assert capped[3:].sum() == 0 and capped[2] > dist[2] and capped.sum() == pytest.approx(1.0)
    assert ng.drafted_per_proposal(p, 8, cap=2) < 2.0
    assert ng.expected_tokens_per_step(p, 8, cap=0) == 1.0 and ng.expected_draft_tokens(p, 8, cap=0) == 0.0


def test_sampled_proposals_follow_the_model():
    rng = np.random.default_rng(7)
    p = ng.get_preset("code")
    n = 200_000
    proposed, length, agreement = ng.sample_proposals([p] * n, 8, rng)
    assert proposed.mean() == pytest.approx(p.propose_rate, abs=0.005)
    assert np.all(length[~proposed] == 0) and np.all(agreement[~proposed] == 0)
    assert np.all((length[proposed] >= 1) & (length[proposed] <= 8)) and np.all(agreement <= length)
    lengths = np.bincount(length[proposed], minlength=9)[1:] / proposed.sum()
    np.testing.assert_allclose(lengths, ng.proposal_lengths(p.continue_rate, 8), atol=0.005)
    hist = np.bincount(np.minimum(agreement, length)[proposed], minlength=9) / proposed.sum()
    np.testing.assert_allclose(hist, ng.accepted_distribution(p, 8), atol=0.005)
    # Whole match: whatever the copy's length, the same share of copies is accepted in full
    # (a chain of per-token acceptances would accept a long copy in full less often than a short one).
    full = [np.mean(agreement[proposed & (length == L)] == L) for L in (2, 4, 8)]
    assert max(full) - min(full) < 0.02
    assert full[0] == pytest.approx(p.whole_match, abs=0.02)


def test_nothing_is_proposed_at_k_zero_or_for_no_requests():
    rng = np.random.default_rng(0)
    proposed, length, agreement = ng.sample_proposals([ng.get_preset("code")] * 5, 0, rng)
    assert not proposed.any() and not length.any() and not agreement.any()
    assert [len(a) for a in ng.sample_proposals([], 8, rng)] == [0, 0, 0]
