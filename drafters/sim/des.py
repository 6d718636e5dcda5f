"""Discrete-event simulator: one or more simulated vLLM replicas in virtual time.

Why: controller policies must be compared over hours of traffic and many
load levels; a virtual clock runs that in seconds of CPU, with the same engine
model as the HTTP sim replica (``drafters.sim.engine``).

Events: request arrivals (from a trace or closed-loop clients), engine-step
completions (one in flight per replica; a step's duration comes from the cost
model), policy ticks every ``tick_s`` simulated seconds, and replicas coming
back from a restart.  At arrival the policy's ``admit`` picks the replica and
the per-request knobs (see ``drafters.sim.policy`` for the hook API), which
``Simulation.submit`` hands to the engine as ``vllm_xargs``.  Policies and
benchmarks observe and act through ``Simulation``'s public interface
(``replica_views``, ``snapshot``, ``submit``, ``restart_replica``), and
``tenant_counters`` are the gateway's telemetry (``contract.telemetry``).

Usage::

    from drafters.sim import EngineConfig, Simulation, ClosedLoopSource, TenantSpec, StaticPolicy
    sim = Simulation(
        replicas=[EngineConfig(name="spec-0", gpu="h200", model="qwen3-8b", profile="dspark-b8-av")],
        source=ClosedLoopSource(concurrency=16, tenants=[TenantSpec("t1", "gsm8k")], seed=1),
        policy=StaticPolicy(),            # or your controller adapter
    )
    report = sim.run(until_s=30.0, warmup_s=5.0)
    print(report.throughput_tok_s, report.tpot_ms(50), report.acceptance_length)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from contract.knobs import RequestKnobs, parse_knobs
from contract.telemetry import COUNTER_FIELDS, RequestSpecStats, add_increments
from contract.vllm_metrics import VllmMetricsSnapshot

from .engine import EngineConfig, EngineRequest, ReplicaEngine
from .engine_types import simulated_profile
from .policy import BasePolicy, ClusterView, Policy, ReplicaView

_ARRIVAL, _STEP, _TICK, _READY = 0, 1, 2, 3


@dataclass(frozen=True)
class RequestRecord:
    id: int
    tenant: str
    workload: str
    replica: str
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    spec_steps: int
    draft_tokens: int
    accepted_tokens: int
    max_draft: int | None
    min_confidence: float | None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class TimelinePoint:
    t: float
    replica: str
    running: int
    waiting: int
    tok_s: float  # output tokens/s over the last tick
    acceptance_length: float | None  # over the last tick
    tokens_per_step: float  # vLLM's iteration tokens per step (computed prompt + emitted) over the last tick


@dataclass
class SimReport:
    window_s: tuple[float, float]
    records: list[RequestRecord]
    output_tokens: int  # emitted inside the window
    drafts: int
    accepted: int
    draft_tokens: int
    timeline: list[TimelinePoint] = field(default_factory=list)
    per_replica_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.window_s[1] - self.window_s[0]

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def completed(self) -> list[RequestRecord]:
        """Requests whose first token and finish both fall inside the measurement window."""
        lo, hi = self.window_s
        return [r for r in self.records if r.first_token_s >= lo and r.finish_s <= hi]

    def _pct(self, values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")

    def tpot_ms(self, q: float = 50, tenant: str | None = None) -> float:
        vals = [r.tpot_s for r in self.completed if r.tpot_s is not None and (tenant is None or r.tenant == tenant)]
        return 1e3 * self._pct(vals, q)

    def mean_tpot_ms(self, tenant: str | None = None) -> float:
        vals = [r.tpot_s for r in self.completed if r.tpot_s is not None and (tenant is None or r.tenant == tenant)]
        return 1e3 * float(np.mean(vals)) if vals else float("nan")

    def ttft_ms(self, q: float = 50, tenant: str | None = None) -> float:
        vals = [r.ttft_s for r in self.completed if tenant is None or r.tenant == tenant]
        return 1e3 * self._pct(vals, q)

    def tenant_throughput_tok_s(self, tenant: str) -> float:
        toks = sum(r.output_tokens for r in self.completed if r.tenant == tenant)
        return toks / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, float | None]:
        return {
            "throughput_tok_s": round(self.throughput_tok_s, 1),
            "tpot_p50_ms": round(self.tpot_ms(50), 2), "tpot_p90_ms": round(self.tpot_ms(90), 2),
            "ttft_p50_ms": round(self.ttft_ms(50), 1), "ttft_p99_ms": round(self.ttft_ms(99), 1),
            "acceptance_length": None if self.acceptance_length is None else round(self.acceptance_length, 3),
            "completed": len(self.completed),
        }


class Simulation:
    """Virtual-time run of replicas + a request source + a policy (see module docstring).

    Public interface (what policies and benchmarks use; nothing writes into
    ``engines``): ``replica_views()`` / ``snapshot(name)`` to observe,
    ``submit(request, replica, vllm_xargs)`` to hand a request to a replica
    (knobs parsed leniently, as the engine side does), and
    ``restart_replica(name, profile, downtime_s)`` to restart one with another
    launch profile. ``tenant_counters`` are the gateway's telemetry counters.
    """

    def __init__(self, replicas: list[EngineConfig], source, policy: Policy | None = None, tick_s: float = 1.0,
                 seed: int = 0):
        if not replicas:
            raise ValueError("at least one replica is required")
        names = [c.name for c in replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be unique: {names}")
        self.seed = seed
        self._index = {c.name: i for i, c in enumerate(replicas)}
        self.engines = {c.name: ReplicaEngine(c, self._rng(c, 0)) for c in replicas}
        self.source = source
        self.policy = policy or BasePolicy()
        self.tick_s = tick_s
        self.tenant_counters: dict[tuple[str, str], dict[str, float]] = {}
        self.view = ClusterView(0.0, {n: ReplicaView(e) for n, e in self.engines.items()}, self.tenant_counters)
        self.restarts: list[tuple[float, str, str]] = []  # (time, replica, profile) of every restart_replica()
        self._draining: dict[str, tuple[str, float]] = {}  # replica -> (profile, downtime_s) once drained
        self._retired: dict[str, dict[str, float]] = {n: {} for n in names}  # counters of engines replaced by restarts
        self._held: dict[str, list[tuple[object, dict | None]]] = {}  # requests waiting for a replica to come up
        self._ready_at: dict[str, float] = {}  # down replica -> when it is ready again
        self._heap: list = []
        self._seq = 0
        self._busy = {n: False for n in names}
        self._trace_of: dict[int, object] = {}
        attach = getattr(self.policy, "attach", None)
        if attach is not None:
            attach(self)

    # -- public interface ---------------------------------------------
    @property
    def now(self) -> float:
        return self.view.now

    def replica_views(self) -> dict[str, ReplicaView]:
        """name -> live read-only view (the same objects as ``view.replicas``)."""
        return self.view.replicas

    def snapshot(self, name: str) -> VllmMetricsSnapshot | None:
        """Replica ``name``'s /metrics as a controller would parse it; None while it is down."""
        return self.view.replicas[name].snapshot()

    def restarting(self) -> set[str]:
        """Replicas draining for a restart or down."""
        return {n for n, v in self.view.replicas.items() if not v.available}

    def restart_replica(self, name: str, profile: str, downtime_s: float) -> None:
        """Restart ``name`` with launch profile ``profile``: it takes no new requests
        (draining), and once its requests have finished it is down for ``downtime_s``
        (vLLM start-up) with a fresh engine -- counters from zero, as a restarted
        vLLM's -- then ready again."""
        if name not in self.engines:
            raise KeyError(name)
        if not self.view.replicas[name].available:
            raise ValueError(f"replica {name} is already restarting")
        simulated_profile(profile)  # reject an unknown or unsimulated label now, not at the swap
        self.restarts.append((self.now, name, profile))
        self._draining[name] = (profile, max(0.0, downtime_s))
        self.view.replicas[name].status = "draining"
        if not self.engines[name].has_work() and not self._busy[name]:
            self._swap(name, self.now)

    def submit(self, request, replica: str | None = None, vllm_xargs: dict | None = None) -> str:
        """Hand ``request`` (a ``TraceRequest``) to ``replica`` now, with ``vllm_xargs`` as the
        replica receives them (parsed by ``contract.knobs.parse_knobs``: invalid values are
        ignored). A replica that is missing or unavailable is replaced by the least loaded
        available one; with none available the request waits for the first to come up.
        Returns the replica's name."""
        views = self.view.replicas
        if replica not in views or not views[replica].available:
            ready = [n for n, v in views.items() if v.available]
            if not ready:
                first = min((n for n in views if n not in self._draining),
                            key=lambda n: self._ready_at.get(n, float("inf")), default=None)
                target = first or next(iter(views))
                self._held.setdefault(target, []).append((request, vllm_xargs))
                return target
            replica = self.view.least_loaded(ready)
        self._enqueue(request, replica, vllm_xargs)
        return replica

    # -- internals ------------------------------------------------------
    def _rng(self, cfg: EngineConfig, restarts: int) -> np.random.Generator:
        return np.random.default_rng(self.seed + 1000 * self._index[cfg.name] + cfg.seed + 7919 * restarts)

    def _push(self, t: float, kind: int, obj) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj))

    def _enqueue(self, request, replica: str, vllm_xargs: dict | None) -> None:
        knobs = parse_knobs(vllm_xargs)
        now = self.now
        er = EngineRequest(str(request.id), request.prompt_tokens, request.output_tokens, request.workload,
                           request.tenant, knobs.max_draft, knobs.min_confidence,
                           arrival_s=getattr(request, "arrival_s", now), max_batch=knobs.max_batch,
                           schedule=knobs.schedule)
        self._trace_of[id(er)] = request
        self.engines[replica].add_request(er, now)
        if not self._busy[replica]:
            self._start_step(replica, now)

    def _start_step(self, name: str, now: float) -> None:
        out = self.engines[name].step(now)
        if out.batch == 0:
            self._busy[name] = False
            return
        self._busy[name] = True
        self._push(now + out.duration_s, _STEP, (name, out))

    def _swap(self, name: str, now: float) -> None:
        """A drained replica goes down and comes back with its new profile."""
        profile, downtime = self._draining.pop(name)
        old = self.engines[name]
        retired = self._retired[name]
        for k, v in old.counters.snapshot().items():
            retired[k] = retired.get(k, 0.0) + v
        cfg = replace(old.config, profile=profile)
        eng = self.engines[name] = ReplicaEngine(cfg, self._rng(cfg, sum(1 for _, n, _ in self.restarts if n == name)))
        self.view.replicas[name] = ReplicaView(eng, status="down")
        self._ready_at[name] = now + downtime
        self._push(now + downtime, _READY, name)

    def _totals(self, name: str) -> dict[str, float]:
        """Cumulative counters of the replica across restarts (retired engines + the live one)."""
        live = self.engines[name].counters.snapshot()
        retired = self._retired[name]
        return {k: v + retired.get(k, 0.0) for k, v in live.items()}

    def run(self, until_s: float, warmup_s: float = 0.0) -> SimReport:
        for r in self.source.initial():
            self._push(r.arrival_s, _ARRIVAL, r)
        if self.tick_s > 0:
            self._push(self.tick_s, _TICK, None)
        records: list[RequestRecord] = []
        out_tokens = 0
        per_rep: dict[str, int] = {n: 0 for n in self.engines}
        warm_snap: dict[str, dict] | None = None
        tick_prev = {n: (0, 0, 0, 0, 0.0) for n in self.engines}
        timeline: list[TimelinePoint] = []

        def snap() -> dict[str, dict]:
            return {n: self._totals(n) for n in self.engines}

        if warmup_s <= 0:
            warm_snap = snap()
        heap = self._heap
        while heap:
            t, _, kind, obj = heapq.heappop(heap)
            if t > until_s:
                break
            if warm_snap is None and t >= warmup_s:
                warm_snap = snap()
            self.view.now = t
            if kind == _ARRIVAL:
                adm = self.policy.admit(obj, self.view)
                self.submit(obj, adm.replica, adm.xargs())
            elif kind == _STEP:
                name, out = obj
                if warmup_s <= t <= until_s:
                    n = sum(k for _, k in out.emissions)
                    out_tokens += n
                    per_rep[name] += n
                eng = self.engines[name]
                for er in out.finished:
                    tr = self._trace_of.pop(id(er))
                    self._record_tenant(er, name, eng.profile.speculative, eng.profile.block_size)
                    records.append(RequestRecord(
                        tr.id, er.tenant, er.workload, name, er.arrival_s, er.first_token_s or er.finish_s,
                        er.finish_s, er.prompt_tokens, er.output, er.spec_steps, er.draft_tokens,
                        er.accepted_tokens, er.max_draft, er.min_confidence))
                    for nxt in self.source.on_finish(tr, t):
                        self._push(nxt.arrival_s, _ARRIVAL, nxt)
                if name in self._draining and not eng.has_work():
                    self._busy[name] = False
                    self._swap(name, t)
                else:
                    self._start_step(name, t)
            elif kind == _READY:
                self.view.replicas[obj].status = "ready"
                self._ready_at.pop(obj, None)
                for req, xargs in self._held.pop(obj, []):
                    self._enqueue(req, obj, xargs)
            else:  # tick
                for n in self.engines:
                    c = self._totals(n)
                    e = self.engines[n]
                    prev = tick_prev[n]
                    cur = (c["generation_tokens"], c["num_drafts"], c["num_accepted_tokens"], c["steps"],
                           c["iteration_tokens_sum"])
                    dsteps = cur[3] - prev[3]
                    timeline.append(TimelinePoint(
                        t, n, e.num_running, e.num_waiting, (cur[0] - prev[0]) / self.tick_s,
                        1.0 + (cur[2] - prev[2]) / (cur[1] - prev[1]) if cur[1] > prev[1] else None,
                        (cur[4] - prev[4]) / dsteps if dsteps else 0.0))
                    tick_prev[n] = cur
                self.policy.tick(self.view)
                self._push(t + self.tick_s, _TICK, None)
        if warm_snap is None:
            warm_snap = snap()
        end = snap()
        drafts = sum(end[n]["num_drafts"] - warm_snap[n]["num_drafts"] for n in end)
        accepted = sum(end[n]["num_accepted_tokens"] - warm_snap[n]["num_accepted_tokens"] for n in end)
        dtoks = sum(end[n]["num_draft_tokens"] - warm_snap[n]["num_draft_tokens"] for n in end)
        return SimReport((warmup_s, until_s), records, out_tokens, int(drafts), int(accepted), int(dtoks), timeline,
                         per_rep)

    def _record_tenant(self, er: EngineRequest, replica: str, speculative: bool, block: int) -> None:
        """The gateway's telemetry for one finished request: ``increments_for`` of what the
        response reported (``metrics.speculative_decoding`` only from speculative replicas)
        and the draft allowance the gateway knows from the knobs it sent (the engine honours them)."""
        cap = RequestKnobs(max_draft=er.max_draft, max_batch=er.max_batch, schedule=er.schedule).largest_cap()
        stats = RequestSpecStats(
            prompt_tokens=er.prompt_tokens, completion_tokens=er.output,
            num_spec_steps=er.spec_steps if speculative else None,
            num_draft_tokens=er.draft_tokens if speculative else None,
            num_accepted_draft_tokens=er.accepted_tokens if speculative else None,
            draft_allowance=(block if cap is None else min(block, cap)) if speculative else None,
            acceptance_histogram=tuple(er.accepted_hist) if speculative and er.accepted_hist else None,
        )
        c = self.tenant_counters.get((er.tenant, replica))
        if c is None:
            c = self.tenant_counters[(er.tenant, replica)] = {f: 0.0 for f in COUNTER_FIELDS}
        add_increments(c, stats)


def run_closed_loop(config: EngineConfig, concurrency: int, tenants, until_s: float = 30.0, warmup_s: float = 5.0,
                    policy: Policy | None = None, seed: int = 0, ramp_s: float = 0.0) -> SimReport:
    """Convenience: one replica, ``concurrency`` closed-loop clients (like benchmark_serving --max-concurrency);
    ``ramp_s`` staggers the clients' first requests."""
    from .trace import ClosedLoopSource

    sim = Simulation([config], ClosedLoopSource(concurrency, list(tenants), seed=seed, ramp_s=ramp_s), policy,
                     seed=seed)
    return sim.run(until_s, warmup_s)


__all__ = ["Simulation", "SimReport", "RequestRecord", "TimelinePoint", "run_closed_loop"]
