"""The rollout rule (controller/decision/rollout.py) on simulated replica metrics.

SIMULATION: each arm's requests are drawn from a noisy model of speculative
decoding -- a per-request acceptance rate (prompts differ: Beta-distributed
around the drafter's mean), a number of verification steps, accepted drafts
per step binomial in that rate, completion tokens = steps + accepted, and a
request duration = steps x the arm's step time (x lognormal noise). Each
request becomes the gateway's counter increments through
`contract.telemetry.increments_for`, summed as Redis would sum them, and the
rule reads only those counters.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from contract.settings import RolloutSettings
from contract.telemetry import RequestSpecStats, increments_for
from controller.decision.rollout import ArmStats, judge, t_quantile, welch

CFG = RolloutSettings(min_requests=30, confidence=0.95, min_gain=0.0, max_goodput_loss=0.10, max_duration_s=3600)


def simulate(n: int, rate: float, seed: int, *, block: int = 8, step_ms: float = 20.0, timed: bool = True,
             spread: float = 20.0) -> tuple[ArmStats, list[float]]:
    """n requests of one arm -> (ArmStats from summed counters, per-request acceptance lengths)."""
    rng = random.Random(seed)
    counters: dict[str, float] = {}
    lengths = []
    for _ in range(n):
        p = rng.betavariate(rate * spread, (1 - rate) * spread)  # this prompt's acceptance rate
        steps = rng.randint(8, 40)
        accepted = 0
        for _ in range(steps):  # a draft is accepted up to its first rejection
            k = 0
            while k < block and rng.random() < p:
                k += 1
            accepted += k
        completion = steps + accepted
        duration = steps * step_ms / 1000 * math.exp(rng.gauss(0, 0.1)) if timed else None
        stats = RequestSpecStats(prompt_tokens=rng.randint(20, 200), completion_tokens=completion, num_spec_steps=steps,
                                 num_draft_tokens=steps * block, num_accepted_draft_tokens=accepted, duration_s=duration)
        lengths.append(1 + accepted / steps)
        for k, v in increments_for(stats).items():
            counters[k] = counters.get(k, 0.0) + v
    return ArmStats.from_counters(counters), lengths


def test_promotes_a_clearly_better_drafter():
    candidate, _ = simulate(60, 0.75, seed=1)  # a drafter trained on the tenant's traffic
    incumbent, _ = simulate(180, 0.55, seed=2)  # the generic one
    v = judge(candidate, incumbent, CFG, elapsed_s=600)
    assert v.verdict == "promote", v.reason
    assert v.numbers["lower"] > 0 and v.numbers["goodput"] == "ok"
    assert "acceptance" in v.reason and "goodput" in v.reason and "\n" not in v.reason


def test_rolls_back_a_worse_drafter():
    candidate, _ = simulate(60, 0.45, seed=3)
    incumbent, _ = simulate(180, 0.55, seed=4)
    v = judge(candidate, incumbent, CFG, elapsed_s=600)
    assert v.verdict == "rollback", v.reason
    assert v.numbers["upper"] < 0 and v.reason.startswith("candidate not better")


def test_min_gain_asks_for_a_gain_that_matters():
    candidate, _ = simulate(200, 0.60, seed=5)
    incumbent, _ = simulate(200, 0.55, seed=6)
    assert judge(candidate, incumbent, CFG, elapsed_s=600).verdict == "promote"
    # A gain well below 1 token per step that is still significant is not worth a drafter:
    strict = CFG.model_copy(update={"min_gain": 1.0})
    v = judge(candidate, incumbent, strict, elapsed_s=600)
    assert v.verdict == "rollback" and v.numbers["upper"] < 1.0, v.reason


def test_waits_below_min_requests_even_when_clearly_better():
    candidate, _ = simulate(29, 0.85, seed=7)
    incumbent, _ = simulate(500, 0.40, seed=8)
    v = judge(candidate, incumbent, CFG, elapsed_s=600)
    assert v.verdict == "wait" and "need 30 per arm" in v.reason, v.reason
    candidate, _ = simulate(30, 0.85, seed=7)
    assert judge(candidate, incumbent, CFG, elapsed_s=600).verdict == "promote"


def test_an_undecided_canary_is_rolled_back_at_max_duration():
    same, _ = simulate(100, 0.6, seed=9)  # two arms with identical requests: the difference is exactly 0
    v = judge(same, same, CFG, elapsed_s=3599)
    assert v.verdict == "wait" and v.reason.startswith("not yet significant"), v.reason
    v = judge(same, same, CFG, elapsed_s=3601)
    assert v.verdict == "rollback" and "max_duration" in v.reason, v.reason
    # ... and so is one that never gathered enough traffic.
    few, _ = simulate(5, 0.9, seed=10)
    assert judge(few, same, CFG, elapsed_s=100).verdict == "wait"
    assert judge(few, same, CFG, elapsed_s=3601).verdict == "rollback"


def test_goodput_allowance():
    incumbent, _ = simulate(200, 0.55, seed=11, step_ms=20.0)
    # Accepted far more (1.7x tokens per step), but each step costs 2.2x (a much
    # bigger drafter): fewer tokens per second.
    dear, _ = simulate(100, 0.75, seed=12, step_ms=44.0)
    v = judge(dear, incumbent, CFG, elapsed_s=600)
    assert v.numbers["lower"] > 0  # acceptance alone would promote it
    assert v.verdict == "rollback" and v.reason.startswith("candidate's goodput too low"), v.reason
    assert v.numbers["goodput_ratio"] < 0.9
    # A slightly dearer step that the acceptance gain pays for is promoted; so is a
    # small loss inside the allowance.
    fair, _ = simulate(100, 0.75, seed=12, step_ms=24.0)
    v = judge(fair, incumbent, CFG, elapsed_s=600)
    assert v.verdict == "promote", v.reason
    lossy, _ = simulate(100, 0.75, seed=12, step_ms=36.0)
    v = judge(lossy, incumbent, CFG, elapsed_s=600)
    ratio = v.numbers["goodput_ratio"]
    assert 0.9 <= ratio < 1.0 and v.verdict == "promote", v.reason
    tight = CFG.model_copy(update={"max_goodput_loss": 0.0})
    assert judge(lossy, incumbent, tight, elapsed_s=600).verdict == "rollback"


def test_goodput_unmeasured_does_not_block_but_pending_does():
    candidate, _ = simulate(60, 0.75, seed=13, timed=False)
    incumbent, _ = simulate(180, 0.55, seed=14, timed=False)
    v = judge(candidate, incumbent, CFG, elapsed_s=600)
    assert v.verdict == "promote" and "goodput not measured" in v.reason
    timed_inc, _ = simulate(180, 0.55, seed=14)  # only the incumbent's gateway times requests so far
    v = judge(candidate, timed_inc, CFG, elapsed_s=600)
    assert v.verdict == "wait" and "goodput pending" in v.reason, v.reason


def test_counter_sums_give_the_per_request_mean_and_variance():
    arm, lengths = simulate(50, 0.6, seed=15)
    assert arm.n == 50
    assert arm.mean == pytest.approx(statistics.fmean(lengths), rel=1e-12)
    assert arm.variance == pytest.approx(statistics.variance(lengths), rel=1e-9)


def test_welch_matches_the_textbook_formula():
    a, la = simulate(40, 0.7, seed=16)
    b, lb = simulate(90, 0.5, seed=17)
    cmp = welch(a, b, 0.95)
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    assert cmp.df == pytest.approx(df, rel=1e-9)
    assert cmp.se == pytest.approx(math.sqrt(va + vb), rel=1e-9)
    assert cmp.lower == pytest.approx(statistics.fmean(la) - statistics.fmean(lb) - cmp.t * math.sqrt(va + vb), rel=1e-9)


# Student's t quantiles from the standard table (e.g. NIST/SEMATECH e-Handbook, 1.3.6.7.2).
T_TABLE = {
    (0.95, 1): 6.314, (0.95, 2): 2.920, (0.95, 3): 2.353, (0.95, 5): 2.015, (0.95, 10): 1.812, (0.95, 30): 1.697,
    (0.975, 3): 3.182, (0.975, 10): 2.228, (0.975, 30): 2.042, (0.99, 3): 4.541, (0.99, 10): 2.764, (0.99, 30): 2.457,
    (0.90, 4): 1.533, (0.90, 100): 1.290,
}


@pytest.mark.parametrize("p, df", sorted(T_TABLE))
def test_t_quantile_matches_the_table(p, df):
    assert t_quantile(p, df) == pytest.approx(T_TABLE[(p, df)], rel=0.004, abs=0.001)


def test_t_quantile_below_three_degrees_of_freedom_is_conservative():
    # Between the tabulated 1 and 2 (and 2 and 3), the exact value at the lower integer is used: never smaller.
    assert t_quantile(0.95, 1.5) == pytest.approx(6.314, rel=1e-3)
    assert t_quantile(0.95, 2.7) == pytest.approx(2.920, rel=1e-3)
    assert t_quantile(0.95, math.inf) == pytest.approx(1.6449, rel=1e-4)
