"""PlanGate: a fleet-plan restart must pay back the capacity it costs; GatedActuator: the gate in
front of a restart action, the one restart path of the shipped controller and of the benchmark."""

from __future__ import annotations

import pytest

from contract.keys import FLEET_PLAN_KEY
from contract.settings import RestartGateSettings, Settings
from contract.store.memory import MemoryStore
from controller.actuation import GatedActuator, NoopRestart, PlanGate, default_actuator, store_fleet_plan
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
    # No regime seen to end yet: the Lindy guess (as long again) must pay the restart and the
    # way back, (gain - 1) * streak >= 2 x restart_s: +50 % -> 120 s, +10 % -> 600 s, +5 % -> 1200 s.
    for gain, expected in [(1.5, 120.0), (1.1, 600.0), (1.05, 1200.0)]:
        gate = PlanGate(restart_s=30.0)
        # (to the tick: the credit is summed a tick at a time)
        assert first_action_time(gate, lambda t: {"r0": ("off", gain)}) == pytest.approx(expected, abs=1.0), gain


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
    gate = PlanGate(restart_s=30.0)  # gain 2.0 at full loss: 60 s of credit (the restart and the way back)
    regimes = {n: regime(n, "dspark-b8-av", "off", 2.0) for n in ("r0", "r1")}
    for t in range(0, 30):
        assert gate.actions(regimes, float(t), busy={"r9"} if t >= 25 else frozenset()) == []
    # Busy from 25 s (another replica restarting): no credit earned, none lost.
    # 24 s of credit before, 5 s frozen: 36 more seconds.
    for t in range(30, 65):
        assert gate.actions(regimes, float(t)) == [], t
    assert gate.actions(regimes, 65.0) == [("r0", "off")]
    # The fleet-wide streak carries over: r1 follows on the next tick.
    assert gate.actions(regimes, 66.0) == [("r1", "off")]
    # r0 again (its restart is not visible in this test's regimes): the per-replica interval holds it back.
    assert gate.actions(regimes, 130.0) == []


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
    assert wait(1.0) == pytest.approx(600.0, abs=1.0)
    assert wait(0.5) == wait(0.05) == pytest.approx(300.0, abs=1.0)


def test_a_gain_dipping_below_the_margin_briefly_keeps_its_streak():
    gate = PlanGate(restart_s=30.0, grace_s=15.0)
    # 3 s of every 20 the plan keeps the current profile (its gain fell under the plan's margin).
    dips = lambda t: {"r0": ("dspark-b8-av", 1.0) if t % 20 < 3 else ("off", 1.1)}  # noqa: E731
    fired = first_action_time(gate, dips)
    assert fired is not None and fired < 700.0  # 600 s without dips


def test_a_recommendation_gone_longer_than_the_grace_starts_over():
    gate = PlanGate(restart_s=30.0, grace_s=15.0)
    gone = lambda t: {"r0": ("dspark-b8-av", 1.0) if 200 <= t < 260 else ("off", 1.1)}  # noqa: E731
    # A fresh streak from 260 s; its credit would pay one downtime at 560 s, but the 200-s
    # regime seen to end charges the way back too: 0.1 x (streak / 2) >= 2 x 30 s at a 1200-s streak.
    assert first_action_time(gate, gone) == pytest.approx(1460.0, abs=1.0)
    without_history = PlanGate(restart_s=30.0, grace_s=15.0)
    assert first_action_time(without_history, lambda t: {"r0": ("off", 1.1)}) == 600.0


def test_where_regimes_are_seen_to_end_a_restart_must_also_pay_for_the_way_back():
    """Two regimes of 120 s ended unacted (+10 % each: too little to restart), then `off`
    at +58 %: alone that pays one downtime back in 52 s, but the regimes seen say this one
    will likely end as they did, too soon to pay for going and coming back, so the gate
    waits; a regime that outlasts every one seen is judged by the Lindy guess with the
    chance 1 / 3 that it is unlike them: restart once 0.58 x streak / 3 >= 2 x 30 s."""
    def phases(until_off: float):
        def plan(t: float) -> dict:
            if t < 120:
                return {"r0": ("dspark-b16", 1.1)}
            if t < 240:
                return {"r0": ("dspark-b4-av", 1.1)}
            return {"r0": ("off", 1.58)} if t < until_off else {"r0": ("dspark-b8-av", 1.0)}
        return plan

    assert first_action_time(PlanGate(restart_s=30.0), phases(360.0)) is None
    fired = first_action_time(PlanGate(restart_s=30.0), phases(3600.0))
    assert fired == 240.0 + 311.0
    # Without regimes seen to end, the Lindy guess alone: 0.58 x streak >= 2 x 30 s.
    assert first_action_time(PlanGate(restart_s=30.0), lambda t: {"r0": ("off", 1.58)}) == 104.0


