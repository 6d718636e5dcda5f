"""The controller's decision: measurements in, per-tenant policies out. PURE.

No I/O, no clock, no randomness: `decide()` is a function of its arguments,
so the live controller (`controller/service.py`), the table-driven tests and
the discrete-event benchmark (`bench/control_sweep.py`) run literally the
same code.

`decide()` is a sequence of stages, one module each:

- `context`: the tick's fleet (live replicas, candidate caps, acceptance,
  current choices, knees);
- `goodput`: the model that prices a joint choice of caps on one replica;
- `optimizer`: the fleet's goodput-optimal caps per tenant, allowed caps
  (admin bounds), TPOT and the SLO choice;
- `hysteresis`: whether the proposal becomes the policy (margins, dwell,
  confirmation, strong signals), and the same for floors and thresholds;
- `floor`: the confidence floor theta* for the chosen cap, when it pays;
- `threshold`: the batch above which everyone off would win (max_batch);
- `schedule`: each drafting tenant's batch -> draft-length schedule, the
  caps of all tenants extended jointly to other batch sizes (the engine
  applies it every step);
- `apart`: which replicas the heaviest tenants prefer, where the model prices
  them apart above sharing every step (routing's placement);
- `assembly`: the published policy (routing, admin overrides, the carried
  drafter / canary / capture opt-in), reason, record;
- `rollout`: the canary rule (promote / roll back / wait), used by
  `controller/rollout.py` outside `decide()`;
- `fleet`: per-replica regime, fleet plan and downtime cost.
"""

from __future__ import annotations

from typing import Mapping

from contract.knobs import Schedule, schedule_cap
from contract.overrides import TenantOverride

from . import apart, assembly, hysteresis
from .config import DecisionConfig
from .context import FleetContext, fleet_context
from .fleet import (
    plan_profiles,
    downtime_loss,
    fleet_plan,
    operating_rho,
    replica_regimes,
    restart_targets,
    servable_profiles,
)
from .floor import confidence_floor, marginal_theta
from .goodput import (
    GoodputModel,
    ReplicaEval,
    effective_cap,
    regime_label,
    replica_load,
    run_batch,
)
from .optimizer import Optimizer, Plan, TenantProposal
from .probe import drafts, predicted_gain, tenant_probe
from .schedule import (
    schedule_gain,
    schedule_gain_elsewhere,
    scheduled_proposals,
    schedules_stand,
    tenant_schedules,
)
from .threshold import LoadThresholds, spec_max_batch
from .views import (
    FULL,
    Carried,
    CostFn,
    Decision,
    DecisionRecord,
    MeasuredGain,
    Placement,
    ReplicaInput,
    ReplicaRegime,
    TenantState,
    TenantView,
    cap_label,
)

DEFAULT_CONFIG = DecisionConfig()


