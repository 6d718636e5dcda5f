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
    on a replica drafts). So a recommendation is acted on only when its
    predicted gain repays the lost capacity over the time it can be expected
    to last. How long a regime will last is unknown; the estimate used is how
    long it has already lasted (the recommendation's stable streak, a
    Lindy-style guess): restart once

        (gain - 1) * streak_s >= payback * restart_s

    so a +5 % recommendation waits ~10 min, a +50 % one ~1 min -- and a
    regime that flips every few minutes never triggers restarts. Also: at
    least `min_gain`, one replica at a time, none restarted within
    `min_interval_s`.
    """

    def __init__(self, restart_s: float = 30.0, payback: float = 1.0, min_gain: float = 1.05,
                 min_interval_s: float = 120.0, min_confirm_s: float = 30.0) -> None:
        self.restart_s = restart_s
        self.payback = payback
        self.min_gain = min_gain
        self.min_interval_s = min_interval_s
        self.min_confirm_s = min_confirm_s
        self._streak: dict[str, tuple[str, float]] = {}  # replica -> (recommended profile, since)
        self._last_restart: dict[str, float] = {}

    def pays_back(self, gain: float, streak_s: float) -> bool:
        return streak_s >= self.min_confirm_s and (gain - 1.0) * streak_s >= self.payback * self.restart_s

    def actions(self, regimes: dict[str, ReplicaRegime], now: float, busy: set[str] | frozenset = frozenset()) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name in sorted(regimes):
            r = regimes[name]
            if r.recommended_profile == r.profile or r.recommended_gain < self.min_gain:
                self._streak.pop(name, None)
                continue
            prof, since = self._streak.get(name, (r.recommended_profile, now))
            if prof != r.recommended_profile:
                since = now
            self._streak[name] = (r.recommended_profile, since)
            recent = now - self._last_restart.get(name, float("-inf")) < self.min_interval_s
            if self.pays_back(r.recommended_gain, now - since) and not recent and not busy and not out:
                out.append((name, r.recommended_profile))
                self._last_restart[name] = now
                self._streak.pop(name, None)
        return out
