"""testbed.crossover: the A/B crossover ratios bench/real_ab.py reports, on blocks whose
answer is known."""

from __future__ import annotations

import math
import random

import pytest

from testbed.crossover import Block, crossover_ratios, fmt_ratio, geometric_mean, worst_case


def blocks(baseline: str, ratio: float, replica_effect: float, pairs: int, noise: float, rng: random.Random) -> list[Block]:
    """Pairs of blocks (policy on the first replica, then on the second) where the policy
    is `ratio` times the baseline and the first replica `replica_effect` times the second."""
    out = []
    for _ in range(pairs):
        for side in (1, -1):
            base = 100.0 * math.exp(rng.gauss(0, noise))
            policy_replica, reference_replica = (replica_effect, 1.0) if side == 1 else (1.0, replica_effect)
            out.append(Block(baseline, side, base * ratio * policy_replica, base * reference_replica * math.exp(rng.gauss(0, noise))))
    return out


def test_the_replica_effect_cancels_and_each_baseline_gets_its_ratio():
    rng = random.Random(1)
    data = blocks("off", 1.10, 1.5, 3, 0.0, rng) + blocks("table", 0.95, 1.5, 3, 0.0, rng)
    got = crossover_ratios(data)
    assert got["off"].ratio == pytest.approx(1.10)
    assert got["table"].ratio == pytest.approx(0.95)
    # noise-free blocks: the interval shrinks onto the estimate
    assert got["off"].low == pytest.approx(1.10) and got["off"].high == pytest.approx(1.10)
    assert got["off"].blocks == 6 and got["off"].df == 12 - 3


def test_the_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = random.Random(7)
    covered = 0
    trials = 400
    for _ in range(trials):
        data = blocks("off", 1.05, 1.3, 2, 0.08, rng) + blocks("on", 1.20, 1.3, 2, 0.08, rng)
        r = crossover_ratios(data)["off"]
        covered += r.low <= 1.05 <= r.high
    assert 0.90 <= covered / trials <= 0.99


def test_without_residual_freedom_there_is_an_estimate_and_no_interval():
    got = crossover_ratios([Block("off", 1, 110.0, 100.0), Block("off", -1, 120.0, 100.0)])["off"]
    assert got.df == 0 and got.low is None and got.high is None
    assert got.ratio == pytest.approx(math.sqrt(1.1 * 1.2))
    assert "no interval" in fmt_ratio(got)


def test_blocks_without_throughput_are_left_out():
    data = [Block("off", 1, 0.0, 100.0), Block("off", 1, 110.0, 100.0), Block("off", 1, 110.0, 100.0)]
    got = crossover_ratios(data)["off"]
    assert got.blocks == 2 and got.ratio == pytest.approx(1.1)


def test_the_best_static_is_the_baseline_the_policy_compares_worst_against():
    rng = random.Random(3)
    ratios = crossover_ratios(blocks("off", 1.10, 1.0, 2, 0.02, rng) + blocks("table", 0.97, 1.0, 2, 0.02, rng))
    assert worst_case(ratios, ["off", "table", "absent"]).baseline == "table"
    assert worst_case(ratios, ["absent"]) is None


def test_the_geometric_mean_of_independent_segments():
    rng = random.Random(5)
    light = crossover_ratios(blocks("table", 1.21, 1.2, 3, 0.01, rng))["table"]
    heavy = crossover_ratios(blocks("table", 1.00, 1.2, 3, 0.01, rng))["table"]
    mean = geometric_mean([light, heavy])
    assert mean.ratio == pytest.approx(1.1, rel=0.02)
    assert mean.low < mean.ratio < mean.high
