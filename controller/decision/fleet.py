"""Per-replica regimes and the fleet plan: which launch profile to run.

Why: per-tenant caps tune speculation within the profiles the replicas were
launched with; whether another profile (block size, adaptive verification,
or no drafter at all) would serve the load better is a restart, decided by
the actuation's payback gate (`controller/actuation.py`) from what this
stage reports per replica: the regime (rho = tokens per step / knee), the
recommended profile with its predicted gain, and what the replica's
downtime would cost the fleet.

Safety: a restart must not ask for a profile the replica cannot serve. What a
replica can be restarted into (`servable_profiles`) is decided from what is
known about its drafter checkpoint -- its own profile (a `dspark-b8` replica
loads a checkpoint proposing at least 8 tokens) and the fleet-wide drafter
setting (`controller.decision.drafter`) -- never assumed: an `off` replica
without a configured drafter stays `off`.
"""

from __future__ import annotations

from dataclasses import replace

from contract.knobs import K0_SKIPS, k0_skips_drafter
from contract.profiles import OFF, PROFILE_LABELS, Profile, parse_profile
from contract.settings import DrafterSettings

from .config import DecisionConfig
from .context import FleetContext
from .goodput import GoodputModel, regime_label, replica_load, run_batch
from .views import FULL, ReplicaInput, ReplicaRegime, TenantState


def _profile_or_off(label: str) -> Profile:
    try:
        return parse_profile(label)
    except ValueError:  # labels are validated at start-up; an unknown one can serve nothing but off
        return OFF


def servable_profiles(profile: str, drafter: DrafterSettings | None = None) -> tuple[str, ...]:
    """Launch profiles a replica running `profile` can be restarted into (label order).

    The rules mirror what vLLM accepts (drafters/checkpoint.py): a profile of a
    drafter method needs a checkpoint of that method proposing at least the
    profile's draft length. Known checkpoints:

    * the replica's own: its profile proves a checkpoint of its method proposing
      at least its block, so the same method at that length or shorter (with or
      without `-av`); nothing longer (a b8 checkpoint refuses `b16`);
    * the fleet-wide `drafter` (when set): its method up to its
      `speculative_tokens`, for every replica;
    * ngram needs no checkpoint: any size, for a replica already running ngram.

    `off` is always servable. An `off` replica without a fleet drafter can be
    restarted only as `off`: it has no checkpoint to draft with.
    """
    own = _profile_or_off(profile)
    fleet = drafter if drafter is not None and drafter.method else None
    ok = {"off"}
    for label in PROFILE_LABELS:
        p = parse_profile(label)
        if not p.speculative:
            continue
        if p.method == own.method and (not p.needs_drafter or p.block_size <= own.block_size):
            ok.add(label)
        elif fleet is not None and p.method == fleet.method and p.block_size <= (fleet.speculative_tokens or 0):
            ok.add(label)
    return tuple(label for label in PROFILE_LABELS if label in ok)


def restart_targets(profile: str, drafter: DrafterSettings | None = None,
                    configured: frozenset[str] | None = None) -> tuple[str, ...]:
    """What the plan may recommend for a replica running `profile`: what it can serve
    (`servable_profiles`), held to the `configured` profiles when given (on
    Kubernetes a profile without a pool cannot be scaled up); its own profile always."""
    return tuple(p for p in servable_profiles(profile, drafter)
                 if configured is None or p in configured or p == profile)


def _targets(cfg: DecisionConfig, configured: frozenset[str] | None) -> frozenset[str] | None:
    return configured if cfg.plan_configured_profiles_only and configured is not None else None


def k0_skips_after_restart(rep: ReplicaInput, method: str) -> bool:
    """Whether `rep`, restarted into `method`, would skip the drafter's pass at K=0:
    where the method has a skip (`contract.knobs.k0_skips_drafter`), unless the
    replica's engine shows it refuses skips -- its current method has one and it is
    not in force (the plugin did not verify that vLLM's sources): the restart keeps
    the engine."""
    refused = rep.method in K0_SKIPS and not rep.k0_skips_pass
    return k0_skips_drafter(method, None) and not refused


