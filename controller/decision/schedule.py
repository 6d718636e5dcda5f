"""Per-tenant batch -> draft-length schedules (`specgate_schedule`). PURE.

Why: the cap a tenant's hysteresis picks is right for today's batch only,
and load moves within a controller tick (a burst of clients) while requests
already admitted keep the knobs they were sent. vLLM's own answer is a table
that picks K every step from the step's batch -- one table for every tenant.
A schedule is that table per tenant: the engine looks it up every step
(drafters.vllm_ext), so a load step is met at the next engine step, and a
greedy tenant can keep drafting at a batch where a sampling tenant's drafts
no longer pay.

How: for each batch size b on `cfg.schedule_grid`, the tenants that draft
choose their draft lengths jointly by coordinate ascent on the goodput model
with every knob-capable speculative replica evaluated at batch b (they share
the step: one tenant's drafts slow every request in it), each tenant priced
as at least a small participant (`priced_mix`), as the optimizer does at
today's batch. Long drafts obey the survey rule at b's own rho. Each
tenant's lengths are then made monotone (never longer at a larger batch).

What stays with the hysteresis (hysteresis.py): whether a tenant drafts at
all (its cap at today's batch, with margins, confirmation and dwell: an
on/off change also moves its routing), a TPOT target's choice (a tenant
whose cap its SLO chose gets no schedule: the schedule knows no targets),
and when a changed schedule is published (`steady_schedule`): the load
itself no longer moves a drafting tenant's policy; acceptance, the step
cost and the traffic mix, which the schedule is computed from, do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from contract.knobs import Schedule, compact_schedule

from .config import DecisionConfig
from .context import FleetContext
from .optimizer import Optimizer, priced_mix
from .views import ReplicaInput


def schedule_replicas(ctx: FleetContext) -> list[ReplicaInput]:
    """The replicas a schedule acts on: live, speculative and honouring the knobs."""
    return [r for r in ctx.live if r.block > 0 and r.supports_knobs]


def _priced_at(reps: list[ReplicaInput], batch: float, t: str) -> list[ReplicaInput]:
    """`reps` at `batch`, tenant t priced as at least a small participant (`priced_mix`)."""
    return [replace(rep, batch=batch, waiting=0.0, mix=priced_mix(rep, t)) for rep in reps]


def _rho_at(reps: list[ReplicaInput], batch: float) -> float:
    return max((batch / rep.cost.knee_tokens(batch, rep.context_tokens) for rep in reps), default=0.0)


def joint_lengths(
    opt: Optimizer, chosen: Mapping[str, int], grid: Iterable[int], rounds: int = 2
) -> dict[int, dict[str, int]]:
    """Batch size -> the drafting tenants' goodput-best caps at that batch.

    Tenants whose chosen cap is 0 stay at 0 (they are off, or routed to an off
    pool). Each batch is searched from two starts -- the previous batch's
    answer (the first batch: `chosen`) and every drafting tenant off -- and
    keeps the one that ends best on the replicas' total;
    starting from the neighbour's answer keeps neighbouring batches agreeing
    where the model is indifferent.
    """
    ctx, model, cfg = opt.ctx, opt.model, opt.cfg
    reps = schedule_replicas(ctx)
    drafting = [t for t, k in chosen.items() if k > 0]
    out: dict[int, dict[str, int]] = {}
    if not reps or not drafting:
        return out
    options = {t: opt.allowed_caps(t, base_rho=0.0) for t in drafting}
    previous = dict(chosen)
    for b in grid:
        long_ok = _rho_at(reps, float(b)) < cfg.large_draft_rho
        caps = {t: [c for c in options[t] if long_ok or min(c, ctx.max_block) <= cfg.large_draft] or [0]
                for t in drafting}
        at_b = [replace(rep, batch=float(b), waiting=0.0) for rep in reps]
        priced = {t: _priced_at(reps, float(b), t) for t in drafting}
        # Several starts, as the optimizer's: one tenant alone stopping saves little
        # while the others keep the drafter's pass running, everyone stopping saves it.
        starts = [previous, {**previous, **{t: 0 for t in drafting}}]
        best_total, best = -1.0, previous
        for start in starts:
            choice = {**start, **{t: start[t] if start[t] in caps[t] else caps[t][-1] for t in drafting}}
            for _ in range(rounds):
                for t in drafting:
                    best_c, best_g = choice[t], -1.0
                    for c in caps[t]:
                        g = model.total(priced[t], {**choice, t: c})
                        if g > best_g * (1 + 1e-9):
                            best_c, best_g = c, g
                    choice[t] = best_c
            total = model.total(at_b, choice)
            if total > best_total * (1 + 1e-6):
                best_total, best = total, choice
        previous = best
        out[b] = {t: best[t] for t in drafting}
    return out


def monotone(lengths: list[tuple[int, int]]) -> Schedule:
    """`lengths` ((batch, cap) ascending) never longer at a larger batch: each
    entry at most every entry before it. The step cost only grows with the
    batch, so a longer draft at a larger batch is the model's noise (a
    near-tie between two caps), and a schedule that rises again would make
    the engine draft more as the load grows."""
    out: list[tuple[int, int]] = []
    running = math.inf
    for b, c in lengths:
        running = min(running, c)
        out.append((b, int(running)))
    return compact_schedule(out)


def tenant_schedules(opt: Optimizer, chosen: Mapping[str, int], cfg: DecisionConfig) -> dict[str, Schedule]:
    """Per drafting tenant (its cap at today's batch > 0), its schedule; none
    without a grid or a knob-capable speculative replica, and none for a
    tenant the model would not let draft at any batch on the grid."""
    grid = sorted(set(cfg.schedule_grid or ()))
    if not grid:
        return {}
    joint = joint_lengths(opt, chosen, grid)
    if not joint:
        return {}
    block = opt.ctx.max_block
    out: dict[str, Schedule] = {}
    for t, k in chosen.items():
        if k <= 0:
            continue
        schedule = monotone([(b, min(joint[b][t], block)) for b in grid])
        if any(d > 0 for _, d in schedule):
            out[t] = schedule
    return out
