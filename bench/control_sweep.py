"""Controller benchmark on the discrete-event simulator (SIMULATION, not hardware).

One run compares, on simulated H200 + Qwen3-8B replicas (drafters.sim):

* `off` and every static `dspark-b{4,8,16}` with and without adaptive
  verification (`-av`);
* vLLM's own mechanism tuned as a careful operator would: its batch-size ->
  K table (`num_speculative_tokens_per_batch_size`) on dspark-b8, grid-searched
  over the documented shape with scaled breakpoints and over plain
  thresholds (`k_table_candidates`); the best candidate per sweep point and
  over the trace is reported as the `tuned K table`, by name;
* the specgate controller (with and without its restart actuator);
* two references on the trace: `best-static-per-phase` (hindsight: the best
  static profile of each phase, switched for free) and the model's upper
  bound per phase (bench/control_bound.py: the best per-replica profile x
  per-tenant cap x tenant placement, priced with the simulator's own truth),
  and the same bound limited to the controller's launch profile (what its knobs
  and placement could make of it without a restart), under each truth it can price;
* with `--sensitivity`, the trace again on simulated truths the controller's
  model does not share (`DSPARK_PERTURBATIONS`: the drafter's pass x0.5 / x2, K=0
  steps that still pay the drafter, a steep DFlash-like acceptance decay, a
  tenant whose acceptance drifts, adaptive verification budgeting with
  vLLM's start-up cost tables instead of the real step cost), K tables
  re-tuned per truth;
* on (a) a closed-loop concurrency sweep 1..256 with a mixed code/chat tenant
  population and (b) a multi-tenant closed-loop trace whose concurrency and
  tenant mix change every phase.

`--fleet ngram` runs the same benchmark on replicas with vLLM's ngram prompt
lookup instead of DSpark (`FLEETS`): statics `off` and `ngram-k{2,4,8}`, the
K tables on `ngram-k8`, the controller's fleet starting as `ngram-k8` (no
fleet-wide drafter checkpoint: ngram needs none, and an `off` replica stays
drafter-less), priced by the simulator's ngram truth
(`drafters.sim.ngram_acceptance`: proposals in some steps, copies accepted
whole or left early, the proposer's CPU time in every step) -- assumptions
the controller's model does not share. Its `--sensitivity` perturbations
(`NGRAM_PERTURBATIONS`) are prompt lookup's own: the search's CPU time x10,
the search run at K=0 (stock vLLM), `code` proposing half as often, `code`'s
copies matching less as the trace goes on, and `chat` quoting its context as
`code` does.

specgate here is the shipped code, driven by the simulator's public
interface (`Simulation.snapshot` / `replica_views` / `submit` /
`restart_replica`): the controller's `controller.core.ControlCore` (signals ->
estimators -> the pure `controller.decision.decide`) fed every tick with the
/metrics snapshot of each replica (the knobs it advertises in
`specgate_ext_info` included) and the gateway's per-(tenant, replica)
telemetry counters (`contract.telemetry.increments_for`); the gateway's
routing (`gateway.routing.rank_replicas` over `gateway.replicas.ReplicaState`s,
policies through `gateway.policy_watch.PolicyView`) and knob merge
(`contract.knobs.merged_xargs`, parsed on the engine side by `parse_knobs`:
a step whose requests are all capped at 0 -- or all above their
`max_batch` -- runs at K=0 and skips the drafter); and (row `controller`) the
controller's restart path, `controller.actuation.GatedActuator` with the
`PlanGate` of `settings.controller.restart_gate` (a restart must pay back its
downtime) and a restart action that restarts the simulated replica
(`SimRestart`). `controller(knobs-only)` has no actuator. Settings come from
the one settings tree: `--config specgate.yaml`, SPECGATE_* variables, and
`--set controller.restart_gate.min_loss=0.6`-style overrides.

Prints throughput, TPOT p50/p99, SLO attainment and number of policy changes,
then the target ratios. Usage:

    .venv/bin/python bench/control_sweep.py            # full run (--jobs parallel processes)
    .venv/bin/python bench/control_sweep.py --quick    # shorter phases / fewer points and K-table candidates
    .venv/bin/python bench/control_sweep.py --trace-only --sensitivity   # the trace, then under each perturbation
    .venv/bin/python bench/control_sweep.py --quick --fleet ngram        # the same on ngram (prompt-lookup) replicas
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract.knobs import merged_xargs  # noqa: E402
from contract.policy import PolicySet  # noqa: E402
from contract.profiles import BLOCK_SIZES  # noqa: E402
from contract.settings import Settings, load_settings  # noqa: E402
from contract.telemetry import TelemetryCounters  # noqa: E402
from controller.actuation import GatedActuator, PlanGate  # noqa: E402
from controller.core import ControlCore  # noqa: E402
from controller.costs import ReplicaCost  # noqa: E402
from drafters.sim import (  # noqa: E402
    Admission,
    BasePolicy,
    ClosedLoopSource,
    EngineConfig,
    RequestSampler,
    Simulation,
    TenantSpec,
)
from bench.control_bound import Truth, apart_bound, best_of, phase_bound, shared_bound, static_price  # noqa: E402
from gateway.policy_watch import PolicyView  # noqa: E402
from gateway.replicas import ReplicaState  # noqa: E402
from gateway.routing import RouteRequest, rank_replicas  # noqa: E402
from testbed.phases import Phase  # noqa: E402
from testbed.stats import percentile  # noqa: E402

GPU, MODEL = "h200", "qwen3-8b"
KTABLE_PREFIX = "k-table"
REPLICAS = 2  # every policy gets the same two simulated H200s


# Structural perturbations (--sensitivity): a simulated truth the controller's
# model does not share (drafters.sim.EngineConfig fields); the controller keeps
# its online learning (step cost from /metrics, acceptance from telemetry).
# Each fleet perturbs what its drafter is made of.
DSPARK_PERTURBATIONS: dict[str, dict] = {
    "drafter pass x0.5": {"drafter_cost_scale": 0.5},
    "drafter pass x2": {"drafter_cost_scale": 2.0},
    "K=0 still pays the drafter (vLLM 0.32 V2)": {"k0_pays_drafter": True},
    "steep (DFlash-like) acceptance decay": {"drafter_family": "dflash"},
    "code acceptance drifts -0.3 logit/min": {"acceptance_drift": (("code", -0.3),)},
    "adaptive verification budgets at its start-up tables (ctx 8192, vLLM 0.32)": {"av_profile_context": 8192.0},
}
# Prompt lookup: its CPU search dearer (a slow host; x10 makes it ~1.4 ms of a ~12 ms step at 64
# requests), the search run at K=0 too (stock vLLM, no plugin), a tenant whose text repeats its
# context less, one whose copies stop matching as the trace goes on, and a sampled tenant whose
# text quotes its context (the method's prior says sampled text accepts nothing).
NGRAM_PERTURBATIONS: dict[str, dict] = {
    "proposer search x10": {"drafter_cost_scale": 10.0},
    "K=0 still searches (stock vLLM, no plugin)": {"k0_pays_drafter": True},
    "code proposes half as often": {"ngram_propose_scale": (("code", 0.5),)},
    "code whole-match drifts -0.3 logit/min": {"acceptance_drift": (("code", -0.3),)},
    "chat quotes its context as code does": {"ngram_behaves_as": (("chat", "code"),)},
}


@dataclass(frozen=True)
class Fleet:
    """What one kind of replica fleet compares: its static profiles, the profile vLLM's K tables
    run on, the controller fleet's launch profile, and the fleet-wide drafter checkpoint the
    controller is told about (`controller.decision.drafter`; None: none)."""

    name: str
    statics: tuple[str, ...]
    k_table_profile: str
    controller_start: str
    drafter: dict | None
    perturbations: dict[str, dict]


FLEETS: dict[str, Fleet] = {
    # The simulated DSpark replicas load a drafter for every block size a profile names.
    "dspark": Fleet("dspark", ("off", "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av", "dspark-b16",
                               "dspark-b16-av"), "dspark-b8", "dspark-b8-av",
                    {"method": "dspark", "speculative_tokens": max(BLOCK_SIZES)}, DSPARK_PERTURBATIONS),
    # ngram needs no checkpoint: the controller may re-size an ngram replica, never draft on an off one.
    "ngram": Fleet("ngram", ("off", "ngram-k2", "ngram-k4", "ngram-k8"), "ngram-k8", "ngram-k8", None,
                   NGRAM_PERTURBATIONS),
}
RESTART_S = 30.0  # simulated replica restart (drain done) to ready: vLLM start-up incl. CUDA-graph capture
CONTROLLERS = ("controller", "controller(knobs-only)")


# ---------------------------------------------------------------------------
# vLLM's own mechanism, tuned as a careful operator would


def k_table_candidates(quick: bool = False) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """vLLM `num_speculative_tokens_per_batch_size` tables on a K=8 profile (the fleet's
    `k_table_profile`: dspark-b8 or ngram-k8), keyed by their policy name.

    Two families an operator would search: the documented shape (full K, then
    ~2/3 K, ~1/3 K, then 0) with its three breakpoints (32/64/128 requests in
    the docs) scaled to where this fleet turns compute-bound, and the plain
    threshold (full K up to N requests per replica, then 0). The batch is per
    replica (what vLLM sees), so a fleet of two at c=256 holds 128 each: the
    docs' table never reaches its K=0 row there. The benchmark runs every
    candidate and reports the best per sweep point and over the trace (the
    grid search), naming the table it chose.
    """
    k, out = 8, {}
    for scale in ((0.25, 0.5, 1.0) if quick else (0.25, 0.375, 0.5, 0.75, 1.0)):
        a, b, c = (max(2, round(x * scale)) for x in (32, 64, 128))
        out[f"{KTABLE_PREFIX}[8<={a},5<={b},3<={c},0]"] = ((1, a, k), (a + 1, b, 5), (b + 1, c, 3), (c + 1, 1024, 0))
    for n in ((16, 48) if quick else (16, 24, 32, 48, 64, 96)):
        out[f"{KTABLE_PREFIX}[8<={n},0]"] = ((1, n, k), (n + 1, 1024, 0))
    return out


def is_k_table(policy: str) -> bool:
    return policy.startswith(KTABLE_PREFIX)


# ---------------------------------------------------------------------------
# specgate on the simulator: the gateway's routing + knob merge, the
# controller's ControlCore and its restart actuator


class SimRestart:
    """`controller.actuation.RestartAction` on the simulator: drain the replica, restart it
    with the new launch profile, `downtime_s` until it is ready (`Simulation.restart_replica`)."""

    name = "sim-restart"

    def __init__(self, sim: Simulation, downtime_s: float) -> None:
        self.sim = sim
        self.downtime_s = downtime_s

    def busy(self) -> set[str]:
        return self.sim.restarting()

    async def restart(self, replica: str, profile: str) -> None:
        self.sim.restart_replica(replica, profile, self.downtime_s)


class ControllerPolicy(BasePolicy):
    """specgate (gateway + controller) behind the simulator's policy hook.

    * Each tick: every replica's /metrics snapshot (`Simulation.snapshot`, with
      the knobs the replica advertises in `specgate_ext_info`) goes to the
      controller's `ControlCore` and to the gateway's `ReplicaState` (its load
      gauges and `ext_knobs`), the tenants' telemetry counters to the core;
      `decide()` -> the published policies (`gateway.policy_watch.PolicyView`);
      with `actuate`, the decision's replica regimes go to the shipped
      `GatedActuator` (`PlanGate` from `settings.controller.restart_gate`) whose
      restart action restarts simulated replicas (`SimRestart`).
    * Each request: the gateway's `rank_replicas` over the `ReplicaState`s
      (in-flight = the replica's running + waiting, exact as the gateway's own
      count; gauges from the last scrape; a replica draining or down for a
      restart is out of rotation), and `merged_xargs` of the tenant's policy
      with what the chosen replica advertises; the simulated engine parses
      them with the lenient `parse_knobs`.
    """

    name = "controller"

    def __init__(self, settings: Settings, tpot_targets: dict[str, float], actuate: bool = True):
        cfg = settings.controller
        self.settings = settings
        self.core = ControlCore(
            cfg.decision,
            cost_factory=lambda name, profile: ReplicaCost.for_names(cfg.gpu, cfg.model, profile, cfg.step_cost_half_life_s),
            half_life_s=cfg.half_life_s,
            tpot_targets=tpot_targets,
            unhealthy_after_failures=cfg.unhealthy_after_failures,
        )
        self.actuate = actuate
        self.actuator: GatedActuator | None = None
        self.sim: Simulation | None = None
        self.policy_view = PolicyView({})
        self.gateway: dict[str, ReplicaState] = {}
        self.changes = 0
        self.ticks = 0
        self._last: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draws = random.Random(0)  # per-request probe draws, reproducible run to run

    def attach(self, sim: Simulation) -> None:
        self.sim = sim
        self.gateway = {name: ReplicaState(name=name, url=f"sim://{name}", profile=rv.profile, configured_model=MODEL,
                                           healthy=rv.available)
                        for name, rv in sim.replica_views().items()}
        if self.actuate:
            self.actuator = GatedActuator(PlanGate.from_settings(self.settings.controller.restart_gate),
                                          SimRestart(sim, RESTART_S))
            self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    @property
    def restarts(self) -> list[tuple[float, str, str]]:
        return list(self.actuator.restarts) if self.actuator else []

    def tick(self, view) -> None:
        assert self.sim is not None, "attach() first (Simulation does it)"
        now = view.now
        dt = 0.0 if self._last is None else now - self._last
        self._last = now
        for name, rv in self.sim.replica_views().items():
            snap = self.sim.snapshot(name)  # None while the replica is down: a failed scrape
            self.core.observe_replica(name, rv.profile, now, snap)
            st = self.gateway[name]
            st.profile = rv.profile
            st.open_attempts = rv.load  # the gateway's count at the scrape (it is exact at every moment)
            st.observe_metrics(snap, now)
        counters = [TelemetryCounters(t, r, dict(c)) for (t, r), c in sorted(view.tenant_counters.items())]
        self.core.observe_telemetry(counters, dt)
        decision = self.core.decide(now)
        self.core.commit(decision)
        if self.ticks:
            self.changes += len(decision.changes)
        self.ticks += 1
        if decision.policies != self.policy_view.policies.policies:
            self.policy_view.update(PolicySet(version=self.policy_view.policies.version + 1, policies=decision.policies))
        if self.actuator is not None and self._loop is not None:
            self._loop.run_until_complete(self.actuator.apply(decision.replicas, now))

    def admit(self, request, view) -> Admission:
        policy, _ = self.policy_view.for_tenant(request.tenant).draw(self._draws.random())  # a probe's arm, per request
        states = []
        for name, rv in view.replicas.items():
            st = self.gateway[name]
            st.open_attempts = rv.load  # the gateway's in-flight count: requests sent there and not finished
            st.healthy = rv.available  # a draining or restarting replica is out of rotation
            states.append(st)
        ranked = rank_replicas(states, RouteRequest(MODEL, request.tenant), policy)
        if not ranked:
            return Admission()
        pick = ranked[0]
        return Admission(replica=pick.name, vllm_xargs=merged_xargs(None, policy, pick.ext_knobs))


# ---------------------------------------------------------------------------
# Workloads


class PhasedClosedLoop:
    """Closed-loop clients whose number and tenant mix change by phase."""

    def __init__(self, phases: list[Phase], tenants: dict[str, TenantSpec], seed: int = 0):
        self.phases = phases
        self.bounds = np.cumsum([p.duration_s for p in phases])
        self.samplers = [
            RequestSampler([TenantSpec(**{**tenants[t].__dict__, "weight": w}) for t, w in p.mix.items()], seed + i)
            for i, p in enumerate(phases)
        ]
        self.active = 0
        self._ids = 0

    def phase_at(self, t: float) -> int:
        return int(min(np.searchsorted(self.bounds, t, side="right"), len(self.phases) - 1))

    def _draw(self, t: float):
        r = self.samplers[self.phase_at(t)].draw(t)
        self._ids += 1
        object.__setattr__(r, "id", self._ids)
        return r

    def initial(self):
        self.active = self.phases[0].concurrency
        return [self._draw(0.0) for _ in range(self.active)]

    def on_finish(self, req, now: float):
        self.active -= 1
        target = self.phases[self.phase_at(now)].concurrency
        out = [self._draw(now) for _ in range(max(0, target - self.active))]
        self.active += len(out)
        return out


TENANTS = {
    "code": TenantSpec("code", "code", prompt_mean=600, output_mean=300),
    "chat": TenantSpec("chat", "chat", prompt_mean=400, output_mean=250),
    "math": TenantSpec("math", "gsm8k", prompt_mean=300, output_mean=350),
    "creative": TenantSpec("creative", "creative", prompt_mean=300, output_mean=300),
}
TPOT_TARGET_MS = {"code": 30.0, "chat": 40.0, "math": 30.0, "creative": 60.0}
SWEEP_MIX = {"code": 1.0, "chat": 1.0}  # the concurrency sweep's tenants (equal weights)


# ---------------------------------------------------------------------------
# Running


@dataclass
class Result:
    policy: str
    tokens: float
    duration: float
    tpot: list[float]
    slo_ok: int
    slo_n: int
    changes: int
    phase_tokens: list[float] = field(default_factory=list)
    phase_tpot: list[list[float]] = field(default_factory=list)
    phase_slo: list[tuple[int, int]] = field(default_factory=list)
    restarts: list = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.tokens / self.duration

    def pct(self, q: float) -> float:
        value = percentile(self.tpot, q)
        return float("nan") if value is None else value

    @property
    def slo(self) -> float:
        return self.slo_ok / self.slo_n if self.slo_n else float("nan")


def fleet_for(policy: str, settings: Settings, truth: dict | None = None,
              kind: Fleet = FLEETS["dspark"]) -> tuple[list[EngineConfig], BasePolicy]:
    truth = truth or {}

    def fleet(profile: str, **kw) -> list[EngineConfig]:
        return [EngineConfig(gpu=GPU, model=MODEL, profile=profile, name=f"r{i}", seed=i, **truth, **kw)
                for i in range(REPLICAS)]

    if policy in CONTROLLERS:
        return fleet(kind.controller_start), ControllerPolicy(settings, TPOT_TARGET_MS, actuate=(policy == "controller"))
    if is_k_table(policy):
        return fleet(kind.k_table_profile, spec_k_table=k_table_candidates()[policy]), BasePolicy()
    return fleet(policy), BasePolicy()


def run_one(policy: str, source, until_s: float, warmup_s: float, seed: int, settings: Settings,
            phase_bounds: list[float] | None = None, truth: dict | None = None,
            kind: Fleet = FLEETS["dspark"]) -> Result:
    cfgs, pol = fleet_for(policy, settings, truth, kind)
    sim = Simulation(cfgs, source, pol, tick_s=settings.controller.tick_s, seed=seed)
    try:
        rep = sim.run(until_s, warmup_s)
    finally:
        if isinstance(pol, ControllerPolicy):
            pol.close()
    recs = [r for r in rep.completed if r.arrival_s >= warmup_s and r.output_tokens > 1]
    tpots = [1000 * (r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in recs]
    ok = sum(1 for r, t in zip(recs, tpots) if t <= TPOT_TARGET_MS.get(r.tenant, 50.0))
    res = Result(policy, rep.output_tokens, until_s - warmup_s, tpots, ok, len(recs),
                 pol.changes if isinstance(pol, ControllerPolicy) else 0)
    if isinstance(pol, ControllerPolicy):
        res.restarts = pol.restarts
    if phase_bounds:
        edges = [0.0] + list(phase_bounds)
        for a, b in zip(edges[:-1], edges[1:]):
            # Output tokens of requests finishing in the phase.
            res.phase_tokens.append(sum(r.output_tokens for r in rep.records if a <= r.finish_s < b))
            pr = [(r, t) for r, t in zip(recs, tpots) if a <= r.arrival_s < b]
            res.phase_tpot.append([t for _, t in pr])
            res.phase_slo.append((sum(1 for r, t in pr if t <= TPOT_TARGET_MS.get(r.tenant, 50.0)), len(pr)))
    return res


def _sweep_job(job: tuple[str, int, float, float, int, Settings, Fleet]) -> Result:
    policy, c, warm, measure_s, seed, settings, kind = job
    src = ClosedLoopSource(c, [TENANTS[t] for t in SWEEP_MIX], seed=seed)
    return run_one(policy, src, warm + measure_s, warm, seed, settings, kind=kind)


def _trace_job(job: tuple[str, list, int, Settings, dict, Fleet]) -> Result:
    policy, phases, seed, settings, truth, kind = job
    bounds = list(np.cumsum([p.duration_s for p in phases]))
    return run_one(policy, PhasedClosedLoop(phases, TENANTS, seed=seed), bounds[-1], 0.0, seed, settings, bounds, truth,
                   kind)


def best_k_table(rows: list[Result]) -> Result:
    """The grid search's pick among the K-table candidates."""
    return max((r for r in rows if is_k_table(r.policy)), key=lambda r: r.throughput)