def plan_profiles(live: list[ReplicaInput], drafter: DrafterSettings | None = None,
                  configured: frozenset[str] | None = None) -> list[tuple[str, int, bool]]:
    """Profiles the fleet plan weighs: those at least one live replica can be
    restarted into (`restart_targets`), as (label, block, adaptive). A
    restart can change a replica's draft length or adaptive verification
    within its checkpoint, not conjure a checkpoint for another method or a
    longer block. `off` is one unless `configured` excludes it."""
    labels = {label for r in live for label in restart_targets(r.profile, drafter, configured)}
    out = []
    for label in PROFILE_LABELS:
        if label in labels:
            p = parse_profile(label)
            out.append((label, p.block_size, p.adaptive))
    return out


def operating_rho(ctx: FleetContext, model: GoodputModel, choice: dict[str, int]) -> dict[str, float]:
    """Each replica's rho at `choice` (measured tokens per step when known)."""
    rho: dict[str, float] = {}
    for rep in ctx.live:
        n = model.evaluate(rep, choice).verify_tokens
        measured = rep.tokens_per_step if rep.tokens_per_step else n
        rho[rep.name] = measured / ctx.knee[rep.name] if ctx.knee[rep.name] > 0 else 0.0
    return rho


def fleet_plan(live: list[ReplicaInput], choice: dict[str, int], model: GoodputModel, cfg: DecisionConfig,
               configured: frozenset[str] | None = None) -> tuple[str | None, float]:
    """The launch profile that, run by every replica, serves the current load
    and tenant mix best (tenant caps re-optimised for it), and its predicted
    gain over the fleet as it runs now.

    Homogeneous on purpose: a mixed fleet's benefit depends on routing
    between pools that the per-replica view cannot predict reliably, while a
    homogeneous profile is exactly what the static baselines run. The one
    exception is safety: a replica that cannot serve a candidate profile
    (`restart_targets`) is evaluated as it runs now, so the gain is what
    converting only the replicas that can would bring. `configured`: the
    profiles of every configured replica (`FleetContext.profiles`), which
    bound the plan when `cfg.plan_configured_profiles_only`.
    """
    if not live:
        return None, 1.0
    # The running fleet is charged its drafters for whatever actually runs on
    # each speculative replica (routing to the off pool is a preference and
    # spills when that pool is busier), hence no off pool here.
    model = replace(model, off_pool=False)
    current = model.total(live, choice)
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
    allowed = _targets(cfg, configured)
    servable = {r.name: restart_targets(r.profile, cfg.drafter, allowed) for r in live}
    best_profile, best_g = None, current
    for profile, block, adaptive in plan_profiles(live, cfg.drafter, allowed):
        alts = [
            replace(r, block=block, adaptive=adaptive, supports_knobs=True, profile=profile, batch=mean_b, mix=agg or r.mix,
                    k0_skips_pass=k0_skips_after_restart(r, parse_profile(profile).method))
            if profile in servable[r.name] else replace(r, batch=mean_b, mix=agg or r.mix)
            for r in live
        ]
        blocks = sorted({a.block for a in alts if a.block > 0})
        top = blocks[-1] if blocks else 0
        caps = {t: top for t in choice}
        options = [0] + [c for c in cfg.draft_caps if c < top and c not in blocks] + blocks
        for t in sorted(caps):  # one coordinate pass over tenants' caps
            scores = {k: model.total(alts, {**caps, t: k}) for k in options}
            caps[t] = max(scores, key=lambda k: (scores[k], k))
        g = model.total(alts, caps)
        if g > best_g * (1 + 1e-9) or (adaptive and best_profile is not None and g >= best_g * (1 - 1e-9)
                                       and _plain_twin(best_profile, profile)):
            best_profile, best_g = profile, g
    return best_profile, (best_g / current if current > 0 else 1.0)


