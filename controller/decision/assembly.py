"""Policy assembly: the published policy and the record that explains it.

Why a stage: the cap, floor and load threshold are decided separately; the
policy a gateway reads combines them with routing (which profile to prefer)
and the operator's word. Admin overrides go through `contract.overrides` --
`TenantOverride.allows_cap` for the caps the optimizer may pick,
`clamp_confidence` for floors, `apply_override` for the policy -- so an
override means the same here as in the admin API. Where `apply_override`
cannot know the fleet, the decision's fleet knowledge is kept (see
`with_override`). What the decision does not choose -- the tenant's
drafter, canary and capture opt-in -- is carried onto the policy last
(`carry`), after any override, so neither the optimizer nor a pin drops it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from contract.knobs import Schedule
from contract.overrides import FleetShape, TenantOverride, apply_override
from contract.policy import SpeculationPolicy

from ..acceptance_fit import Proposal
from .context import FleetContext
from .goodput import regime_label
from .hysteresis import Verdict
from .optimizer import TenantProposal
from .placement import preferred_profile
from .views import FULL, Carried, DecisionRecord, TenantView, cap_label


def speculation_policy(
    k: int, theta: float | None, ctx: FleetContext, max_batch: int | None, schedule: Schedule | None = None
) -> SpeculationPolicy:
    """The controller's own policy for cap k (0 = off: prefer the off pool if any).

    With a schedule (schedule.py) the engine drafts by it at every batch, and
    the cap is its longest draft: k, the cap at today's batch, would cut the
    longer drafts it allows at smaller batches."""
    if k <= 0:
        return SpeculationPolicy(enabled=False, preferred_profile="off" if ctx.off_pool else None, max_draft=0)
    max_draft = None if k >= FULL else min(k, ctx.max_block)
    if schedule is not None:
        max_draft = max(d for _, d in schedule)
    return SpeculationPolicy(
        enabled=True, preferred_profile=preferred_profile(k, ctx.live), max_draft=max_draft,
        min_confidence=theta, max_batch=max_batch, schedule=schedule,
    )


def clamp_floor(theta: float | None, ov: TenantOverride | None, k: int) -> float | None:
    """A drafting tenant's floor inside the override's confidence bounds."""
    return ov.clamp_confidence(theta) if ov is not None and k > 0 else theta


def with_override(policy: SpeculationPolicy, ov: TenantOverride | None, ctx: FleetContext) -> SpeculationPolicy:
    """`apply_override` on the controller's policy, given the live fleet.

    The caps and floors the decision picks already lie inside the override
    (`allows_cap`, `clamp_confidence`), so `apply_override` mostly confirms
    them; it also drops the load threshold of a tenant pinned on, routes a
    tenant pinned off to the off pool, and caps at the largest live block.
    """
    return apply_override(policy, ov, FleetShape(off_pool=ctx.off_pool, max_block=ctx.max_block)) or policy


def carry(policy: SpeculationPolicy, carried: Carried | None, prev: SpeculationPolicy | None) -> SpeculationPolicy:
    """`policy` with the tenant's drafter, canary and capture opt-in (`Carried`)
    set. When the drafter or canary differ from the previous policy's, the
    rollout's note leads the reason: that change is the news of this tick."""
    c = carried or Carried()
    out = policy.model_copy(update={"drafter": c.drafter, "canary": c.canary, "capture": c.capture})
    moved = (prev.drafter, prev.canary) != (c.drafter, c.canary) if prev is not None else bool(c.drafter or c.canary)
    if moved and c.note:
        out = out.model_copy(update={"reason": f"{c.note}; {policy.reason}" if policy.reason else c.note})
    return out


def gain_vs_off(v: Verdict, p: TenantProposal) -> float:
    """Predicted fleet goodput at the chosen cap over the tenant off."""
    g_best = p.table.get(v.chosen, 0.0)
    return g_best / p.g_off if p.g_off > 0 else 1.0


def acceptance_label(acceptance: float | Mapping[str, float]) -> str:
    """The reason's `a=`: the acceptance the decision priced. One method (or one number):
    `0.88`; a tenant whose home replicas run several methods: `dspark:0.88/ngram:0.41`,
    since a tenant's ngram and trained-drafter acceptance differ several-fold."""
    if not isinstance(acceptance, Mapping):
        return f"{acceptance:.2f}"
    if len(acceptance) == 1:
        return f"{next(iter(acceptance.values())):.2f}"
    return "/".join(f"{m}:{a:.2f}" for m, a in sorted(acceptance.items()))


