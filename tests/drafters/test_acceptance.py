import numpy as np
import pytest

from drafters.acceptance import (
    WORKLOADS, adaptive_verification_budget, confidence_cut_length, conditional_acceptance,
    expected_accepted_per_position, expected_draft_length, expected_tokens_adaptive, expected_tokens_per_step,
    get_preset, measured_conditional_acceptance, sample_request, sample_step, survival,
)
from drafters.costmodel import drafter_time_s, get_gpu, get_model, step_time_array_s


def test_presets_exist():
    for w in ("gsm8k", "math500", "mbpp", "humaneval", "mt-bench", "chat", "code", "creative"):
        assert w in WORKLOADS
        get_preset(w, "dflash")
    with pytest.raises(KeyError, match="unknown workload"):
        get_preset("nope")


def test_survival_falls_along_block():
    p = get_preset("gsm8k")
    a = conditional_acceptance(p, 16)
    s = survival(p, 16)
    assert np.all(np.diff(s) < 0) and s[0] == pytest.approx(a[0])


def test_tau_monotone_in_cap_and_threshold():
    p = get_preset("humaneval")
    taus = [expected_tokens_per_step(p, k) for k in range(0, 17)]
    assert taus[0] == 1.0 and all(b > a for a, b in zip(taus, taus[1:]))
    assert expected_tokens_per_step(p, 8, 0.6) < expected_tokens_per_step(p, 8, 0.2) <= expected_tokens_per_step(p, 8)
    assert expected_draft_length(p, 8, 0.6) < expected_draft_length(p, 8) == pytest.approx(8)
    per_pos = expected_accepted_per_position(p, 8)
    assert 1 + per_pos.sum() == pytest.approx(expected_tokens_per_step(p, 8))


def test_confidence_cut():
    c = np.array([0.9, 0.7, 0.5, 0.3])
    assert confidence_cut_length(c, 0.0) == 4
    assert confidence_cut_length(c, 0.6) == 2
    assert confidence_cut_length(c, 0.95) == 0


def test_sampling_matches_expectation():
    p = get_preset("math500")
    rng = np.random.default_rng(7)
    emitted, steps, drafted = 0, 0, []
    for _ in range(400):  # each request generates ~100 tokens: the step-weighted AL vLLM reports
        req = sample_request(p, rng)
        n = 0
        while n < 100:
            st = sample_step(req, 8, 0.0, rng)
            assert 0 <= st.accepted <= st.drafted == 8
            n += st.accepted + 1
            steps += 1
        emitted += n
    assert emitted / steps == pytest.approx(expected_tokens_per_step(p, 8), rel=0.04)
    # a threshold drafts fewer tokens on average, never more than the cap
    for _ in range(500):
        req = sample_request(p, rng)
        st = sample_step(req, 6, 0.5, rng)
        assert st.drafted <= 6 and st.accepted <= st.drafted
        drafted.append(st.drafted)
    assert np.mean(drafted) < 6


def test_adaptive_budget_trims_under_load():
    gpu, model, p = get_gpu("h200"), get_model("qwen3-8b"), get_preset("mt-bench")
    light = expected_tokens_adaptive(p, 8, 1, drafter_time_s(gpu, model, 1, 8, 1000),
                                     lambda n: step_time_array_s(gpu, model, n, 1, 1000))
    heavy = expected_tokens_adaptive(p, 8, 128, drafter_time_s(gpu, model, 128, 8, 1000),
                                     lambda n: step_time_array_s(gpu, model, n, 128, 1000))
    assert light[1] == pytest.approx(8.0)  # memory-bound: verify everything
    assert heavy[1] < 3.0  # compute-bound: only the best slots
    assert light[0] > heavy[0] > 1.0


def test_adaptive_budget_prefers_high_scores():
    scores = np.array([0.95, 0.9, 0.1, 0.05])
    # flat cost: admit all; steep cost: admit only the high ones
    b_flat, _ = adaptive_verification_budget(scores, 2, 2, 0.001, lambda n: np.full(np.shape(n), 0.01))
    b_steep, thr = adaptive_verification_budget(scores, 2, 2, 0.001, lambda n: 0.01 + 0.004 * np.asarray(n))
    assert b_flat == 4 and b_steep == 2 and thr == pytest.approx(0.9)


@pytest.mark.parametrize("workload", ["gsm8k", "math500"])
def test_dspark_per_position_acceptance_is_flat_and_dflash_decays_as_the_seed_reports(workload):
    """What a per-position measurement reports (accepted at i / accepted at i-1
    over all drafts): DSpark flat across the block (the Markov head), DFlash
    falling from the first position to 0.78/0.88 of it at the 16th."""
    dspark = measured_conditional_acceptance(get_preset(workload, "dspark"), 16)
    dflash = measured_conditional_acceptance(get_preset(workload, "dflash"), 16)
    assert dspark.max() - dspark.min() < 0.02
    assert np.all(np.diff(dflash) < 0)
    assert dflash[-1] / dflash[0] == pytest.approx(0.78 / 0.88, abs=0.02)
    # Each request's own curve decays a little: survivor selection flattens the measured one.
    assert np.all(np.diff(conditional_acceptance(get_preset(workload), 16)) < 0)


def test_the_published_qwen3_8b_drafter_has_its_own_preset():
    p = get_preset("speed-coding")
    assert expected_tokens_per_step(p, 7) == pytest.approx(3.41, rel=0.01)
    assert expected_tokens_per_step(p, 7) < expected_tokens_per_step(get_preset("code"), 7)  # the 14B table is kinder
    with pytest.raises(KeyError):
        get_preset("speed-coding", "dflash")  # no DFlash figure published for it
