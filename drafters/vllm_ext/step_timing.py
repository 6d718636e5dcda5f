"""Engine steps timed where they run, exported on the replica's /metrics.

WHY: the controller prices every speculation choice with a replica's step
time. vLLM 0.32 exports no step duration, so the counter-based learner
(controller/step_cost.py) reads one averaged point per scrape interval: the
interval over the steps in it, at the interval's mean tokens per step. That
mixes steps of every shape and idle gaps, and cannot tell a step of one
request verifying nine tokens from one of nine requests. Timed in the engine
core, each step is known exactly: how many requests it scheduled, how many
forward tokens (drafts and prefill included), how many of them were drafts,
whether the drafter runs after it, and how long it took.

WHAT IS TIMED: on the engine-core Scheduler, up to the end of
`update_from_output()` for a SchedulerOutput -- scheduling, the forward pass,
sampling, rejection sampling and (V1) the drafter's proposal for the next
step, and turning the output into request outputs: the engine's whole step,
on any runner and method -- from the previous step's end where the engine
still had requests then (the period between steps, the engine core's loop
included), else from the step's own `schedule()` (idle time excluded). Under
async scheduling (GPU) the next step is scheduled before this one's output is
processed, and the same rule gives the period between outputs (not verified
on a GPU here).

THE CHANNEL (docs/vllm_ext.md): the engine core keeps cumulative sums per
cell -- scheduled requests and forward tokens each bucketed to the next power
of two, and whether the drafter runs after the step (its draft length K > 0);
the API-server process asks for them with vLLM's own utility call
(`call_utility_async("specgate_ext_step_stats")`, a method this module adds to
EngineCore) every `SPECGATE_STEP_STATS_INTERVAL_S` seconds (default 1; 0
switches it off) and serves the latest answer as counters
(`contract.vllm_metrics.ENGINE_STEP_FAMILIES`):

    specgate_engine_steps_total{batch,tokens,drafting}
    specgate_engine_step_seconds_total{...}
    specgate_engine_step_requests_total{...}
    specgate_engine_step_tokens_total{...}
    specgate_engine_step_draft_tokens_total{...}

Within a cell, sums / steps are exact per-step means, so a scraper's delta
per interval is a set of exact points, idle time excluded; the counters lag
the engine by at most one poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contract.vllm_metrics import StepCell, StepCellKey, add_step, step_cell_key, step_families

logger = logging.getLogger("specgate.vllm_ext")

STEP_STATS_RPC = "specgate_ext_step_stats"
INTERVAL_ENV = "SPECGATE_STEP_STATS_INTERVAL_S"
DEFAULT_INTERVAL_S = 1.0
_T0_ATTR = "_specgate_step_t0"  # on a SchedulerOutput: when its schedule() began
_LAST_END_ATTR = "_specgate_last_step_end"  # on the Scheduler
_BUSY_ATTR = "_specgate_busy_at_last_end"  # on the Scheduler: it still had requests when the last step ended


@dataclass(frozen=True)
class StepShape:
    """What one engine step scheduled."""

    requests: int
    tokens: int
    draft_tokens: int
    drafting: bool  # the drafter runs after this step (its draft length K > 0)

    @property
    def cell(self) -> StepCellKey:
        return step_cell_key(self.requests, self.tokens, self.drafting)


def shape_of(scheduler_output: Any) -> StepShape | None:
    """PURE: a SchedulerOutput's shape; None for a step with nothing to run."""
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
    if not scheduled or tokens <= 0:
        return None
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    drafts = sum(len(v) for v in spec.values())
    k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
    return StepShape(len(scheduled), tokens, drafts, bool(k) if k is not None else drafts > 0)


class StepTable:
    """Cumulative per-cell sums in the engine core; thread-safe (read by the utility call)."""

    def __init__(self) -> None:
        self._cells: dict[StepCellKey, StepCell] = {}
        self._lock = threading.Lock()

    def record(self, shape: StepShape, seconds: float) -> None:
        with self._lock:
            add_step(self._cells, shape.requests, shape.tokens, shape.draft_tokens, shape.drafting, seconds)

    def snapshot(self) -> list[list[float]]:
        """JSON-ready rows [batch, tokens, drafting, steps, seconds, requests, tokens, draft_tokens]
        (the utility call's answer crosses a process boundary)."""
        with self._lock:
            return [[*key, *cell.values()] for key, cell in sorted(self._cells.items())]


