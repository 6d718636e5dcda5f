"""testbed.phases: one phase type, laid end to end."""

from __future__ import annotations

from testbed.phases import Phase, lay_out, phase_at


def test_lay_out_puts_phases_end_to_end_and_numbers_them():
    light, heavy, again = lay_out(
        [Phase("light", 10.0, rate=1.0), Phase("heavy", 20.0, concurrency=128, settle_s=5.0), Phase("light", 10.0)]
    )
    assert (light.start_s, light.end_s, light.label) == (0.0, 10.0, "1 light")
    assert (heavy.start_s, heavy.end_s, heavy.measure_s, heavy.label) == (10.0, 30.0, 15.0, "2 heavy")
    assert (again.start_s, again.label) == (30.0, "3 light")
    assert phase_at(29.9, [light, heavy, again]) is heavy
    assert phase_at(40.0, [light, heavy, again]) is None


def test_a_phase_not_laid_out_is_named_plainly():
    assert Phase("alone", 50.0, concurrency=8, settle_s=10.0).label == "alone"
