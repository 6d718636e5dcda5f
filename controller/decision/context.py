"""The tick's fleet context: what every stage derives from the inputs first.

Why a stage of its own: the live replicas, the candidate caps, each tenant's
acceptance, the current choices and each replica's knee are facts of this
tick that the optimizer, the floor, the threshold and the fleet plan all
read; computing them once, here, keeps those stages free of bookkeeping and
guarantees they all see the same fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.policy import DEFAULT_TENANT

from ..acceptance_fit import Proposal
from .config import DecisionConfig
from .goodput import GoodputModel, run_batch
from .views import FULL, ReplicaInput, TenantState, TenantView


@dataclass(frozen=True)
class FleetContext:
    live: list[ReplicaInput]  # healthy replicas
    off_pool: bool  # some live replica does not speculate: k=0 tenants are routed there
    max_block: int  # largest drafter block among live replicas (0 = none speculates)
    caps: list[int]  # candidate draft caps > 0, ascending, FULL last
    tenants: dict[str, TenantView]  # every tenant decided this tick, the default tenant included
    acc: dict[str, float]  # tenant -> conditional acceptance
    method_acc: dict[str, dict[str, float]]  # tenant -> method -> conditional acceptance on that method
    proposal: dict[str, dict[str, Proposal]]  # tenant -> method -> measured proposal rate and fill
    fleet_a: float  # the default tenant's acceptance (tenants without an estimate)
    current: dict[str, int]  # tenant -> cap in force (unknown -> largest cap)
    thetas: dict[str, float | None]  # tenant -> confidence floor in force
    knee: dict[str, float]  # replica -> verified tokens per step at the compute knee
    homes: dict[str, list[ReplicaInput]]  # tenant -> the replicas its choice is judged on
    # Profiles of every configured replica, healthy or not (on Kubernetes: the pools that
    # exist, since SPECGATE_REPLICAS lists each pool's ordinals); the fleet plan may be held to them.
    profiles: frozenset[str] = frozenset()

    def goodput_model(self) -> GoodputModel:
        return GoodputModel(self.acc, self.fleet_a, self.thetas, self.off_pool, self.method_acc, self.proposal)


def fleet_acceptance(tenants: list[TenantView]) -> float:
    """Evidence-weighted mean acceptance (0.7 with no evidence at all)."""
    weight = sum(max(t.evidence_steps, 0.0) for t in tenants)
    if weight <= 0:
        return 0.7
    return sum(t.acceptance * max(t.evidence_steps, 0.0) for t in tenants) / weight


def knees(live: list[ReplicaInput]) -> dict[str, float]:
    """Replica -> verified tokens per step at its compute knee, at the batch it runs."""
    return {rep.name: rep.cost.knee_tokens(run_batch(rep), rep.context_tokens) for rep in live}


def homes_of(view: TenantView, live: list[ReplicaInput]) -> list[ReplicaInput]:
    # Where its traffic went plus every speculative replica: the policy
    # itself moves traffic (routing), so having landed on an `off`
    # replica says nothing about where the next request goes.
    t = view.tenant
    chosen = [r for r in live if view.shares.get(r.name, 0) > 0 or t in r.mix or r.block > 0]
    return chosen or live


def loaded_as(ctx: FleetContext, live: list[ReplicaInput]) -> FleetContext:
    """The tick's fleet with its replicas carrying other loads (`live`, the same
    replicas as `ctx.live` or fewer): what a placement is priced on."""
    return replace(ctx, live=live, knee=knees(live), homes={t: homes_of(v, live) for t, v in ctx.tenants.items()})


def fleet_context(
    replicas: list[ReplicaInput], tenants: list[TenantView], state: dict[str, TenantState], cfg: DecisionConfig
) -> FleetContext:
    live = [r for r in replicas if r.healthy]
    off_pool = any(r.block == 0 for r in live)
    max_block = max({r.block for r in live if r.block > 0}, default=0)
    # Caps below the largest block, plus FULL = "no cap" (the replica's own
    # block): publishing no cap means a profile change (restart to another
    # block size) does not leave tenants pinned to the old block.
    caps = sorted({c for c in cfg.draft_caps if c < max_block}) + ([FULL] if max_block else [])

    views = {t.tenant: t for t in tenants}
    if DEFAULT_TENANT not in views:
        views[DEFAULT_TENANT] = TenantView(DEFAULT_TENANT, fleet_acceptance(tenants), 0.0)
    # Start from the current choices (unknown -> largest cap) and floors.
    current = {t: (state[t].k if t in state and state[t].k >= 0 else (caps[-1] if caps else 0)) for t in views}
    return FleetContext(
        live=live,
        off_pool=off_pool,
        max_block=max_block,
        caps=caps,
        tenants=views,
        acc={t: v.acceptance for t, v in views.items()},
        method_acc={t: dict(v.by_method) for t, v in views.items() if v.by_method},
        proposal={t: dict(v.proposal) for t, v in views.items() if v.proposal},
        fleet_a=views[DEFAULT_TENANT].acceptance,
        current=current,
        thetas={t: (state[t].theta if t in state else None) for t in views},
        knee=knees(live),
        homes={t: homes_of(v, live) for t, v in views.items()},
        profiles=frozenset(r.profile for r in replicas),
    )
