"""Cumulative engine counters and latency histograms, with vLLM's /metrics meaning.

Why a module of its own: the numbers the simulated engine keeps (drafts,
accepted tokens, preemptions, TTFT/ITL/TPOT/e2e histograms) are read by three
different consumers -- the engine that fills them (``engine.py``), the HTTP
replica's Prometheus collector (``metrics.py``) and the discrete-event
simulator's reports (``des.py``) -- and none of them needs the scheduler to
understand them.  A "draft" is one request-step with >= 1 drafted token;
drafted tokens include ones trimmed by adaptive verification (they count as
rejected), exactly as vLLM's spec-decode counters do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract.vllm_metrics import StepCell, StepCellKey

from .. import acceptance as acc

# Histogram buckets (vLLM's, trimmed).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0)
ITER_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class BucketHistogram:
    """Cumulative-bucket histogram (Prometheus semantics) with vectorised observe."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = np.asarray(bounds, dtype=float)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self.sum += float(value)
        self.count += 1

    def observe_many(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        np.add.at(self.counts, np.searchsorted(self.bounds, values, side="left"), 1)
        self.sum += float(np.sum(values))
        self.count += int(len(values))

    def cumulative(self) -> list[tuple[str, float]]:
        """[(le, cumulative count)] including '+Inf'."""
        cum = np.cumsum(self.counts)
        out = [(_fmt(b), float(c)) for b, c in zip(self.bounds, cum[:-1])]
        out.append(("+Inf", float(cum[-1])))
        return out


def _fmt(b: float) -> str:
    return str(float(b))


@dataclass
class EngineCounters:
    """Cumulative counters with vLLM /metrics meaning."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(acc.MAX_POSITIONS, dtype=np.int64))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    request_success: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    busy_s: float = 0.0
    verified_draft_tokens: int = 0
    iteration_tokens: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITER_TOKEN_BUCKETS))
    ttft: BucketHistogram = field(default_factory=lambda: BucketHistogram(TTFT_BUCKETS))
    itl: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITL_BUCKETS))
    tpot: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITL_BUCKETS))
    e2e: BucketHistogram = field(default_factory=lambda: BucketHistogram(E2E_BUCKETS))
    # The specgate extension's engine-timed steps (drafters/vllm_ext/step_timing.py), per
    # (batch, tokens, drafting) cell, counted as the plugin counts them on a real replica.
    step_cells: dict[StepCellKey, StepCell] = field(default_factory=dict)

    def engine_steps(self) -> dict[StepCellKey, StepCell]:
        return dict(self.step_cells)

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts, exactly as vLLM's spec-decode logger computes it."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def snapshot(self) -> dict[str, float]:
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens, "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens, "num_preemptions": self.num_preemptions,
            "steps": self.steps, "busy_s": self.busy_s, "iteration_tokens_sum": self.iteration_tokens.sum,
            "verified_draft_tokens": self.verified_draft_tokens,
        }


__all__ = ["BucketHistogram", "EngineCounters", "TTFT_BUCKETS", "ITL_BUCKETS", "E2E_BUCKETS", "ITER_TOKEN_BUCKETS"]