def tenant_policy(
    ctx: FleetContext, v: Verdict, p: TenantProposal, ov: TenantOverride | None, theta: float | None,
    max_batch: int | None, rho: dict[str, float], acceptance: float | Mapping[str, float],
    schedule: Schedule | None = None,
) -> SpeculationPolicy:
    """The policy to publish for one tenant, with its reason and source. `acceptance`: what the
    decision priced, per method of the tenant's home replicas (`GoodputModel.acceptance`)."""
    policy = with_override(speculation_policy(v.chosen, theta, ctx, max_batch, schedule), ov, ctx)
    local_rho = max(rho.values(), default=0.0)
    bits = [v.why, f"rho={local_rho:.2f} ({regime_label(local_rho)})", f"a={acceptance_label(acceptance)}",
            f"gain_vs_off={gain_vs_off(v, p):.2f}"]
    if p.slo_note:
        bits.append(p.slo_note)
    # An `auto` override with bounds is the controller deciding inside them
    # (unless it just had to move the tenant); `on`/`off` pins are the admin's.
    source = "admin" if v.forced or (ov is not None and ov.mode != "auto") else "controller"
    return policy.model_copy(update={"reason": "; ".join(bits), "source": source})


def place(policy: SpeculationPolicy, replicas: tuple[str, ...] | None, why: str) -> SpeculationPolicy:
    """`policy` with the tenant's placement (`decision/apart.py`; None: not
    placed) and, when placed, the reason's clause saying where and why."""
    if replicas is None:
        return policy if policy.placement is None else policy.model_copy(update={"placement": None})
    reason = f"{policy.reason}; {why}" if policy.reason else why
    return policy.model_copy(update={"placement": replicas, "reason": reason})


def _proposal_fields(q: Proposal) -> dict:
    out: dict = {"rate": round(q.rate, 4), "fill": round(q.fill, 4)}
    if q.survival:
        out["survival"] = [round(x, 4) for x in q.survival]
    return out


def record(
    now: float, changed: bool, policy: SpeculationPolicy, v: Verdict, p: TenantProposal, view: TenantView,
    theta: float | None, theta_star: float, rho: dict[str, float], tpot_ms: float,
    predicted_gain: float | None = None, schedule_gain: float | None = None,
    schedule_gain_elsewhere: float | None = None,
) -> DecisionRecord:
    numbers = {
        "k": cap_label(v.chosen),
        "proposed_k": cap_label(p.best),
        "theta": theta,
        "theta_star": theta_star or None,  # the floor's marginal-cost value, published only when it pays
        "acceptance": round(view.acceptance, 4),
        "acceptance_length": round(view.acceptance_length, 4) if view.acceptance_length is not None else None,
        "evidence_steps": round(view.evidence_steps, 1),
        # Per method: the measured share of decode steps with a proposal and the share of the
        # allowance proposed (methods that may not propose: ngram), and the measured survival per
        # draft position where histograms back it (`TenantEstimator.method_proposal`).
        "proposal": {m: _proposal_fields(q) for m, q in sorted(view.proposal.items())} or None,
        "gain_vs_off": round(gain_vs_off(v, p), 4),
        "improvement": None if math.isinf(v.improvement) else round(v.improvement, 4),
        "traffic_share": round(p.share, 4),
        "smoothed_improvement": {cap_label(k): round(x, 4) for k, x in sorted(v.smoothed.items())},
        "margin": v.margin,
        "goodput_by_k": {cap_label(k): round(g, 1) for k, g in sorted(p.table.items())},
        "rho": {name: round(r, 3) for name, r in rho.items()},
        "predicted_tpot_ms": round(tpot_ms, 3) if math.isfinite(tpot_ms) else None,  # None: no healthy replica serves it
        "tpot_target_ms": view.tpot_target_ms,
        "pending": [cap_label(v.pending_k), v.pending_count] if v.pending_k is not None else None,
        "max_batch": policy.max_batch,
        "schedule": [list(pair) for pair in policy.schedule] if policy.schedule is not None else None,
        # The tick's recomputed schedule against the one in force, where it acts now
        # (`schedule.schedule_gain`; None: nothing to compare): below the retune margin it waits.
        "schedule_gain": None if schedule_gain is None or math.isinf(schedule_gain) else round(schedule_gain, 4),
        # Past the dwell, with schedule_gain under the margin: its largest gain at any one batch
        # (`schedule.schedule_gain_elsewhere`; None: not asked); at strong_margin it is published.
        "schedule_gain_elsewhere": None if schedule_gain_elsewhere is None or math.isinf(schedule_gain_elsewhere)
        else round(schedule_gain_elsewhere, 4),
        # A probe's two arms (controller/decision/probe.py): their measured ratio of time per output
        # token beside the model's prediction for a request drafting at the arm's cap.
        "measured_gain": None if view.measured_gain is None else {
            "measured": round(view.measured_gain.gain, 4),
            "predicted": None if predicted_gain is None else round(predicted_gain, 4),
            "drafting_tokens": round(view.measured_gain.drafting_tokens, 1),
            "plain_tokens": round(view.measured_gain.plain_tokens, 1),
        },
    }
    return DecisionRecord(p.tenant, now, changed, policy, policy.reason, numbers)
