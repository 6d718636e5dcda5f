"""The controller's decision: measurements in, per-tenant policies out. PURE.

No I/O, no clock, no randomness: `decide()` is a function of its arguments,
so the live controller (`controller/service.py`), the table-driven tests and
the discrete-event benchmark (`bench/control_sweep.py`) run literally the
same code.

Model. Each replica r runs a batch of B_r requests whose tenants have
conditional per-position acceptance a_t (see `acceptance_fit`). If tenant t
drafts L_t tokens per step, one engine step verifies
n_r = B_r * sum_t mix_rt * (1 + L_t) tokens, emits
B_r * sum_t mix_rt * tau_t(L_t) tokens and takes T_r(B_r, n_r) seconds (cost
model: roofline with the drafter's pass; drafting stops costing when nobody
drafts). Fleet goodput is sum_r B_r * tokens / T_r. The decision picks each
tenant's draft cap k_t in {0} + caps by coordinate ascent on fleet goodput —
that is what "switch speculation off under compute-bound load" means here:
once n_r passes the knee, each extra verified token costs ~2P/F and a
tenant's k_t -> 0 wins. Acceptance alone never switches anything off (it
stays high while the batch turns compute-bound); the regime does.

The confidence floor follows the survey's continuous form of vLLM's
adaptive-verification budget: admit a draft position iff its survival
S >= theta* = G * c_m (goodput times marginal verify cost per token); near 0
when memory-bound, large when compute-bound. A floor is published only when the model predicts it beats no floor (the
engine's budget and the per-tenant cap usually subsume it). A tenant with a
TPOT target may keep a longer draft than the goodput optimum if that keeps
it inside its target and costs the fleet at most `slo_budget` of predicted
goodput. A drafting policy also carries `max_batch`, the batch above which
everyone off would win: the engine applies it at every step, so a load step
switches drafting off before the next tick, in-flight requests included.

Hysteresis (why the policy never flaps on noisy signals): a change needs a
predicted improvement over the *current* choice above a margin that is
asymmetric (turn on: +5 %, turn off: +3 %, retune: +3 %, widened when the
tenant's acceptance estimate rests on little data), the same proposal on
`confirm_ticks` consecutive ticks, and `min_dwell_s` since the last change.
A strong signal (improvement above `strong_margin` on `strong_ticks`
consecutive ticks, e.g. a load step deep into or out of the compute-bound
regime) skips the smoothing; a strong turn-off also ignores dwell:
protecting the fleet beats smoothness. Admin overrides bypass hysteresis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

from gateway.speculation_policy import DEFAULT_TENANT, SpeculationPolicy

from .acceptance_fit import draft_length, tokens_per_step
from .overrides import TenantOverride


class CostFn(Protocol):
    """Step time of one replica (seconds) — see controller/costs.py."""

    def step_time_s(
        self, batch: float, verify_tokens: float, draft_len: int, context_tokens: float, drafting_batch: float | None = None
    ) -> float: ...

    def knee_tokens(self, batch: float, context_tokens: float) -> float: ...


FULL = 1 << 20  # draft cap meaning "no cap": the replica's whole block


def _k(k: int) -> str:
    return "full" if k >= FULL else str(k)


@dataclass(frozen=True)
class DecisionConfig:
    draft_caps: tuple[int, ...] = (2, 4, 8, 16)
    on_margin: float = 0.05
    off_margin: float = 0.03
    retune_margin: float = 0.05
    strong_margin: float = 0.15
    confirm_ticks: int = 3
    min_dwell_s: float = 30.0
    slo_budget: float = 0.10
    large_draft: int = 8  # drafts longer than this only while rho < large_draft_rho
    large_draft_rho: float = 0.5
    theta_step: float = 0.05  # confidence floors are published on this grid
    theta_max: float = 0.9
    theta_min_change: float = 0.2  # re-publish a floor only when it moves this much (or k changes)
    theta_min_gain: float = 0.01  # publish a floor only when it beats no floor by this much (predicted)
    thin_evidence_steps: float = 200.0  # below this many effective steps, margins widen
    thin_extra_margin: float = 0.05
    min_batch: float = 1.0
    plan_margin: float = 0.02  # predicted gain per converted replica before the fleet plan recommends a profile (PlanGate decides on restarts)
    strong_ticks: int = 2  # consecutive strong ticks that bypass smoothing (and, to turn off, dwell)
    smoothing: float = 0.2  # EMA weight of the newest tick in the candidates' relative goodput
    # Load threshold sent with each drafting policy (specgate_max_batch): the
    # batch at which everyone off starts to beat the current choice by
    # off_margin, rounded down to this grid. None disables it.
    max_batch_grid: tuple[int, ...] | None = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class ReplicaView:
    """One replica as the estimators see it this tick."""

    name: str
    profile: str
    block: int  # drafter block size gamma; 0 = no speculation
    adaptive: bool
    supports_knobs: bool
    cost: CostFn
    batch: float  # running requests (smoothed)
    waiting: float = 0.0
    context_tokens: float = 1024.0
    healthy: bool = True
    tokens_per_step: float | None = None  # measured (vLLM iteration_tokens)
    acceptance_length: float | None = None  # measured (vLLM spec counters)
    mix: dict[str, float] = field(default_factory=dict)  # tenant -> share of this replica's traffic
    # Prompt tokens prefilled per generated token: in steady state every output
    # token "brings" this much prefill into the same steps, so a policy that
    # emits more tokens per step also prefills more per step.
    prefill_ratio: float = 0.0
    prompt_tokens: float = 512.0  # mean prompt length (prefill chunk size)


@dataclass(frozen=True)
class TenantView:
    tenant: str
    acceptance: float  # conditional per-position acceptance a (shrunk estimate)
    evidence_steps: float = 0.0  # effective (decayed) verification steps behind the estimate
    tpot_target_ms: float | None = None
    shares: dict[str, float] = field(default_factory=dict)  # replica -> share of this tenant's traffic


@dataclass(frozen=True)
class TenantState:
    """What hysteresis needs to remember about one tenant between ticks."""

    k: int = -1  # current draft cap; -1 = never decided
    theta: float | None = None
    since: float = float("-inf")
    pending_k: int | None = None
    pending_count: int = 0
    policy: SpeculationPolicy | None = None
    smoothed: tuple[tuple[int, float], ...] = ()  # EMA of normalised predicted goodput per candidate k
    strong_k: int | None = None  # candidate of the current run of strong signals
    strong_count: int = 0
    theta_ema: float | None = None  # smoothed confidence floor before gridding
    provisional: bool = False  # last change rested on thin evidence: dwell does not protect it


@dataclass(frozen=True)
class DecisionRecord:
    tenant: str
    at: float
    changed: bool
    policy: SpeculationPolicy
    reason: str
    numbers: dict


@dataclass(frozen=True)
class ReplicaRegime:
    name: str
    profile: str
    batch: float
    tokens_per_step: float
    knee: float
    rho: float
    regime: str
    acceptance_length: float | None
    predicted_goodput_tok_s: float
    recommended_profile: str
    recommended_gain: float
    # Share of this replica's goodput the fleet loses while it restarts (the
    # others absorb its requests): what a restart costs per second of downtime.
    downtime_loss: float = 1.0


@dataclass(frozen=True)
class Decision:
    policies: dict[str, SpeculationPolicy]
    state: dict[str, TenantState]
    records: list[DecisionRecord]
    replicas: dict[str, ReplicaRegime]

    @property
    def changes(self) -> list[DecisionRecord]:
        return [r for r in self.records if r.changed]


# ---------------------------------------------------------------------------
# Goodput model


def regime_label(rho: float) -> str:
    if rho < 0.7:
        return "memory-bound"
    if rho < 1.0:
        return "near-knee"
    return "compute-bound"


def _load(rep: ReplicaView) -> float:
    """Requests on the replica: running plus waiting. A queue is the batch of
    the next seconds (a load step shows up there first, while its prompts are
    still being prefilled), so the regime is judged on it."""
    return max(rep.batch + max(rep.waiting, 0.0), 0.0)


def _batch(rep: ReplicaView) -> float:
    """The batch the policy will run at (`_load`; an idle replica counts as
    holding its next request)."""
    return max(_load(rep), 1.0)


def _effective_cap(rep: ReplicaView, k: int) -> int:
    if rep.block <= 0 or k <= 0:
        return 0
    if not rep.supports_knobs:
        # Without per-request knobs the replica drafts its full block; a
        # tenant that should not speculate is steered to an `off` replica by
        # routing (preferred_profile), which the model takes as realised.
        return rep.block if k > 0 else 0
    return min(k, rep.block)


def _replica_eval(
    rep: ReplicaView,
    choice: dict[str, int],
    acc: dict[str, float],
    theta: dict[str, float | None],
    engine_theta: float,
    default_k: int,
    fleet_a: float,
    off_pool: bool = False,
) -> tuple[float, float, float, dict[str, float]]:
    """(goodput tok/s, step seconds, verified tokens per step, per-tenant tau).

    An idle replica is evaluated as holding one request (the next arrival).
    The drafter's pass covers the replica's whole block (DSpark drafts it in
    one parallel pass) for the share of the batch that drafts, see below.
    """
    batch = _batch(rep)
    mix = rep.mix or {DEFAULT_TENANT: 1.0}
    total = sum(mix.values()) or 1.0
    rows = []  # (tenant, weight, a, cap, floor)
    for tenant, weight in mix.items():
        w = weight / total
        cap = _effective_cap(rep, choice.get(tenant, default_k))
        rows.append((tenant, w, acc.get(tenant, fleet_a), cap, theta.get(tenant)))
    # vLLM drafts batch-wide: on a speculative replica the drafter proposes a
    # full block for every decoding request whatever the per-request caps
    # (a cap of 0 saves verification, not drafting). Two ways out: with an off
    # pool, a tenant at k=0 is routed there (preferred_profile="off") and
    # stops costing this replica's drafter; and on a knob-capable replica
    # (drafters.vllm_ext) a step whose requests are all capped at 0 runs with
    # K=0, which skips the drafter's pass -- so the pass is paid while anyone
    # on the replica drafts, and not at all once nobody does.
    if off_pool:
        drafting = sum(w for _, w, _, cap, _ in rows if cap > 0)
    elif rep.supports_knobs:
        drafting = 1.0 if any(cap > 0 for _, _, _, cap, _ in rows) else 0.0
    else:
        drafting = 1.0 if rep.block > 0 else 0.0
    longest = rep.block if drafting > 0 else 0

    def evaluate(limit: int) -> tuple[float, float, float, dict[str, float]]:
        tokens = verify = 0.0
        taus: dict[str, float] = {}
        for tenant, w, a, cap, floor in rows:
            length = draft_length(a, min(cap, limit), floor if rep.adaptive else None)
            taus[tenant] = tokens_per_step(a, length)
            tokens += w * taus[tenant]
            verify += w * (1 + length)
        n = batch * verify
        prefill = rep.prefill_ratio * batch * tokens  # mean prompt tokens per step
        step = rep.cost.step_time_s(batch, n, longest, rep.context_tokens, batch * drafting)
        if prefill > 0:
            # Prefill arrives in chunks (a whole prompt, up to the step budget),
            # not as a smooth trickle: a fraction q of steps carries one chunk.
            # Averaging max(memory, compute) over bursty steps is what makes a
            # memory-bound decode batch slower than its mean token count says.
            chunk = max(1.0, rep.prompt_tokens)
            q = min(1.0, prefill / chunk)
            burst = rep.cost.step_time_s(batch, n + chunk, longest, rep.context_tokens, batch * drafting)
            step = q * burst + (1 - q) * step
        return batch * tokens / step, step, n + prefill, taus

    if not rep.adaptive or longest == 0:
        return evaluate(longest)
    # (min_confidence floors are honoured only by -av replicas: the confidence
    # head runs only under adaptive verification.)
    # Adaptive verification: the engine drafts the caps but verifies only the
    # budget that maximises tokens per unit step time (modelled as a common
    # per-request verify limit chosen each step).
    return max((evaluate(limit) for limit in range(0, longest + 1)), key=lambda r: r[0])


def _marginal_theta(rep: ReplicaView, goodput: float, verify_tokens: float, cfg: DecisionConfig) -> float:
    """theta* = G * c_m: the survival a draft position needs to pay for its verification."""
    batch = max(_batch(rep), cfg.min_batch)
    delta = max(1.0, 0.1 * verify_tokens)
    t0 = rep.cost.step_time_s(batch, verify_tokens, rep.block, rep.context_tokens)
    t1 = rep.cost.step_time_s(batch, verify_tokens + delta, rep.block, rep.context_tokens)
    c_m = max(0.0, (t1 - t0) / delta)
    return min(cfg.theta_max, goodput * c_m if goodput > 0 else 0.0)


def _grid(value: float, step: float) -> float:
    return round(round(value / step) * step, 4)


# ---------------------------------------------------------------------------
# Decision


def decide(
    replicas: list[ReplicaView],
    tenants: list[TenantView],
    state: dict[str, TenantState],
    overrides: dict[str, TenantOverride],
    now: float,
    cfg: DecisionConfig = DecisionConfig(),
) -> Decision:
    live = [r for r in replicas if r.healthy]
    off_pool = any(r.block == 0 for r in live)
    spec_blocks = sorted({r.block for r in live if r.block > 0})
    max_block = max(spec_blocks, default=0)
    # Caps below the largest block, plus FULL = "no cap" (the replica's own
    # block): publishing no cap means a profile change (restart to another
    # block size) does not leave tenants pinned to the old block.
    caps = sorted({c for c in cfg.draft_caps if c < max_block}) + ([FULL] if max_block else [])

    tenant_views = {t.tenant: t for t in tenants}
    if DEFAULT_TENANT not in tenant_views:
        fleet_a = _fleet_acceptance(tenants)
        tenant_views[DEFAULT_TENANT] = TenantView(DEFAULT_TENANT, fleet_a, 0.0)
    fleet_a = tenant_views[DEFAULT_TENANT].acceptance
    acc = {t: v.acceptance for t, v in tenant_views.items()}

    # Start from the current choices (unknown -> largest cap) and fix each
    # replica's engine-side floor at the current operating point.
    current = {t: (state[t].k if t in state and state[t].k >= 0 else (caps[-1] if caps else 0)) for t in tenant_views}
    thetas: dict[str, float | None] = {t: (state[t].theta if t in state else None) for t in tenant_views}
    default_k = current[DEFAULT_TENANT]
    engine_theta: dict[str, float] = {}
    rho: dict[str, float] = {}
    knee: dict[str, float] = {}
    for rep in live:
        g, _, n, _ = _replica_eval(rep, current, acc, thetas, 0.0, default_k, fleet_a, off_pool)
        engine_theta[rep.name] = 0.0  # adaptive verification is modelled inside _replica_eval
        knee[rep.name] = rep.cost.knee_tokens(_batch(rep), rep.context_tokens)
        measured = rep.tokens_per_step if rep.tokens_per_step else n
        rho[rep.name] = measured / knee[rep.name] if knee[rep.name] > 0 else 0.0

    def replicas_of(t: str) -> list[ReplicaView]:
        view = tenant_views[t]
        # Where its traffic went plus every speculative replica: the policy
        # itself moves traffic (routing), so having landed on an `off`
        # replica says nothing about where the next request goes.
        chosen = [r for r in live if view.shares.get(r.name, 0) > 0 or t in r.mix or r.block > 0]
        return chosen or live

    def fleet_goodput(choice: dict[str, int], th: dict[str, float | None], reps: list[ReplicaView], probe: str) -> float:
        total = 0.0
        for rep in reps:
            if probe not in rep.mix:
                # A tenant with no traffic here yet: judge it as a 5 % newcomer.
                rep = replace(rep, mix={**(rep.mix or {DEFAULT_TENANT: 1.0}), probe: 0.05 * (sum(rep.mix.values()) or 1.0)})
            g, _, _, _ = _replica_eval(rep, choice, acc, th, engine_theta[rep.name], choice[DEFAULT_TENANT], fleet_a, off_pool)
            total += g
        return total

    def tpot_ms(choice: dict[str, int], th: dict[str, float | None], t: str, reps: list[ReplicaView]) -> float:
        view = tenant_views[t]
        weights = {r.name: view.shares.get(r.name, 0.0) for r in reps}
        norm = sum(weights.values()) or float(len(reps))
        total = 0.0
        for rep in reps:
            _, step, _, taus = _replica_eval(rep, choice, acc, th, engine_theta[rep.name], choice[DEFAULT_TENANT], fleet_a, off_pool)
            tau = taus.get(t) or tokens_per_step(acc[t], draft_length(acc[t], _effective_cap(rep, choice[t]), th.get(t)))
            total += (weights[rep.name] if sum(weights.values()) else 1.0) * step / tau
        return 1000.0 * total / norm

    def allowed_caps(t: str, reps: list[ReplicaView]) -> list[int]:
        ov = overrides.get(t)
        options = [0] + caps
        # Survey rule: long drafts only well below the knee. Keyed on the
        # batch's own rho (B / knee), which the policy does not move, so the
        # gate cannot oscillate with the draft length it gates.
        base_rho = max((_batch(r) / knee[r.name] for r in reps if knee.get(r.name)), default=0.0)
        options = [k for k in options if min(k, max_block) <= cfg.large_draft or base_rho < cfg.large_draft_rho]
        if ov is not None:
            if ov.mode == "off":
                return [0]
            if ov.mode == "on":
                options = [k for k in options if k > 0] or caps[:1]
            lo = ov.max_draft_min or 0
            hi = ov.max_draft_max if ov.max_draft_max is not None else 10**6
            bounded = [k for k in options if k == 0 and ov.mode != "on" or lo <= k <= hi]
            if not bounded and ov.mode != "off":
                bounded = [min(max(lo, 1), max_block or lo)] if max_block else [0]
            options = bounded
        return options or [0]

    # Coordinate ascent on fleet goodput, heaviest tenants first, from several
    # starts: the current choice, everyone off, everyone at each cap. The
    # joint starts matter because the drafter's pass is shared by the batch:
    # one tenant alone turning off saves little, everyone off saves the pass.
    order = sorted(tenant_views, key=lambda t: -sum(r.mix.get(t, 0.0) * max(r.batch, 0.0) for r in live))
    options = {t: allowed_caps(t, replicas_of(t)) for t in order}

    def total_goodput(choice: dict[str, int]) -> float:
        return sum(
            _replica_eval(rep, choice, acc, thetas, engine_theta[rep.name], choice[DEFAULT_TENANT], fleet_a, off_pool)[0]
            for rep in live
        )

    def ascend(start: dict[str, int]) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
        proposal = {t: (start[t] if start[t] in options[t] else options[t][-1]) for t in order}
        tables: dict[str, dict[int, float]] = {}
        for _ in range(2):
            for t in order:
                reps = replicas_of(t)
                best_k, best_g = proposal[t], -1.0
                table: dict[int, float] = {}
                for k in options[t]:
                    table[k] = fleet_goodput({**proposal, t: k}, thetas, reps, t)
                    if table[k] > best_g * (1 + 1e-9):
                        best_k, best_g = k, table[k]
                tables[t] = table
                proposal[t] = best_k
        return proposal, tables

    starts = [current] + [{t: c for t in order} for c in [0] + caps]
    best_total = -1.0
    proposal, scores = current, {}
    for start in starts:
        cand, tables = ascend(start)
        g = total_goodput(cand)
        if g > best_total * (1 + 1e-6):
            best_total, proposal, scores = g, cand, tables

    # Regime at the proposed operating point (measured tokens/step when known).
    for rep in live:
        _, _, n_prop, _ = _replica_eval(rep, proposal, acc, thetas, engine_theta[rep.name], proposal[DEFAULT_TENANT], fleet_a, off_pool)
        measured = rep.tokens_per_step if rep.tokens_per_step else n_prop
        rho[rep.name] = measured / knee[rep.name] if knee[rep.name] > 0 else 0.0

    policies: dict[str, SpeculationPolicy] = {}
    new_state: dict[str, TenantState] = {}
    records: list[DecisionRecord] = []
    thresholds: dict[tuple, int | None] = {}  # (replica, joint choice) -> max_batch
    for t in sorted(tenant_views):
        view = tenant_views[t]
        reps = replicas_of(t)
        table = scores[t]
        prev = state.get(t, TenantState())
        ov = overrides.get(t)
        best = proposal[t]
        slo_note = ""
        slo_driven = False
        if view.tpot_target_ms and table:
            slo_best, slo_note = _slo_choice(t, best, table, view.tpot_target_ms, proposal, thetas, reps, tpot_ms, cfg)
            slo_driven = slo_best != best
            best = slo_best

        cur = prev.k if prev.k >= 0 else None
        # Look the table up first: `dict.get`'s default would evaluate a full
        # fleet goodput even when the value is already there.
        g_off = table[0] if 0 in table else fleet_goodput({**proposal, t: 0}, thetas, reps, t)
        if cur is None:
            g_cur = 0.0
        else:
            g_cur = table[cur] if cur in table else fleet_goodput({**proposal, t: cur}, thetas, reps, t)
        # Improvements are fleet goodput changes scaled by the tenant's share
        # of the traffic it shares replicas with: a 5 % tenant that triples
        # its own tokens moves the fleet ~10 %, and that must clear a margin
        # meant for the tenant's decision, not the fleet's.
        share = _share(t, reps)
        improvement = ((table.get(best, 0.0) / g_cur - 1.0) / share) if g_cur > 0 else math.inf
        # Smoothed relative goodput of every candidate vs the current choice:
        # the noise filter for ordinary changes (strong signals act unsmoothed).
        # EMA of each candidate's predicted goodput survives policy changes,
        # so a change is never followed by a verdict based on one noisy tick.
        # Normalised per tick (best = 1) so that a load step does not leave
        # yesterday's absolute goodput dominating the average.
        prev_s = dict(prev.smoothed)
        top = max(table.values(), default=0.0) or 1.0
        ema = {k: cfg.smoothing * g / top + (1 - cfg.smoothing) * prev_s.get(k, g / top) for k, g in table.items()}
        smoothed: dict[int, float] = {}
        if cur is not None and ema.get(cur, 0.0) > 0:
            smoothed = {k: (g / ema[cur] - 1.0) / share for k, g in ema.items()}
        candidate = best
        if smoothed and not slo_driven:
            candidate = max(smoothed, key=lambda k: (smoothed[k], -abs(k - (cur or 0))))
        s_imp = smoothed.get(candidate, improvement) if not slo_driven else max(improvement, 0.0)
        thin = cfg.thin_extra_margin if view.evidence_steps < cfg.thin_evidence_steps else 0.0
        if cur is None or slo_driven:
            margin = 0.0
        elif cur == 0 and candidate > 0:
            margin = cfg.on_margin + thin
        elif candidate == 0:
            margin = cfg.off_margin
        else:
            margin = cfg.retune_margin + thin

        forced = ov is not None and not ov.is_noop and (cur is None or not _within(cur, ov, allowed_caps(t, reps)))
        pending_k, pending_count = prev.pending_k, prev.pending_count
        chosen = cur if cur is not None else best
        thin_now = view.evidence_steps < cfg.thin_evidence_steps
        dwell_ok = now - prev.since >= cfg.min_dwell_s or (prev.provisional and not thin_now)
        strong_now = cur is not None and best != cur and improvement >= cfg.strong_margin
        strong_count = prev.strong_count + 1 if strong_now and prev.strong_k == best else (1 if strong_now else 0)
        strong = strong_now and strong_count >= cfg.strong_ticks
        why: str
        if cur is None:
            # First decision: the uncapped default (the replica's full block)
            # stands unless the proposal beats it by the retune margin -- a cap
            # must earn its place, as every later change must.
            default = max(table) if table else best
            g_default = table.get(default, 0.0)
            gain_first = ((table.get(best, 0.0) / g_default - 1.0) / share) if g_default > 0 else math.inf
            if best == 0 or best == default or gain_first >= cfg.retune_margin or slo_driven or (ov and not ov.is_noop):
                chosen, why = best, "first decision"
            else:
                chosen, why = default, f"first decision: k={_k(best)} would gain only {gain_first:+.1%}"
            pending_k, pending_count = None, 0
        elif forced:
            chosen, why = best, f"admin override ({ov.mode})"
            pending_k, pending_count = None, 0
        elif strong and (best == 0 or dwell_ok):
            # Strong signal held for strong_ticks (a load step): skips the
            # smoothing. A turn-off (protecting the fleet from a compute-bound
            # batch) also skips dwell; anything else still respects it.
            chosen, why = best, f"k {_k(cur)}->{_k(best)}: predicted goodput {improvement:+.1%} (strong)"
            pending_k, pending_count = None, 0
            # A regime step: the smoothed history describes the old regime.
            ema = {k: g / top for k, g in table.items()}
        elif candidate == cur:
            why = "holding: current choice is the best predicted"
            pending_k, pending_count = None, 0
        elif s_imp < margin:
            why = f"holding: k={_k(candidate)} would gain {s_imp:+.1%} (smoothed) < margin {margin:.0%}"
            pending_k, pending_count = None, 0
        else:
            pending_count = pending_count + 1 if pending_k == candidate else 1
            pending_k = candidate
            if pending_count >= cfg.confirm_ticks and dwell_ok:
                chosen = candidate
                why = f"k {_k(cur)}->{_k(candidate)}: predicted goodput {s_imp:+.1%} (smoothed, {pending_count} ticks)"
                pending_k, pending_count = None, 0
            elif not dwell_ok:
                why = f"pending k={_k(candidate)} ({s_imp:+.1%}): dwell {now - prev.since:.1f}s < {cfg.min_dwell_s:.0f}s"
            else:
                why = f"pending k={_k(candidate)} ({s_imp:+.1%}): confirmation {pending_count}/{cfg.confirm_ticks}"
        g_best = table.get(chosen, 0.0) if chosen is not None else 0.0
        gain = g_best / g_off if g_off > 0 else 1.0

        # Confidence floor for the chosen cap.
        raw_theta = _choose_theta(t, chosen, reps, proposal, thetas, engine_theta, acc, fleet_a, cfg, None, off_pool) or 0.0
        theta_star = raw_theta
        if raw_theta > 0:
            # theta* says which positions are worth verifying, but adaptive
            # verification already ranks every slot by confidence and admits
            # the best budget; a per-tenant floor on top only pays where it
            # cuts what the engine's shared budget cannot (a low-acceptance
            # tenant next to a high one). Elsewhere it only costs: a noisy
            # confidence head cuts drafts that would have been accepted
            # (simulated: -2.3 % at c=16 for a 0.2 floor that the expectation
            # model called free). So it must beat no floor, predicted.
            trial = {**proposal, t: chosen}
            with_floor = fleet_goodput(trial, {**thetas, t: raw_theta}, reps, t)
            without = fleet_goodput(trial, {**thetas, t: None}, reps, t)
            if with_floor < without * (1 + cfg.theta_min_gain):
                raw_theta = 0.0
        theta_ema = raw_theta if chosen != cur or prev.theta_ema is None else (
            cfg.smoothing * raw_theta + (1 - cfg.smoothing) * prev.theta_ema
        )
        theta = _grid(theta_ema, cfg.theta_step) or None
        if chosen == cur and not forced and prev.policy is not None:
            small = abs((theta or 0.0) - (prev.theta or 0.0)) < cfg.theta_min_change
            if small or now - prev.since < cfg.min_dwell_s:
                theta = prev.theta  # small or early floor moves are noise, not news
        if ov is not None and chosen > 0:
            if ov.min_confidence_min is not None:
                theta = max(theta or 0.0, ov.min_confidence_min)
            if ov.min_confidence_max is not None and theta is not None:
                theta = min(theta, ov.min_confidence_max)

        local_rho = max((rho[r.name] for r in reps), default=0.0)
        # Above which batch this choice should give way to everyone off, on the
        # tenant's replicas (sent as specgate_max_batch; the engine applies it
        # every step, so a load step needs no tick to take effect). Pinned on
        # means on at any load: no threshold then.
        max_batch = None
        if chosen > 0 and not (ov is not None and ov.mode == "on"):
            choice = {**proposal, t: chosen}
            key = tuple(sorted(choice.items()))
            limits = []
            for r in reps:
                if r.supports_knobs and r.block > 0:
                    # Every tenant that holds the proposal asks the same question.
                    if (r.name, key) not in thresholds:
                        thresholds[(r.name, key)] = _spec_max_batch(r, choice, acc, thetas, fleet_a, off_pool, cfg)
                    limits.append(thresholds[(r.name, key)])
            max_batch = min((m for m in limits if m is not None), default=None)
        prev_mb = prev.policy.max_batch if prev.policy is not None and chosen == cur else None
        if max_batch is not None and prev_mb is not None and 0.5 <= max_batch / prev_mb <= 2.0:
            max_batch = prev_mb  # a grid step or two either way is noise, not news (no new policy version)
        policy = _policy(chosen, theta, reps, live, max_block, max_batch)
        reason_bits = [why, f"rho={local_rho:.2f} ({regime_label(local_rho)})", f"a={acc[t]:.2f}", f"gain_vs_off={gain:.2f}"]
        if slo_note:
            reason_bits.append(slo_note)
        policy = policy.model_copy(update={"reason": "; ".join(reason_bits), "source": "admin" if forced or (ov and ov.mode != "auto") else "controller"})
        changed = prev.policy is None or prev.policy.behaviour() != policy.behaviour()
        since = now if (changed or prev.k != chosen) else prev.since
        kept = tuple(sorted(ema.items()))
        if chosen != cur:
            strong_count = 0
        new_state[t] = TenantState(
            chosen, theta, since, pending_k, pending_count, policy, kept, best if strong_count else None, strong_count,
            theta_ema if chosen > 0 else None,
            (thin_now if since == now else prev.provisional),
        )
        policies[t] = policy
        numbers = {
            "k": _k(chosen),
            "proposed_k": _k(best),
            "theta": theta,
            "theta_star": theta_star or None,  # the floor's marginal-cost value, published only when it pays
            "acceptance": round(acc[t], 4),
            "evidence_steps": round(view.evidence_steps, 1),
            "gain_vs_off": round(gain, 4),
            "improvement": None if math.isinf(improvement) else round(improvement, 4),
            "traffic_share": round(share, 4),
            "smoothed_improvement": {str(k): round(v, 4) for k, v in sorted(smoothed.items())},
            "margin": margin,
            "goodput_by_k": {_k(k): round(v, 1) for k, v in sorted(table.items())},
            "rho": {r.name: round(rho[r.name], 3) for r in reps},
            "predicted_tpot_ms": round(tpot_ms({**proposal, t: chosen}, {**thetas, t: theta}, t, reps), 3),
            "tpot_target_ms": view.tpot_target_ms,
            "pending": [pending_k, pending_count] if pending_k is not None else None,
            "max_batch": max_batch,
        }
        records.append(DecisionRecord(t, now, changed, policy, policy.reason, numbers))

    final_choice = {t: new_state[t].k for t in new_state}
    final_theta = {t: new_state[t].theta for t in new_state}
    regimes = {}
    plan_profile, plan_gain = _fleet_plan(live, final_choice, acc, final_theta, fleet_a, cfg)
    final_eval = {
        rep.name: _replica_eval(rep, final_choice, acc, final_theta, engine_theta[rep.name], final_choice[DEFAULT_TENANT], fleet_a, off_pool)
        for rep in live
    }
    # Goodput each replica delivers now (`_replica_eval` judges an idle replica
    # as holding its next request: scale by occupancy below one request).
    occupied = {rep.name: final_eval[rep.name][0] * min(1.0, _load(rep)) for rep in live}
    for rep in live:
        g, _, n, _ = final_eval[rep.name]
        # Gain per replica still to convert (converting 1 of N realises ~1/N).
        to_convert = sum(1 for r in live if r.profile != plan_profile) or 1
        per_replica = 1 + (plan_gain - 1) * len(live) / to_convert
        rec_profile = plan_profile if plan_profile and per_replica >= 1 + cfg.plan_margin else rep.profile
        rec_gain = per_replica if rec_profile != rep.profile else 1.0
        measured = rep.tokens_per_step if rep.tokens_per_step else n
        r_rho = measured / knee[rep.name] if knee[rep.name] else 0.0
        loss = _downtime_loss(live, rep.name, occupied, final_choice, acc, final_theta, fleet_a, off_pool)
        regimes[rep.name] = ReplicaRegime(
            rep.name, rep.profile, rep.batch, round(measured, 2), round(knee[rep.name], 1), round(r_rho, 3),
            regime_label(r_rho), rep.acceptance_length, round(g, 1), rec_profile, round(rec_gain, 4), round(loss, 4),
        )
    return Decision(policies, new_state, records, regimes)


def _spec_max_batch(rep: ReplicaView, choice, acc, thetas, fleet_a, off_pool, cfg: DecisionConfig) -> int | None:
    """The largest batch (on `cfg.max_batch_grid`) at which `choice` still holds
    against everyone off on this replica; None if it holds on the whole grid.

    Why: a load step (a burst of clients) turns a replica compute-bound
    faster than one controller tick, and requests admitted before the tick
    keep drafting for their whole life. The threshold travels with each
    request (specgate_max_batch) and the engine checks it every step, so
    drafting stops at the next step after the batch crosses it -- for
    requests already in flight too. Keyed on off_margin, the margin at
    which the decision itself turns speculation off; the first crossing
    above today's batch (with prefill in the steps the goodput ratio is not
    monotonic in the batch, and a larger margin's crossing jumps between
    distant grid points from tick to tick).
    """
    grid = cfg.max_batch_grid
    if not grid or rep.block <= 0:
        return None
    off = {t: 0 for t in choice}
    # Grid points below today's batch are where the replica already runs
    # (the decision has judged them); search upwards from there.
    now_b = _batch(rep)
    below = [b for b in grid if b < now_b]
    last_ok: int | None = below[-1] if below else None
    for b in grid[len(below):]:
        at = replace(rep, batch=float(b), waiting=0.0)
        on = _replica_eval(at, choice, acc, thetas, 0.0, choice.get(DEFAULT_TENANT, 0), fleet_a, off_pool)[0]
        without = _replica_eval(at, off, acc, thetas, 0.0, 0, fleet_a, off_pool)[0]
        if without >= on * (1 + cfg.off_margin):
            return last_ok if last_ok is not None else b
        last_ok = b
    return None


def _downtime_loss(live, name, occupied, choice, acc, thetas, fleet_a, off_pool) -> float:
    """Share of replica `name`'s own goodput that the fleet loses while it restarts.

    Its requests move to the others (in proportion to their load), which
    then run larger batches: nearly free while they are memory-bound (a
    bigger batch costs little step time), all of it once they are
    compute-bound. In the replica's own units, like the fleet plan's
    per-replica gain, so that a restart pays back when
    `(gain - 1) x time >= downtime x loss`. `occupied`: each replica's
    goodput now (replica -> tok/s).
    """
    others = [r for r in live if r.name != name]
    gone = next((r for r in live if r.name == name), None)
    if gone is None or not others:
        return 1.0
    own = occupied[name]
    if own <= 0:
        return 0.0
    before = sum(occupied[r.name] for r in others)
    moved = _load(gone)
    load = [_load(r) for r in others]
    total = sum(load)
    after = 0.0
    for r, b in zip(others, load):
        grown = replace(r, batch=r.batch + moved * (b / total if total > 0 else 1.0 / len(others)))
        g = _replica_eval(grown, choice, acc, thetas, 0.0, choice.get(DEFAULT_TENANT, 0), fleet_a, off_pool)[0]
        after += g * min(1.0, _load(grown))
    return min(1.0, max(0.0, 1.0 - (after - before) / own))


def _share(t: str, reps: list[ReplicaView]) -> float:
    total = sum(max(r.batch, 1.0) for r in reps)
    if total <= 0:
        return 1.0
    mixed = sum(max(r.batch, 1.0) * (r.mix.get(t, 0.0) / (sum(r.mix.values()) or 1.0)) for r in reps if r.mix)
    plain = sum(max(r.batch, 1.0) for r in reps if not r.mix and t == DEFAULT_TENANT)
    return min(1.0, max(0.05, (mixed + plain) / total))


def _fleet_acceptance(tenants: list[TenantView]) -> float:
    weight = sum(max(t.evidence_steps, 0.0) for t in tenants)
    if weight <= 0:
        return 0.7
    return sum(t.acceptance * max(t.evidence_steps, 0.0) for t in tenants) / weight


def _within(k: int, ov: TenantOverride, options: list[int]) -> bool:
    return k in options


def _slo_choice(t, best, table, target_ms, proposal, thetas, reps, tpot_ms, cfg):
    """Keep a tenant inside its TPOT target when the fleet can afford it.

    Only a choice that actually *meets* the target is worth goodput: if no
    affordable draft cap gets the tenant under its target, the goodput
    optimum stands (spending fleet capacity on a miss helps no one).
    """
    best_tpot = tpot_ms({**proposal, t: best}, thetas, t, reps)
    if best_tpot <= target_ms:
        return best, ""
    g_best = table[best]
    meeting = [
        k for k, g in table.items()
        if g >= (1 - cfg.slo_budget) * g_best and tpot_ms({**proposal, t: k}, thetas, t, reps) <= target_ms
    ]
    if not meeting:
        return best, f"SLO {target_ms:.0f}ms unreachable at affordable cost (best {best_tpot:.1f}ms)"
    pick = max(meeting, key=lambda k: table[k])
    new_tpot = tpot_ms({**proposal, t: pick}, thetas, t, reps)
    return pick, f"SLO {target_ms:.0f}ms: k={_k(pick)} tpot {new_tpot:.1f}ms (goodput-optimal k={_k(best)} {best_tpot:.1f}ms)"


def _choose_theta(t, k, reps, proposal, thetas, engine_theta, acc, fleet_a, cfg, ov, off_pool=False) -> float | None:
    if k <= 0:
        return None
    knob_reps = [r for r in reps if r.supports_knobs and r.block > 0 and r.adaptive]
    if not knob_reps:
        return None
    values = []
    for rep in knob_reps:
        choice = {**proposal, t: k}
        g, _, n, _ = _replica_eval(rep, choice, acc, thetas, engine_theta[rep.name], choice[DEFAULT_TENANT], fleet_a, off_pool)
        values.append(_marginal_theta(rep, g, n, cfg))
    # Never publish a floor that would cut the tenant's *mean* draft below
    # the chosen cap (that would contradict the cap decision): the floor then
    # only trims requests whose confidence runs below the tenant's average.
    consistent = acc[t] ** min(k, max(r.block for r in knob_reps))
    theta = math.floor(min(sum(values) / len(values), consistent) / cfg.theta_step) * cfg.theta_step
    theta = round(theta, 4)
    if ov is not None:
        if ov.min_confidence_min is not None:
            theta = max(theta, ov.min_confidence_min)
        if ov.min_confidence_max is not None:
            theta = min(theta, ov.min_confidence_max)
    return theta if theta > 0 else None


def _policy(k: int, theta: float | None, reps: list[ReplicaView], live: list[ReplicaView], max_block: int,
            max_batch: int | None = None) -> SpeculationPolicy:
    if k <= 0:
        off = any(r.block == 0 for r in live)
        return SpeculationPolicy(enabled=False, preferred_profile="off" if off else None, max_draft=0)
    spec = sorted({(r.block, r.profile) for r in live if r.block > 0})
    fitting = [p for b, p in spec if b >= k]
    preferred = fitting[0] if fitting and len(spec) > 1 else None
    return SpeculationPolicy(
        enabled=True, preferred_profile=preferred, max_draft=None if k >= FULL else min(k, max_block), min_confidence=theta,
        max_batch=max_batch,
    )


PLAN_PROFILES: tuple[tuple[str, int, bool], ...] = (
    ("off", 0, False),
    ("dspark-b4-av", 4, True), ("dspark-b8-av", 8, True), ("dspark-b16-av", 16, True),
    ("dspark-b4", 4, False), ("dspark-b8", 8, False), ("dspark-b16", 16, False),
)


def _fleet_plan(live, choice, acc, thetas, fleet_a, cfg) -> tuple[str | None, float]:
    """Fleet plan: the launch profile that, run by every replica, serves the
    current load and tenant mix best (tenant caps re-optimised for it), and
    its predicted gain over the fleet as it runs now.

    Homogeneous on purpose: a mixed fleet's benefit depends on routing
    between pools that the per-replica view cannot predict reliably, while a
    homogeneous profile is exactly what the static baselines run.
    """
    if not live:
        return None, 1.0
    # The running fleet is charged its drafters for whatever actually runs on
    # each speculative replica (routing to the off pool is a preference and
    # spills when that pool is busier), hence off_pool=False here.
    current = sum(
        _replica_eval(r, choice, acc, thetas, 0.0, choice[DEFAULT_TENANT], fleet_a, False)[0] for r in live
    )
    # A homogeneous fleet balances load: evaluate it at the fleet's mean batch
    # and aggregate tenant mix, not at today's per-replica split (which the
    # current routing between pools distorts).
    total_b = sum(max(r.batch, 0.0) for r in live)
    mean_b = total_b / len(live)
    agg: dict[str, float] = {}
    for r in live:
        for t, w in (r.mix or {}).items():
            agg[t] = agg.get(t, 0.0) + w * max(r.batch, 1.0)
    norm = sum(agg.values()) or 1.0
    agg = {t: w / norm for t, w in agg.items()}
    best_profile, best_g = None, current
    for profile, block, adaptive in PLAN_PROFILES:
        alts = [
            replace(r, block=block, adaptive=adaptive, supports_knobs=True, profile=profile, batch=mean_b, mix=agg or r.mix)
            for r in live
        ]
        caps = {t: (block if block else 0) for t in choice}
        options = [0] + [c for c in cfg.draft_caps if c < block] + ([block] if block else [])
        for t in sorted(caps):  # one coordinate pass over tenants' caps
            scores = {}
            for k in options:
                trial = {**caps, t: k}
                scores[k] = sum(_replica_eval(a, trial, acc, thetas, 0.0, trial[DEFAULT_TENANT], fleet_a, False)[0] for a in alts)
            caps[t] = max(scores, key=lambda k: (scores[k], k))
        g = sum(_replica_eval(a, caps, acc, thetas, 0.0, caps[DEFAULT_TENANT], fleet_a, False)[0] for a in alts)
        if g > best_g * (1 + 1e-9):
            best_profile, best_g = profile, g
    return best_profile, (best_g / current if current > 0 else 1.0)
