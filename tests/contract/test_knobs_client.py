"""Client-supplied specgate knobs: validation and the policy-caps merge."""

from __future__ import annotations

import pytest

from contract.knobs import KnobError, merged_xargs, validate_client_xargs

BOTH = frozenset({"max_draft", "min_confidence"})
from contract.policy import SpeculationPolicy


@pytest.mark.parametrize(
    "xargs, param",
    [
        ({"specgate_max_draft": -1}, "vllm_xargs.specgate_max_draft"),
        ({"specgate_max_draft": "4"}, "vllm_xargs.specgate_max_draft"),
        ({"specgate_max_draft": 2.5}, "vllm_xargs.specgate_max_draft"),
        ({"specgate_max_draft": True}, "vllm_xargs.specgate_max_draft"),
        ({"specgate_max_draft": 1000}, "vllm_xargs.specgate_max_draft"),
        ({"specgate_min_confidence": 1.5}, "vllm_xargs.specgate_min_confidence"),
        ({"specgate_min_confidence": "high"}, "vllm_xargs.specgate_min_confidence"),
        ({"specgate_min_confidence": -0.1}, "vllm_xargs.specgate_min_confidence"),
        ({"specgate_max_batch": -2}, "vllm_xargs.specgate_max_batch"),
        ({"specgate_max_batch": "64"}, "vllm_xargs.specgate_max_batch"),
        ({"specgate_max_batch": 1 << 20}, "vllm_xargs.specgate_max_batch"),
        ({"specgate_typo": 1}, "vllm_xargs.specgate_typo"),
        ("not-an-object", "vllm_xargs"),
    ],
)
def test_bad_client_knobs_are_rejected(xargs, param):
    with pytest.raises(KnobError) as exc:
        validate_client_xargs(xargs)
    assert exc.value.param == param


def test_good_client_knobs_pass():
    x = {"specgate_max_draft": 0, "specgate_min_confidence": 1, "specgate_max_batch": 32, "other": "kept"}
    assert validate_client_xargs(x) is x
    assert validate_client_xargs(None) is None


def test_policy_caps_client():
    policy = SpeculationPolicy(max_draft=4, min_confidence=0.5)
    assert merged_xargs(None, policy, BOTH) == {"specgate_max_draft": 4, "specgate_min_confidence": 0.5}
    asked_less = merged_xargs({"specgate_max_draft": 2, "specgate_min_confidence": 0.9, "x": 1}, policy, BOTH)
    assert asked_less == {"specgate_max_draft": 2, "specgate_min_confidence": 0.9, "x": 1}
    asked_more = merged_xargs({"specgate_max_draft": 16, "specgate_min_confidence": 0.1}, policy, BOTH)
    assert asked_more == {"specgate_max_draft": 4, "specgate_min_confidence": 0.5}


def test_disabled_policy_forces_zero_and_plain_replicas_are_untouched():
    off = SpeculationPolicy(enabled=False)
    assert merged_xargs({"specgate_max_draft": 8}, off, BOTH)["specgate_max_draft"] == 0
    client = {"specgate_max_draft": 8}
    assert merged_xargs(client, off, frozenset()) is client
    assert merged_xargs(None, SpeculationPolicy(), BOTH) is None


def test_confidence_floor_only_for_replicas_that_honour_it():
    policy = SpeculationPolicy(max_draft=4, min_confidence=0.5)
    assert merged_xargs(None, policy, frozenset({"max_draft"})) == {"specgate_max_draft": 4}
    floor_only = SpeculationPolicy(min_confidence=0.5)
    client = {"x": 1}
    assert merged_xargs(client, floor_only, frozenset({"max_draft"})) is client


def test_load_threshold_is_a_cap_too_and_only_for_replicas_that_honour_it():
    policy = SpeculationPolicy(max_draft=4, max_batch=48)
    three = frozenset({"max_draft", "max_batch", "min_confidence"})
    assert merged_xargs(None, policy, three) == {"specgate_max_draft": 4, "specgate_max_batch": 48}
    # A client may ask to stop drafting at a smaller batch, never at a larger one.
    assert merged_xargs({"specgate_max_batch": 16}, policy, three)["specgate_max_batch"] == 16
    assert merged_xargs({"specgate_max_batch": 512}, policy, three)["specgate_max_batch"] == 48
    # An older extension (no max_batch knob) is not sent one.
    assert merged_xargs(None, policy, BOTH) == {"specgate_max_draft": 4}
