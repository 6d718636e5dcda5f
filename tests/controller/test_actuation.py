"""PlanGate: a fleet-plan restart must pay back the capacity it costs."""

from __future__ import annotations

import pytest

from controller.actuation import PlanGate
from controller.decision import ReplicaRegime


def regime(name: str, profile: str, recommended: str, gain: float) -> ReplicaRegime:
    return ReplicaRegime(name, profile, 32.0, 100.0, 200.0, 0.5, "transition", 3.0, 1000.0, recommended, gain)


def first_action_time(gate: PlanGate, plan, until: float = 3600.0) -> float | None:
    """Tick once a second with `plan(t)` (replica -> (recommended, gain)); when the first restart fires."""
    t = 0.0
    while t <= until:
        regimes = {n: regime(n, "dspark-b8-av", rec, g) for n, (rec, g) in plan(t).items()}
        if gate.actions(regimes, t):
            return t
        t += 1.0
    return None


def test_the_wait_scales_with_the_predicted_gain():
    # (gain - 1) * streak >= restart_s: +50 % -> 60 s, +10 % -> 300 s, +5 % -> 600 s.
    for gain, expected in [(1.5, 60.0), (1.1, 300.0), (1.05, 600.0)]:
        gate = PlanGate(restart_s=30.0)
        assert first_action_time(gate, lambda t: {"r0": ("off", gain)}) == expected, gain


def test_a_strong_recommendation_still_waits_the_minimum_confirmation():
    gate = PlanGate(restart_s=30.0, min_confirm_s=30.0)
    assert first_action_time(gate, lambda t: {"r0": ("off", 5.0)}) == 30.0


def test_below_min_gain_never_restarts():
    gate = PlanGate(restart_s=30.0, min_gain=1.05)
    assert first_action_time(gate, lambda t: {"r0": ("off", 1.04)}) is None
    # ... on average: a gain hovering around the margin is judged by its mean.
    gate = PlanGate(restart_s=30.0, min_gain=1.05)
    assert first_action_time(gate, lambda t: {"r0": ("off", 1.06 if t % 2 else 1.02)}) is None


def test_a_regime_that_keeps_changing_never_pays_back():
    # The recommendation alternates every 100 s (a +20 % gain needs 150 s of stability).
    gate = PlanGate(restart_s=30.0)
    assert first_action_time(gate, lambda t: {"r0": ("off" if int(t // 100) % 2 else "dspark-b4-av", 1.2)}) is None


def test_one_restart_at_a_time_and_none_while_busy():
    gate = PlanGate(restart_s=30.0)  # gain 2.0 at full loss: 30 s of credit
    regimes = {n: regime(n, "dspark-b8-av", "off", 2.0) for n in ("r0", "r1")}
    for t in range(0, 30):
        assert gate.actions(regimes, float(t), busy={"r9"} if t >= 25 else frozenset()) == []
    # Busy from 25 s (another replica restarting): no credit earned, none lost.
    # 24 s of credit before, 5 s frozen: 6 more seconds.
    for t in range(30, 35):
        assert gate.actions(regimes, float(t)) == [], t
    assert gate.actions(regimes, 35.0) == [("r0", "off")]
    # The fleet-wide streak carries over: r1 follows on the next tick.
    assert gate.actions(regimes, 36.0) == [("r1", "off")]
    # r0 again (its restart is not visible in this test's regimes): the per-replica interval holds it back.
    assert gate.actions(regimes, 100.0) == []


def test_the_cost_of_downtime_follows_the_load():
    """A compute-bound fleet loses the whole replica (loss 1); an idle one is charged min_loss."""
    def wait(loss: float) -> float | None:
        gate = PlanGate(restart_s=30.0, min_loss=0.5)
        for t in range(0, 3600):
            r = ReplicaRegime("r0", "dspark-b8-av", 4.0, 10.0, 200.0, 0.1, "memory-bound", 3.0, 1000.0,
                              "dspark-b16-av", 1.1, loss)
            if gate.actions({"r0": r}, float(t)):
                return float(t)
        return None
    assert wait(1.0) == pytest.approx(300.0, abs=1.0)
    assert wait(0.5) == wait(0.05) == pytest.approx(150.0, abs=1.0)


def test_a_gain_dipping_below_the_margin_briefly_keeps_its_streak():
    gate = PlanGate(restart_s=30.0, grace_s=15.0)
    # 3 s of every 20 the plan keeps the current profile (its gain fell under the plan's margin).
    dips = lambda t: {"r0": ("dspark-b8-av", 1.0) if t % 20 < 3 else ("off", 1.1)}  # noqa: E731
    fired = first_action_time(gate, dips)
    assert fired is not None and fired < 400.0


def test_a_recommendation_gone_longer_than_the_grace_starts_over():
    gate = PlanGate(restart_s=30.0, grace_s=15.0)
    gone = lambda t: {"r0": ("dspark-b8-av", 1.0) if 200 <= t < 260 else ("off", 1.1)}  # noqa: E731
    assert first_action_time(gate, gone) == 560.0  # 260 s + 300 s of fresh credit