def best_static_per_phase(statics: list[Result], n_phases: int, total: float) -> tuple[Result, list[Result]]:
    """Hindsight: the best static profile of each phase (by its finished-request tokens), switched for free."""
    picks = [max(statics, key=lambda r: r.phase_tokens[i]) for i in range(n_phases)]
    res = Result("best-static-per-phase", sum(p.phase_tokens[i] for i, p in enumerate(picks)), total,
                 [t for i, p in enumerate(picks) for t in p.phase_tpot[i]],
                 sum(p.phase_slo[i][0] for i, p in enumerate(picks)), sum(p.phase_slo[i][1] for i, p in enumerate(picks)),
                 sum(1 for a, b in zip(picks, picks[1:]) if a.policy != b.policy))
    return res, picks


def bench_settings(config: str | None, assignments: list[str], kind: Fleet = FLEETS["dspark"]) -> Settings:
    """specgate's settings tree for the controller under test: `--config` YAML and
    SPECGATE_* variables as in production, plus `--set dotted.key=value` (highest);
    `controller.decision.drafter` defaults to what the simulated fleet loads (`Fleet.drafter`)."""
    overrides: dict = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set wants dotted.key=value, got {item!r}")
        *path, leaf = key.strip().split(".")
        node = overrides
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(raw)
    settings = load_settings(config, **overrides)
    if settings.controller.decision.drafter.method is None and kind.drafter is not None:
        # The simulated DSpark replicas load a drafter for every block size a
        # profile names (drafters.sim), so the operator of this fleet tells the
        # controller so, as `controller.decision.drafter` asks of a real one;
        # without it the fleet plan keeps each replica within its own block.
        decision = overrides.setdefault("controller", {}).setdefault("decision", {})
        decision["drafter"] = dict(kind.drafter)
        settings = load_settings(config, **overrides)
    return settings


