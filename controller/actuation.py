"""Actuation: publish per-tenant policies; hand the fleet plan to an actuator.

Policies go through `gateway.speculation_policy.publish_policies` (versioned
document + pub/sub), and only when something material changed, so that the
policy version counts real changes and gateways are not woken every tick.

The fleet plan (which replica should run which launch profile) changes a
replica's *launch arguments*, i.e. a restart — something only the
deployment layer may do. So it is a recommendation behind the `Actuator`
interface; the default `NoopActuator` only records it (admin API + metric).
A Kubernetes/Compose actuator would implement `apply()`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Protocol

from gateway.speculation_policy import PolicySet, SpeculationPolicy, load_policies, publish_policies
from gateway.store import Store

from .decision import ReplicaRegime
from .overrides import FLEET_PLAN_KEY


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


class Actuator(Protocol):
    name: str

    async def apply(self, plan: dict[str, dict]) -> None: ...


class NoopActuator:
    """Records the plan; changes nothing (restarting replicas is the operator's call)."""

    name = "noop"

    def __init__(self) -> None:
        self.last_plan: dict[str, dict] = {}

    async def apply(self, plan: dict[str, dict]) -> None:
        self.last_plan = plan


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


async def store_fleet_plan(store: Store, plan: dict[str, dict], actuator: Actuator) -> None:
    await store.set_json(FLEET_PLAN_KEY, {"actuator": actuator.name, "replicas": plan})
    await actuator.apply(plan)


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

    def __init__(self, restart_s: float = 30.0, payback: float = 1.0, min_gain: float = 1.05,
                 min_interval_s: float = 120.0, min_confirm_s: float = 30.0, min_loss: float = 0.8, grace_s: float = 15.0) -> None:
        self.restart_s = restart_s
        self.min_loss = min_loss
        self.payback = payback
        self.min_gain = min_gain
        self.min_interval_s = min_interval_s
        self.min_confirm_s = min_confirm_s
        self.grace_s = grace_s
        # recommended profile -> (streak start, credit = integral of (gain - 1) dt, last seen); fleet-wide
        self._streak: dict[str, tuple[float, float, float]] = {}
        self._last_restart: dict[str, float] = {}

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
            self._streak = {p: (since, credit, now) for p, (since, credit, _) in self._streak.items()}
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