def test_a_streak_ended_by_the_restart_it_asked_for_is_no_regime_length():
    gate = PlanGate(restart_s=30.0)
    regimes = {"r0": regime("r0", "dspark-b8-av", "off", 2.0)}
    fired = [t for t in range(0, 70) if gate.actions(regimes, float(t))]
    assert fired == [60]
    done = {"r0": regime("r0", "off", "off", 1.0)}  # converted: nothing wanted any more
    for t in range(70, 130):
        gate.actions(done, float(t))
    assert gate.expected_left_s(5.0) == 5.0  # nothing recorded, no regime was seen to end: the Lindy guess
    # An unacted streak that ends is one.
    for t in range(130, 140):
        gate.actions({"r0": regime("r0", "off", "dspark-b4-av", 1.01)}, float(t))
    for t in range(140, 230):
        gate.actions(done, float(t))
    assert gate.expected_left_s(4.0) == 4.0  # 9 s: a flap, shorter than min_confirm_s
    for t in range(230, 290):
        gate.actions({"r0": regime("r0", "off", "dspark-b4-av", 1.01)}, float(t))
    for t in range(290, 330):
        gate.actions(done, float(t))
    assert gate.expected_left_s(40.0) == pytest.approx((59.0 - 40.0 + 40.0) / 2)  # it lasted 59 s


# -- GatedActuator: the one restart path (shipped service and benchmark) ------


class RecordingRestart:
    """A RestartAction that 'restarts' by remembering; busy from a restart until told otherwise."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.busy_now: set[str] = set()

    def busy(self) -> set[str]:
        return set(self.busy_now)

    async def restart(self, replica: str, profile: str) -> None:
        self.calls.append((replica, profile))
        self.busy_now.add(replica)


def regimes_at(gain: float, names=("r0", "r1")) -> dict:
    return {n: regime(n, "dspark-b8-av", "off", gain) for n in names}


def test_plan_gate_from_settings_has_the_constructor_defaults():
    a, b = PlanGate(), PlanGate.from_settings(RestartGateSettings())
    fields = ("restart_s", "payback", "min_gain", "min_interval_s", "min_confirm_s", "min_loss", "grace_s")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    gate = PlanGate.from_settings(RestartGateSettings(restart_s=60.0, min_loss=0.5))
    assert (gate.restart_s, gate.min_loss) == (60.0, 0.5)


async def test_gated_actuator_restarts_when_the_gate_fires_and_documents_it():
    action = RecordingRestart()
    act = GatedActuator(PlanGate(restart_s=30.0), action)  # gain 2.0 at full loss: 60 s of credit
    docs = [await act.apply(regimes_at(2.0), float(t)) for t in range(0, 61)]
    assert all(d["restart_now"] is None for d in docs[:60])
    assert docs[60]["restart_now"] == ["r0", "off"] and action.calls == [("r0", "off")]
    assert docs[60]["actuator"] == "recording" and set(docs[60]["replicas"]) == {"r0", "r1"}
    assert docs[60]["replicas"]["r0"]["recommended_profile"] == "off"
    assert docs[60]["restarting"] == ["r0"]
    assert docs[60]["last_restart"] == {"replica": "r0", "profile": "off", "age_s": 0.0}
    assert act.restarts == [(60.0, "r0", "off")]
    # While the action reports a replica restarting the gate holds: nothing else restarts.
    for t in range(61, 90):
        doc = await act.apply(regimes_at(2.0), float(t))
        assert doc["restart_now"] is None and doc["restarting"] == ["r0"]
    assert doc["last_restart"]["age_s"] == 29.0
    # Done: the fleet-wide streak carries over to the next replica at once.
    action.busy_now = set()
    doc = await act.apply(regimes_at(2.0, names=("r1",)), 90.0)
    assert doc["restart_now"] == ["r1", "off"] and action.calls[-1] == ("r1", "off")


async def test_hold_freezes_the_gate():
    action = RecordingRestart()
    act = GatedActuator(PlanGate(restart_s=30.0), action)
    for t in range(0, 20):
        await act.apply(regimes_at(2.0), float(t))
    for t in range(20, 200):  # paused controller: no restart, no credit earned, none lost
        assert (await act.apply(regimes_at(2.0), float(t), hold=True))["restart_now"] is None
    assert action.calls == []
    fired = [t for t in range(200, 260) if (await act.apply(regimes_at(2.0), float(t)))["restart_now"]]
    assert fired and fired[0] == 240  # 19 s of credit before the pause (0..19), 41 more after it


async def test_shipped_actuator_records_the_restart_it_would_make():
    """The service's default: the gate from settings.controller.restart_gate, restarting nothing."""
    act = default_actuator(Settings().controller.restart_gate)
    assert isinstance(act.restart, NoopRestart) and act.name == "recommend"
    store = MemoryStore()
    for t in range(0, 121):
        doc = await store_fleet_plan(store, regimes_at(1.5, names=("r0",)), act, float(t))
        if doc["restart_now"]:
            break
    # +50 % at full loss of the default 30 s restart, and its way back: 60 s of credit, 120 s of streak.
    assert t == 120 and doc["restart_now"] == ["r0", "off"]
    stored = await store.get_json(FLEET_PLAN_KEY)
    assert stored == doc and stored["actuator"] == "recommend" and stored["restarting"] == []
    assert act.restart.recorded == [("r0", "off")]
    # Nothing restarted, so the plan stands; the per-replica interval keeps the record quiet.
    doc = await store_fleet_plan(store, regimes_at(1.5, names=("r0",)), act, 121.0)
    assert doc["restart_now"] is None and doc["last_restart"]["replica"] == "r0"


