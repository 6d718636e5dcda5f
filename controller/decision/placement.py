"""Where a tenant's traffic goes under a draft cap: the gateway's routing, as the model prices it.

Why: routing follows the policy. A tenant at k=0 is sent to the `off` pool
(`preferred_profile="off"`), a speculating tenant to the replicas of its
preferred profile (every replica when the policy names none): the routing
model both planes share, `contract.routing`, which the gateway ranks by and
`routed_to` reads. So the replicas a tenant's traffic was *observed* on
describe where it goes under its current cap only, and pricing a candidate
whose routing differs on that observation is wrong: a tenant switched off
lands wholly on the off pool, where no cap gains anything, and the model
then saw almost nothing to win by turning it back on -- measured with
`specgate load`'s step workload, the heaviest tenant stayed off through the
whole light phase after the load dropped (predicted gain +1-4 %, under the
5 % margin, with its speculating TPOT predicted at the off replica's 50 ms).

So a tenant's candidate caps are priced on the placement its traffic would
have if it speculated -- where speculation, not load balance, makes the
difference between them:

* a tenant that speculates now: where its traffic was observed, for k=0
  too (the model's standing idealisation of the off pool, `goodput.py`:
  routing there "taken as realised", the tenant no longer costing the
  speculative replicas' drafter); a k > 0 whose routing differs (another
  preferred profile) moves its load to that profile's replicas;
* a tenant parked on the off pool now (k=0): its load (running and waiting
  requests) spread evenly over the replicas a speculating policy routes it
  to (least-load routing evens them out), and for k=0 over every live
  replica -- the same placement with the drafts removed. Priced where it is
  parked instead, turning it on would claim the relief of the off pool as a
  speculation gain (measured: on-off flaps every ~8 s under the step
  workload's heavy phase), which the turn-off direction never charges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from contract.routing import profile_for_cap, speculation_tier

from .views import ReplicaInput


class _Steering(NamedTuple):
    """What routing reads of the policy a cap publishes (`assembly.speculation_policy`)."""

    enabled: bool
    preferred_profile: str | None


def preferred_profile(k: int, live: Sequence[ReplicaInput]) -> str | None:
    """The profile a speculating tenant at cap k is steered to
    (`contract.routing.profile_for_cap` over the live speculative profiles):
    the rule `assembly.speculation_policy` publishes."""
    return profile_for_cap(k, ((r.block, r.profile) for r in live if r.block > 0))


def routed_to(k: int, live: Sequence[ReplicaInput], off_pool: bool) -> frozenset[str]:
    """Names of the replicas a tenant at cap k is routed to: routing's tier
    0 for the policy the cap publishes. Without an off pool a tenant at k=0
    has no preferred replicas (it is told not to draft wherever it lands)."""
    if k <= 0 and not off_pool:
        return frozenset(r.name for r in live)
    steering = _Steering(enabled=k > 0, preferred_profile=preferred_profile(k, live) if k > 0 else None)
    return frozenset(r.name for r in live if speculation_tier(r, steering) == 0)


def _fraction(rep: ReplicaInput, tenant: str) -> float:
    total = sum(rep.mix.values())
    return rep.mix.get(tenant, 0.0) / total if total > 0 else 0.0


def move_tenant(live: Sequence[ReplicaInput], tenant: str, targets: frozenset[str]) -> list[ReplicaInput]:
    """`live` with `tenant`'s running and waiting requests moved off the
    replicas outside `targets` and spread evenly over those inside; a replica
    left with no load is dropped. Unchanged when the tenant has no load
    anywhere or no target is live."""
    dest = [r for r in live if r.name in targets]
    moved_b = sum(r.batch * _fraction(r, tenant) for r in live)
    moved_w = sum(r.waiting * _fraction(r, tenant) for r in live)
    if not dest or moved_b + moved_w <= 0:
        return list(live)
    add_b, add_w = moved_b / len(dest), moved_w / len(dest)
    out = []
    for rep in live:
        f, total, load = _fraction(rep, tenant), sum(rep.mix.values()), rep.batch + rep.waiting
        target = rep.name in targets
        # The other tenants' traffic, in requests; on an idle replica in
        # proportions -- unless the tenant's moved requests become its only load.
        scale = load if load > 0 else (0.0 if target else 1.0)
        mix = {o: scale * v / total for o, v in rep.mix.items() if o != tenant and total > 0}
        batch, waiting = rep.batch * (1 - f), rep.waiting * (1 - f)
        if target:
            batch, waiting = batch + add_b, waiting + add_w
            mix[tenant] = add_b + add_w
        elif load > 0 and batch + waiting <= 1e-9:
            # Emptied: it emits nothing under this choice (an idle replica is
            # otherwise priced as holding its next request, which would reward
            # crowding traffic onto fewer replicas).
            continue
        out.append(replace(rep, batch=batch, waiting=waiting, mix={o: c for o, c in mix.items() if c > 0}))
    return out


def pricing_targets(k: int, cur: int, live: Sequence[ReplicaInput], off_pool: bool) -> frozenset[str] | None:
    """Where a tenant now at cap `cur` is priced for candidate cap k: the
    replicas its load is spread over, or None for where it was observed
    (see the module's docstring)."""
    if off_pool and cur == 0:
        # Parked on the off pool: every candidate is priced as if it
        # speculated (k=0: spread like a speculating tenant without a
        # preferred profile, with its drafts removed).
        return routed_to(k, live, off_pool) if k > 0 else frozenset(r.name for r in live)
    if k > 0 and routed_to(k, live, off_pool) != routed_to(cur, live, off_pool):
        return routed_to(k, live, off_pool)
    return None


def place(
    live: Sequence[ReplicaInput], choice: Mapping[str, int], current: Mapping[str, int], off_pool: bool
) -> list[ReplicaInput]:
    """The live replicas as `choice` is priced on: every tenant with
    `pricing_targets` moved there (`move_tenant`), the others as observed."""
    placed = list(live)
    for tenant in sorted(choice):
        targets = pricing_targets(choice[tenant], current.get(tenant, choice[tenant]), live, off_pool)
        if targets is not None:
            placed = move_tenant(placed, tenant, targets)
    return placed


def tenant_load(rep: ReplicaInput, tenant: str) -> float:
    """Requests of `tenant` on `rep` (running and waiting)."""
    return (rep.batch + rep.waiting) * _fraction(rep, tenant)
