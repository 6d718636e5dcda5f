"""Signals: turn cumulative counters (vLLM `/metrics`, the gateway's
per-tenant telemetry) into per-interval deltas.

Why deltas and why this care: every rate the controller uses (acceptance,
tokens per step, step rate) is a ratio of counter increments over one tick.
Counters go backwards when a replica restarts (or a Redis key is flushed);
treating that as a huge negative delta would poison the estimators for
minutes, so a decrease is read as "the counter restarted from zero" and the
new value itself is taken as the increment (Prometheus' `rate()` does the
same). A replica that fails a scrape yields no sample for that tick instead
of zeros, so a flaky scrape never looks like an idle replica.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from contract.telemetry import COUNTER_FIELDS, TelemetryCounters
from contract.vllm_metrics import StepCell, StepCellKey, VllmMetricsSnapshot, fetch_metrics


def counter_delta(previous: float | None, current: float | None) -> float:
    """Increment of a monotonic counter, safe across resets (decrease => restart)."""
    if current is None:
        return 0.0
    if previous is None:
        return 0.0  # first sight: no interval yet
    if current < previous:
        return current  # counter restarted from zero since the last scrape
    return current - previous


@dataclass(frozen=True)
class ReplicaSample:
    """One replica over one interval (between two successful scrapes)."""

    name: str
    dt_s: float
    running: float
    waiting: float
    kv_usage: float
    running_at_start: float | None = None  # the gauge at the interval's first scrape (None: unknown)
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    iteration_tokens: float = 0.0  # tokens processed by engine steps in the interval
    iterations: float = 0.0  # engine steps in the interval
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    prompt_tokens_computed: float | None = None  # None: the replica does not export the split
    gpu_util: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    supports_knobs: bool = False
    engine_fixes: frozenset[str] | None = None  # vLLM fixes in force on the replica (specgate_ext_info); None: not reported
    # Engine steps the extension timed in the interval, per (batch, tokens, drafting) cell
    # (contract.vllm_metrics.StepCell); empty where the replica does not export them.
    engine_steps: dict[StepCellKey, StepCell] = field(default_factory=dict)
    restarted: bool = False

    @property
    def busy_throughout(self) -> bool:
        """Requests ran at both ends of the interval: the best a scrape can
        tell that the engine never idled in it, so that interval / steps is a
        step time. An interval that starts idle (a load step arriving) or ends
        idle (the last requests finishing) holds idle time and would price a
        step at up to the whole interval."""
        start = self.running if self.running_at_start is None else self.running_at_start
        return start >= 1 and self.running >= 1

    @property
    def forward_tokens(self) -> float:
        """Tokens the engine's forward passes processed in the interval: one
        per request-step (generated minus accepted drafts), every verified
        draft (accepted or rejected) and the prompt tokens it computed.
        vLLM's `iteration_tokens` counts emitted tokens and so misses the
        rejected drafts (35-37% of the work with ngram k=8 on the CPU bed)."""
        return max(0.0, self.generation_tokens - self.accepted_tokens) + self.draft_tokens + self.prefill_tokens

    @property
    def prefill_tokens(self) -> float:
        """Prompt tokens the engine computed (not served from the prefix cache) in the interval."""
        return self.prompt_tokens if self.prompt_tokens_computed is None else self.prompt_tokens_computed


def step_deltas(old: dict[StepCellKey, StepCell], new: dict[StepCellKey, StepCell]) -> dict[StepCellKey, StepCell]:
    """PURE: per-cell increments of the extension's step counters; a cell whose step count fell
    restarted with the engine (its new sums are the increments), a cell without a step is dropped."""
    out: dict[StepCellKey, StepCell] = {}
    for key, cell in new.items():
        before = old.get(key)
        delta = cell if before is None or cell.steps < before.steps else cell.minus(before)
        if delta.steps > 0:
            out[key] = delta
    return out


class ReplicaDeltaTracker:
    """Keeps the previous snapshot of every replica and produces interval samples."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, VllmMetricsSnapshot]] = {}

    def forget(self, name: str) -> None:
        self._last.pop(name, None)

    def update(self, name: str, at: float, snap: VllmMetricsSnapshot) -> ReplicaSample | None:
        prev = self._last.get(name)
        self._last[name] = (at, snap)
        if prev is None:
            return None
        t0, old = prev
        dt = at - t0
        if dt <= 0:
            return None
        restarted = any(
            new is not None and old_v is not None and new < old_v
            for old_v, new in (
                (old.spec_num_drafts, snap.spec_num_drafts),
                (old.iteration_tokens_count, snap.iteration_tokens_count),
                (old.generation_tokens, snap.generation_tokens),
            )
        )
        if restarted:
            # Every counter restarted together: the new values are the increments.
            base = VllmMetricsSnapshot()
            old = base
        per_pos = {
            pos: counter_delta(old.spec_accepted_per_pos.get(pos, 0.0 if restarted else None), value)
            for pos, value in snap.spec_accepted_per_pos.items()
        }
        return ReplicaSample(
            name=name,
            dt_s=dt,
            running=snap.num_requests_running,
            waiting=snap.num_requests_waiting,
            kv_usage=snap.kv_cache_usage_perc,
            running_at_start=None if restarted else old.num_requests_running,
            drafts=counter_delta(old.spec_num_drafts if not restarted else 0.0, snap.spec_num_drafts),
            draft_tokens=counter_delta(old.spec_num_draft_tokens if not restarted else 0.0, snap.spec_num_draft_tokens),
            accepted_tokens=counter_delta(
                old.spec_num_accepted_tokens if not restarted else 0.0, snap.spec_num_accepted_tokens
            ),
            accepted_per_pos=per_pos,
            iteration_tokens=counter_delta(
                old.iteration_tokens_sum if not restarted else 0.0, snap.iteration_tokens_sum
            ),
            iterations=counter_delta(old.iteration_tokens_count if not restarted else 0.0, snap.iteration_tokens_count),
            generation_tokens=counter_delta(old.generation_tokens if not restarted else 0.0, snap.generation_tokens),
            prompt_tokens=counter_delta(old.prompt_tokens if not restarted else 0.0, snap.prompt_tokens),
            prompt_tokens_computed=(
                None if snap.prompt_tokens_computed is None
                else counter_delta(old.prompt_tokens_computed if not restarted else 0.0, snap.prompt_tokens_computed)
            ),
            gpu_util=snap.gpu_util,
            sm_active=snap.sm_active,
            tensor_active=snap.tensor_active,
            dram_active=snap.dram_active,
            supports_knobs=snap.supports_knobs,
            engine_fixes=snap.ext_engine_fixes,
            engine_steps=step_deltas(old.engine_steps, snap.engine_steps),
            restarted=restarted,
        )