def _plain_twin(plain: str, adaptive: str) -> bool:
    """Whether `adaptive` is `plain` with adaptive verification on (dspark-b4 and dspark-b4-av).

    Why the plan breaks their tie towards `adaptive`: the model prices adaptive verification
    as the best verify limit common to the batch, which per-tenant schedules already give
    (`at_limit(longest)` is one of the limits it weighs), so at most loads the two price the
    same to the last digit and label order picked the plain one. The engine's adaptive
    verification chooses per step and per request, which the model cannot price (simulated,
    the c=64 sweep point: both priced +9.37 %, dspark-b4 restarted into, 0.972 of
    dspark-b4-av static)."""
    p, a = parse_profile(plain), parse_profile(adaptive)
    return a.adaptive and not p.adaptive and (a.method, a.block_size) == (p.method, p.block_size)


def downtime_loss(
    live: list[ReplicaInput], name: str, occupied: dict[str, float], choice: dict[str, int], model: GoodputModel
) -> float:
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
    moved = replica_load(gone)
    load = [replica_load(r) for r in others]
    total = sum(load)
    after = 0.0
    for r, b in zip(others, load):
        grown = replace(r, batch=r.batch + moved * (b / total if total > 0 else 1.0 / len(others)))
        after += model.goodput(grown, choice) * min(1.0, replica_load(grown))
    return min(1.0, max(0.0, 1.0 - (after - before) / own))


def caps_in_force(state: dict[str, TenantState], batch: float) -> dict[str, int]:
    """Tenant -> the cap its policy gives a request in a step of `batch`
    requests (a schedule's length there, FULL uncapped; the decided cap
    before any policy). Not the decided cap itself: under a schedule that
    cap is the one at the batch where drafting pays the tenant most, and the
    fleet plan pricing the fleet's load at it took a tenant whose schedule
    stops at 24 as drafting at 128, and recommended restarting into `off`."""
    step = max(1, round(batch))
    out: dict[str, int] = {}
    for t, s in state.items():
        cap = s.policy.cap_at(step) if s.policy is not None else s.k
        out[t] = FULL if cap is None else cap
    return out


def replica_regimes(
    ctx: FleetContext, model: GoodputModel, state: dict[str, TenantState], cfg: DecisionConfig
) -> dict[str, ReplicaRegime]:
    """Each live replica at the caps and floors just decided (`state`): its
    regime, goodput, recommended profile and downtime cost."""
    live = ctx.live
    choice = caps_in_force(state, sum(run_batch(r) for r in live) / len(live)) if live else {t: s.k for t, s in state.items()}
    model = model.with_thetas({t: s.theta for t, s in state.items()})
    plan_profile, plan_gain = fleet_plan(live, choice, model, cfg, ctx.profiles)
    final_eval = {rep.name: model.evaluate(rep, choice) for rep in live}
    # Goodput each replica delivers now (the model judges an idle replica as
    # holding its next request: scale by occupancy below one request).
    occupied = {rep.name: final_eval[rep.name].goodput * min(1.0, replica_load(rep)) for rep in live}
    # Only replicas that can serve the plan's profile are converted (and counted).
    allowed = _targets(cfg, ctx.profiles)
    can = {r.name: plan_profile is not None and plan_profile in restart_targets(r.profile, cfg.drafter, allowed)
           for r in live}
    regimes = {}
    for rep in live:
        g, _, n, _ = final_eval[rep.name]
        # Gain per replica still to convert (converting 1 of N realises ~1/N).
        to_convert = sum(1 for r in live if r.profile != plan_profile and can[r.name]) or 1
        per_replica = 1 + (plan_gain - 1) * len(live) / to_convert
        rec_profile = plan_profile if plan_profile and can[rep.name] and per_replica >= 1 + cfg.plan_margin else rep.profile
        rec_gain = per_replica if rec_profile != rep.profile else 1.0
        measured = rep.tokens_per_step if rep.tokens_per_step else n
        knee = ctx.knee[rep.name]
        r_rho = measured / knee if knee else 0.0
        loss = downtime_loss(live, rep.name, occupied, choice, model)
        regimes[rep.name] = ReplicaRegime(
            rep.name, rep.profile, rep.batch, round(measured, 2), round(knee, 1), round(r_rho, 3),
            regime_label(r_rho), rep.acceptance_length, round(g, 1), rec_profile, round(rec_gain, 4), round(loss, 4),
        )
    return regimes