def run_jobs(fn, jobs: list, workers: int) -> list[Result]:
    """Independent simulations, one process each (results in job order)."""
    if workers <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(fn, jobs))


def table(title: str, rows: list[Result], ref: float) -> None:
    print(f"\n{title}")
    print(f"  {'policy':<30} {'tok/s':>9} {'vs best':>8} {'TPOT p50':>9} {'TPOT p99':>9} {'SLO':>6} {'changes':>8}")
    best = ref
    for r in rows:
        extra = f"  restarts: {[(round(t), n, p) for t, n, p in r.restarts]}" if r.restarts else ""
        print(f"  {r.policy:<30} {r.throughput:9.0f} {r.throughput / best:8.3f} {r.pct(50):9.2f} {r.pct(99):9.2f} "
              f"{r.slo:6.1%} {r.changes:8d}{extra}")


TRACE_PHASES = [  # (concurrency, mix) per phase
    (4, {"code": 0.7, "chat": 0.3}),
    (48, {"code": 0.5, "chat": 0.5}),
    (256, {"chat": 0.6, "creative": 0.4}),
    (16, {"math": 0.5, "creative": 0.5}),
    (128, {"code": 0.8, "chat": 0.2}),
]


def run_sweep(args, settings: Settings, policies: list[str], concurrencies: list[int], measure_s: float,
              warm: float, summary: list[str]) -> None:
    print(f"\n(a) concurrency sweep, closed loop, tenants code:chat = 1:1, {measure_s:.0f} s measured per point "
          f"after {warm:.0f} s warm-up (all policies; the controller's restarts settle)")
    sweep_ok = True
    kind = fleet_of(args)
    # Biggest simulations first, so that the pool's last jobs are short ones.
    jobs = [(p, c, warm, measure_s, args.seed, settings, kind) for c in sorted(concurrencies, reverse=True)
            for p in policies]
    done = {(j[0], j[1]): r for j, r in zip(jobs, run_jobs(_sweep_job, jobs, args.jobs))}
    for c in concurrencies:
        rows = [done[(p, c)] for p in policies]
        statics = [r for r in rows if r.policy in kind.statics]
        best = max(statics, key=lambda r: r.throughput)
        ktab = best_k_table(rows)
        ctrl = next(r for r in rows if r.policy == "controller")
        table(f"c={c}: best static = {best.policy}; tuned K table = {ktab.policy}", rows, ref=best.throughput)
        bound = phase_bound(c, SWEEP_MIX, TENANTS, list(kind.statics), REPLICAS, GPU, MODEL)
        print(f"  upper bound (model) {bound.rate_tok_s:.0f} tok/s ({bound.describe()}); controller/bound "
              f"{ctrl.throughput / bound.rate_tok_s:.3f}; best static sim/model "
              f"{best.throughput / static_price(best.policy, c, SWEEP_MIX, TENANTS, REPLICAS, GPU, MODEL):.3f}")
        ratio = ctrl.throughput / best.throughput
        sweep_ok &= ratio >= 0.98
        summary.append(f"sweep c={c:<4} controller/best-static({best.policy}) = {ratio:.3f}   "
                       f"controller/tuned-K-table({ktab.policy}) = {ctrl.throughput / ktab.throughput:.3f}")
    summary.append(f"TARGET controller >= 0.98x best static at every sweep point: {'MET' if sweep_ok else 'MISSED'}")


