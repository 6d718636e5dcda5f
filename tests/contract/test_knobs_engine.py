"""The knob parsing rules both plugin halves (engine core, worker) share."""

from __future__ import annotations

import math

import pytest

from contract.knobs import (
    MAX_BATCH_KEY,
    MAX_DRAFT_KEY,
    MIN_CONFIDENCE_KEY,
    STOCK,
    RequestKnobs,
    effective_draft_len,
    parse_knobs,
    step_draft_len,
)


@pytest.mark.parametrize("extra", [None, {}, {"kv_transfer_params": {"x": 1}}, "not-a-mapping", ["list"]])
def test_requests_without_keys_are_stock(extra):
    knobs = parse_knobs(extra)
    assert knobs is STOCK
    assert knobs.is_stock and knobs.errors == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (1, 1), (8, 8), (3.0, 3), ("2", 2), (" 4 ", 4), ("+5", 5), (10_000, 10_000)],
)
def test_max_draft_accepts_non_negative_integers(value, expected):
    knobs = parse_knobs({MAX_DRAFT_KEY: value})
    assert knobs == RequestKnobs(max_draft=expected)


@pytest.mark.parametrize("value", [-1, -0.5, 2.5, "two", "", "-3", True, False, None, [1], {"k": 1}, math.nan, math.inf])
def test_max_draft_rejects_invalid_values_without_raising(value):
    knobs = parse_knobs({MAX_DRAFT_KEY: value})
    assert knobs.max_draft is None  # ignored -> stock behaviour
    assert len(knobs.errors) == 1 and MAX_DRAFT_KEY in knobs.errors[0]


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (1, 1.0), (0.3, 0.3), ("0.6", 0.6), (0.0, 0.0)])
def test_min_confidence_accepts_unit_interval(value, expected):
    assert parse_knobs({MIN_CONFIDENCE_KEY: value}).min_confidence == expected


@pytest.mark.parametrize("value", [-0.01, 1.01, 2, "high", True, None, math.nan, math.inf, [0.5]])
def test_min_confidence_rejects_out_of_range(value):
    knobs = parse_knobs({MIN_CONFIDENCE_KEY: value})
    assert knobs.min_confidence is None
    assert len(knobs.errors) == 1 and MIN_CONFIDENCE_KEY in knobs.errors[0]


def test_one_bad_knob_does_not_void_the_other():
    knobs = parse_knobs({MAX_DRAFT_KEY: 2, MIN_CONFIDENCE_KEY: 7})
    assert knobs.max_draft == 2 and knobs.min_confidence is None and len(knobs.errors) == 1


def test_effective_draft_len():
    assert effective_draft_len(4, STOCK) == 4
    assert effective_draft_len(4, RequestKnobs(max_draft=0)) == 0
    assert effective_draft_len(4, RequestKnobs(max_draft=2)) == 2
    assert effective_draft_len(1, RequestKnobs(max_draft=2)) == 1  # a cap never adds drafts


def test_max_batch_switches_drafting_off_above_the_threshold():
    knobs = parse_knobs({MAX_BATCH_KEY: 32, MAX_DRAFT_KEY: 3})
    assert knobs.max_batch == 32 and not knobs.is_stock
    assert knobs.cap_at(32) == 3 and knobs.cap_at(33) == 0
    assert parse_knobs({MAX_BATCH_KEY: "16"}).cap_at(8) is None  # uncapped below the threshold
    assert effective_draft_len(4, parse_knobs({MAX_BATCH_KEY: 16}), batch=17) == 0
    assert step_draft_len([k.cap_at(40) for k in (knobs, knobs)], 8) == 0
    bad = parse_knobs({MAX_BATCH_KEY: -1, MAX_DRAFT_KEY: 2})
    assert bad.max_batch is None and bad.max_draft == 2 and MAX_BATCH_KEY in bad.errors[0]


def test_gateway_policy_xargs_round_trip():
    """What the gateway sends (SpeculationPolicy.vllm_xargs) is what the plugin reads."""
    from contract.policy import SpeculationPolicy

    off = SpeculationPolicy(enabled=False)
    assert parse_knobs(off.vllm_xargs()) == RequestKnobs(max_draft=0)
    tuned = SpeculationPolicy(enabled=True, max_draft=3, min_confidence=0.4, max_batch=48)
    assert parse_knobs(tuned.vllm_xargs()) == RequestKnobs(max_draft=3, min_confidence=0.4, max_batch=48)


def test_step_draft_len_is_the_largest_cap_unless_someone_is_uncapped():
    assert step_draft_len([0, 0, 0], 4) == 0  # nobody may draft: the drafter is skipped
    assert step_draft_len([0, 2, 1], 4) == 2
    assert step_draft_len([0, None, 1], 4) == 4
    assert step_draft_len([0, 9], 4) == 4  # a cap above K is stock
    assert step_draft_len([0, 0], 0) == 0  # no speculation configured


def test_a_k0_step_skips_the_drafter_only_where_the_replica_says_so():
    from contract.knobs import K0_SKIP_NGRAM, K0_SKIP_V1_DFLASH, K0_SKIP_V2_DFLASH, k0_skips_drafter

    expand = "expand_batch_to_tokens"
    assert k0_skips_drafter("dspark", {expand, K0_SKIP_V2_DFLASH})
    assert not k0_skips_drafter("dspark", {expand})  # the plugin did not verify the sources: stock pass
    assert not k0_skips_drafter("dspark", {K0_SKIP_V1_DFLASH, K0_SKIP_NGRAM})  # DSpark runs on the V2 runner
    assert k0_skips_drafter("dflash", {K0_SKIP_V1_DFLASH}) and k0_skips_drafter("ngram", {K0_SKIP_NGRAM})
    assert not k0_skips_drafter("eagle3", {K0_SKIP_NGRAM, K0_SKIP_V1_DFLASH, K0_SKIP_V2_DFLASH})  # its forward writes the draft KV
    assert not k0_skips_drafter("eagle3", None)
    assert k0_skips_drafter("dspark", None)  # nothing reported: the plugin's skip taken as in force
    assert k0_skips_drafter("off", frozenset()) and k0_skips_drafter(None, frozenset())  # nothing to skip
