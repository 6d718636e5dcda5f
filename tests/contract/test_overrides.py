"""`apply_override`: the one override rule, used by the decision and the admin API."""

from __future__ import annotations

import pytest

from contract.overrides import FleetShape, TenantOverride, apply_override
from contract.policy import SpeculationPolicy

DRAFTING = SpeculationPolicy(enabled=True, preferred_profile="dspark-b8", max_draft=8, min_confidence=0.3, max_batch=24)
OFF = SpeculationPolicy(enabled=False, max_draft=0)
FLEET = FleetShape(off_pool=True, max_block=8)


def test_no_override_or_a_noop_leaves_the_controller_s_choice():
    assert apply_override(DRAFTING, None) is None
    assert apply_override(DRAFTING, TenantOverride()) is None


def test_off_pin_turns_speculation_off_and_routes_to_the_off_pool_when_there_is_one():
    pinned = apply_override(DRAFTING, TenantOverride(mode="off"), FLEET)
    assert (pinned.enabled, pinned.max_draft, pinned.preferred_profile, pinned.source) == (False, 0, "off", "admin")
    assert apply_override(DRAFTING, TenantOverride(mode="off"), FleetShape(off_pool=False, max_block=8)).preferred_profile is None


def test_on_pin_drafts_at_any_load_inside_the_bounds():
    pinned = apply_override(OFF, TenantOverride(mode="on", max_draft_max=4, min_confidence_min=0.2), FLEET)
    assert pinned.enabled and pinned.max_draft == 4 and pinned.min_confidence == 0.2 and pinned.max_batch is None
    on = apply_override(DRAFTING, TenantOverride(mode="on"), FLEET)
    assert on.max_draft == 8 and on.max_batch is None  # pinned on: no load threshold


def test_bounds_clamp_and_keep_the_load_threshold():
    pinned = apply_override(DRAFTING, TenantOverride(max_draft_max=4, min_confidence_max=0.1), FLEET)
    assert (pinned.max_draft, pinned.min_confidence, pinned.max_batch) == (4, 0.1, 24)
    assert apply_override(OFF, TenantOverride(max_draft_min=2), FLEET) is None  # bounds do not turn a tenant on


@pytest.mark.parametrize("fleet, expected", [(FleetShape(max_block=16), 16), (FleetShape(), 20)])
def test_a_cap_never_exceeds_the_largest_live_block(fleet, expected):
    assert apply_override(DRAFTING, TenantOverride(mode="on", max_draft_min=20), fleet).max_draft == expected


def test_an_on_pin_with_no_drafting_replica_leaves_the_tenant_off():
    assert apply_override(OFF, TenantOverride(mode="on"), FleetShape(off_pool=True, max_block=0)) is None


def test_fleet_shape_from_profile_labels():
    assert FleetShape.of_profiles(["dspark-b8", "off", None, "dspark-b16-av"]) == FleetShape(off_pool=True, max_block=16)
    assert FleetShape.of_profiles([None]) == FleetShape()


def test_bounds_clamp_a_schedule_but_keep_where_it_stops_and_an_on_pin_drops_it():
    scheduled = DRAFTING.model_copy(update={"schedule": ((4, 8), (16, 3), (64, 0))})
    bounded = apply_override(scheduled, TenantOverride(max_draft_max=4, max_draft_min=2), FLEET)
    assert bounded.schedule == ((4, 4), (16, 3))  # 8 clamped to 4; 0 above 16 stays a stop
    assert apply_override(scheduled, TenantOverride(mode="on"), FLEET).schedule is None
