"""Per-request speculation telemetry parsing: replica data is untrusted."""

from __future__ import annotations

import pytest

from contract.knobs import STOCK, parse_knobs
from contract.telemetry import COUNTER_FIELDS, RequestSpecStats, add_increments, increments_for


def test_reads_vllm_summary():
    stats = RequestSpecStats.from_response(
        {"prompt_tokens": 7, "completion_tokens": 20},
        {"speculative_decoding": {"num_spec_steps": 8, "num_draft_tokens": 32, "num_accepted_draft_tokens": 12}},
    )
    assert (stats.prompt_tokens, stats.completion_tokens) == (7, 20)
    assert (stats.num_spec_steps, stats.num_draft_tokens, stats.num_accepted_draft_tokens) == (8, 32, 12)


def test_derives_steps_from_mean_acceptance_length_when_absent():
    stats = RequestSpecStats.from_response(
        {}, {"speculative_decoding": {"num_draft_tokens": 10, "num_accepted_draft_tokens": 6, "mean_acceptance_length": 2.5}}
    )
    assert stats.num_spec_steps == 4


@pytest.mark.parametrize(
    "usage, metrics",
    [
        ({"prompt_tokens": "abc", "completion_tokens": -3}, {"speculative_decoding": [1, 2]}),
        ([], "metrics"),
        ({"prompt_tokens": True}, {"speculative_decoding": {"num_draft_tokens": "x", "mean_acceptance_length": "y"}}),
        (None, {"speculative_decoding": {"num_draft_tokens": 5, "num_accepted_draft_tokens": None, "mean_acceptance_length": 3}}),
    ],
)
def test_malformed_fields_count_as_absent(usage, metrics):
    stats = RequestSpecStats.from_response(usage, metrics)
    assert stats.prompt_tokens >= 0 and stats.completion_tokens >= 0
    for value in (stats.num_spec_steps, stats.num_draft_tokens, stats.num_accepted_draft_tokens):
        assert value is None or (isinstance(value, int) and value >= 0)


# -- per-request acceptance-length and timing sums (canary comparison) ----------

def test_acceptance_length_sums_per_drafting_request():
    stats = RequestSpecStats(prompt_tokens=5, completion_tokens=20, num_spec_steps=8, num_draft_tokens=32,
                             num_accepted_draft_tokens=12)
    inc = increments_for(stats)
    assert inc["al_requests"] == 1
    assert inc["al_sum"] == pytest.approx(2.5)  # 1 + 12 / 8
    assert inc["al_sumsq"] == pytest.approx(6.25)
    assert "timed_requests" not in inc  # not timed: no timing counter moves
    assert set(inc) <= set(COUNTER_FIELDS)


def test_adding_in_place_sums_what_increments_for_gives():
    """The gateway adds each request into its running sums (`add_increments`):
    the same as summing each request's `increments_for`."""
    requests = [
        RequestSpecStats(prompt_tokens=5, completion_tokens=20, num_spec_steps=8, num_draft_tokens=32, num_accepted_draft_tokens=12),
        RequestSpecStats(completion_tokens=9, duration_s=0.5),
        RequestSpecStats(completion_tokens=3, num_spec_steps=0, num_draft_tokens=0, num_accepted_draft_tokens=0, duration_s=0.1),
        RequestSpecStats(prompt_tokens=2, completion_tokens=7, num_spec_steps=3, num_draft_tokens=12, num_accepted_draft_tokens=None),
    ]
    summed: dict[str, float] = {}
    for stats in requests:
        for k, v in increments_for(stats).items():
            summed[k] = summed.get(k, 0) + v
    acc: dict[str, float] = {}
    for stats in requests:
        assert add_increments(acc, stats) is acc
    assert acc == pytest.approx(summed) and list(acc) == list(summed)
    assert acc["al_requests"] == 2 and acc["timed_requests"] == 2 and acc["requests"] == 4


def test_no_acceptance_sample_without_a_step_or_a_summary():
    # A request that drafted nothing (speculation off, or finished in its prefill) says nothing about acceptance.
    assert "al_requests" not in increments_for(RequestSpecStats(completion_tokens=1, num_spec_steps=0, num_draft_tokens=0,
                                                                 num_accepted_draft_tokens=0))
    assert "al_requests" not in increments_for(RequestSpecStats(completion_tokens=9))


def test_timing_counters_only_when_the_gateway_timed_the_request():
    inc = increments_for(RequestSpecStats(completion_tokens=40, duration_s=0.8))
    assert (inc["timed_requests"], inc["timed_seconds"], inc["timed_completion_tokens"]) == (1, 0.8, 40)
    assert "al_requests" not in inc