def decide(
    replicas: list[ReplicaInput],
    tenants: list[TenantView],
    state: dict[str, TenantState],
    overrides: dict[str, TenantOverride],
    now: float,
    cfg: DecisionConfig = DEFAULT_CONFIG,
    carried: "Mapping[str, Carried] | None" = None,
    placement: Placement | None = None,
) -> Decision:
    """`carried`: per tenant, the drafter, canary and capture opt-in its policy
    carries unchanged (`assembly.carry`); absent = none. `placement`: the
    last tick's `Decision.placement` (absent: every tenant together)."""
    carried = carried or {}
    ctx = fleet_context(replicas, tenants, state, cfg)
    model = ctx.goodput_model()
    opt = Optimizer(ctx, model, overrides, cfg)
    plan = opt.propose()
    placed = apart.step(placement or Placement(), ctx, overrides, cfg, now)
    rho = operating_rho(ctx, model, plan.proposal)
    thresholds = LoadThresholds(model, cfg)

    proposals: dict[str, TenantProposal] = {}
    searched = None
    if schedules_stand(ctx, cfg):
        # The engine applies each drafting tenant's schedule every step: on/off is
        # priced where drafting pays (schedule.py). A TPOT target is about today's
        # batch: where it moves the tenant's cap there (the SLO's choice), that stands.
        for t in sorted(ctx.tenants):
            if ctx.tenants[t].tpot_target_ms:
                today = opt.tenant_proposal(t, plan, state.get(t, TenantState()).k)
                if today.slo_driven:
                    proposals[t] = today
        scheduled, searched = scheduled_proposals(opt, {t: s.k for t, s in state.items()}, cfg,
                                                  [t for t in sorted(ctx.tenants) if t not in proposals])
        proposals.update(scheduled)
    verdicts: dict[str, hysteresis.Verdict] = {}
    for t in sorted(ctx.tenants):
        prev = state.get(t, TenantState())
        if t not in proposals:
            proposals[t] = opt.tenant_proposal(t, plan, prev.k)
        verdicts[t] = hysteresis.step(prev, proposals[t], cfg, now)
    # Every tenant's on/off and cap is known: the schedules extend them jointly to every batch.
    schedules = tenant_schedules(opt, {t: v.chosen for t, v in verdicts.items()}, cfg, searched)
    schedules = {t: s for t, s in schedules.items() if not proposals[t].slo_driven}

    # What each tenant drafts at a batch as this tick computes it: a schedule, else its cap.
    computed: dict[str, Schedule | int] = {t: schedules.get(t, v.chosen) for t, v in verdicts.items()}
    policies, new_state, records = {}, {}, []
    for t in sorted(ctx.tenants):
        prev, ov, view = state.get(t, TenantState()), overrides.get(t), ctx.tenants[t]
        proposal, verdict = proposals[t], verdicts[t]
        k = verdict.chosen
        choice = {**plan.proposal, t: k}

        theta_star, worth = confidence_floor(opt, t, k, plan.proposal, cfg)
        theta, theta_ema = hysteresis.smooth_floor(prev, verdict, worth, cfg, now)
        theta = assembly.clamp_floor(theta, ov, k)
        load = max((run_batch(r) for r in ctx.homes[t]), default=1.0)
        in_force = hysteresis.schedule_in_force(prev)
        new = schedules.get(t)
        gain = schedule_gain(opt, t, in_force, new, computed, load) \
            if in_force is not None and new is not None and new != in_force else None
        elsewhere: list[float] = []  # the gain at any one batch, when the hysteresis asks for it

        def gain_elsewhere() -> float:
            elsewhere.append(schedule_gain_elsewhere(opt, t, in_force, new, computed))
            return elsewhere[-1]

        schedule = hysteresis.steady_schedule(prev, verdict, new, cfg, now, stand=searched is not None, gain=gain,
                                              elsewhere=gain_elsewhere if gain is not None else None)
        # A schedule says where the tenant stops drafting itself (its zeros; the policy
        # sends its envelope as max_batch to plugins without schedules); the load
        # threshold, priced for today's cap at every batch, would cut it short.
        max_batch = None
        if schedule is None:
            max_batch = thresholds.for_choice(choice, ctx.homes[t]) if k > 0 else None
            max_batch = hysteresis.steady_max_batch(prev, verdict, max_batch, load, cfg, now)
        # The cap its requests get at today's batch: a schedule's length there (k is then
        # its cap where drafting pays it, which may lie at another batch).
        k_now = k if schedule is None else schedule_cap(schedule, max(1, round(load)))

        tenant_rho = {r.name: rho[r.name] for r in ctx.homes[t]}
        # The acceptance priced on the tenant's drafting homes (per method), not its overall estimate.
        priced = {r.method: model.acceptance(t, r.method) for r in ctx.homes[t] if r.method != "off"}
        policy = assembly.tenant_policy(ctx, verdict, proposal, ov, theta, max_batch, tenant_rho,
                                        priced or view.acceptance, schedule)  # fmt: skip
        policy = assembly.carry(policy, carried.get(t), prev.policy)
        policy = assembly.place(policy, placed.of(t), apart.note(placed, t))
        policy = policy.model_copy(update={"probe": tenant_probe(ctx, model, t, policy, prev.policy, cfg, ov)})
        changed = hysteresis.policy_changed(prev, policy)
        new_state[t] = hysteresis.remember(prev, verdict, policy, theta, theta_ema, changed, now)
        policies[t] = policy
        tpot = opt.tpot_ms({**plan.proposal, t: k_now}, t, {**ctx.thetas, t: theta})
        drafting_cap = (k_now or k) if drafts(policy) else max((r.block for r in ctx.homes[t]), default=0)
        predicted = predicted_gain(ctx, model, t, choice, drafting_cap) if view.measured_gain is not None else None
        records.append(assembly.record(now, changed, policy, verdict, proposal, view, theta, theta_star, tenant_rho, tpot,
                                       predicted, gain, elsewhere[-1] if elsewhere else None))  # fmt: skip

    return Decision(policies, new_state, records, replica_regimes(ctx, model, new_state, cfg), placed)


__all__ = [
    "FULL", "Carried", "MeasuredGain", "plan_profiles", "CostFn", "Decision", "DecisionConfig", "DecisionRecord", "FleetContext", "GoodputModel",
    "LoadThresholds", "Optimizer", "Placement", "Plan", "ReplicaEval", "ReplicaInput", "ReplicaRegime", "TenantProposal",
    "TenantState", "TenantView", "cap_label", "confidence_floor", "decide", "downtime_loss", "effective_cap",
    "fleet_context", "fleet_plan", "marginal_theta", "operating_rho", "regime_label", "replica_load", "run_batch",
    "restart_targets", "servable_profiles", "spec_max_batch", "tenant_schedules",
]
