"""PlanGate: a fleet-plan restart must pay back the capacity it costs."""

from __future__ import annotations

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


def test_a_regime_that_keeps_changing_never_pays_back():
    # The recommendation alternates every 100 s (a +20 % gain needs 150 s of stability).
    gate = PlanGate(restart_s=30.0)
    assert first_action_time(gate, lambda t: {"r0": ("off" if int(t // 100) % 2 else "dspark-b4-av", 1.2)}) is None


def test_one_restart_at_a_time_and_none_while_busy():
    gate = PlanGate(restart_s=30.0)
    regimes = {n: regime(n, "dspark-b8-av", "off", 2.0) for n in ("r0", "r1")}
    assert gate.actions(regimes, 0.0) == []
    assert gate.actions(regimes, 40.0, busy={"r9"}) == []  # another replica is restarting
    assert gate.actions(regimes, 41.0) == [("r0", "off")]
    assert gate.actions(regimes, 42.0) == [("r1", "off")]
    # r0 again (its restart is not visible in this test's regimes): the per-replica interval holds it back.
    assert gate.actions(regimes, 100.0) == []
