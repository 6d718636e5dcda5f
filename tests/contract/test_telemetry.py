"""Per-request speculation telemetry parsing: replica data is untrusted."""

from __future__ import annotations

import pytest

from contract.telemetry import RequestSpecStats


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