def launch_bound(phases: list[Phase], kind: Fleet, truth: dict, ctrl: Result, best: Result) -> dict[str, float]:
    """What the controller's knobs and routing could make of its launch profile under `truth`
    (bench/control_bound.py limited to `kind.controller_start`; {} where the bound cannot
    price the truth), printed per phase: `vs_launch_bound`, the controller's share of it, and
    `launch_bound_vs_best`, it over the best single static's price (both the model's). Why: a
    row below its target with the second near 1 is the controller's to close; with the second
    below the target, no knob policy on that launch profile reaches it without a restart."""
    priced = Truth.of(truth)
    if priced is None:
        return {}
    d = phases[0].duration_s
    rates = [phase_bound(p.concurrency, p.mix, TENANTS, [kind.controller_start], REPLICAS, GPU, MODEL, priced).rate_tok_s
             for p in phases]
    best_price = [static_price(best.policy, p.concurrency, p.mix, TENANTS, REPLICAS, GPU, MODEL, priced) for p in phases]
    total = sum(rates)
    out = {"vs_launch_bound": sum(ctrl.phase_tokens) / d / max(total, 1e-9),
           "launch_bound_vs_best": total / max(sum(best_price), 1e-9)}
    print(f"  {kind.controller_start}'s bound, knobs and placement only (model, this truth), per phase: "
          + " ".join(f"{r:.0f}" for r in rates)
          + "; controller / it: " + " ".join(f"{c / d / max(r, 1e-9):.3f}" for c, r in zip(ctrl.phase_tokens, rates))
          + f" (trace {out['vs_launch_bound']:.3f}); it / {best.policy}'s price {out['launch_bound_vs_best']:.3f}")
    return out


