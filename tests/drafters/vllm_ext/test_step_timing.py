"""The step-timing table and its exposition (drafters/vllm_ext/step_timing.py), without vLLM:
shapes of SchedulerOutput-like objects, cells, the worker wrapper's timing hooks, and the
counters read back by the snapshot parser the gateway and controller use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from contract.vllm_metrics import StepCell, parse_vllm_metrics, power_of_two_bound
from drafters.vllm_ext import step_timing
from drafters.vllm_ext.step_timing import StepShape, StepStatsCollector, StepTable, shape_of


def output(tokens: dict[str, int], spec: dict[str, list[int]] | None = None, k: int | None = 4):
    out = SimpleNamespace(num_scheduled_tokens=tokens, total_num_scheduled_tokens=sum(tokens.values()),
                          scheduled_spec_decode_tokens=spec or {})  # fmt: skip
    if k is not None:
        out.num_spec_tokens_to_schedule = k
    return out


@pytest.mark.parametrize("n,expected", [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024)])
def test_a_cell_bound_is_the_next_power_of_two(n, expected):
    assert power_of_two_bound(n) == expected


def test_a_step_shape_counts_requests_forward_tokens_and_verified_drafts():
    shape = shape_of(output({"a": 5, "b": 1, "c": 40}, {"a": [7, 8, 9, 10]}, k=4))
    assert shape == StepShape(requests=3, tokens=46, draft_tokens=4, drafting=True)
    assert shape.cell == (4, 64, 1)
    assert shape_of(output({"a": 1}, k=0)).drafting is False  # every request capped at 0: K=0
    assert shape_of(output({"a": 3}, {"a": [1, 2]}, k=None)).drafting is True  # no K field: drafts say it
    assert shape_of(output({}, k=4)) is None  # an empty step is not a step


def test_the_table_sums_per_cell():
    table = StepTable()
    table.record(StepShape(3, 12, 8, True), 0.010)
    table.record(StepShape(4, 16, 12, True), 0.014)
    table.record(StepShape(1, 1, 0, False), 0.002)
    rows = table.snapshot()
    assert rows == [[1, 1, 0, 1.0, 0.002, 1.0, 1.0, 0.0], [4, 16, 1, 2.0, pytest.approx(0.024), 7.0, 28.0, 20.0]]


def test_the_scheduler_times_each_step_from_schedule_to_update(monkeypatch):
    # The wrappers read the step_timing module's clock; the test owns it, so the
    # sums are exact on any machine (real sleeps overslept by seconds under load).
    now = [1000.0]

    def advance(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(step_timing, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    class Scheduler:  # vLLM's engine-core Scheduler, reduced to the calls a step makes
        requests = False

        def has_requests(self):
            return self.requests

        def schedule(self):
            advance(0.005)
            return output({"a": 2, "b": 2}, {"a": [1], "b": [2]}, k=1)

        def update_from_output(self, scheduler_output, model_output):
            advance(0.005)
            return {}

    class EngineCore:
        pass

    before = {tuple(r[:3]): r for r in step_timing.TABLE.snapshot()}
    assert step_timing.install_scheduler(Scheduler)
    assert not step_timing.install_scheduler(Scheduler)  # idempotent
    assert step_timing.install_engine_core(EngineCore) and not step_timing.install_engine_core(EngineCore)
    sched = Scheduler()
    out = sched.schedule()
    advance(0.02)  # the forward pass
    sched.update_from_output(out, None)  # 30 ms; no request left: the engine idles
    advance(0.3)  # idle: not counted
    sched.requests = True
    sched.update_from_output(sched.schedule(), None)  # 10 ms from its own schedule(); requests left
    advance(0.01)  # the engine core's loop between two busy steps: counted
    sched.update_from_output(sched.schedule(), None)  # 20 ms from the previous end
    # Async scheduling: the next step is scheduled before this one's output is processed; it is
    # timed from the previous step's end (the period), not from its own schedule().
    first, second = sched.schedule(), sched.schedule()
    sched.update_from_output(first, None)  # 15 ms from the previous end
    advance(0.02)
    sched.update_from_output(second, None)  # 25 ms from first's end
    after = {tuple(r[:3]): r for r in step_timing.TABLE.snapshot()}
    old = before.get((2, 4, 1), [2, 4, 1, 0.0, 0.0, 0.0, 0.0, 0.0])
    row = after[(2, 4, 1)]
    assert row[3] - old[3] == 5
    assert row[4] - old[4] == pytest.approx(0.030 + 0.010 + 0.020 + 0.015 + 0.025)  # the 300 ms idle left out
    assert (row[5] - old[5], row[6] - old[6], row[7] - old[7]) == (10, 20, 10)
    assert getattr(EngineCore(), step_timing.STEP_STATS_RPC)() == step_timing.TABLE.snapshot()


def test_the_exposition_reads_back_as_cells():
    table = StepTable()
    table.record(StepShape(3, 12, 8, True), 0.010)
    table.record(StepShape(8, 8, 0, False), 0.006)
    collector = StepStatsCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    assert parse_vllm_metrics(generate_latest(registry).decode()).engine_steps == {}  # nothing polled yet
    collector.rows = table.snapshot()
    snap = parse_vllm_metrics(generate_latest(registry).decode())
    assert snap.engine_steps == {
        (4, 16, 1): StepCell(steps=1, seconds=0.010, requests=3, tokens=12, draft_tokens=8),
        (8, 8, 0): StepCell(steps=1, seconds=0.006, requests=8, tokens=8, draft_tokens=0),
    }
