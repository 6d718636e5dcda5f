"""SpeculationPolicy: the cap it gives a request at a batch, as the engine looks it up."""

from __future__ import annotations

import pytest

from contract.policy import ProbeSpec, SpeculationPolicy


@pytest.mark.parametrize("policy, batch, expected", [
    (SpeculationPolicy(), 64, None),  # uncapped: the replica's block
    (SpeculationPolicy(enabled=False, max_draft=0), 1, 0),
    (SpeculationPolicy(enabled=False), 1, 0),  # off whatever its caps say
    (SpeculationPolicy(max_draft=4), 512, 4),
    (SpeculationPolicy(max_draft=4, max_batch=16), 16, 4),
    (SpeculationPolicy(max_draft=4, max_batch=16), 17, 0),
    (SpeculationPolicy(max_draft=8, schedule=((1, 0), (8, 8), (24, 2))), 1, 0),
    (SpeculationPolicy(max_draft=8, schedule=((1, 0), (8, 8), (24, 2))), 6, 8),
    (SpeculationPolicy(max_draft=8, schedule=((1, 0), (8, 8), (24, 2))), 24, 2),
    (SpeculationPolicy(max_draft=8, schedule=((1, 0), (8, 8), (24, 2))), 25, 0),
    (SpeculationPolicy(max_draft=4, schedule=((8, 8),)), 2, 4),  # the smaller of cap and schedule
])
def test_cap_at_is_the_engines_lookup(policy, batch, expected):
    assert policy.cap_at(batch) == expected


def test_the_probe_arm_is_looked_up_by_its_own_schedule():
    off = SpeculationPolicy(enabled=False, max_draft=0, probe=ProbeSpec(share=0.05, schedule=((4, 8),)))
    assert off.cap_at(2) == 0 and off.probe_arm().cap_at(2) == 8 and off.probe_arm().cap_at(5) == 0
