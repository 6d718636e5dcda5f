"""Actuation: publish per-tenant policies; act on the fleet plan through an actuator.

Policies go through `contract.policy.publish_policies` (versioned
document + pub/sub), and only when something material changed, so that the
policy version counts real changes and gateways are not woken every tick.

The fleet plan (which replica should run which launch profile) changes a
replica's *launch arguments*, i.e. a restart. Every tick the service hands
the decision's replica regimes to an `Actuator`; the one it runs is
`GatedActuator`: `PlanGate` (settings `controller.restart_gate`) decides
whether a recommended change pays back its downtime *now*, and a
`RestartAction` carries the restart out. Restarting vLLM replicas is the
deployment layer's job, so the shipped action, `NoopRestart`, only records
what the gate would restart (the plan document's `restart_now` /
`last_restart`, admin API `/admin/fleet-plan`); a Kubernetes/Compose action
would implement `restart()`. The benchmark (bench/control_sweep.py) runs
the same `GatedActuator` with an action that restarts simulated replicas.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Protocol

from contract.keys import FLEET_PLAN_KEY
from contract.policy import PolicySet, SpeculationPolicy, load_policies, publish_policies
from contract.settings import RestartGateSettings
from contract.store import Store

from .decision import ReplicaRegime


def _material(p: SpeculationPolicy) -> tuple:
    """Worth a new version: a change in behaviour, or in who set it (an admin
    pin replacing an identical controller choice must show as `admin`)."""
    return (p.behaviour(), p.source)


async def publish_if_changed(store: Store, policies: dict[str, SpeculationPolicy]) -> PolicySet | None:
    """Publish a new policy version when any tenant's policy materially differs."""
    current = await load_policies(store)
    if set(current.policies) == set(policies) and all(
        _material(current.policies[t]) == _material(p) for t, p in policies.items()
    ):
        return None
    return await publish_policies(store, policies)


def fleet_plan(regimes: dict[str, ReplicaRegime]) -> dict[str, dict]:
    return {
        name: {
            "current_profile": r.profile,
            "recommended_profile": r.recommended_profile,
            "predicted_gain": r.recommended_gain,
            "downtime_loss": r.downtime_loss,
            "rho": r.rho,
            "regime": r.regime,
        }
        for name, r in regimes.items()
    }


class Actuator(Protocol):
    """Acts on one tick's fleet plan; returns the plan document the service stores."""

    name: str

    async def apply(self, regimes: dict[str, ReplicaRegime], now: float, hold: bool = False) -> dict[str, Any]: ...


class RestartAction(Protocol):
    """Carries out the restarts `PlanGate` decides on."""

    name: str

    def busy(self) -> set[str]:
        """Replicas restarting now (draining or starting): the gate holds while there are any."""
        ...

    async def restart(self, replica: str, profile: str) -> None:
        """Drain `replica` and start it again with launch profile `profile`."""
        ...


class NoopRestart:
    """The shipped action: records the restarts the gate decides; restarts nothing
    (the controller has no hold on vLLM replicas -- the operator applies them)."""

    name = "noop"

    def __init__(self, keep: int = 20) -> None:
        self.keep = keep
        self.recorded: list[tuple[str, str]] = []

    def busy(self) -> set[str]:
        return set()

    async def restart(self, replica: str, profile: str) -> None:
        self.recorded = (self.recorded + [(replica, profile)])[-self.keep:]


class GatedActuator:
    """`PlanGate` in front of a `RestartAction`: the one restart path of the
    shipped controller and of the benchmark.

    `apply()` asks the gate for the restart to make now (at most one), hands
    it to the action and returns the plan document: the per-replica plan
    (`fleet_plan`), `restart_now` = [replica, profile] made this tick or null,
    `restarting` = replicas the action reports busy (a recording-only action:
    none), and `last_restart` = {replica, profile, age_s} of the most recent
    one. `hold=True` (the controller is paused) freezes the gate: no restart,
    streaks neither earn nor reset.
    """

    def __init__(self, gate: PlanGate, restart: RestartAction) -> None:
        self.gate = gate
        self.restart = restart
        self.name = restart.name
        self.restarts: list[tuple[float, str, str]] = []  # (now, replica, profile), everything this actuator restarted
        self.last_plan: dict[str, Any] = {}

    async def apply(self, regimes: dict[str, ReplicaRegime], now: float, hold: bool = False) -> dict[str, Any]:
        busy = set(self.restart.busy())
        if hold:
            self.gate.hold(now)
            actions: list[tuple[str, str]] = []
        else:
            actions = self.gate.actions(regimes, now, busy)
        for replica, profile in actions:
            await self.restart.restart(replica, profile)
            self.restarts.append((now, replica, profile))
        last = self.restarts[-1] if self.restarts else None
        self.last_plan = {
            "actuator": self.name,
            "replicas": fleet_plan(regimes),
            "restart_now": list(actions[0]) if actions else None,
            "restarting": sorted(self.restart.busy()),
            "last_restart": {"replica": last[1], "profile": last[2], "age_s": round(now - last[0], 3)} if last else None,
        }
        return self.last_plan


def default_actuator(settings: RestartGateSettings) -> GatedActuator:
    """What the shipped controller runs: the gate from `controller.restart_gate`, recording only."""
    return GatedActuator(PlanGate.from_settings(settings), NoopRestart())


async def store_fleet_plan(store: Store, regimes: dict[str, ReplicaRegime], actuator: Actuator, now: float,
                           hold: bool = False) -> dict[str, Any]:
    """Let the actuator act on the plan, then store its plan document (admin API)."""
    doc = await actuator.apply(regimes, now, hold)
    await store.set_json(FLEET_PLAN_KEY, doc)
    return doc


