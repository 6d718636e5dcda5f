"""Each published calibration point must stay within its stated tolerance (see drafters/calibration.py)."""

import pytest

from drafters.calibration import INFO_POINTS, POINTS, CalibrationResult, format_table


@pytest.mark.parametrize("point", POINTS + INFO_POINTS, ids=lambda p: p.name)
def test_calibration_point(point):
    r = CalibrationResult(point, float(point.predict()))
    assert r.ok, format_table([r])


def test_static_block7_stops_paying_by_c64():
    """The shape, not just the two ends: monotone fall from >3x to ~1x."""
    from drafters.acceptance import expected_tokens_per_step, get_preset
    from drafters.costmodel import get_gpu, get_model, static_speedup

    tau = expected_tokens_per_step(get_preset("gsm8k"), 7)
    sus = [static_speedup(get_gpu("h100"), get_model("qwen3-8b"), c, 400, 7, tau) for c in (1, 4, 16, 32, 64, 128)]
    assert all(b <= a * 1.01 for a, b in zip(sus, sus[1:]))  # flat while memory-bound, then falls
    assert sus[0] > 3.0 and 0.85 < sus[4] < 1.25 and sus[5] < 1.0