# -- the recommendation: what to do and why, in the gate's numbers -------------------


async def test_the_explanation_predicts_when_the_gate_fires():
    act = GatedActuator(PlanGate(restart_s=30.0), NoopRestart())
    regs = regimes_at(1.5, names=("r0",))
    for t in range(0, 120):
        doc = await act.apply(regs, float(t))
        step = doc["recommendation"]["steps"][0]
        # +50 % at full loss repays the 30 s restart and the one back after 120 s: the forecast counts down to it.
        assert t + step["pays_back_in_s"] == pytest.approx(120.0), t
        assert step["cost_s"] == 30.0 and step["credit_s"] == pytest.approx(0.5 * t)
    assert doc["recommendation"]["summary"] == (
        "restart r0 (dspark-b8-av) as off: predicted 1.50x goodput per converted replica; the restart costs ~30 s "
        "of its goodput (30 s down x 100% lost); pays back its restart and the way back in ~1 s")
    doc = await act.apply(regs, 120.0)
    assert doc["restart_now"] == ["r0", "off"]
    assert doc["recommendation"]["summary"].endswith("paid back: converting now")


def test_the_forecast_counts_the_way_back_where_regimes_have_ended():
    """Two 119-s regimes ended unacted, then `off` at +58 % from 240 s: the outlook's
    `pays_back_in_s` counts down to the tick the gate fires (551 s), and says how long
    the regime is expected to last."""
    gate = PlanGate(restart_s=30.0)
    early = {"r0": regime("r0", "dspark-b8-av", "dspark-b16", 1.1)}
    later = {"r0": regime("r0", "dspark-b8-av", "dspark-b4-av", 1.1)}
    for t in range(0, 240):
        assert gate.actions(early if t < 120 else later, float(t)) == []
    off = {"r0": regime("r0", "dspark-b8-av", "off", 1.58)}
    for t in range(240, 551):
        assert gate.actions(off, float(t)) == [], t
        step = gate.outlook(off, float(t))["r0"]
        if t >= 300:
            assert t + step["pays_back_in_s"] == pytest.approx(551.0, abs=1.0), t
            age = t - 240
            assert step["expected_left_s"] == pytest.approx((2 * max(119 - age, 0) + age) / 3, abs=0.1)
    assert gate.actions(off, 551.0) == [("r0", "off")]


async def test_pool_replicas_are_explained_as_pool_scaling_in_recommend_mode():
    act = default_actuator(RestartGateSettings())
    regs = {
        "vllm-dspark-b8-0": regime("vllm-dspark-b8-0", "dspark-b8", "dspark-b8-av", 1.18),
        "vllm-dspark-b8-1": regime("vllm-dspark-b8-1", "dspark-b8", "dspark-b8-av", 1.18),
        "vllm-off-0": regime("vllm-off-0", "off", "off", 1.0),
    }
    doc = await act.apply(regs, 0.0)
    rec = doc["recommendation"]
    assert [s["replica"] for s in rec["steps"]] == ["vllm-dspark-b8-0", "vllm-dspark-b8-1"]
    assert rec["summary"].startswith("scale vllm-dspark-b8 2->1 and vllm-dspark-b8-av 0->1: predicted 1.18x goodput "
                                     "per converted replica")
    assert "pays back its restart and the way back in ~333 s" in rec["summary"] and rec["summary"].endswith("(then 1 more replica to convert)")
    assert doc["actuator"] == "recommend" and "action" not in doc


async def test_below_min_gain_and_paused_are_said_plainly():
    act = GatedActuator(PlanGate(restart_s=30.0, min_gain=1.05), NoopRestart())
    doc = await act.apply(regimes_at(1.03, names=("r0",)), 0.0)
    assert doc["recommendation"]["steps"][0]["pays_back_in_s"] is None
    assert "does not pay back at this gain (the gate needs a mean gain of 1.05x)" in doc["recommendation"]["summary"]
    doc = await act.apply(regimes_at(2.0, names=("r0",)), 1.0, hold=True)
    assert doc["recommendation"]["summary"].endswith("controller paused")
    doc = await act.apply({"r0": regime("r0", "off", "off", 1.0)}, 2.0)
    assert doc["recommendation"] == {"summary": "no change: every replica runs the best profile it can serve", "steps": []}
