"""Estimators: interval samples in, smoothed state out (ReplicaInput/TenantView
for the decision).

Two time scales on purpose:

* Regime signals (batch size, tokens per step) move with load and must be
  seen within a tick or two, so they are lightly smoothed (EMA, alpha 0.6).
* Acceptance is a property of the tenant's workload and drafter; it is noisy
  per request and must not chase that noise, so per-tenant acceptance uses
  decayed sums with a ~5-minute half-life and is shrunk toward a weak prior
  for the method by a pseudo-count: a tenant with ten requests gets mostly
  the prior, one with ten thousand gets its own. Never toward the fleet
  mean: that is other tenants' text, which may draft very differently. The
  same holds for how often and how fully a tenant proposes (ngram).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields

from contract.telemetry import SURVIVAL_ACCEPTED, SURVIVAL_POSITIONS, SURVIVAL_REACH, acceptance_length

from .acceptance_fit import (
    ACCEPTANCE_PRIOR,
    ALWAYS_PROPOSES,
    PRIOR_DECODE_STEPS,
    PRIOR_FULL_TOKENS,
    PROPOSAL_PRIOR,
    SURVIVAL_MIN_STEPS,
    SURVIVAL_PSEUDO_STEPS,
    Proposal,
    expected_accepted,
    fit_conditional_acceptance,
    method_acceptance_prior,
    survival_from_counts,
)
from contract.knobs import k0_skips_drafter
from contract.vllm_metrics import StepCell, StepCellKey

from .costs import ReplicaCost, parse_profile
from .decision import MeasuredGain, ReplicaInput, TenantView
from .decision.views import method_of
from .signals import ReplicaSample, TenantSample


# Decoded tokens (decayed) each arm of a probe needs on a replica before the
# two are compared there: about two 64-token requests.
MIN_ARM_TOKENS = 100.0


def capped_request_steps(cells: Mapping[StepCellKey, StepCell], cap: Callable[[int], int | None]) -> tuple[float, float]:
    """(request-steps in steps where `cap` (batch -> a request's draft cap)
    gives 0, all request-steps) of one interval's engine-timed cells, each
    cell at its mean batch. Why: a request whose schedule caps it at 0 in a
    step cannot propose there, and its telemetry counts that step as a decode
    step without a proposal; only the engine knows the batch of each step,
    so the share of a tenant's decode steps its policy capped is read here."""
    capped = total = 0.0
    for requests, c in _caps_by_cell(cells, cap):
        total += requests
        if c == 0:
            capped += requests
    return capped, total


def _caps_by_cell(cells: Mapping[StepCellKey, StepCell], cap: Callable[[int], int | None]):
    """(request-steps, the cap `cap` gives at the cell's mean batch) of each cell that ran
    steps: one reading of a cell's batch for every count taken from the engine's table."""
    for cell in cells.values():
        if cell.steps > 0 and cell.requests > 0:
            yield cell.requests, cap(max(1, round(cell.requests / cell.steps)))


def cap_reach_steps(cells: Mapping[StepCellKey, StepCell], cap: Callable[[int], int | None], block: int,
                    positions: int = SURVIVAL_POSITIONS) -> list[float]:
    """[i-1] = the request-steps of one interval's engine-timed cells whose cap
    (`cap` at the cell's mean batch; None = the replica's `block`) allowed draft
    position i, i = 1..positions. Why: a schedule caps a request below its
    allowance in steps of a larger batch (greedy's [[1, 8], [4, 4], [512, 2]]
    caps it at 2 above four requests), and its telemetry cannot tell such a
    step from a short proposal: measured there, the fill of a cap-8 allowance
    reads ~0.3 and position 3's survival ~0.06, so the model priced a 2-token
    draft at a third of the tokens it verifies and longer drafts as worthless,
    and kept drafting 2 where that lost (`TenantEstimator.method_proposal`
    corrects both with these counts)."""
    out = [0.0] * positions
    for requests, c in _caps_by_cell(cells, cap):
        for i in range(max(min(block if c is None else c, positions), 0)):
            out[i] += requests
    return out


def _decay(half_life_s: float, dt_s: float) -> float:
    return 0.5 ** (max(dt_s, 0.0) / half_life_s) if half_life_s > 0 else 0.0


def passes_run(cells: Mapping[StepCellKey, StepCell], method: str, engine_fixes: Iterable[str] | None
               ) -> dict[StepCellKey, StepCell]:
    """PURE: the engine-timed cells with `drafting` meaning what the learner reads
    it as, that the drafter's pass ran after the step. The plugin labels a cell by
    the step's draft length (K > 0 after its caps); on a speculative replica whose
    K=0 steps do not skip the pass (`contract.knobs.k0_skips_drafter`: EAGLE-3, or
    DSpark/DFlash/ngram without the skip in force) a K=0 step ran the pass as well,
    so its cell is read as a drafting one. Read as labelled, every such step looked
    like a plain decode step as dear as a drafting one: the learner put the pass
    into the per-request term (simulated, vLLM 0.32's V2 runner at 128 requests a
    replica: the pass priced at 3.9 ms of its ~15, and `off`, 58 % better, below
    +4 %), so the fleet plan never recommended the restart that removes it."""
    if k0_skips_drafter(method, engine_fixes):  # also True without speculation ("off")
        return dict(cells)
    out: dict[StepCellKey, StepCell] = {}
    for (batch, tokens, _), cell in cells.items():
        key = (batch, tokens, 1)
        out[key] = out[key].plus(cell) if key in out else cell
    return out


@dataclass
class ReplicaEstimate:
    name: str
    profile: str
    cost: ReplicaCost
    batch: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    tokens_per_step: float | None = None
    prefill_ratio: float = 0.0  # prompt tokens prefilled per generated token (chunked prefill shares steps)
    step_time_s: float | None = None
    acceptance_length: float | None = None
    per_position: dict[int, float] = field(default_factory=dict)  # P(position i accepted) per draft
    gpu_util: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    supports_knobs: bool = False
    engine_fixes: frozenset[str] | None = None  # None: the replica reports none (contract.knobs.k0_skips_drafter)
    healthy: bool = True
    samples: int = 0
    restarts: int = 0
    context_tokens: float = 1024.0

    @property
    def block(self) -> int:
        return parse_profile(self.profile)[0]

    @property
    def adaptive(self) -> bool:
        return parse_profile(self.profile)[1]

    @property
    def method(self) -> str:
        return method_of(self.profile)

    def knee(self) -> float:
        return self.cost.knee_tokens(max(self.batch, 1.0), self.context_tokens)

    def rho(self) -> float | None:
        if self.tokens_per_step is None:
            return None
        return self.tokens_per_step / self.knee()


class ReplicaEstimator:
    """Per-replica smoothed regime and acceptance."""

    def __init__(self, alpha_regime: float = 0.6, alpha_acceptance: float = 0.2) -> None:
        self.alpha_regime = alpha_regime
        self.alpha_acceptance = alpha_acceptance
        self.replicas: dict[str, ReplicaEstimate] = {}

    def ensure(self, name: str, profile: str, cost: ReplicaCost) -> ReplicaEstimate:
        est = self.replicas.get(name)
        if est is None:
            est = self.replicas[name] = ReplicaEstimate(name, profile, cost)
        est.profile = profile
        return est

    def mark_unhealthy(self, name: str) -> None:
        if name in self.replicas:
            self.replicas[name].healthy = False

    def update(self, sample: ReplicaSample, context_tokens: float | None = None,
               prompt_tokens: float | None = None) -> ReplicaEstimate:
        """`prompt_tokens`: the mean prompt of finished requests (the size of
        a prefill chunk, for the step cost's burst model); None: unknown."""
        est = self.replicas[sample.name]
        a, b = self.alpha_regime, self.alpha_acceptance
        est.healthy = True
        est.samples += 1
        est.restarts += int(sample.restarted)
        est.supports_knobs = sample.supports_knobs
        est.engine_fixes = sample.engine_fixes
        if context_tokens:
            est.context_tokens = context_tokens
        first = est.samples == 1
        est.batch = sample.running if first else a * sample.running + (1 - a) * est.batch
        est.waiting = sample.waiting if first else a * sample.waiting + (1 - a) * est.waiting
        est.kv_usage = sample.kv_usage
        if sample.iterations > 0:
            # Forward tokens per step (verify work and prefill included): what
            # the step cost and the knee are measured in. Under adaptive
            # verification this is an upper bound: vLLM counts every drafted
            # token, the trimmed ones too, and exports nothing that tells how
            # many were verified (docs/controller.md, Limits).
            tps = sample.forward_tokens / sample.iterations
            est.tokens_per_step = tps if est.tokens_per_step is None else a * tps + (1 - a) * est.tokens_per_step
            step = sample.dt_s / sample.iterations
            if sample.generation_tokens > 0:
                ratio = sample.prompt_tokens / sample.generation_tokens
                est.prefill_ratio = ratio if est.samples == 1 else b * ratio + (1 - b) * est.prefill_ratio
            if sample.engine_steps:
                # The extension timed the steps themselves: exact points, idle time excluded.
                est.cost.observe_cells(sample.dt_s, passes_run(sample.engine_steps, est.method, est.engine_fixes),
                                       est.block)
            if sample.busy_throughout:
                # The interval is all steps only when the engine never idled in it.
                est.step_time_s = step if est.step_time_s is None else a * step + (1 - a) * est.step_time_s
                requests_per_step = max(sample.generation_tokens - sample.accepted_tokens, 0.0) / sample.iterations
                chunk = prompt_tokens
                if chunk and sample.prompt_tokens > 0 and sample.prompt_tokens_computed is not None:
                    chunk *= min(1.0, sample.prompt_tokens_computed / sample.prompt_tokens)  # prefix-cache hits
                # The drafter proposes for every decoding request of a step that
                # drafts at all (vLLM drafts batch-wide; a request whose drafts the
                # token budget or its cap left unscheduled still paid for them), so
                # its pass scales with the decode batch of drafting steps, not with
                # the drafts vLLM counts. A step drafts when any request in it
                # does: at >= 1 draft per step on average, nearly all of them.
                phi = min(1.0, sample.drafts / sample.iterations)
                if not k0_skips_drafter(est.method, est.engine_fixes):
                    phi = 1.0  # its K=0 steps run the pass too (`passes_run`)
                batch = max(requests_per_step, 1.0)
                if not sample.engine_steps:
                    est.cost.observe(sample.dt_s, sample.iterations, sample.forward_tokens,
                                     phi * batch * sample.iterations, batch, sample.prefill_tokens, chunk, est.block)
        elif sample.running < 1:
            est.tokens_per_step = None if est.tokens_per_step is None else (1 - a) * est.tokens_per_step
        if sample.drafts > 0:
            al = 1.0 + sample.accepted_tokens / sample.drafts
            w = min(1.0, b * math.sqrt(sample.drafts / 50.0)) if est.acceptance_length is not None else 1.0
            est.acceptance_length = al if est.acceptance_length is None else w * al + (1 - w) * est.acceptance_length
            for pos, acc in sample.accepted_per_pos.items():
                rate = acc / sample.drafts
                old = est.per_position.get(pos)
                est.per_position[pos] = rate if old is None else w * rate + (1 - w) * old
        est.gpu_util = sample.gpu_util
        est.tensor_active = sample.tensor_active
        est.dram_active = sample.dram_active
        return est


@dataclass
class _TenantSums:
    steps: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    completion: float = 0.0
    prompt: float = 0.0
    requests: float = 0.0
    by_replica: dict[str, float] = field(default_factory=dict)  # decayed completion tokens (routing mix)
    # Proposal evidence of requests allowed to draft (contract.telemetry's allowed_* counters).
    decode_steps: float = 0.0
    proposal_steps: float = 0.0
    # Request-steps of the replicas it ran on where its policy capped it at 0, and all of
    # them, weighted by its share there (`capped_request_steps`): decode steps that could not propose.
    capped_weight: float = 0.0
    counted_weight: float = 0.0
    # [i-1]: of those request-steps, the ones whose cap allowed draft position i, weighted alike
    # (`cap_reach_steps`); [0] are those it could draft in at all.
    cap_reach: list[float] = field(default_factory=lambda: [0.0] * SURVIVAL_POSITIONS)
    proposal_drafted: float = 0.0
    proposal_full: float = 0.0
    # Per draft position i (index i-1): proposal steps that reached it and those accepted there.
    reach: list[float] = field(default_factory=lambda: [0.0] * SURVIVAL_POSITIONS)
    survived: list[float] = field(default_factory=lambda: [0.0] * SURVIVAL_POSITIONS)

    def scale(self, d: float) -> None:
        """Decay every sum by `d` (the routing mix `by_replica` keeps its own half-life)."""
        for name in _TENANT_SUM_FIELDS:
            setattr(self, name, getattr(self, name) * d)
        self.reach = [v * d for v in self.reach]
        self.survived = [v * d for v in self.survived]
        self.cap_reach = [v * d for v in self.cap_reach]

    def cap_shares(self) -> list[float] | None:
        """[i-1] = the share of the request-steps it could draft in whose cap allowed
        position i (1 at position 1); None without engine-timed evidence."""
        if self.cap_reach[0] <= 0:
            return None
        return [v / self.cap_reach[0] for v in self.cap_reach]

    def add(self, smp: TenantSample, verify_ratio: float) -> None:
        self.steps += smp.get("num_spec_steps")
        self.drafted += smp.get("num_draft_tokens") * verify_ratio
        self.accepted += smp.get("num_accepted_draft_tokens")
        self.decode_steps += smp.get("allowed_decode_steps")
        self.proposal_steps += smp.get("allowed_spec_steps")
        self.proposal_drafted += smp.get("allowed_draft_tokens")
        self.proposal_full += smp.get("allowed_full_tokens")
        if smp.get(SURVIVAL_REACH[0]) > 0:
            for i in range(SURVIVAL_POSITIONS):
                self.reach[i] += smp.get(SURVIVAL_REACH[i])
                self.survived[i] += smp.get(SURVIVAL_ACCEPTED[i])


_TENANT_SUM_FIELDS = tuple(f.name for f in fields(_TenantSums) if f.type in (float, "float"))


def _cap_corrected_reach(reach: list[float], shares: list[float]) -> list[float]:
    """Position i's reach counted only in steps whose cap allowed position i:
    of the proposal steps that accepted i-1 drafts, a share shares[i-1] /
    shares[i-2] had a cap of i or more (the rest stopped at i-1 by the cap,
    not by a rejection). Assumes acceptance does not depend on the batch.
    Position 1 is every drafting step's. A position no cap allowed keeps no
    reach: `survival_from_counts` continues the shape measured before it."""
    out = list(reach)
    for i in range(1, len(reach)):
        prev = shares[i - 1]
        out[i] = reach[i] * min(1.0, shares[i] / prev) if prev > 0 else 0.0
    return out


def _shrunk(s: _TenantSums, prior: float, n0: float) -> float:
    """The conditional acceptance fitted to `s` plus `n0` pseudo-steps at
    `prior`, drafted like `s`'s own steps (4 tokens a step without any)."""
    per_step_d = s.drafted / s.steps if s.steps > 0 and s.drafted > 0 else 4.0
    a = fit_conditional_acceptance(
        s.steps + n0, s.drafted + n0 * per_step_d, s.accepted + n0 * expected_accepted(prior, per_step_d)
    )
    return prior if a is None else a


class TenantEstimator:
    """Per-tenant decayed acceptance, shrunk toward a weak prior; kept per
    speculation method as well (`method_acceptance`), because one tenant's
    text is accepted at very different rates by an ngram lookup and by a
    trained drafter."""

    def __init__(self, half_life_s: float = 300.0, mix_half_life_s: float = 5.0, prior_steps: float = 100.0) -> None:
        self.half_life_s = half_life_s
        self.mix_half_life_s = mix_half_life_s
        self.prior_steps = prior_steps
        self.sums: dict[str, _TenantSums] = {}
        self.method_sums: dict[tuple[str, str], _TenantSums] = {}  # (tenant, method) -> acceptance sums
        # (tenant, replica) -> decayed [drafting tokens, drafting s, plain tokens, plain s] of a probe's arms
        self.arm_sums: dict[tuple[str, str], list[float]] = {}
        self.fleet_prior = ACCEPTANCE_PRIOR  # conditional acceptance before any data at all (a trained drafter)

    def decay(self, dt_s: float, serving: Iterable[str] | None = None) -> None:
        """Age the sums by `dt_s`. The routing mix ages only on the replicas in
        `serving` (those that finished requests since the last call; None: all), and by
        at most one mix half-life a call.

        Why the mix waits for traffic: it is the share of a replica's recent tokens per
        tenant, and an idle spell says nothing about it. Aged by the clock, a mix was
        gone after a minute without traffic (or a paused controller), and the first
        tenant back held it alone: every other tenant was priced at the share floor,
        where its own drafting barely lengthens the step, so its gain read inflated --
        on the real bed `k 0->2: +9.6 %` right after a pause, `-10.1 %` once the mix
        came back, 30 s (the dwell) later."""
        d = _decay(self.half_life_s, dt_s)
        dm = _decay(self.mix_half_life_s, min(dt_s, self.mix_half_life_s))
        aging = None if serving is None else set(serving)
        for s in self.method_sums.values():
            s.scale(d)
        for key in list(self.arm_sums):
            arms = self.arm_sums[key] = [v * d for v in self.arm_sums[key]]
            if arms[0] + arms[2] < 1e-3:
                del self.arm_sums[key]
        for s in self.sums.values():
            s.scale(d)
            for r in list(s.by_replica):
                if aging is not None and r not in aging:
                    continue
                s.by_replica[r] *= dm
                if s.by_replica[r] < 1e-3:
                    del s.by_replica[r]

    def update(
        self, samples: list[TenantSample], verify_ratio: dict[str, float] | None = None,
        methods: dict[str, str] | None = None,
    ) -> None:
        """Fold interval samples in; `verify_ratio` (per replica, see ReplicaEstimate)
        turns drafted tokens into verified ones before fitting acceptance;
        `methods` (replica -> speculation method) files them per method too."""
        verify_ratio = verify_ratio or {}
        methods = methods or {}
        for smp in samples:
            method = methods.get(smp.replica)
            ratio = verify_ratio.get(smp.replica, 1.0)
            if method and method != "off" and (smp.get("num_spec_steps") > 0 or smp.get("allowed_decode_steps") > 0):
                # (a request allowed to draft that never proposed is evidence of the proposal rate)
                self.method_sums.setdefault((smp.tenant, method), _TenantSums()).add(smp, ratio)
            arms = [smp.get(f"probed_{arm}_{unit}") for arm in ("drafting", "plain") for unit in ("tokens", "seconds")]
            if any(arms):
                acc = self.arm_sums.setdefault((smp.tenant, smp.replica), [0.0] * 4)
                self.arm_sums[(smp.tenant, smp.replica)] = [a + b for a, b in zip(acc, arms)]
            s = self.sums.setdefault(smp.tenant, _TenantSums())
            s.add(smp, ratio)
            s.completion += smp.get("completion_tokens")
            s.prompt += smp.get("prompt_tokens")
            s.requests += smp.get("requests")
            s.by_replica[smp.replica] = s.by_replica.get(smp.replica, 0.0) + smp.get("completion_tokens")

    def observe_capped(self, tenant: str, method: str, capped: float, counted: float,
                       cap_reach: list[float] | None = None) -> None:  # fmt: skip
        """Fold in one replica interval's request-steps where the tenant's
        policy capped it at 0 (`capped_request_steps`, weighted by its share
        of the replica) and those whose cap allowed each draft position
        (`cap_reach_steps`, weighted alike); only for tenants and methods
        with telemetry."""
        for s in (self.sums.get(tenant), self.method_sums.get((tenant, method))):
            if s is not None:
                s.capped_weight += capped
                s.counted_weight += counted
                if cap_reach is not None:
                    s.cap_reach = [a + b for a, b in zip(s.cap_reach, cap_reach)]

    def acceptance(self, tenant: str) -> tuple[float, float]:
        """(shrunk conditional acceptance, effective steps of evidence): the
        tenant's own drafted and accepted sums plus `prior_steps` pseudo-steps
        at the prior (a trained drafter's), drafted like its own steps. Never
        toward the fleet: a tenant with little evidence beside one that
        dominates the traffic (sampled chat beside greedy code) took that
        tenant's acceptance and kept drafting where it cost it 16 %.

        Evidence counts decode steps of requests allowed to draft (speculation
        steps where the telemetry predates those counters): what drafting
        yields a tenant per step is known as well from steps in which it found
        nothing to propose as from those it did -- sampled text that ngram
        rarely proposes for is well measured, not thin."""
        s = self.sums.get(tenant)
        if s is None:
            return self.fleet_prior, 0.0
        return _shrunk(s, self.fleet_prior, self.prior_steps), max(s.steps, s.decode_steps)

    def method_acceptance(self, tenant: str) -> dict[str, float]:
        """{method: the tenant's acceptance on that method}, each shrunk toward
        the method's weak prior (`acceptance_fit.method_acceptance_prior`),
        never toward other tenants; only methods it has data on."""
        out: dict[str, float] = {}
        for (t, method), s in self.method_sums.items():
            if t == tenant and s.steps > 0:
                out[method] = _shrunk(s, method_acceptance_prior(method), self.prior_steps)
        return out

    def method_proposal(self, tenant: str) -> dict[str, Proposal]:
        """{method: how often and how fully the tenant proposes there}, for
        the methods that may not propose (`acceptance_fit.PROPOSAL_PRIOR`):
        its own decode steps, shrunk toward the method's weak prior -- never
        toward other tenants, whose text may propose at a very different
        rate (greedy code against sampled chat). Methods it has no evidence
        on are left to the prior (`GoodputModel.proposal`). Decode steps in
        which its policy capped it at 0 (`observe_capped`) are left out of
        the rate's denominator: a schedule that stops at 24 requests a step
        would otherwise read as a tenant that rarely proposes.

        Steps its schedule capped below its allowance (`observe_capped`'s
        `cap_reach`) are taken out of the fill and the survival alike: the
        fill is drafted tokens over the caps in force (not the allowance), and
        position i's reach counts only the share of the steps whose cap
        allowed it (`_cap_corrected_reach`). A proposal's length under a cap
        c is modelled as fill x c, as without a schedule."""
        out: dict[str, Proposal] = {}
        for (t, method), s in self.method_sums.items():
            if t != tenant:
                continue
            prior = PROPOSAL_PRIOR.get(method)
            survival = None
            shares = s.cap_shares()
            if s.reach[0] >= SURVIVAL_MIN_STEPS:
                a = _shrunk(s, method_acceptance_prior(method), self.prior_steps)
                reach = s.reach if shares is None else _cap_corrected_reach(s.reach, shares)
                survival = survival_from_counts(reach, s.survived, a, SURVIVAL_PSEUDO_STEPS)
            if prior is not None and s.decode_steps > 0:
                # Steps its policy capped at 0 could not propose: they are not evidence of the rate.
                capped = s.capped_weight / s.counted_weight if s.counted_weight > 0 else 0.0
                decode = max(s.decode_steps * (1.0 - capped), s.proposal_steps)
                rate = (s.proposal_steps + PRIOR_DECODE_STEPS * prior.rate) / (decode + PRIOR_DECODE_STEPS)
                full = s.proposal_full
                if shares is not None and s.proposal_steps > 0:
                    # The caps in force over its proposal steps: sum_i P(cap >= i), never above the allowance.
                    full = min(full, s.proposal_steps * sum(shares))
                fill = (s.proposal_drafted + PRIOR_FULL_TOKENS * prior.fill) / (full + PRIOR_FULL_TOKENS)
                out[method] = Proposal(min(1.0, rate), min(1.0, fill), survival)
            elif survival is not None:
                out[method] = (prior or ALWAYS_PROPOSES)._replace(survival=survival)
        return out

    def measured_gain(self, tenant: str, min_tokens: float = MIN_ARM_TOKENS) -> MeasuredGain | None:
        """The tenant's gain from drafting as its probe's two arms measured it:
        per replica where both arms have `min_tokens` decoded tokens (decayed),
        plain seconds per token over drafting seconds per token -- the arms ran
        on that replica in the same steps -- combined across replicas as a
        geometric mean weighted by the smaller arm. None: no such replica."""
        log_sum = weight = drafting = plain = 0.0
        for (t, _), (d_tok, d_s, p_tok, p_s) in self.arm_sums.items():
            if t != tenant or d_tok < min_tokens or p_tok < min_tokens or d_s <= 0 or p_s <= 0:
                continue
            w = min(d_tok, p_tok)
            log_sum += w * math.log((p_s / p_tok) / (d_s / d_tok))
            weight += w
            drafting += d_tok
            plain += p_tok
        if weight <= 0:
            return None
        return MeasuredGain(math.exp(log_sum / weight), drafting, plain)

    def prefill_ratio(self) -> float | None:
        """Prompt tokens per generated token over finished requests: the
        steady-state share of prefill in the steps. Unlike the replicas'
        interval ratio it does not spike when a load step admits a burst of
        prompts (admissions are not completions)."""
        completion = sum(s.completion for s in self.sums.values())
        return sum(s.prompt for s in self.sums.values()) / completion if completion > 0 else None

    def prompt_tokens(self) -> float | None:
        req = sum(s.requests for s in self.sums.values())
        return sum(s.prompt for s in self.sums.values()) / req if req > 0 else None

    def context_tokens(self) -> float | None:
        req = sum(s.requests for s in self.sums.values())
        if req <= 0:
            return None
        return (sum(s.prompt for s in self.sums.values()) + 0.5 * sum(s.completion for s in self.sums.values())) / req

    def views(self, tenants: set[str], tpot_targets: dict[str, float | None]) -> list[TenantView]:
        out = []
        for t in sorted(tenants | set(self.sums)):
            a, n = self.acceptance(t)
            s = self.sums.get(t)
            shares: dict[str, float] = {}
            if s and s.by_replica:
                total = sum(s.by_replica.values())
                shares = {r: v / total for r, v in s.by_replica.items() if total > 0}
            out.append(TenantView(t, a, n, tpot_targets.get(t), shares, self.method_acceptance(t), self.method_proposal(t),
                                  self.measured_gain(t), s.steps if s else 0.0,
                                  acceptance_length(s.accepted, s.steps) if s else None))
        return out

    def replica_mix(self) -> dict[str, dict[str, float]]:
        """{replica: {tenant: share of that replica's recent completion tokens}}."""
        per: dict[str, dict[str, float]] = {}
        for t, s in self.sums.items():
            for r, v in s.by_replica.items():
                per.setdefault(r, {})[t] = v
        return {r: {t: v / sum(m.values()) for t, v in m.items()} for r, m in per.items() if sum(m.values()) > 0}


def replica_views(
    est: ReplicaEstimator, mix: dict[str, dict[str, float]], prompt_tokens: float | None = None,
    prefill_ratio: float | None = None,
) -> list[ReplicaInput]:
    """Decision inputs per replica; `prefill_ratio` (from finished requests, see
    TenantEstimator.prefill_ratio) wins over each replica's interval estimate."""
    views = []
    for r in est.replicas.values():
        views.append(
            ReplicaInput(
                name=r.name, profile=r.profile, block=r.block, adaptive=r.adaptive, supports_knobs=r.supports_knobs,
                cost=r.cost, batch=r.batch, waiting=r.waiting, context_tokens=r.context_tokens, healthy=r.healthy,
                tokens_per_step=r.tokens_per_step, acceptance_length=r.acceptance_length, mix=mix.get(r.name, {}),
                prefill_ratio=r.prefill_ratio if prefill_ratio is None else prefill_ratio,
                prompt_tokens=prompt_tokens or 512.0,
                k0_skips_pass=k0_skips_drafter(r.method, r.engine_fixes),
            )
        )
    return views
