"""`specgate_schedule`: the per-request batch -> draft-length schedule (contract.knobs),
one definition for the plugin, the simulator, the gateway's merge and the policy model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.knobs import (
    MAX_DRAFT_KEY,
    SCHEDULE_KEY,
    STOCK,
    KnobError,
    RequestKnobs,
    cap_at,
    compact_schedule,
    flat_schedule,
    lower_schedule,
    merged_xargs,
    parse_knobs,
    schedule_cap,
    schedule_envelope,
    step_draft_len,
    validate_client_xargs,
)
from contract.policy import SpeculationPolicy

ALL = frozenset({"max_draft", "max_batch", "schedule"})


def test_the_first_pair_at_or_above_the_batch_decides_and_nothing_drafts_above_the_last():
    schedule = ((4, 8), (16, 3), (64, 1))
    assert [schedule_cap(schedule, b) for b in (1, 4, 5, 16, 17, 64, 65, 1000)] == [8, 8, 3, 3, 1, 1, 0, 0]


def test_the_wire_form_is_a_flat_list_and_parses_leniently_like_the_other_counts():
    knobs = parse_knobs({SCHEDULE_KEY: [4, 8, "16", 3.0]})
    assert knobs == RequestKnobs(schedule=((4, 8), (16, 3))) and not knobs.is_stock
    assert flat_schedule(knobs.schedule) == [4, 8, 16, 3]
    assert knobs.cap_at(3) == 8 and knobs.cap_at(10) == 3 and knobs.cap_at(17) == 0


@pytest.mark.parametrize("bad", [
    [], [4], [4, 8, 16], [[4, 8]], "4,8", 4, [0, 3], [4, 8, 4, 2], [8, 2, 4, 3], [4, -1], [4, 65], [4, 2.5],
    [4, "x"], [True, 2], [1 << 17, 1], list(range(1, 131)) + [0, 1],
])  # fmt: skip
def test_an_invalid_schedule_is_reported_and_ignored_by_the_engine(bad):
    knobs = parse_knobs({SCHEDULE_KEY: bad, MAX_DRAFT_KEY: 2})
    assert knobs.schedule is None and knobs.max_draft == 2  # the other knob still holds
    assert len(knobs.errors) == 1 and SCHEDULE_KEY in knobs.errors[0]


@pytest.mark.parametrize("bad", [
    [], [4], [4, 8, 16], [[4, 8]], "4,8", [0, 3], [4, 8, 4, 2], [4, -1], [4, 65], [4, 2.5], [4, "2"], [True, 2],
])  # fmt: skip
def test_the_gateway_rejects_an_invalid_schedule_naming_the_field(bad):
    with pytest.raises(KnobError) as exc:
        validate_client_xargs({SCHEDULE_KEY: bad})
    assert exc.value.param == "vllm_xargs.specgate_schedule"
    assert "specgate_schedule" in str(exc.value)


def test_max_draft_and_max_batch_are_the_one_pair_case_and_further_caps():
    for batch in (1, 8, 32, 33, 100):
        assert cap_at(3, 32, batch) == cap_at(None, None, batch, ((32, 3),))
    # Beside a schedule they cap it further: the smallest cap wins.
    assert cap_at(2, None, 1, ((4, 8),)) == 2
    assert cap_at(None, 2, 3, ((4, 8),)) == 0
    assert cap_at(None, None, 5, ((4, 8),)) == 0


def test_compact_keeps_the_step_function_with_the_fewest_pairs():
    assert compact_schedule([(2, 8), (4, 8), (8, 3), (16, 0), (32, 0)]) == ((4, 8), (8, 3))
    assert compact_schedule([(4, 0), (8, 0)]) == ((8, 0),)  # "never" keeps one pair


schedules = st.lists(st.tuples(st.integers(1, 300), st.integers(0, 12)), min_size=1, max_size=8).map(
    lambda pairs: tuple(sorted({b: k for b, k in pairs}.items())))


@given(schedules, schedules)
def test_lower_is_the_pointwise_minimum_and_the_envelope_never_caps_below(a, b):
    low = lower_schedule(a, b)
    for batch in range(1, 310):
        assert schedule_cap(low, batch) == min(schedule_cap(a, batch), schedule_cap(b, batch))
        env_draft, env_batch = schedule_envelope(a)
        assert cap_at(env_draft, env_batch, batch, a) == schedule_cap(a, batch)
        assert schedule_cap(compact_schedule(a), batch) == schedule_cap(a, batch)


def test_a_step_drafts_the_largest_scheduled_cap():
    greedy, sampled = parse_knobs({SCHEDULE_KEY: [8, 6, 32, 2]}), parse_knobs({SCHEDULE_KEY: [4, 1]})
    assert step_draft_len([greedy.cap_at(3), sampled.cap_at(3)], 8) == 6
    assert step_draft_len([greedy.cap_at(20), sampled.cap_at(20)], 8) == 2
    assert step_draft_len([greedy.cap_at(40), sampled.cap_at(40)], 8) == 0


def test_the_policy_sends_its_schedule_with_the_envelope_for_older_plugins():
    policy = SpeculationPolicy.model_validate({"schedule": [[4, 8], [16, 3], [48, 0]]})
    xargs = policy.vllm_xargs()
    assert xargs == {"specgate_max_draft": 8, "specgate_max_batch": 16, SCHEDULE_KEY: [4, 8, 16, 3, 48, 0]}
    assert parse_knobs(xargs) == RequestKnobs(max_draft=8, max_batch=16, schedule=((4, 8), (16, 3), (48, 0)))
    # A replica whose plugin predates schedules gets the envelope only.
    assert merged_xargs(None, policy, frozenset({"max_draft", "max_batch"})) == {
        "specgate_max_draft": 8, "specgate_max_batch": 16}
    # An admin's tighter max_draft still caps the schedule.
    assert SpeculationPolicy(max_draft=2, schedule=((4, 8),)).vllm_xargs()["specgate_max_draft"] == 2
    assert SpeculationPolicy(enabled=False, schedule=((4, 8),)).vllm_xargs() == {"specgate_max_draft": 0}


@pytest.mark.parametrize("bad", [[], [[4, 8], [4, 3]], [[0, 2]], [[4, 99]], [[4]]])
def test_the_policy_model_rejects_what_the_gateway_would(bad):
    with pytest.raises(ValueError, match="schedule"):
        SpeculationPolicy.model_validate({"schedule": bad})


def test_a_client_schedule_only_lowers_the_policys_pointwise():
    policy = SpeculationPolicy(schedule=((4, 8), (16, 3)))
    merged = merged_xargs({SCHEDULE_KEY: [2, 12, 8, 2, 64, 6], "x": 1}, policy, ALL)
    assert merged[SCHEDULE_KEY] == [2, 8, 8, 2, 16, 3] and merged["x"] == 1
    assert merged["specgate_max_draft"] == 8 and merged["specgate_max_batch"] == 16
    # A client schedule under a policy without one is sent as asked (the policy's caps still apply).
    assert merged_xargs({SCHEDULE_KEY: [8, 4]}, SpeculationPolicy(max_draft=2), ALL) == {
        SCHEDULE_KEY: [8, 4], "specgate_max_draft": 2}
    # The schedule is only sent to replicas that advertise it.
    assert SCHEDULE_KEY not in merged_xargs(None, policy, frozenset({"max_draft", "max_batch"}))


def test_the_largest_cap_is_the_most_any_step_may_draft():
    assert STOCK.largest_cap() is None
    assert parse_knobs({"specgate_max_draft": 5}).largest_cap() == 5
    assert parse_knobs({"specgate_max_batch": 8}).largest_cap() is None  # uncapped at or below 8
    assert parse_knobs({"specgate_max_batch": 0}).largest_cap() == 0
    assert parse_knobs({"specgate_schedule": [4, 8, 16, 3]}).largest_cap() == 8
    assert parse_knobs({"specgate_schedule": [4, 8, 16, 3], "specgate_max_draft": 6}).largest_cap() == 6
    assert parse_knobs({"specgate_schedule": [4, 0]}).largest_cap() == 0