@pytest.mark.parametrize("duration", [-1.0, float("nan"), float("inf"), "1.5", True, None, [1]])
def test_bad_duration_counts_as_untimed(duration):
    stats = RequestSpecStats.from_response({"completion_tokens": 4}, {}, duration_s=duration)
    assert stats.duration_s is None
    assert "timed_requests" not in increments_for(stats)


def test_from_response_carries_the_duration_and_the_acceptance_length():
    stats = RequestSpecStats.from_response(
        {"prompt_tokens": 7, "completion_tokens": 20},
        {"speculative_decoding": {"num_spec_steps": 8, "num_draft_tokens": 32, "num_accepted_draft_tokens": 12}},
        duration_s=1.25,
    )
    assert stats.duration_s == 1.25 and stats.acceptance_length == pytest.approx(2.5)
    assert RequestSpecStats.from_response({}, {}).duration_s is None  # existing callers: two arguments


def test_an_impossible_acceptance_is_clamped_and_an_infinite_count_is_absent():
    stats = RequestSpecStats.from_response(
        {"completion_tokens": float("inf")},
        {"speculative_decoding": {"num_spec_steps": 2, "num_draft_tokens": 8, "num_accepted_draft_tokens": 10**9}},
    )
    assert stats.num_accepted_draft_tokens == 8 and stats.completion_tokens == 0
    assert increments_for(stats)["al_sum"] == pytest.approx(5.0)  # 1 + 8 / 2: never past what was drafted


# -- proposal counters: how often and how fully a request allowed to draft proposes --


def _ngram_summary(steps=10, drafted=55, accepted=17, k=8):
    return {"speculative_decoding": {"num_spec_steps": steps, "num_draft_tokens": drafted,
                                     "num_accepted_draft_tokens": accepted, "num_spec_tokens": k}}


def test_the_allowance_is_the_replicas_k_bounded_by_the_largest_cap_the_knobs_allow():
    usage = {"completion_tokens": 64}
    assert RequestSpecStats.from_response(usage, _ngram_summary(), knobs=STOCK).draft_allowance == 8
    assert RequestSpecStats.from_response(usage, _ngram_summary(), knobs=parse_knobs({"specgate_max_draft": 3})).draft_allowance == 3
    sched = parse_knobs({"specgate_schedule": [4, 6, 32, 2]})
    assert RequestSpecStats.from_response(usage, _ngram_summary(), knobs=sched).draft_allowance == 6
    assert RequestSpecStats.from_response(usage, _ngram_summary(), knobs=parse_knobs({"specgate_max_batch": 0})).draft_allowance == 0
    # Unknown knobs (a continued stream's part) or no K reported: no allowance, no proposal counters.
    assert RequestSpecStats.from_response(usage, _ngram_summary()).draft_allowance is None
    no_k = {"speculative_decoding": {"num_spec_steps": 1, "num_draft_tokens": 2, "num_accepted_draft_tokens": 1}}
    assert RequestSpecStats.from_response(usage, no_k, knobs=STOCK).draft_allowance is None


def test_decode_steps_are_the_steps_after_the_first_token():
    """64 tokens with 17 accepted drafts took 64 - 17 = 47 steps, the first of
    them the prefill's: 46 decode steps, 10 of which held a proposal."""
    stats = RequestSpecStats.from_response({"completion_tokens": 64}, _ngram_summary(), knobs=STOCK)
    assert stats.decode_steps == 46
    inc = increments_for(stats)
    assert (inc["allowed_decode_steps"], inc["allowed_spec_steps"]) == (46, 10)
    assert (inc["allowed_draft_tokens"], inc["allowed_full_tokens"]) == (55, 80)
    assert set(inc) <= set(COUNTER_FIELDS)


def test_a_request_capped_at_zero_or_of_unknown_knobs_is_no_proposal_evidence():
    for knobs in (parse_knobs({"specgate_max_draft": 0}), None):
        stats = RequestSpecStats.from_response({"completion_tokens": 64}, _ngram_summary(0, 0, 0), knobs=knobs)
        assert "allowed_decode_steps" not in increments_for(stats)
    # Allowed but never proposing: decode steps without a proposal (the rate's evidence).
    stats = RequestSpecStats.from_response({"completion_tokens": 64}, _ngram_summary(0, 0, 0), knobs=STOCK)
    inc = increments_for(stats)
    assert inc["allowed_decode_steps"] == 63 and inc["allowed_spec_steps"] == 0


# -- a probe's two arms: engine decode time, split by whether the request could draft --