@dataclass(frozen=True)
class TenantSample:
    """One (tenant, replica) pair's telemetry increments over one interval."""

    tenant: str
    replica: str
    deltas: dict[str, float]

    def get(self, name: str) -> float:
        return self.deltas.get(name, 0.0)


class TelemetryDeltaTracker:
    """Differentiates the gateway's per-(tenant, replica) counters.

    The first read is the baseline: what the counters hold then is history
    from before this controller (or before it led). A series that appears
    after it is new since the previous read and counts whole: taking it as a
    baseline too lost every tenant's first flush on every replica, all of
    the evidence of a tenant that sends a few requests."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], dict[str, float]] = {}
        self._primed = False

    def update(self, counters: list[TelemetryCounters]) -> list[TenantSample]:
        out: list[TenantSample] = []
        primed, self._primed = self._primed, True
        for c in counters:
            key = (c.tenant, c.replica)
            prev = self._last.get(key)
            self._last[key] = dict(c.values)
            if prev is None:
                if not primed:
                    continue
                prev = {}
            reset = any(c.get(f) < prev.get(f, 0.0) for f in COUNTER_FIELDS)
            deltas = {
                f: (c.get(f) if reset else counter_delta(prev.get(f, 0.0), c.get(f))) for f in COUNTER_FIELDS
            }
            if any(deltas.values()):
                out.append(TenantSample(c.tenant, c.replica, deltas))
        return out


async def scrape_all(
    client: httpx.AsyncClient, replicas: dict[str, str], timeout_s: float = 2.0
) -> dict[str, tuple[float, VllmMetricsSnapshot | None]]:
    """Scrape every replica concurrently; {name: (monotonic time, snapshot | None)}."""
    names = list(replicas)
    snaps = await asyncio.gather(*(fetch_metrics(client, replicas[n], timeout_s) for n in names))
    now = time.monotonic()
    return {n: (now, s) for n, s in zip(names, snaps)}


def merge_gpu_gauges(snap: VllmMetricsSnapshot, dcgm: VllmMetricsSnapshot | None) -> VllmMetricsSnapshot:
    """Overlay gauges from a separate dcgm-exporter endpoint onto a replica snapshot."""
    if dcgm is None:
        return snap
    for attr in ("gpu_util", "sm_active", "tensor_active", "dram_active"):
        value = getattr(dcgm, attr)
        if value is not None:
            setattr(snap, attr, value)
    return snap