def run_trace(args, settings: Settings, policies: list[str], phases: list[Phase], truth: dict,
              label: str) -> dict[str, float]:
    """One trace run of every policy; prints its tables and returns the headline ratios."""
    d = phases[0].duration_s
    total = float(sum(p.duration_s for p in phases))
    kind = fleet_of(args)
    rows = run_jobs(_trace_job, [(p, phases, args.seed, settings, truth, kind) for p in policies], args.jobs)
    statics = [r for r in rows if r.policy in kind.statics]
    per_phase, picks = best_static_per_phase(statics, len(phases), total)
    best = max(statics, key=lambda r: r.throughput)
    ktab = best_k_table(rows)
    ctrl = next(r for r in rows if r.policy == "controller")
    table(f"phase trace [{label}]: best single static = {best.policy}; tuned K table = {ktab.policy}; "
          f"best static per phase = {[p.policy for p in picks]}", rows + [per_phase], ref=best.throughput)
    out = {
        "vs_best_static": ctrl.throughput / best.throughput,
        "vs_k_table": ctrl.throughput / ktab.throughput,
        "vs_static_per_phase": sum(ctrl.phase_tokens) / max(per_phase.tokens, 1),
    }
    out.update(launch_bound(phases, kind, truth, ctrl, best))
    if truth:
        return out
    print("\n  per phase, tokens/s of finished requests (* = best static of the phase), and the model's upper "
          "bound (bench/control_bound.py: best per-replica profile x per-tenant cap x tenant placement, priced "
          "with the simulator's own truth; steady state, so optimistic -- `static sim/model` is how much):")
    print(f"    {'policy':<28}" + "".join(f"{'phase ' + str(i + 1):>11}" for i in range(len(phases))))
    for r in rows:
        cells = "".join(f"{r.phase_tokens[i] / d:10.0f}{'*' if picks[i] is r else ' '}" for i in range(len(phases)))
        print(f"    {r.policy:<28}{cells}")
    bounds, gaps, placements = [], [], []
    for i, ph in enumerate(phases):
        shared = shared_bound(ph.concurrency, ph.mix, TENANTS, list(kind.statics), REPLICAS, GPU, MODEL)
        apart = apart_bound(ph.concurrency, ph.mix, TENANTS, list(kind.statics), REPLICAS, GPU, MODEL)
        placements.append(None if apart is None else apart.rate_tok_s / shared.rate_tok_s)
        bounds.append(best_of(shared, apart))
        pick = picks[i]
        gaps.append((pick.phase_tokens[i] / d) / static_price(pick.policy, ph.concurrency, ph.mix, TENANTS, REPLICAS,
                                                               GPU, MODEL))
    print(f"    {'upper bound (model)':<28}" + "".join(f"{b.rate_tok_s:10.0f} " for b in bounds))
    print(f"    {'static sim/model':<28}" + "".join(f"{g:10.3f} " for g in gaps))
    # What keeping tenants apart (routing by batch composition, issue 30 item 6) could be worth on
    # this truth: the model's best with one tenant per replica over its best with the mix shared.
    print(f"    {'apart/shared (model)':<28}" + "".join(f"{x:10.3f} " if x is not None else f"{'--':>10} "
                                                       for x in placements))
    for r in (x for x in rows if x.policy in CONTROLLERS):
        print(f"    {r.policy + '/bound':<28}" + "".join(
            f"{r.phase_tokens[i] / d / max(b.rate_tok_s, 1):10.3f} " for i, b in enumerate(bounds)))
    for i, b in enumerate(bounds):
        print(f"    bound phase {i + 1}: {b.describe()}")
    out["vs_bound"] = (sum(ctrl.phase_tokens) / total) / (sum(b.rate_tok_s * p.duration_s for b, p in zip(bounds, phases)) / total)
    out["static_gap"] = float(np.mean(gaps))
    return out


