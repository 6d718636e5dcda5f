"""The confidence floor for a chosen cap: theta* = G * c_m, when it pays.

Why: the survey's continuous form of vLLM's adaptive-verification budget
admits a draft position iff its survival S >= theta* = goodput times the
marginal verify cost per token -- near 0 when memory-bound, large when
compute-bound. Floors only exist on knob-capable adaptive (-av) replicas (the
confidence head runs only there), and one is published only when the model
predicts it beats no floor: adaptive verification already ranks every slot
and the per-tenant cap usually subsumes the floor, while a noisy confidence
head cuts drafts that would have been accepted (simulated: -2.3 % at c=16
for a 0.2 floor that the expectation model called free).
"""

from __future__ import annotations

import math

from .config import DecisionConfig
from .goodput import run_batch
from .optimizer import Optimizer
from .views import ReplicaInput


def marginal_theta(rep: ReplicaInput, goodput: float, verify_tokens: float, cfg: DecisionConfig) -> float:
    """theta* = G * c_m: the survival a draft position needs to pay for its verification."""
    batch = max(run_batch(rep), cfg.min_batch)
    delta = max(1.0, 0.1 * verify_tokens)
    t0 = rep.cost.step_time_s(batch, verify_tokens, rep.block, rep.context_tokens)
    t1 = rep.cost.step_time_s(batch, verify_tokens + delta, rep.block, rep.context_tokens)
    c_m = max(0.0, (t1 - t0) / delta)
    return min(cfg.theta_max, goodput * c_m if goodput > 0 else 0.0)


def theta_star(opt: Optimizer, t: str, k: int, proposal: dict[str, int], cfg: DecisionConfig) -> float | None:
    """The floor's marginal-cost value for tenant t at cap k, on the floor grid (None: no floor)."""
    if k <= 0:
        return None
    knob_reps = [r for r in opt.ctx.homes[t] if r.supports_knobs and r.block > 0 and r.adaptive]
    if not knob_reps:
        return None
    values = []
    choice = {**proposal, t: k}
    for rep in knob_reps:
        g, _, n, _ = opt.model.evaluate(rep, choice)
        values.append(marginal_theta(rep, g, n, cfg))
    # Never publish a floor that would cut the tenant's *mean* draft below
    # the chosen cap (that would contradict the cap decision): the floor then
    # only trims requests whose confidence runs below the tenant's average.
    consistent = opt.ctx.acc[t] ** min(k, max(r.block for r in knob_reps))
    theta = math.floor(min(sum(values) / len(values), consistent) / cfg.theta_step) * cfg.theta_step
    theta = round(theta, 4)
    return theta if theta > 0 else None


def confidence_floor(opt: Optimizer, t: str, k: int, proposal: dict[str, int], cfg: DecisionConfig) -> tuple[float, float]:
    """(theta*, the floor worth publishing: theta* if it beats no floor by theta_min_gain, else 0)."""
    star = theta_star(opt, t, k, proposal, cfg) or 0.0
    if star <= 0:
        return star, star
    trial = {**proposal, t: k}
    with_floor = opt.fleet_goodput(trial, t, {**opt.ctx.thetas, t: star})
    without = opt.fleet_goodput(trial, t, {**opt.ctx.thetas, t: None})
    return star, (0.0 if with_floor < without * (1 + cfg.theta_min_gain) else star)