def regime_dict(r: ReplicaRegime) -> dict:
    return asdict(r)


class PlanGate:
    """When to act on the fleet plan: a restart must pay for itself (pure state machine, no I/O).

    A restart takes a replica away for `restart_s` (start-up incl. CUDA-graph
    capture) plus its drain, and per-request knobs already capture most of a
    regime's gain without one (drafters.vllm_ext skips the drafter when nobody
    on a replica drafts). What the downtime costs depends on the load: the
    other replicas absorb the restarting one's requests, nearly for free
    while they are memory-bound, at the price of most of its goodput once
    they are compute-bound. The decision prices that as the regime's
    `downtime_loss` (share of the replica's goodput the fleet loses while
    it is away). So a recommendation is acted on only when its predicted
    gain repays the lost capacity over the time it can be expected to last. How long a regime
    will last is unknown; the estimate used is how long it has already
    lasted (the recommendation's stable streak, a Lindy-style guess):
    restart once

        integral over the streak of (gain - 1) dt >= payback * restart_s * max(downtime_loss, min_loss)

    so at full loss a +5 % recommendation waits ~10 min, a +50 % one ~1 min,
    and a regime that flips every few minutes never triggers restarts. The
    charge never falls below `min_loss` of a downtime, however idle the
    fleet: a restart made for a regime may have to be undone when the regime
    ends, at whatever load then holds (simulated phase trace: with 0.6 the
    fleet converted to b16 late in a c=4 phase and lost 14 % in the c=48
    phase that followed; at 0.8 a +7 % recommendation on an idle fleet
    waits ~6 min). Also: a mean gain over the streak of at least `min_gain`,
    one replica at a time, none restarted within `min_interval_s`.
    """

    def __init__(self, settings: RestartGateSettings | None = None, **overrides: float) -> None:
        """The gate's numbers and their defaults are `RestartGateSettings`'
        (stated once, in the settings tree); keyword overrides are validated
        against it (tests, experiments)."""
        s = RestartGateSettings.model_validate({**(settings or RestartGateSettings()).model_dump(), **overrides})
        self.restart_s = s.restart_s
        self.min_loss = s.min_loss
        self.payback = s.payback
        self.min_gain = s.min_gain
        self.min_interval_s = s.min_interval_s
        self.min_confirm_s = s.min_confirm_s
        self.grace_s = s.grace_s
        # recommended profile -> (streak start, credit = integral of (gain - 1) dt, last seen); fleet-wide
        self._streak: dict[str, tuple[float, float, float]] = {}
        self._last_restart: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: RestartGateSettings) -> PlanGate:
        return cls(settings)

    def hold(self, now: float) -> None:
        """Freeze the streaks at `now` (a restart in progress, or the controller paused)."""
        self._streak = {p: (since, credit, now) for p, (since, credit, _) in self._streak.items()}

    def pays_back(self, credit: float, streak_s: float, downtime_loss: float = 1.0) -> bool:
        """`credit`: the predicted advantage accumulated over the streak, integral of (gain - 1) dt;
        its mean over the streak must reach `min_gain` (a gain that hovers around the
        margin earns less, but single ticks below it do not end the streak)."""
        cost_s = self.payback * self.restart_s * max(downtime_loss, self.min_loss)
        mean_ok = streak_s > 0 and credit / streak_s >= self.min_gain - 1.0
        return streak_s >= self.min_confirm_s and credit >= cost_s and mean_ok

    def actions(self, regimes: dict[str, ReplicaRegime], now: float, busy: set[str] | frozenset = frozenset()) -> list[tuple[str, str]]:
        """Restarts to make now: [(replica, profile)], at most one.

        The streak belongs to the recommended *profile*, fleet-wide: the plan
        is homogeneous, so once the fleet has been told "b4-av" for S seconds,
        the second replica's conversion continues the same regime rather than
        starting a new wait. It accumulates credit, the predicted advantage
        (gain - 1) per second, and survives dips shorter than `grace_s` (a
        gain hovering around the plan's margin drops in and out of the
        recommendation; that is noise, not a new regime). While a replica is
        restarting the signals are our own transient (the others carry its
        load), so streaks neither earn nor reset: the gate holds its state
        and acts on none.
        """
        if busy:
            self.hold(now)
            return []
        wanted = {
            name: r for name, r in regimes.items()
            if r.recommended_profile != r.profile and r.recommended_gain > 1.0
        }
        gains: dict[str, float] = {}
        for r in wanted.values():
            gains[r.recommended_profile] = max(gains.get(r.recommended_profile, 1.0), r.recommended_gain)
        streaks: dict[str, tuple[float, float, float]] = {}
        for p, (since, credit, seen) in self._streak.items():
            if p in gains:
                streaks[p] = (since, credit + (gains[p] - 1.0) * (now - seen), now)
            elif now - seen <= self.grace_s:
                streaks[p] = (since, credit, seen)
        for p in gains:
            streaks.setdefault(p, (now, 0.0, now))
        self._streak = streaks
        for name in sorted(wanted):
            r = wanted[name]
            since, credit, _ = self._streak[r.recommended_profile]
            recent = now - self._last_restart.get(name, float("-inf")) < self.min_interval_s
            if not recent and self.pays_back(credit, now - since, r.downtime_loss):
                self._last_restart[name] = now
                return [(name, r.recommended_profile)]
        return []