def fleet_of(args: argparse.Namespace) -> Fleet:
    """The fleet kind the invocation compares, with `--controller-start` applied (validated in `main`)."""
    kind = FLEETS[args.fleet]
    return replace(kind, controller_start=args.controller_start) if args.controller_start else kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sweep points and K-table candidates, shorter runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sweep-only", action="store_true")
    ap.add_argument("--trace-only", action="store_true")
    ap.add_argument("--sensitivity", action="store_true",
                    help="also run the trace under each structural perturbation of the simulated truth (the fleet's "
                         "DSPARK_PERTURBATIONS / NGRAM_PERTURBATIONS)")
    ap.add_argument("--truths", type=str, default="",
                    help="with --sensitivity: only the perturbations whose name contains one of these comma-separated "
                         "strings (e.g. 'K=0'); the as-modelled trace always runs")
    ap.add_argument("--fleet", choices=sorted(FLEETS), default="dspark",
                    help="the replicas' speculation: DSpark drafters (default) or vLLM's ngram prompt lookup")
    ap.add_argument("--controller-start", type=str, default=None, metavar="PROFILE",
                    help="the launch profile the controller's fleet starts as (default: the fleet's, dspark-b8-av or "
                         "ngram-k8); naming the K tables' profile (dspark-b8) compares the two policies on one launch")
    ap.add_argument("--points", type=str, default="", help="comma-separated sweep concurrencies (default: all)")
    ap.add_argument("--warm", type=float, default=0.0,
                    help="sweep warm-up seconds for every policy (default 900; --quick 120)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="simulations run in parallel processes (default: one per CPU)")
    ap.add_argument("--config", type=str, default=None,
                    help="specgate YAML whose controller section (decision, restart_gate, gpu/model) the controller "
                         "runs with; SPECGATE_* variables apply as in production")
    ap.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                    help="settings override, highest precedence, e.g. --set controller.restart_gate.min_loss=0.6 "
                         "(repeatable)")
    args = ap.parse_args()
    if args.controller_start and args.controller_start not in FLEETS[args.fleet].statics:
        ap.error(f"--controller-start: {args.controller_start!r} is not one of {', '.join(FLEETS[args.fleet].statics)}")
    kind = fleet_of(args)
    settings = bench_settings(args.config, args.assignments, kind)
    t_start = time.time()
    ktables = list(k_table_candidates(args.quick))
    policies = list(kind.statics) + ktables + list(CONTROLLERS)
    concurrencies = [1, 16, 64, 256] if args.quick else [1, 4, 16, 64, 128, 256]
    if args.points:
        concurrencies = [int(c) for c in args.points.split(",")]
    measure_s = 40.0 if args.quick else 60.0
    # Same measurement window for every policy (the request sample differs
    # between windows); long enough for the controller's restarts to settle.
    # Sweep points are steady states: the controller's restarts are
    # payback-gated, the way back included (a +8 % profile change on a
    # near-idle fleet waits ~10 min, by design, see controller.actuation.PlanGate;
    # measured 2026-12-08: both replicas converted by 678 s at c=1 and 634 s at
    # c=64), so the default warm-up lets them happen; the phase trace (b) is
    # where adaptation speed counts.
    warm = args.warm or (120.0 if args.quick else 900.0)
    print("specgate controller benchmark -- SIMULATION (drafters.sim discrete-event model; H200 + Qwen3-8B roofline)")
    print(f"fleet: {kind.name} ({', '.join(kind.statics)}), {REPLICAS} replicas per policy. controller fleet starts as "
          f"{REPLICAS}x {kind.controller_start}; it acts by "
          f"per-request knobs, the gateway's routing tiers and, for `controller`, the gated restart actuator applying its "
          f"fleet plan ({RESTART_S:.0f} s simulated restart); `controller(knobs-only)` has no actuator.")
    print(f"baselines: every static profile{' with and without adaptive verification' if kind.name == 'dspark' else ''}; "
          f"vLLM's batch-size -> K table on {kind.k_table_profile}, grid-searched over {len(ktables)} candidates "
          f"({', '.join(ktables)}): the best per sweep point and over the trace is the `tuned K table`.")
    gate = settings.controller.restart_gate
    print("controller settings: restart_gate " + ", ".join(f"{k}={v}" for k, v in gate.model_dump().items())
          + "; step cost learned from the replicas' /metrics, prior "
          + (f"{settings.controller.gpu}/{settings.controller.model}" if settings.controller.gpu else "generic (no preset)")
          + f"; tick {settings.controller.tick_s} s")
    summary: list[str] = []

    if not args.trace_only:
        run_sweep(args, settings, policies, concurrencies, measure_s, warm, summary)

    if not args.sweep_only:
        d = 120.0 if args.quick else 240.0
        phases = [Phase(f"phase {i + 1}", d, concurrency=c, mix=mix) for i, (c, mix) in enumerate(TRACE_PHASES)]
        print(f"\n(b) phase-changing multi-tenant trace, closed loop, {len(phases)} phases x {d:.0f} s (no warm-up):")
        for i, p in enumerate(phases):
            print(f"    phase {i + 1}: concurrency {p.concurrency:>3}, mix {p.mix}")
        r = run_trace(args, settings, policies, phases, {}, "as modelled")
        summary.append(f"TARGET trace controller >= 1.05x best single static: "
                       f"{'MET' if r['vs_best_static'] >= 1.05 else 'MISSED'} ({r['vs_best_static']:.3f})")
        summary.append(f"TARGET trace controller >= 1.00x tuned K table: "
                       f"{'MET' if r['vs_k_table'] >= 1.00 else 'MISSED'} ({r['vs_k_table']:.3f})")
        summary.append(f"trace controller/best-static-per-phase (hindsight) = {r['vs_static_per_phase']:.3f}")
        summary.append(f"TARGET trace controller >= 0.90 of the model's upper bound: "
                       f"{'MET' if r['vs_bound'] >= 0.90 else 'MISSED'} ({r['vs_bound']:.3f}; the best static of "
                       f"each phase reaches {r['static_gap']:.3f} of its own model price, the bound's optimism)")
        if args.sensitivity:
            print("\n(c) structural sensitivity: the same trace on a simulated truth the controller's model does not "
                  "share (its online learning on); K tables re-tuned per truth")
            wanted = [w.strip() for w in args.truths.split(",") if w.strip()]
            chosen = {n: t for n, t in kind.perturbations.items() if not wanted or any(w in n for w in wanted)}
            results = {"as modelled": r, **{name: run_trace(args, settings, policies, phases, truth, name)
                                            for name, truth in chosen.items()}}
            print(f"\n  {'truth':<44} {'ctrl/best static':>17} {'ctrl/tuned K':>13} {'ctrl/launch bound':>18} "
                  f"{'launch bound/best static':>25}")
            for name, res in results.items():
                bound_cells = (f"{res['vs_launch_bound']:18.3f} {res['launch_bound_vs_best']:25.3f}"
                               if "vs_launch_bound" in res else f"{'--':>18} {'--':>25}")
                print(f"  {name:<44} {res['vs_best_static']:17.3f} {res['vs_k_table']:13.3f} {bound_cells}")
            worst = min(res["vs_best_static"] for res in results.values())
            summary.append(f"TARGET never below 0.95x best static under any perturbation: "
                           f"{'MET' if worst >= 0.95 else 'MISSED'} (worst {worst:.3f})")

    print("\nSummary (simulated):")
    for line in summary:
        print("  " + line)
    print(f"\n(wall time {time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
