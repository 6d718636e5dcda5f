"""The joint choice of per-tenant draft caps: what the fleet should run.

Why coordinate ascent on *fleet* goodput: the drafter's pass is shared by a
replica's whole batch, so one tenant's cap changes every co-located tenant's
step time. Each tenant's cap k_t in {0} + caps is chosen against the others'
(heaviest tenants first) from several starts -- the current choice, everyone
off, everyone at each cap -- because one tenant alone turning off saves
little while everyone off saves the pass. That is what "switch speculation
off under compute-bound load" means here: once a replica passes its knee,
each extra verified token costs ~2P/F and k_t -> 0 wins. Acceptance alone
never switches anything off (it stays high while the batch turns
compute-bound); the regime does.

Also here: the caps a tenant may take (survey rule for long drafts, admin
bounds via `TenantOverride.allows_cap`), predicted TPOT, and the SLO choice:
a tenant with a TPOT target may keep a longer draft than the goodput optimum
if that keeps it inside its target and costs the fleet at most `slo_budget`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from contract.overrides import TenantOverride
from contract.policy import DEFAULT_TENANT

from ..acceptance_fit import draft_length
from .config import DecisionConfig
from .context import FleetContext
from .goodput import GoodputModel, effective_cap, run_batch
from .placement import place, pricing_targets, tenant_load
from .views import ReplicaInput, cap_label


@dataclass(frozen=True)
class Plan:
    """The fleet's goodput-optimal joint choice and how each tenant's caps scored."""

    proposal: dict[str, int]  # tenant -> cap
    tables: dict[str, dict[int, float]]  # tenant -> {allowed cap: fleet goodput with the others at the proposal}
    options: dict[str, list[int]]  # tenant -> caps it may take


@dataclass(frozen=True)
class TenantProposal:
    """What the optimizer proposes for one tenant, priced for hysteresis."""

    tenant: str
    best: int  # proposed cap (goodput optimum, or the SLO's choice)
    table: dict[int, float]  # fleet goodput by allowed cap
    g_off: float  # fleet goodput with the tenant off
    g_cur: float  # fleet goodput at the tenant's current cap (0 if never decided)
    share: float  # the tenant's share of the traffic on its replicas
    slo_driven: bool  # `best` is the SLO's choice, not the goodput optimum
    slo_note: str
    evidence_steps: float
    allowed: list[int]  # caps the tenant may take
    pinned: str | None  # mode of an admin override that is not a no-op


# A tenant is priced as at least this share of each replica's traffic: a
# newcomer (no traffic here yet) or one whose traffic has decayed to a trickle
# is judged as the small participant it may become, and the hysteresis divides
# fleet gains by the same share (`Optimizer.share`), so the margins apply to the
# tenant's own gain -- pricing it at 0.5 % while dividing by 5 % would shrink
# its gain tenfold and keep it off at idle.
MIN_PRICED_SHARE = 0.05


def priced_mix(rep: ReplicaInput, t: str) -> dict[str, float]:
    """`rep`'s traffic mix with tenant t raised to at least MIN_PRICED_SHARE."""
    mix = dict(rep.mix or {DEFAULT_TENANT: 1.0})
    others = sum(v for k, v in mix.items() if k != t)
    floor = MIN_PRICED_SHARE / (1.0 - MIN_PRICED_SHARE) * others
    if mix.get(t, 0.0) < floor:
        mix[t] = floor
    return mix