def cells_of(rows: list[list[float]]) -> dict[StepCellKey, StepCell]:
    """PURE: `StepTable.snapshot` rows back into cells."""
    return {(int(r[0]), int(r[1]), int(r[2])): StepCell(*(float(v) for v in r[3:8])) for r in rows}


TABLE = StepTable()


def step_began(scheduler_output: Any, t0: float) -> None:
    setattr(scheduler_output, _T0_ATTR, t0)


def step_ended(scheduler: Any, scheduler_output: Any, t1: float) -> None:
    """Record the step: from the previous step's end where the engine had work left then (the
    period between steps, the engine core's loop between them included), else from its own
    schedule() (the engine idled, or this is the first step).

    Why the period: throughput is tokens per wall second, and between two busy steps the engine
    core still turns outputs into messages and takes in new requests; timed from schedule() alone
    a curve learned from the CPU bed's steps predicted steps 9-38 % shorter than its interval /
    steps. Under async scheduling the next step is scheduled before this one's output is processed; the same rule
    then also gives the period between outputs."""
    t0 = getattr(scheduler_output, _T0_ATTR, None)
    last, busy = getattr(scheduler, _LAST_END_ATTR, None), getattr(scheduler, _BUSY_ATTR, False)
    setattr(scheduler, _LAST_END_ATTR, t1)
    has_requests = getattr(scheduler, "has_requests", None)
    setattr(scheduler, _BUSY_ATTR, bool(has_requests()) if callable(has_requests) else False)
    shape = shape_of(scheduler_output)
    if t0 is None or shape is None:
        return
    TABLE.record(shape, t1 - (last if busy else t0))  # busy is only ever set together with last


def install_scheduler(scheduler_cls: type) -> bool:
    """Time each step on vLLM's engine-core Scheduler: `schedule()` begins it,
    `update_from_output()` ends it."""
    from .guard import patch_once, run_guarded

    def wrap_schedule(orig):
        def schedule(self, *args, **kwargs):
            t0 = time.perf_counter()
            scheduler_output = orig(self, *args, **kwargs)
            run_guarded("step timing", None, step_began, scheduler_output, t0)
            return scheduler_output

        return schedule

    def wrap_update(orig):
        def update_from_output(self, scheduler_output, *args, **kwargs):
            result = orig(self, scheduler_output, *args, **kwargs)
            run_guarded("step timing", None, step_ended, self, scheduler_output, time.perf_counter())
            return result

        return update_from_output

    return patch_once(scheduler_cls, "_specgate_step_timing_patched",
                      {"schedule": wrap_schedule, "update_from_output": wrap_update})  # fmt: skip


def install_engine_core(engine_core_cls: type) -> bool:
    """Give vLLM's EngineCore the utility method the API server calls by name."""
    if STEP_STATS_RPC in engine_core_cls.__dict__:
        return False
    setattr(engine_core_cls, STEP_STATS_RPC, lambda self: TABLE.snapshot())
    return True


def interval_s() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


class StepStatsCollector:
    """A prometheus_client collector serving the latest table the engine core sent."""

    def __init__(self) -> None:
        self.rows: list[list[float]] = []

    def describe(self) -> Iterable:
        return []  # unchecked collector: series appear once the first answer arrives

    def collect(self) -> Iterable:
        return step_families(cells_of(self.rows))


COLLECTOR = StepStatsCollector()
_registered = False


async def poll(engine: Any, every_s: float) -> None:
    """Ask the engine core for its table every `every_s` seconds, for the engine client's life."""
    warned = False
    while True:
        await asyncio.sleep(every_s)
        try:
            rows = await asyncio.wait_for(engine.engine_core.call_utility_async(STEP_STATS_RPC), 30.0)
            COLLECTOR.rows = rows if isinstance(rows, list) else []
            warned = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine shutting down or busy: try again next time
            if not warned:
                logger.warning("specgate: the engine core did not send its step timings (%s); retrying", exc)
                warned = True
            if getattr(engine, "errored", False):
                return


def start_polling(engine: Any, registry: Any = None) -> asyncio.Task | None:
    """Register the collector (once per process) and start the poll on the running loop."""
    global _registered
    every = interval_s()
    if every <= 0:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    if not _registered:
        from prometheus_client import REGISTRY

        (registry or REGISTRY).register(COLLECTOR)
        _registered = True
    return loop.create_task(poll(engine, every))