def test_probed_requests_add_their_decode_time_to_their_arm():
    metrics = {**_ngram_summary(), "generation_time_ms": 630.0}
    drafting = RequestSpecStats.from_response({"completion_tokens": 64}, metrics, knobs=STOCK, probed=True)
    assert drafting.decode_s == pytest.approx(0.63)
    inc = increments_for(drafting)
    assert inc["probed_drafting_tokens"] == 63 and inc["probed_drafting_seconds"] == pytest.approx(0.63)
    assert "probed_plain_tokens" not in inc
    held = RequestSpecStats.from_response({"completion_tokens": 64}, {**_ngram_summary(0, 0, 0), "generation_time_ms": 900.0},
                                          knobs=parse_knobs({"specgate_max_draft": 0}), probed=True)
    inc = increments_for(held)
    assert inc["probed_plain_tokens"] == 63 and inc["probed_plain_seconds"] == pytest.approx(0.9)
    assert set(inc) <= set(COUNTER_FIELDS)


def test_only_probed_requests_with_a_decode_time_and_known_knobs_count_in_an_arm():
    metrics = {**_ngram_summary(), "generation_time_ms": 630.0}
    for stats in (
        RequestSpecStats.from_response({"completion_tokens": 64}, metrics, knobs=STOCK),  # no probe in force
        RequestSpecStats.from_response({"completion_tokens": 64}, _ngram_summary(), knobs=STOCK, probed=True),
        RequestSpecStats.from_response({"completion_tokens": 64}, metrics, probed=True),  # knobs unknown
        RequestSpecStats.from_response({"completion_tokens": 1}, metrics, knobs=STOCK, probed=True),
    ):
        assert not any(k.startswith("probed_") for k in increments_for(stats))
    # A replica that does not speculate (no speculative_decoding): the request was in the plain arm.
    plain = RequestSpecStats.from_response({"completion_tokens": 11}, {"generation_time_ms": 100.0}, knobs=STOCK, probed=True)
    assert increments_for(plain)["probed_plain_tokens"] == 10


# -- survival per draft position (acceptance_histogram) -------------------------

def _spec(hist: list[int], k: int) -> dict:
    return {"speculative_decoding": {"num_spec_steps": sum(hist), "num_draft_tokens": k * sum(hist),
                                     "num_accepted_draft_tokens": sum(j * c for j, c in enumerate(hist)),
                                     "num_spec_tokens": k, "acceptance_histogram": hist}}


def test_each_position_counts_the_steps_that_reached_it_and_those_accepted_there():
    """Histogram [2, 1, 0, 3]: 6 proposal steps, 4 accepted >= 1 draft, 3 >= 2, 3 >= 3."""
    stats = RequestSpecStats.from_response({"completion_tokens": 30}, _spec([2, 1, 0, 3], 3), knobs=STOCK)
    inc = increments_for(stats)
    assert [(inc[f"survival_reach_{i}"], inc[f"survival_accepted_{i}"]) for i in (1, 2, 3)] == [(6, 4), (4, 3), (3, 3)]
    assert set(inc) <= set(COUNTER_FIELDS)


def test_positions_beyond_the_requests_cap_get_no_evidence():
    """Capped at 2 drafts (of the replica's 3), the request says nothing of position 3."""
    stats = RequestSpecStats.from_response({"completion_tokens": 30}, _spec([2, 1, 3, 0], 3),
                                           knobs=parse_knobs({"specgate_max_draft": 2}))
    inc = increments_for(stats)
    assert (inc["survival_reach_2"], inc["survival_accepted_2"]) == (4, 3)
    assert "survival_reach_3" not in inc


@pytest.mark.parametrize("hist", [[1, "x"], [-1, 3], [5, 1], "1,2", [], [1.5, 2]])
def test_a_malformed_or_inconsistent_histogram_is_left_out(hist):
    spec = _spec([1, 1], 1)
    spec["speculative_decoding"]["acceptance_histogram"] = hist
    stats = RequestSpecStats.from_response({"completion_tokens": 9}, spec, knobs=STOCK)
    assert stats.acceptance_histogram is None
    assert not any(name.startswith("survival_") for name in increments_for(stats))


def test_a_histogram_cut_at_its_largest_count_still_counts_the_next_positions_reach():
    """[2, 3]: no step accepted 2 of the 3 drafts allowed, so position 2 is reached by 3 steps
    and passed by none (a simulator's histogram may stop at its largest count; vLLM pads to K+1)."""
    stats = RequestSpecStats(completion_tokens=9, num_spec_steps=5, num_draft_tokens=15, num_accepted_draft_tokens=3,
                             draft_allowance=3, acceptance_histogram=(2, 3))
    inc = increments_for(stats)
    assert [(inc.get(f"survival_reach_{i}"), inc.get(f"survival_accepted_{i}")) for i in (1, 2, 3)] == [
        (5, 3), (3, 0), (None, None)]