class Optimizer:
    def __init__(self, ctx: FleetContext, model: GoodputModel, overrides: Mapping[str, TenantOverride], cfg: DecisionConfig):
        self.ctx, self.model, self.overrides, self.cfg = ctx, model, overrides, cfg
        self._placed: dict[tuple[tuple[str, int], ...], list[ReplicaInput]] = {}

    # -- pricing ----------------------------------------------------------
    def placed(self, choice: Mapping[str, int]) -> list[ReplicaInput]:
        """The live replicas carrying traffic as routing would under `choice`
        (`placement.place`; memoised: the ascent asks for the same choices often)."""
        key = tuple(sorted(choice.items()))
        if key not in self._placed:
            self._placed[key] = place(self.ctx.live, choice, self.ctx.current, self.ctx.off_pool)
        return self._placed[key]

    def fleet_goodput(self, choice: Mapping[str, int], t: str, thetas: Mapping[str, float | None] | None = None) -> float:
        """Goodput of the live replicas under `choice` (floors: the model's
        unless given), tenant t priced as at least a small participant
        everywhere. Every live replica, not only those t's traffic was seen
        on: a candidate cap may route it elsewhere (`placed`), and every
        candidate must be summed over the same replicas to compare."""
        model = self.model if thetas is None else self.model.with_thetas(thetas)
        return sum(model.evaluate(replace(rep, mix=priced_mix(rep, t)), choice).goodput for rep in self.placed(choice))

    def tpot_ms(self, choice: Mapping[str, int], t: str, thetas: Mapping[str, float | None] | None = None) -> float:
        """Predicted time per output token of tenant t (weighted by its traffic shares);
        infinite while no healthy replica serves it (every replica down is a
        state the controller must ride through, not a crash of its tick)."""
        model = self.model if thetas is None else self.model.with_thetas(thetas)
        acc, reps = self.ctx.acc, self.placed(choice)
        if not reps:
            return math.inf
        if pricing_targets(choice[t], self.ctx.current.get(t, choice[t]), self.ctx.live, self.ctx.off_pool) is not None:
            # Routed elsewhere than observed: weighted by where its requests would run.
            weights = {r.name: tenant_load(r, t) for r in reps}
        else:
            view = self.ctx.tenants[t]
            weights = {r.name: view.shares.get(r.name, 0.0) for r in reps}
        norm = sum(weights.values()) or float(len(reps))
        total = 0.0
        for rep in reps:
            _, step, _, taus = model.evaluate(rep, choice)
            tau = taus.get(t) or model.proposes(t, rep.method).tokens(
                acc[t], draft_length(acc[t], effective_cap(rep, choice[t]), model.thetas.get(t)))
            total += (weights[rep.name] if sum(weights.values()) else 1.0) * step / tau
        return 1000.0 * total / norm

    def share(self, t: str) -> float:
        """Tenant t's share of the traffic on the live replicas, as
        `fleet_goodput` prices it (`priced_mix`: at least MIN_PRICED_SHARE on
        each), so that a fleet gain divided by it is the tenant's own."""
        reps = self.ctx.live
        total = sum(max(r.batch, 1.0) for r in reps)
        if total <= 0:
            return 1.0
        priced = 0.0
        for r in reps:
            mix = priced_mix(r, t)
            priced += max(r.batch, 1.0) * mix[t] / (sum(mix.values()) or 1.0)
        return min(1.0, max(MIN_PRICED_SHARE, priced / total))

    # -- the choice -------------------------------------------------------
    def allowed_caps(self, t: str, base_rho: float | None = None) -> list[int]:
        """The caps tenant t may take: admin bounds, and the survey rule for long
        drafts at `base_rho` (default: today's batch on its replicas; a schedule
        applies the rule per batch size itself and passes 0)."""
        ctx, cfg, ov = self.ctx, self.cfg, self.overrides.get(t)
        options = [0] + ctx.caps
        # Survey rule: long drafts only well below the knee. Keyed on the
        # batch's own rho (B / knee), which the policy does not move, so the
        # gate cannot oscillate with the draft length it gates.
        if base_rho is None:
            base_rho = max((run_batch(r) / ctx.knee[r.name] for r in ctx.homes[t] if ctx.knee.get(r.name)), default=0.0)
        options = [k for k in options if min(k, ctx.max_block) <= cfg.large_draft or base_rho < cfg.large_draft_rho]
        if ov is not None:
            if ov.mode == "off":
                return [0]
            if ov.mode == "on":
                options = [k for k in options if k > 0] or ctx.caps[:1]
            bounded = [k for k in options if ov.allows_cap(k)]
            if not bounded:
                # Bounds above every candidate: the smallest allowed cap, at most the largest block.
                bounded = [min(ov.clamp_cap(1), ctx.max_block)] if ctx.max_block else [0]
            options = bounded
        return options or [0]

    def propose(self) -> Plan:
        """Coordinate ascent on fleet goodput, heaviest tenants first, best of several starts."""
        ctx = self.ctx
        order = sorted(ctx.tenants, key=lambda t: -sum(r.mix.get(t, 0.0) * max(r.batch, 0.0) for r in ctx.live))
        options = {t: self.allowed_caps(t) for t in order}
        starts = [ctx.current] + [{t: c for t in order} for c in [0] + ctx.caps]
        best_total = -1.0
        proposal, scores = ctx.current, {}
        for start in starts:
            cand, tables = self._ascend(start, order, options)
            g = self.model.total(self.placed(cand), cand)
            if g > best_total * (1 + 1e-6):
                best_total, proposal, scores = g, cand, tables
        return Plan(proposal, scores, options)

    def _ascend(self, start, order, options) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
        proposal = {t: (start[t] if start[t] in options[t] else options[t][-1]) for t in order}
        tables: dict[str, dict[int, float]] = {}
        for _ in range(2):
            for t in order:
                best_k, best_g = proposal[t], -1.0
                table: dict[int, float] = {}
                for k in options[t]:
                    table[k] = self.fleet_goodput({**proposal, t: k}, t)
                    if table[k] > best_g * (1 + 1e-9):
                        best_k, best_g = k, table[k]
                tables[t] = table
                proposal[t] = best_k
        return proposal, tables

    def slo_choice(self, t: str, best: int, table: dict[int, float], target_ms: float, proposal: dict[str, int]) -> tuple[int, str]:
        """Keep a tenant inside its TPOT target when the fleet can afford it.

        Only a choice that actually *meets* the target is worth goodput: if no
        affordable draft cap gets the tenant under its target, the goodput
        optimum stands (spending fleet capacity on a miss helps no one).
        """
        best_tpot = self.tpot_ms({**proposal, t: best}, t)
        if best_tpot <= target_ms:
            return best, ""
        g_best = table[best]
        meeting = [
            k for k, g in table.items()
            if g >= (1 - self.cfg.slo_budget) * g_best and self.tpot_ms({**proposal, t: k}, t) <= target_ms
        ]
        if not meeting:
            return best, f"SLO {target_ms:.0f}ms unreachable at affordable cost (best {best_tpot:.1f}ms)"
        pick = max(meeting, key=lambda k: table[k])
        new_tpot = self.tpot_ms({**proposal, t: pick}, t)
        return pick, f"SLO {target_ms:.0f}ms: k={cap_label(pick)} tpot {new_tpot:.1f}ms (goodput-optimal k={cap_label(best)} {best_tpot:.1f}ms)"

    def tenant_proposal(self, t: str, plan: Plan, current_k: int) -> TenantProposal:
        """The plan's cap for tenant t (or its SLO's), priced against off and the current cap."""
        view, table, proposal = self.ctx.tenants[t], plan.tables[t], plan.proposal
        best, slo_note, slo_driven = proposal[t], "", False
        if view.tpot_target_ms and table:
            slo_best, slo_note = self.slo_choice(t, best, table, view.tpot_target_ms, proposal)
            slo_driven = slo_best != best
            best = slo_best
        cur = current_k if current_k >= 0 else None
        # Look the table up first: `dict.get`'s default would evaluate a full
        # fleet goodput even when the value is already there.
        g_off = table[0] if 0 in table else self.fleet_goodput({**proposal, t: 0}, t)
        if cur is None:
            g_cur = 0.0
        else:
            g_cur = table[cur] if cur in table else self.fleet_goodput({**proposal, t: cur}, t)
        ov = self.overrides.get(t)
        return TenantProposal(
            tenant=t, best=best, table=table, g_off=g_off, g_cur=g_cur, share=self.share(t), slo_driven=slo_driven,
            slo_note=slo_note, evidence_steps=view.evidence_steps, allowed=plan.options[t],
            pinned=ov.mode if ov is not None and not ov.is_noop else None,
        )
