"""Actuation: publish per-tenant policies; act on the fleet plan through an actuator.

Policies go through `contract.policy.publish_policies` (versioned
document + pub/sub), and only when something material changed, so that the
policy version counts real changes and gateways are not woken every tick.

The fleet plan (which replica should run which launch profile) changes a
replica's *launch arguments*, i.e. a restart. Every tick the service hands
the decision's replica regimes to an `Actuator`; the one it runs is
`GatedActuator`: `PlanGate` (settings `controller.restart_gate`) decides
whether a recommended change pays back its downtime *now*, and a
`RestartAction` carries the restart out. Which action runs is
`controller.restart_gate.actuator` (`default_actuator`):

* `recommend` (default): `NoopRestart` records what the gate would restart
  (the plan document's `restart_now` / `last_restart`, admin API
  `/admin/fleet-plan`) and changes nothing; the operator applies it.
* `kubernetes`: `controller.kube_scaling.KubernetesScaling` scales the
  per-profile StatefulSets through the Kubernetes API.

Either way the plan document carries `recommendation`: for every replica the
plan would convert, what to do ("scale vllm-dspark-b8 2->1 and vllm-dspark-b16-av
0->1", or "restart r0 (off) as dspark-b8" where replicas are not pool
members) and why, in the gate's own numbers (`PlanGate.outlook`): the predicted
gain per converted replica, what the restart's downtime costs and how long
until the gain has paid it back. The benchmark (bench/control_sweep.py) runs
the same `GatedActuator` with an action that restarts simulated replicas.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict
from typing import Any, Callable, Protocol, runtime_checkable

from contract.keys import FLEET_PLAN_KEY
from contract.policy import PolicySet, SpeculationPolicy, load_policies, policy_changes, publish_policies
from contract.settings import RestartGateSettings
from contract.store import Store

from .decision import ReplicaRegime
from .kube_scaling import pool_name, replica_profile


async def publish_if_changed(store: Store, policies: dict[str, SpeculationPolicy],
                             current: PolicySet | None = None) -> PolicySet | None:
    """Publish a new policy version when any tenant's policy materially differs
    (`contract.policy.policy_changes`) from `current` (default: the store's)."""
    if current is None:
        current = await load_policies(store)
    if set(current.policies) == set(policies) and not any(
        policy_changes(current.policies[t], p) for t, p in policies.items()
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


@runtime_checkable
class ObservedAction(Protocol):
    """A `RestartAction` whose state lives elsewhere (a cluster): `refresh()` reads
    it once per tick, before `busy()` is asked (which must not block the loop),
    and `report()` is its part of the plan document (what it did, its errors)."""

    async def refresh(self) -> None: ...

    def report(self) -> dict[str, Any]: ...


class NoopRestart:
    """The `recommend` action: records the restarts the gate decides; restarts nothing
    (the controller has no hold on the replicas -- the operator applies them, guided
    by the plan document's `recommendation`)."""

    name = "recommend"  # the `controller.restart_gate.actuator` value that selects it

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

    def __init__(self, gate: PlanGate, restart: RestartAction, pool_prefix: str = "vllm-") -> None:
        """`pool_prefix`: replicas named `<pool_prefix><profile>-<ordinal>` are members of
        the pool (StatefulSet) `<pool_prefix><profile>`; the recommendation speaks of
        scaling pools for them, of restarting replicas otherwise."""
        self.gate = gate
        self.restart = restart
        self.name = restart.name
        self.pool_prefix = pool_prefix
        self.restarts: list[tuple[float, str, str]] = []  # (now, replica, profile), everything this actuator restarted
        self.last_plan: dict[str, Any] = {}

    async def apply(self, regimes: dict[str, ReplicaRegime], now: float, hold: bool = False) -> dict[str, Any]:
        observed = isinstance(self.restart, ObservedAction)
        if observed:
            await self.restart.refresh()
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
        restarting = sorted(self.restart.busy())
        self.last_plan = {
            "actuator": self.name,
            "replicas": fleet_plan(regimes),
            "restart_now": list(actions[0]) if actions else None,
            "restarting": restarting,
            "last_restart": {"replica": last[1], "profile": last[2], "age_s": round(now - last[0], 3)} if last else None,
            "recommendation": recommendation(regimes, self.gate.outlook(regimes, now), actions, restarting,
                                             self.pool_prefix, paused=hold),
        }
        if observed:
            self.last_plan["action"] = self.restart.report()
        return self.last_plan


def default_actuator(settings: RestartGateSettings) -> GatedActuator:
    """What the shipped controller runs: the gate from `controller.restart_gate` in front of
    the action `restart_gate.actuator` names (`recommend`: record only; `kubernetes`: scale
    the pools). A `kubernetes` actuator that cannot load its client or credentials fails
    here, at start-up, rather than tick after tick."""
    prefix = settings.kubernetes.pool_prefix
    if settings.actuator == "kubernetes":
        from .kube_scaling import KubernetesScaling

        action = KubernetesScaling.from_settings(settings.kubernetes)
        return GatedActuator(PlanGate.from_settings(settings, pool_order(prefix)), action, prefix)
    return GatedActuator(PlanGate.from_settings(settings), NoopRestart(), prefix)


def pool_order(pool_prefix: str) -> Callable[[str], tuple[str, int]]:
    """Restart order for pool replicas: a StatefulSet scaled down removes its highest
    ordinal, so that is the replica the gate should name (and hold to its
    `min_interval_s`); other names keep their order."""
    def key(name: str) -> tuple[str, int]:
        if replica_profile(pool_prefix, name) is None:
            return (name, 0)
        stem, _, ordinal = name.rpartition("-")
        return (stem, -int(ordinal))
    return key


def describe_step(replica: str, current: str, target: str, counts: dict[str, int], pool_prefix: str) -> str:
    """What converting `replica` from `current` to `target` means to whoever applies it.

    Pool members (`<pool_prefix><profile>-<ordinal>`) convert by scaling their pools,
    counted by the replicas the controller sees live per profile; other replicas are
    restarted with the new launch profile."""
    if replica_profile(pool_prefix, replica) == current:
        n, m = counts.get(current, 0), counts.get(target, 0)
        return (f"scale {pool_name(pool_prefix, current)} {n}->{max(n - 1, 0)} and "
                f"{pool_name(pool_prefix, target)} {m}->{m + 1}")
    return f"restart {replica} ({current}) as {target}"


def recommendation(
    regimes: dict[str, ReplicaRegime], outlook: dict[str, dict[str, Any]], actions: list[tuple[str, str]],
    restarting: list[str], pool_prefix: str, paused: bool = False,
) -> dict[str, Any]:
    """The plan in words, from the gate's numbers (pure): one step per replica to convert,
    each with `explanation`, and `summary`, the step the gate takes first."""
    counts: dict[str, int] = {}
    for r in regimes.values():
        counts[r.profile] = counts.get(r.profile, 0) + 1
    now_doing = dict(actions)
    steps = []
    for name in sorted(outlook):
        o, r = outlook[name], regimes[name]
        what = describe_step(name, r.profile, o["profile"], counts, pool_prefix)
        why = (f"predicted {o['gain']:.2f}x goodput per converted replica; the restart costs ~{o['cost_s']:.0f} s "
               f"of its goodput ({o['restart_s']:.0f} s down x {o['charged_loss']:.0%} lost)")
        if now_doing.get(name) == o["profile"]:
            when = "paid back: converting now"
        elif restarting:
            when = f"waiting for {', '.join(restarting)} to finish restarting"
        elif paused:
            when = "controller paused"
        elif o["pays_back_in_s"] is None:
            when = f"does not pay back at this gain (the gate needs a mean gain of {o['min_gain']:.2f}x)"
        else:
            when = f"pays back its restart and the way back in ~{o['pays_back_in_s']:.0f} s"
        steps.append({"replica": name, "from_profile": r.profile, "to_profile": o["profile"], "action": what,
                      **{k: o[k] for k in ("gain", "downtime_loss", "cost_s", "credit_s", "streak_s", "pays_back_in_s")},
                      "explanation": f"{what}: {why}; {when}"})
    if steps:
        first = next((s for s in steps if now_doing.get(s["replica"]) == s["to_profile"]), None)
        first = first or min(steps, key=lambda s: math.inf if s["pays_back_in_s"] is None else s["pays_back_in_s"])
        more = len(steps) - 1
        summary = first["explanation"] + (f" (then {more} more replica{'s' if more > 1 else ''} to convert)" if more else "")
    else:
        summary = "no change: every replica runs the best profile it can serve"
    return {"summary": summary, "steps": steps}


async def store_fleet_plan(store: Store, regimes: dict[str, ReplicaRegime], actuator: Actuator, now: float,
                           hold: bool = False) -> dict[str, Any]:
    """Let the actuator act on the plan, then store its plan document (admin API)."""
    doc = await actuator.apply(regimes, now, hold)
    await store.set_json(FLEET_PLAN_KEY, doc)
    return doc


def regime_dict(r: ReplicaRegime) -> dict:
    return asdict(r)


# How many ended regimes (recommendation streaks gone unacted) PlanGate reads a regime's
# expected length from: the last quarter-hour or so of a workload whose load moves every few minutes.
REGIME_HISTORY = 16


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
    will last is unknown; the first estimate is how long it has already
    lasted (the recommendation's stable streak, a Lindy-style guess). The
    one-way charge, what the streak's credit must reach before anything else
    is asked, is

        integral over the streak of (gain - 1) dt >= payback * restart_s * max(downtime_loss, min_loss)

    and the way back (below) doubles it while no regime has been seen to end:
    so at full loss a +5 % recommendation waits ~20 min, a +50 % one ~2 min,
    and a regime that flips every few minutes never triggers restarts. The
    charge never falls below `min_loss` of a downtime, however idle the
    fleet: a restart made for a regime may have to be undone when the regime
    ends, at whatever load then holds (simulated phase trace: with 0.6 the
    fleet converted to b16 late in a c=4 phase and lost 14 % in the c=48
    phase that followed; at 0.8 a +7 % recommendation on an idle fleet
    waits ~11 min). Also: a mean gain over the streak of at least `min_gain`,
    one replica at a time, none restarted within `min_interval_s`.

    Every regime ends, and a restart made for one is undone when it does, so a
    restart must pay for its way back too, at the streak's mean gain, over the
    time this regime is expected to last (`expected_left_s`):

        (credit / streak) x expected_left >= 2 x payback x restart_s x max(downtime_loss, min_loss)

    That time is read from the regimes seen to end (a recommendation's streak
    of at least `min_confirm_s` gone past the grace without being acted on;
    the last `REGIME_HISTORY`): like one of the n seen, or like none of them
    (the Lindy guess: as long again), each with chance 1 / (n + 1). With none
    seen yet that is the Lindy guess alone, and the rule reads credit >= 2 x
    the one-way charge; a regime that outlasts every one seen waits (n + 1)
    times that. Why both: simulated, phases of 120 s where the drafter's pass
    made `off` +58 % at 256 requests converted both replicas to `off` 59 and
    95 s into one; the c=16 phase after it ran on `off` at 3406 tok/s where
    the speculative fleet delivered 6337, and the way back waited out
    `min_interval_s` (whole trace 5352 tok/s against 6762 without restarts).
    And with no regime seen yet the gate used to charge the one way only: in
    the same trace with 240-s phases (as modelled), a predicted +10 % for
    `dspark-b16-av` at 4 requests (+4 % simulated) converted a replica 236 s
    into the first phase, 4 s before the load rose to 48 requests, where b16
    is the worst profile; two more restarts followed and the trace delivered
    7528 tok/s where the same controller without restarts delivered 7976.
    """

    def __init__(self, settings: RestartGateSettings | None = None, order: Callable[[str], Any] | None = None,
                 **overrides: float) -> None:
        """The gate's numbers and their defaults are `RestartGateSettings`'
        (stated once, in the settings tree); keyword overrides are validated
        against it (tests, experiments). `order`: sort key of the replicas a
        restart may take, first taken first (default: by name; for pools,
        `pool_order`: the replica the StatefulSet will remove)."""
        s = RestartGateSettings.model_validate({**(settings or RestartGateSettings()).model_dump(), **overrides})
        self.order = order or str
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
        self._ended: deque[float] = deque(maxlen=REGIME_HISTORY)  # durations of streaks that ended unacted
        self._acted: set[str] = set()  # profiles restarted into during their current streak

    @classmethod
    def from_settings(cls, settings: RestartGateSettings, order: Callable[[str], Any] | None = None) -> PlanGate:
        return cls(settings, order)

    def hold(self, now: float) -> None:
        """Freeze the streaks at `now` (a restart in progress, or the controller paused)."""
        self._streak = {p: (since, credit, now) for p, (since, credit, _) in self._streak.items()}

    def pays_back(self, credit: float, streak_s: float, downtime_loss: float = 1.0) -> bool:
        """`credit`: the predicted advantage accumulated over the streak, integral of (gain - 1) dt;
        its mean over the streak must reach `min_gain` (a gain that hovers around the
        margin earns less, but single ticks below it do not end the streak)."""
        cost = self.cost_s(downtime_loss)
        return (streak_s >= self.min_confirm_s and credit >= cost and self._mean_ok(credit, streak_s)
                and self._outlasts(credit, streak_s, cost))

    def _mean_ok(self, credit: float, streak_s: float) -> bool:
        """The streak's mean gain reaches `min_gain` (the gate's check and its forecast's).
        A credit summed tick by tick carries rounding: a gain held at exactly min_gain passes."""
        return streak_s > 0 and credit / streak_s >= self.min_gain - 1.0 - 1e-9

    def expected_left_s(self, streak_s: float) -> float:
        """How much longer a regime that has lasted `streak_s` is expected to, from the n
        regimes seen to end: like each of them with chance 1 / (n + 1) (what it had left
        at this age, 0 if it was over by then), unlike all of them with 1 / (n + 1) (the
        Lindy guess: as long again). Where none has ended, the Lindy guess alone: `streak_s`."""
        return (sum(max(d - streak_s, 0.0) for d in self._ended) + streak_s) / (len(self._ended) + 1)

    def _outlasts(self, credit: float, streak_s: float, cost: float) -> bool:
        """The streak's mean gain over the time the regime is expected to last pays for
        the restart and for the one back (see the class docstring)."""
        return streak_s > 0 and credit / streak_s * self.expected_left_s(streak_s) >= 2.0 * cost

    def cost_s(self, downtime_loss: float) -> float:
        """Seconds of the replica's goodput its restart is charged (the credit a streak must earn)."""
        return self.payback * self.restart_s * max(downtime_loss, self.min_loss)

    @staticmethod
    def wanted(regimes: dict[str, ReplicaRegime]) -> tuple[dict[str, ReplicaRegime], dict[str, float]]:
        """The replicas the plan would convert, and what each recommended profile's streak
        earns: its best gain, fleet-wide (the streak belongs to the profile, see `actions`)."""
        wanted = {n: r for n, r in regimes.items() if r.recommended_profile != r.profile and r.recommended_gain > 1.0}
        gains: dict[str, float] = {}
        for r in wanted.values():
            gains[r.recommended_profile] = max(gains.get(r.recommended_profile, 1.0), r.recommended_gain)
        return wanted, gains

    def outlook(self, regimes: dict[str, ReplicaRegime], now: float) -> dict[str, dict[str, Any]]:
        """For every replica the plan would convert, the gate's numbers (pure read of its state,
        as `actions()` last left it): the payback `cost_s` (seconds of the replica's goodput its
        restart costs), the streak's `credit_s` so far, and `pays_back_in_s`, how long until the
        restart is due if the gain holds (None: never at this gain)."""
        wanted, rate = self.wanted(regimes)
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(wanted):
            r = wanted[name]
            since, credit, _ = self._streak.get(r.recommended_profile, (now, 0.0, now))
            streak = max(0.0, now - since)
            charged = max(r.downtime_loss, self.min_loss)
            cost = self.cost_s(r.downtime_loss)
            out[name] = {
                "profile": r.recommended_profile, "gain": r.recommended_gain, "downtime_loss": r.downtime_loss,
                "charged_loss": charged, "restart_s": self.restart_s, "min_gain": self.min_gain,
                "cost_s": round(cost, 3), "credit_s": round(credit, 3), "streak_s": round(streak, 3),
                "expected_left_s": round(self.expected_left_s(streak), 1),
                "pays_back_in_s": self._eta(name, rate[r.recommended_profile], credit, streak, cost, now),
            }
        return out

    def _eta(self, name: str, gain: float, credit: float, streak: float, cost: float, now: float) -> float | None:
        """Seconds until `pays_back` holds (and the replica's interval has passed) at a steady `gain`."""
        g, need = gain - 1.0, self.min_gain - 1.0
        waits = [self.min_confirm_s - streak, (cost - credit) / g]
        if not self._mean_ok(credit, streak):
            if g <= need:
                return None
            waits.append((need * streak - credit) / (g - need))  # (credit + g t) / (streak + t) = need
        last = self._last_restart.get(name)
        if last is not None:
            waits.append(self.min_interval_s - (now - last))
        t = max(0.0, *waits)
        if not self._outlasts(credit + g * t, streak + t, cost):
            # The way back binds: scan while the regimes seen still end within the streak,
            # then the expected rest grows as (streak + t) / (n + 1).
            longest = max(self._ended, default=0.0)
            step = max(1.0, (longest - streak - t) / 200.0)  # a bounded scan, whatever the regimes' length
            while streak + t < longest and not self._outlasts(credit + g * t, streak + t, cost):
                t += step
            if not self._outlasts(credit + g * t, streak + t, cost):
                t = max(t, 2.0 * cost * (len(self._ended) + 1) / g - streak)
        return round(t, 1)

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
        wanted, gains = self.wanted(regimes)
        streaks: dict[str, tuple[float, float, float]] = {}
        for p, (since, credit, seen) in self._streak.items():
            if p in gains:
                streaks[p] = (since, credit + (gains[p] - 1.0) * (now - seen), now)
            elif now - seen <= self.grace_s:
                streaks[p] = (since, credit, seen)
            elif p in self._acted:
                self._acted.discard(p)  # it ended because the fleet converted: not a regime's length
            elif seen - since >= self.min_confirm_s:  # shorter: a flap, never a regime that could restart
                self._ended.append(seen - since)
        for p in gains:
            streaks.setdefault(p, (now, 0.0, now))
        self._streak = streaks
        for name in sorted(wanted, key=self.order):
            r = wanted[name]
            since, credit, _ = self._streak[r.recommended_profile]
            recent = now - self._last_restart.get(name, float("-inf")) < self.min_interval_s
            if not recent and self.pays_back(credit, now - since, r.downtime_loss):
                self._last_restart[name] = now
                self._acted.add(r.recommended_profile)
                return [(name, r.recommended_profile)]
        return []
