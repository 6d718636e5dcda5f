"""Discrete-event simulator: one or more simulated vLLM replicas in virtual time.

Why: controller policies must be compared over hours of traffic and many
load levels; a virtual clock runs that in seconds of CPU, with the same engine
model as the HTTP sim replica (``drafters.sim.engine``).

Events: request arrivals (from a trace or closed-loop clients), engine-step
completions (one in flight per replica; a step's duration comes from the cost
model), and policy ticks every ``tick_s`` simulated seconds.  At arrival the
policy's ``admit`` picks the replica and the per-request knobs (see
``drafters.sim.policy`` for the hook API).

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
from dataclasses import dataclass, field

import numpy as np

from .engine import EngineConfig, EngineRequest, ReplicaEngine
from .policy import BasePolicy, ClusterView, Policy, ReplicaView

_ARRIVAL, _STEP, _TICK = 0, 1, 2
TENANT_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "spec_requests", "num_spec_steps",
                 "num_draft_tokens", "num_accepted_draft_tokens", "ttft_sum_s", "tpot_sum_s", "tpot_count")


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
    tokens_per_step: float


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
    """Virtual-time run of replicas + a request source + a policy (see module docstring)."""

    def __init__(self, replicas: list[EngineConfig], source, policy: Policy | None = None, tick_s: float = 1.0,
                 seed: int = 0):
        if not replicas:
            raise ValueError("at least one replica is required")
        names = [c.name for c in replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be unique: {names}")
        self.engines = {c.name: ReplicaEngine(c, np.random.default_rng(seed + 1000 * i + c.seed))
                        for i, c in enumerate(replicas)}
        self.source = source
        self.policy = policy or BasePolicy()
        self.tick_s = tick_s
        self.tenant_counters: dict[tuple[str, str], dict[str, float]] = {}
        self.view = ClusterView(0.0, {n: ReplicaView(e) for n, e in self.engines.items()}, self.tenant_counters)

    def run(self, until_s: float, warmup_s: float = 0.0) -> SimReport:
        heap: list = []
        seq = 0

        def push(t: float, kind: int, obj) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t, seq, kind, obj))

        for r in self.source.initial():
            push(r.arrival_s, _ARRIVAL, r)
        if self.tick_s > 0:
            push(self.tick_s, _TICK, None)
        busy = {n: False for n in self.engines}
        trace_of: dict[int, object] = {}
        records: list[RequestRecord] = []
        out_tokens = 0
        per_rep: dict[str, int] = {n: 0 for n in self.engines}
        warm_snap: dict[str, dict] | None = None
        tick_prev = {n: (0, 0, 0, 0, 0.0) for n in self.engines}
        timeline: list[TimelinePoint] = []

        def start_step(name: str, now: float) -> None:
            out = self.engines[name].step(now)
            if out.batch == 0:
                busy[name] = False
                return
            busy[name] = True
            push(now + out.duration_s, _STEP, (name, out))

        def snap() -> dict[str, dict]:
            return {n: e.counters.snapshot() for n, e in self.engines.items()}

        if warmup_s <= 0:
            warm_snap = snap()
        while heap:
            t, _, kind, obj = heapq.heappop(heap)
            if t > until_s:
                break
            if warm_snap is None and t >= warmup_s:
                warm_snap = snap()
            self.view.now = t
            if kind == _ARRIVAL:
                adm = self.policy.admit(obj, self.view)
                name = adm.replica if adm.replica in self.engines else self.view.least_loaded()
                er = EngineRequest(str(obj.id), obj.prompt_tokens, obj.output_tokens, obj.workload, obj.tenant,
                                   adm.max_draft, adm.min_confidence, arrival_s=t, max_batch=adm.max_batch)
                trace_of[id(er)] = obj
                self.engines[name].add_request(er, t)
                if not busy[name]:
                    start_step(name, t)
            elif kind == _STEP:
                name, out = obj
                if warmup_s <= t <= until_s:
                    n = sum(k for _, k in out.emissions)
                    out_tokens += n
                    per_rep[name] += n
                for er in out.finished:
                    tr = trace_of.pop(id(er))
                    self._record_tenant(er, name)
                    records.append(RequestRecord(
                        tr.id, er.tenant, er.workload, name, er.arrival_s, er.first_token_s or er.finish_s,
                        er.finish_s, er.prompt_tokens, er.output, er.spec_steps, er.draft_tokens,
                        er.accepted_tokens, er.max_draft, er.min_confidence))
                    for nxt in self.source.on_finish(tr, t):
                        push(nxt.arrival_s, _ARRIVAL, nxt)
                start_step(name, t)
            else:  # tick
                for n, e in self.engines.items():
                    c = e.counters
                    prev = tick_prev[n]
                    cur = (c.generation_tokens, c.num_drafts, c.num_accepted_tokens, c.steps,
                           c.iteration_tokens.sum)
                    dsteps = cur[3] - prev[3]
                    timeline.append(TimelinePoint(
                        t, n, e.num_running, e.num_waiting, (cur[0] - prev[0]) / self.tick_s,
                        1.0 + (cur[2] - prev[2]) / (cur[1] - prev[1]) if cur[1] > prev[1] else None,
                        (cur[4] - prev[4]) / dsteps if dsteps else 0.0))
                    tick_prev[n] = cur
                self.policy.tick(self.view)
                push(t + self.tick_s, _TICK, None)
        if warm_snap is None:
            warm_snap = snap()
        end = snap()
        drafts = sum(end[n]["num_drafts"] - warm_snap[n]["num_drafts"] for n in end)
        accepted = sum(end[n]["num_accepted_tokens"] - warm_snap[n]["num_accepted_tokens"] for n in end)
        dtoks = sum(end[n]["num_draft_tokens"] - warm_snap[n]["num_draft_tokens"] for n in end)
        return SimReport((warmup_s, until_s), records, out_tokens, int(drafts), int(accepted), int(dtoks), timeline,
                         per_rep)

    def _record_tenant(self, er: EngineRequest, replica: str) -> None:
        key = (er.tenant, replica)
        c = self.tenant_counters.get(key)
        if c is None:
            c = self.tenant_counters[key] = {f: 0.0 for f in TENANT_FIELDS}
        c["requests"] += 1
        c["prompt_tokens"] += er.prompt_tokens
        c["completion_tokens"] += er.output
        if er.spec_steps:
            c["spec_requests"] += 1
            c["num_spec_steps"] += er.spec_steps
            c["num_draft_tokens"] += er.draft_tokens
            c["num_accepted_draft_tokens"] += er.accepted_tokens
        if er.first_token_s is not None:
            c["ttft_sum_s"] += er.first_token_s - er.arrival_s
            if er.output > 1:
                c["tpot_sum_s"] += (er.finish_s - er.first_token_s) / (er.output - 1)
                c["tpot_count"] += 1


def run_closed_loop(config: EngineConfig, concurrency: int, tenants, until_s: float = 30.0, warmup_s: float = 5.0,
                    policy: Policy | None = None, seed: int = 0, ramp_s: float = 0.0) -> SimReport:
    """Convenience: one replica, ``concurrency`` closed-loop clients (like benchmark_serving --max-concurrency);
    ``ramp_s`` staggers the clients' first requests."""
    from .trace import ClosedLoopSource

    sim = Simulation([config], ClosedLoopSource(concurrency, list(tenants), seed=seed, ramp_s=ramp_s), policy,
                     seed=seed)
    return sim.run(until_s, warmup_s)


__all__ = ["Simulation", "SimReport", "RequestRecord", "TimelinePoint", "run_closed_loop", "TENANT_FIELDS"]
