"""One step's ngram draw: only matching requests draft, caps truncate the copy, acceptance is whole-match."""

import numpy as np
import pytest

from drafters.sim import ngram_acceptance as ng
from drafters.sim.engine_types import EngineRequest
from drafters.sim.ngram_speculation import draw_ngram_speculation


def _batch(n: int, workload: str = "code") -> list[EngineRequest]:
    reqs = [EngineRequest(str(i), 100, 1000, workload) for i in range(n)]
    for r in reqs:
        r.preset = ng.get_preset(workload)
    return reqs


def test_requests_capped_at_zero_are_left_out_and_none_is_returned_when_nobody_may_draft():
    reqs = _batch(4)
    rng = np.random.default_rng(0)
    assert draw_ngram_speculation(reqs, np.zeros(4, dtype=np.int64), k_propose=8, rng=rng) is None
    assert draw_ngram_speculation(reqs, np.full(4, 8), k_propose=0, rng=rng) is None
    spec = draw_ngram_speculation(reqs, np.array([0, 8, 0, 3]), k_propose=8, rng=rng)
    assert spec.idx == [1, 3] and spec.kmax == 8


def test_a_draw_is_a_proposal_rate_times_a_copy_truncated_to_each_cap():
    n = 40_000
    reqs = _batch(n)
    caps = np.where(np.arange(n) % 2 == 0, 8, 2)
    spec = draw_ngram_speculation(reqs, caps, k_propose=8, rng=np.random.default_rng(1))
    p = ng.get_preset("code")
    assert np.all(spec.verified == spec.drafted) and np.all(spec.accepted <= spec.drafted)
    assert np.all(spec.drafted <= caps[spec.idx])
    proposed = spec.drafted > 0
    assert proposed.mean() == pytest.approx(p.propose_rate, abs=0.01)
    for cap in (8, 2):
        mine = (caps[spec.idx] == cap) & proposed
        assert spec.drafted[mine].mean() == pytest.approx(ng.drafted_per_proposal(p, 8, cap), abs=0.05)
        hist = np.bincount(spec.accepted[mine], minlength=cap + 1) / mine.sum()
        np.testing.assert_allclose(hist, ng.accepted_distribution(p, 8, cap)[:cap + 1], atol=0.015)


def test_the_proposers_k_bounds_the_copy_before_any_cap():
    n = 20_000
    spec = draw_ngram_speculation(_batch(n), np.full(n, 4), k_propose=4, rng=np.random.default_rng(2))
    p = ng.get_preset("code")
    hist = np.bincount(spec.accepted[spec.drafted > 0], minlength=5) / np.count_nonzero(spec.drafted)
    np.testing.assert_allclose(hist, ng.accepted_distribution(p, 4), atol=0.015)
    assert spec.drafted.max() == 4


def test_sampled_chat_proposes_less_often_and_accepts_nearly_nothing():
    n = 20_000
    greedy = draw_ngram_speculation(_batch(n, "code"), np.full(n, 8), k_propose=8, rng=np.random.default_rng(3))
    chat = draw_ngram_speculation(_batch(n, "chat"), np.full(n, 8), k_propose=8, rng=np.random.default_rng(3))
    assert np.count_nonzero(chat.drafted) < 0.6 * np.count_nonzero(greedy.drafted)
    assert chat.accepted.sum() / np.count_nonzero(chat.drafted) < 0.02
    assert greedy.accepted.sum() / np.count_nonzero(greedy.drafted) > 1.5
