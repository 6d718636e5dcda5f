"""Probes: a small random share of a tenant's requests runs the other arm.

Why: the goodput model prices a tenant from what it has measured, and a
tenant that does not draft measures nothing -- switched off on thin or
stale evidence, it stays off whatever its traffic becomes (seen on a second
CPU bed: both tenants off 10 s after start, never back). And a model that
prices a tenant's drafting can be wrong in ways no estimate inside it
reveals. So, per tenant:

* **exploration** -- while it does not draft and its acceptance estimate
  leans on the prior (fewer than `explore_evidence_steps` speculation
  steps behind it, decayed: they fade while it is off), a share
  `explore_share` of its requests drafts the replicas' full block, but only
  in steps small enough that verifying their drafts keeps the replica below
  its knee (`cheap_batch`): evidence where it costs least;
* **hold-out** -- while it drafts, a share `holdout_share` of its requests
  does not (default 0: it costs those requests their speed-up; an operator
  who wants the check turns it on).

The arm is drawn per request by the gateway (`SpeculationPolicy.probe`), so
both arms run on the same replicas in the same steps: the ratio of their
engine-measured time per output token is the tenant's *measured gain* from
drafting, which the controller reports beside the model's prediction for
the same requests (`measured_gain`), so an operator can check the model in
production.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from contract.knobs import Schedule
from contract.overrides import TenantOverride
from contract.policy import ProbeSpec, SpeculationPolicy

from .config import DecisionConfig
from .context import FleetContext
from .goodput import GoodputModel
from .optimizer import priced_mix

NEVER_DRAFT: Schedule = ((1, 0),)  # the hold-out arm: no draft at any batch


def drafts(policy: SpeculationPolicy) -> bool:
    """Whether the policy lets the tenant draft in some step."""
    if not policy.enabled or policy.max_draft == 0 or policy.max_batch == 0:
        return False
    return policy.schedule is None or any(k > 0 for _, k in policy.schedule)


def cheap_batch(knees: Iterable[float], drafted_per_request: float) -> int:
    """The largest step (in requests) whose verify tokens stay at or below the
    smallest of `knees` (tokens per step) when every request drafts
    `drafted_per_request` tokens on average: below its knee a replica's step
    costs the same whatever it verifies, so drafting there is nearly free.
    At least 1: the lightest step is where exploring costs least anyway."""
    knee = min(knees, default=0.0)
    if knee <= 0 or not math.isfinite(knee):
        return 1
    return max(1, int(knee // (1.0 + max(drafted_per_request, 0.0))))


def probe_spec(
    policy: SpeculationPolicy, acceptance_steps: float, block: int, cheap: int, cfg: DecisionConfig,
    profile: str | None = None,
) -> ProbeSpec | None:
    """PURE: the probe to publish with `policy` (None: every request follows it).

    `block`: the largest draft the tenant's speculative replicas run (0: none
    speculates, nothing to explore); `cheap`: `cheap_batch` for it;
    `profile`: the profile of the replicas that run it, where exploring
    requests go. An admin pin (`source == "admin"`) is obeyed as it is: no
    probe. A hold-out stays on the policy's replicas (the arms must share
    their steps)."""
    if policy.source == "admin" or block <= 0:
        return None
    if drafts(policy):
        if cfg.holdout_share <= 0:
            return None
        return ProbeSpec(share=cfg.holdout_share, schedule=NEVER_DRAFT)
    if cfg.explore_share <= 0 or acceptance_steps >= cfg.explore_evidence_steps:
        return None
    return ProbeSpec(share=cfg.explore_share, schedule=((max(1, cheap), block),), profile=profile)


def tenant_probe(
    ctx: FleetContext, model: GoodputModel, t: str, policy: SpeculationPolicy, previous: SpeculationPolicy | None,
    cfg: DecisionConfig, override: TenantOverride | None = None,
) -> ProbeSpec | None:
    """The probe for tenant t's `policy` this tick. Exploration starts below
    `explore_evidence_steps` and, once on, runs until twice that (so the
    evidence it gathers does not stop it at the threshold it crossed, only
    to decay back under it); it drafts no longer than an admin's bounds
    allow (`override`)."""
    reps = [r for r in ctx.homes[t] if r.block > 0]
    if not reps:
        return None
    widest = max(reps, key=lambda r: r.block)
    block = widest.block if override is None else override.clamp_cap(widest.block)
    drafted = max(model.proposes(t, r.method).drafted(r.block) for r in reps)
    cheap = cheap_batch([ctx.knee[r.name] for r in reps], drafted)
    exploring = previous is not None and previous.probe is not None and not drafts(previous)
    if exploring and not drafts(policy):
        cfg = cfg.model_copy(update={"explore_evidence_steps": 2.0 * cfg.explore_evidence_steps})
    probe = probe_spec(policy, ctx.tenants[t].acceptance_steps, block, _power_of_two(cheap), cfg, widest.profile)
    return steady_probe(previous.probe if previous is not None else None, probe)


def _power_of_two(n: int) -> int:
    """`n` rounded down to a power of two: the knee the cheap batch derives from is refitted every tick."""
    return 1 << (max(n, 1).bit_length() - 1)


def steady_probe(old: ProbeSpec | None, new: ProbeSpec | None) -> ProbeSpec | None:
    """`old` while `new` is the same probe up to a cheap batch within a factor
    of two of it: the cheap batch follows the learned knee, which moves with
    every refit, and each new value would be a policy change published to
    every gateway (the real bed's first run changed it nearly every tick)."""
    if old is None or new is None or (old.share, old.profile) != (new.share, new.profile):
        return new
    (old_b, old_k), (new_b, new_k) = old.schedule[-1], new.schedule[-1]
    if len(old.schedule) == len(new.schedule) == 1 and old_k == new_k and old_b <= 2 * new_b and new_b <= 2 * old_b:
        return old
    return new


def predicted_gain(ctx: FleetContext, model: GoodputModel, t: str, choice: Mapping[str, int], cap: int) -> float | None:
    """What the model predicts a probe's arms measure: a request that drafts at
    `cap` beside one that does not, in the same steps, emits the tokens per
    step the model gives the tenant at that cap (`ReplicaEval.taus`), the
    other one -- so their time per token differs by that factor. Weighted by
    the tenant's traffic over its replicas (evenly where it has none)."""
    reps = [r for r in ctx.homes[t] if r.block > 0]
    if not reps or cap <= 0:
        return None
    shares = ctx.tenants[t].shares
    weights = {r.name: shares.get(r.name, 0.0) for r in reps}
    if sum(weights.values()) <= 0:
        weights = {r.name: 1.0 for r in reps}
    total = sum(weights.values())
    # (priced as at least a small participant: the tenant may have no traffic on a replica yet)
    return sum(weights[r.name] * model.evaluate(replace(r, mix=priced_mix(r, t)), {**choice, t: cap}).taus[t]
               for r in reps) / total
