"""Request traces for the simulator: who sends what, when.

Why separate: the same tenants/length distributions feed the open-loop
(Poisson, piecewise-rate) traces the controller is tuned on and the
closed-loop (fixed concurrency) runs that benchmarks like vLLM's
``benchmark_serving --max-concurrency`` report.

Usage::

    from drafters.sim.trace import TenantSpec, poisson_trace, piecewise_poisson_trace, ClosedLoopSource, OpenLoopSource
    tenants = [TenantSpec("math-co", "gsm8k", weight=2), TenantSpec("chat-co", "chat", output_mean=400)]
    trace = piecewise_poisson_trace([(60, 2.0), (60, 20.0)], tenants, seed=1)   # 60 s at 2 rps then 60 s at 20 rps
    source = OpenLoopSource(trace)
    closed = ClosedLoopSource(concurrency=64, tenants=tenants, seed=1)           # next request when one finishes
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TenantSpec:
    """A tenant's traffic: workload preset (drafters.acceptance) and length distributions (lognormal)."""

    name: str
    workload: str = "chat"
    weight: float = 1.0
    prompt_mean: float = 400.0
    output_mean: float = 300.0
    length_cv: float = 0.5
    max_output: int = 4096


@dataclass(frozen=True)
class TraceRequest:
    id: int
    arrival_s: float
    tenant: str
    workload: str
    prompt_tokens: int
    output_tokens: int


def _lognormal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    if cv <= 0:
        return np.full(size, mean)
    sigma2 = np.log(1.0 + cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size)


class RequestSampler:
    """Draws (tenant, prompt, output) for new requests."""

    def __init__(self, tenants: list[TenantSpec], seed: int = 0):
        if not tenants:
            raise ValueError("at least one tenant is required")
        self.tenants = list(tenants)
        w = np.array([t.weight for t in tenants], dtype=float)
        self.p = w / w.sum()
        self.rng = np.random.default_rng(seed)
        self._next_id = 0

    def draw(self, arrival_s: float) -> TraceRequest:
        t = self.tenants[int(self.rng.choice(len(self.tenants), p=self.p))]
        prompt = int(max(1, round(_lognormal(self.rng, t.prompt_mean, t.length_cv, 1)[0])))
        out = int(min(t.max_output, max(2, round(_lognormal(self.rng, t.output_mean, t.length_cv, 1)[0]))))
        self._next_id += 1
        return TraceRequest(self._next_id, arrival_s, t.name, t.workload, prompt, out)


def poisson_trace(rate_rps: float, duration_s: float, tenants: list[TenantSpec], seed: int = 0,
                  start_s: float = 0.0) -> list[TraceRequest]:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``."""
    return piecewise_poisson_trace([(duration_s, rate_rps)], tenants, seed, start_s)


def piecewise_poisson_trace(phases: list[tuple[float, float]], tenants: list[TenantSpec], seed: int = 0,
                            start_s: float = 0.0) -> list[TraceRequest]:
    """Poisson arrivals with a rate that changes by phase: [(duration_s, rate_rps), ...]."""
    sampler = RequestSampler(tenants, seed)
    rng = np.random.default_rng(seed + 7919)
    out: list[TraceRequest] = []
    t0 = start_s
    for duration, rate in phases:
        t = t0
        if rate > 0:
            while True:
                t += float(rng.exponential(1.0 / rate))
                if t >= t0 + duration:
                    break
                out.append(sampler.draw(t))
        t0 += duration
    return out


class OpenLoopSource:
    """Arrivals fixed in advance (a trace)."""

    def __init__(self, trace: list[TraceRequest]):
        self.trace = sorted(trace, key=lambda r: r.arrival_s)

    def initial(self) -> list[TraceRequest]:
        return list(self.trace)

    def on_finish(self, req: TraceRequest, now: float) -> list[TraceRequest]:
        return []


class ClosedLoopSource:
    """``concurrency`` clients, each sending its next request as soon as the previous one finishes."""

    def __init__(self, concurrency: int, tenants: list[TenantSpec], seed: int = 0, ramp_s: float = 0.0,
                 think_s: float = 0.0):
        self.concurrency = concurrency
        self.sampler = RequestSampler(tenants, seed)
        self.ramp_s = ramp_s
        self.think_s = think_s

    def initial(self) -> list[TraceRequest]:
        return [self.sampler.draw(self.ramp_s * i / max(self.concurrency, 1)) for i in range(self.concurrency)]

    def on_finish(self, req: TraceRequest, now: float) -> list[TraceRequest]:
        return [self.sampler.draw(now + self.think_s)]


__all__ = ["TenantSpec", "TraceRequest", "RequestSampler", "poisson_trace", "piecewise_poisson_trace",
           "OpenLoopSource", "ClosedLoopSource"]
