"""The model's upper bound for one phase of bench/control_sweep.py's trace.

Why a bound and not another "oracle": the best static profile per phase
(`best-static-per-phase`) cannot use what the controller may use -- per-tenant
caps, per-replica profiles, tenants kept apart -- so beating it says little.
This is the best *anything* the controller could choose, priced with the
simulator's own truth (drafters.costmodel + drafters.acceptance, the presets
the simulated requests draw from; for ngram profiles
drafters.sim.ngram_acceptance and the engine core's host time, which vLLM
does not overlap with the GPU step there), with perfect knowledge and free
switching:

* every launch profile of the benchmark's fleet (off, dspark-b{4,8,16}, each
  with and without adaptive verification; or off, ngram-k{2,4,8}), per
  replica;
* every per-tenant draft cap (0, 2, 4, 8, 16 up to the block);
* the tenants either sharing both replicas (each replica running the phase's
  mix) or, with two tenants, one replica each (its closed-loop clients
  going to its own replica).

The price is the steady state of a closed loop: a replica holding B
requests (all running) of mix w emits B * sum_t w_t tau_t per step; one
step verifies B * sum_t w_t (1 + verified_t) tokens plus the prefill those
tokens bring (prompt/output of each tenant), at mean context prompt +
output/2, plus the drafter's pass when anyone drafts (batch-wide; at K=0 too
under a `Truth` that says so, which also scales the pass). Adaptive
verification uses `expected_tokens_adaptive` per tenant (as if the batch
were that tenant's). It leaves out what makes real (and simulated) runs
slower -- ramp-up, queueing, prefill bursts, KV preemption, a phase's first
seconds -- so it is optimistic: a static profile's simulated throughput
divided by its own price here (printed beside the bound) shows how much.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from functools import lru_cache

from contract.profiles import parse_profile
from drafters import acceptance as acc
from drafters import costmodel as cm
from drafters.sim import TenantSpec
from drafters.sim import ngram_acceptance as ngram

CAPS = (0, 2, 4, 8, 16)


@dataclass(frozen=True)
class Truth:
    """The simulated truth a bound is priced under: the perturbations of bench/control_sweep.py
    this model can price (`drafters.sim.engine_types.EngineConfig` fields of the same names).

    Why: a sensitivity row that misses its target is either the controller's fault or its
    launch profile's; the bound of the launch profile alone, priced under that row's truth,
    tells which. `k0_pays_drafter`: a step capped at K=0 still runs the drafter's pass (the
    prompt-lookup search for ngram); `drafter_cost_scale`: that pass (search) costs this
    multiple of the model's."""

    k0_pays_drafter: bool = False
    drafter_cost_scale: float = 1.0

    @classmethod
    def of(cls, perturbation: dict | None) -> Truth | None:
        """The truth of a perturbation, None where it changes something else as well
        (acceptance, adaptive verification's tables, proposal rates: not priced here)."""
        perturbation = perturbation or {}
        if set(perturbation) - {f.name for f in fields(cls)}:
            return None
        return cls(**perturbation)


AS_MODELLED = Truth()


@dataclass(frozen=True)
class BoundChoice:
    """The priced choice: per replica, its profile and the tenants (with caps) it serves."""

    rate_tok_s: float
    replicas: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (profile, ((tenant, cap), ...)) per replica

    def describe(self) -> str:
        return " | ".join(f"{p}: " + ", ".join(f"{t} k={k}" for t, k in caps) for p, caps in self.replicas)


