"""Calibration points: fitted ones stay within tolerance (a change cannot silently
undo a fit); held-out ones are reported as they are (see drafters/calibration.py)."""

import math

import pytest

from drafters.calibration import ROLES, POINTS, CalibrationResult, evaluate_all, format_table, points


@pytest.mark.parametrize("point", points("fitted"), ids=lambda p: p.name)
def test_fitted_point_stays_fitted(point):
    r = CalibrationResult(point, float(point.predict()))
    assert r.ok, format_table([r])


def test_every_point_has_a_role_and_a_source_and_held_out_ones_are_printed_apart():
    assert {p.role for p in POINTS} == set(ROLES)
    assert all(p.source for p in POINTS)
    held_out = evaluate_all("held-out")
    assert len(held_out) >= 6 and all(math.isfinite(r.predicted) and r.predicted > 0 for r in held_out)
    text = format_table(evaluate_all())
    assert text.index("FITTED") < text.index("HELD OUT") < text.index("DERIVED")
    assert "held-out: median |error|" in text


def test_static_block7_stops_paying_by_c64():
    """The shape, not just the two ends: monotone fall from >3x to ~1x."""
    from drafters.acceptance import expected_tokens_per_step, get_preset
    from drafters.costmodel import get_gpu, get_model, static_speedup

    tau = expected_tokens_per_step(get_preset("gsm8k"), 7)
    sus = [static_speedup(get_gpu("h100"), get_model("qwen3-8b"), c, 400, 7, tau) for c in (1, 4, 16, 32, 64, 128)]
    assert all(b <= a * 1.01 for a, b in zip(sus, sus[1:]))  # flat while memory-bound, then falls
    assert sus[0] > 3.0 and 0.85 < sus[4] < 1.25 and sus[5] < 1.0