def _normalised(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {t: w / total for t, w in mix.items()}


def _caps(profile: str) -> list[int]:
    """The draft caps a tenant may take on `profile` (0 alone when it does not speculate)."""
    block = parse_profile(profile).block_size
    return [k for k in CAPS if k <= block] or [0]


@lru_cache(maxsize=65536)
def _tenant_tau(workload: str, cap: int, adaptive: bool, batch: float, draft_s: float, gpu: str, model: str,
                context: float, method: str = "dspark", block: int = 0) -> tuple[float, float]:
    """(tokens emitted, draft tokens verified) per request-step."""
    if cap <= 0:
        return 1.0, 0.0
    if method == "ngram":  # the proposer is asked for the profile's K, the cap truncates
        preset = ngram.get_preset(workload)
        return ngram.expected_tokens_per_step(preset, block, cap), ngram.expected_draft_tokens(preset, block, cap)
    preset = acc.get_preset(workload, "dspark")
    if adaptive:
        g, m = cm.get_gpu(gpu), cm.get_model(model)
        b = max(int(round(batch)), 1)
        return acc.expected_tokens_adaptive(preset, cap, b, draft_s, lambda n: cm.step_time_array_s(g, m, n, b, context))
    return acc.expected_tokens_per_step(preset, cap), acc.expected_draft_length(preset, cap)


def batch_shares(mix: dict[str, float], taus: dict[str, float], tenants: dict[str, TenantSpec]) -> dict[str, float]:
    """Each tenant's share of a replica's batch when its requests arrive in
    proportion to `mix` (the trace's one pool of closed-loop clients draws each
    request's tenant from it): a request holds its slot for its output over its
    tokens per step (Little's law), so w_t ~ m_t x output_t / tau_t. Priced with
    w = m, as until 2026-12-07, a tenant that drafts (or writes less) was priced
    as holding the slots its slower neighbour holds (the controller's goodput
    model had the same error: `controller.decision.goodput.batch_shares`, whose
    inputs are token shares, not request shares)."""
    hold = {t: w * max(tenants[t].output_mean, 1.0) / max(taus[t], 1e-9) for t, w in mix.items()}
    total = sum(hold.values())
    return {t: h / total for t, h in hold.items()} if total > 0 else dict(mix)


def replica_rate(profile: str, mix: dict[str, float], caps: dict[str, int], tenants: dict[str, TenantSpec],
                 batch: float, gpu: str, model: str, truth: Truth = AS_MODELLED) -> float:
    """Steady-state output tokens/s of one replica holding `batch` requests of `mix` (weights sum to 1)."""
    if batch <= 0 or not mix:
        return 0.0
    prof = parse_profile(profile)
    g, m = cm.get_gpu(gpu), cm.get_model(model)
    b = max(int(round(batch)), 1)
    context = sum(w * (tenants[t].prompt_mean + tenants[t].output_mean / 2) for t, w in mix.items())
    eff = {t: min(caps.get(t, 0), prof.block_size) for t in mix}
    drafting = prof.block_size > 0 and any(k > 0 for k in eff.values())
    ngram_replica = prof.method == "ngram"  # no drafter pass on the GPU: a CPU search (host time below)
    # The pass (search) runs when anyone drafts, or at K=0 too where the truth says so.
    searching = drafting or (truth.k0_pays_drafter and prof.block_size > 0)
    draft_s = (truth.drafter_cost_scale * cm.drafter_time_s(g, m, b, prof.block_size, context)
               if searching and not ngram_replica else 0.0)
    per = {t: _tenant_tau(tenants[t].workload, eff[t], prof.adaptive, float(b), round(draft_s, 6), gpu, model,
                          round(context), prof.method, prof.block_size) for t in mix}
    shares = batch_shares(mix, {t: tau for t, (tau, _) in per.items()}, tenants)
    tokens = verify = prefill = verifying = 0.0
    for t, w in shares.items():
        tau, verified = per[t]
        tokens += w * tau
        verify += w * (1.0 + verified)
        if eff[t] > 0:  # the share of its request-steps that carry drafts
            verifying += w * (ngram.get_preset(tenants[t].workload).propose_rate if ngram_replica else 1.0)
        prefill += w * tau * tenants[t].prompt_mean / max(tenants[t].output_mean, 1.0)
    # Prefill arrives as whole prompts (the simulator prefills one in a step
    # when the token budget allows), not as a trickle: a share q of the steps
    # carries a chunk of the mean prompt. Priced at the mean token count
    # instead, a memory-bound `off` batch at c=64 was priced 10455 tok/s where
    # it simulates 7325 (the decision's goodput model uses this burst model too).
    n = b * verify
    chunk = max(1.0, sum(w * tenants[t].prompt_mean for t, w in mix.items()))
    q = min(1.0, b * prefill / chunk)
    burst = b * prefill / q if q > 0 else 0.0  # a chunk; more once every step carries prefill (q = 1)
    device = (q * cm.step_time_s(g, m, int(round(n + burst)), b, context)
              + (1.0 - q) * cm.step_time_s(g, m, int(round(n)), b, context) + draft_s)
    host = cm.host_time_s(b, int(round(b * verifying)))
    if searching and ngram_replica:
        host += truth.drafter_cost_scale * cm.ngram_propose_time_s(b, b * context)
    step = cm.step_wall_time_s(device, host, prof.method)
    # Below one request per replica the replica idles part of the time (c=1 on
    # two replicas: each busy half of it).
    return b * tokens / step * min(1.0, batch)


def shared_bound(concurrency: int, mix: dict[str, float], tenants: dict[str, TenantSpec], profiles: list[str],
                 replicas: int = 2, gpu: str = "h200", model: str = "qwen3-8b",
                 truth: Truth = AS_MODELLED) -> BoundChoice:
    """The best choice with every replica running the same profile and the whole mix."""
    mix = _normalised(mix)
    names = sorted(mix)
    best = BoundChoice(0.0, ())
    for profile in profiles:
        for combo in itertools.product(_caps(profile), repeat=len(names)):
            caps = dict(zip(names, combo))
            rate = replicas * replica_rate(profile, mix, caps, tenants, concurrency / replicas, gpu, model, truth)
            if rate > best.rate_tok_s:
                best = BoundChoice(rate, tuple((profile, tuple(caps.items())) for _ in range(replicas)))
    return best


def apart_bound(concurrency: int, mix: dict[str, float], tenants: dict[str, TenantSpec], profiles: list[str],
                replicas: int = 2, gpu: str = "h200", model: str = "qwen3-8b",
                truth: Truth = AS_MODELLED) -> BoundChoice | None:
    """The best choice with two tenants on two replicas, one replica each (its closed-loop
    clients going to its own replica, however unequal the two loads); None for other shapes."""
    mix = _normalised(mix)
    names = sorted(mix)
    if len(names) != 2 or replicas != 2:
        return None
    per_tenant = {}
    for t in names:
        per_tenant[t] = max((replica_rate(profile, {t: 1.0}, {t: k}, tenants, concurrency * mix[t], gpu, model, truth),
                             profile, k) for profile in profiles for k in _caps(profile))
    return BoundChoice(sum(v[0] for v in per_tenant.values()),
                       tuple((per_tenant[t][1], ((t, per_tenant[t][2]),)) for t in names))


def phase_bound(concurrency: int, mix: dict[str, float], tenants: dict[str, TenantSpec], profiles: list[str],
                replicas: int = 2, gpu: str = "h200", model: str = "qwen3-8b",
                truth: Truth = AS_MODELLED) -> BoundChoice:
    """The best choice for one phase (see the module docstring): the tenants sharing the
    replicas or kept apart, whichever the model prices higher. `profiles` limited to the
    controller's launch profile: the most its knobs and routing could make of it."""
    return best_of(shared_bound(concurrency, mix, tenants, profiles, replicas, gpu, model, truth),
                   apart_bound(concurrency, mix, tenants, profiles, replicas, gpu, model, truth))


def best_of(shared: BoundChoice, apart: BoundChoice | None) -> BoundChoice:
    """The placement the model prices higher (shared on a tie)."""
    return apart if apart is not None and apart.rate_tok_s > shared.rate_tok_s else shared


def static_price(profile: str, concurrency: int, mix: dict[str, float], tenants: dict[str, TenantSpec],
                 replicas: int = 2, gpu: str = "h200", model: str = "qwen3-8b", truth: Truth = AS_MODELLED) -> float:
    """This model's price of a static profile (every tenant drafting the whole block): the yardstick
    for how optimistic the bound is (simulated static / this)."""
    mix = _normalised(mix)
    block = parse_profile(profile).block_size
    return replicas * replica_rate(profile, mix, {t: block for t in mix}, tenants, concurrency / replicas, gpu, model,
                                   truth)
