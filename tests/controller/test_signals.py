"""Signals: counter deltas safe across resets/restarts, real scrapes of a sim
replica's /metrics, and the gateway telemetry counters in real Redis."""

from __future__ import annotations

import httpx
import pytest

from contract.vllm_metrics import fetch_metrics as scrape_metrics
from controller.signals import ReplicaDeltaTracker, TelemetryDeltaTracker, counter_delta
from contract.telemetry import RequestSpecStats, read_all, record_request
from contract.vllm_metrics import VllmMetricsSnapshot

from .servers import sim_replica


@pytest.mark.parametrize(
    "prev,cur,expected",
    [(None, 5.0, 0.0), (5.0, 9.0, 4.0), (9.0, 3.0, 3.0), (3.0, None, 0.0), (4.0, 4.0, 0.0)],
)
def test_counter_delta(prev, cur, expected):
    assert counter_delta(prev, cur) == expected


def snap(drafts, accepted, steps, tokens, running=4.0):
    return VllmMetricsSnapshot(
        num_requests_running=running, spec_num_drafts=drafts, spec_num_draft_tokens=drafts * 4,
        spec_num_accepted_tokens=accepted, spec_accepted_per_pos={0: accepted * 0.6, 1: accepted * 0.4},
        iteration_tokens_sum=tokens, iteration_tokens_count=steps, generation_tokens=tokens,
    )


def test_replica_deltas_survive_a_restart():
    tr = ReplicaDeltaTracker()
    assert tr.update("r", 0.0, snap(100, 200, 50, 500)) is None  # first sight: no interval
    s = tr.update("r", 1.0, snap(150, 300, 70, 700))
    assert (s.drafts, s.accepted_tokens, s.iterations, s.iteration_tokens) == (50, 100, 20, 200)
    assert not s.restarted
    # Replica restarted: counters start again from zero; never a negative delta.
    s = tr.update("r", 2.0, snap(10, 20, 5, 50))
    assert s.restarted and (s.drafts, s.accepted_tokens, s.iterations) == (10, 20, 5)
    assert all(v >= 0 for v in s.accepted_per_pos.values())
    s = tr.update("r", 3.0, snap(30, 60, 9, 90))
    assert not s.restarted and s.drafts == 20


def test_a_sample_carries_the_replicas_engine_fixes():
    tr = ReplicaDeltaTracker()
    tr.update("r", 0.0, snap(100, 200, 50, 500))
    fixed = snap(150, 300, 70, 700)
    fixed.ext_engine_fixes = frozenset({"expand_batch_to_tokens"})
    assert tr.update("r", 1.0, fixed).engine_fixes == {"expand_batch_to_tokens"}


def test_engine_timed_steps_become_per_cell_increments():
    from contract.vllm_metrics import StepCell

    tr = ReplicaDeltaTracker()
    first = snap(100, 200, 50, 500)
    first.engine_steps = {(4, 16, 1): StepCell(10, 0.1, 40, 160, 120), (1, 1, 0): StepCell(5, 0.01, 5, 5, 0)}
    tr.update("r", 0.0, first)
    second = snap(150, 300, 70, 700)
    second.engine_steps = {(4, 16, 1): StepCell(14, 0.14, 56, 220, 164), (1, 1, 0): StepCell(5, 0.01, 5, 5, 0),
                           (8, 8, 0): StepCell(2, 0.02, 16, 16, 0)}  # fmt: skip
    s = tr.update("r", 1.0, second)
    assert s.engine_steps == {
        (4, 16, 1): StepCell(4, pytest.approx(0.04), 16, 60, 44),
        (8, 8, 0): StepCell(2, 0.02, 16, 16, 0),  # a new cell: its sums are the increments; an idle one is dropped
    }
    third = snap(160, 310, 75, 710)  # the engine restarted (its step counts fell)
    third.engine_steps = {(4, 16, 1): StepCell(3, 0.03, 12, 48, 36)}
    assert tr.update("r", 2.0, third).engine_steps == {(4, 16, 1): StepCell(3, 0.03, 12, 48, 36)}


async def test_scrape_a_sim_replica_and_differentiate():
    async with sim_replica("dspark-b8", "sim-s") as url:
        async with httpx.AsyncClient() as http:
            first = await scrape_metrics(http, url)
            assert first is not None and first.supports_knobs
            for _ in range(3):
                r = await http.post(url + "/v1/completions", json={"model": "Qwen/Qwen3-8B", "prompt": "[workload=code] x",
                                                                     "max_tokens": 40})
                assert r.status_code == 200
            second = await scrape_metrics(http, url)
            tr = ReplicaDeltaTracker()
            tr.update("s", 0.0, first)
            sample = tr.update("s", 1.0, second)
            assert sample.drafts > 0 and sample.accepted_tokens >= 0 and sample.iterations > 0
            al = 1 + sample.accepted_tokens / sample.drafts
            assert 1.0 <= al <= 9.0
            # The sim replica exports the extension's engine-timed steps too: the interval's steps, cell by cell.
            assert sum(c.steps for c in sample.engine_steps.values()) == sample.iterations
            assert sum(c.draft_tokens for c in sample.engine_steps.values()) == sample.draft_tokens
            assert await scrape_metrics(http, "http://127.0.0.1:9") is None  # unreachable -> None, not zeros


async def test_telemetry_deltas_from_redis(redis_store):
    tr = TelemetryDeltaTracker()
    stats = RequestSpecStats(prompt_tokens=10, completion_tokens=20, num_spec_steps=8, num_draft_tokens=32,
                             num_accepted_draft_tokens=12)
    await record_request(redis_store, "t1", "r1", stats)
    assert tr.update(await read_all(redis_store)) == []
    await record_request(redis_store, "t1", "r1", stats)
    await record_request(redis_store, "t1", "r1", stats)
    (d,) = tr.update(await read_all(redis_store))
    assert (d.tenant, d.replica, d.get("requests"), d.get("num_accepted_draft_tokens")) == ("t1", "r1", 2, 24)
    # Counters flushed (e.g. Redis restarted): the new values are the increments.
    await redis_store.delete("telemetry:t1|r1")
    await record_request(redis_store, "t1", "r1", stats)
    (d,) = tr.update(await read_all(redis_store))
    assert d.get("requests") == 1 and d.get("num_spec_steps") == 8
    # A series that first appears after the baseline is new since the last read: it counts whole.
    await record_request(redis_store, "t2", "r1", stats)
    (d,) = tr.update(await read_all(redis_store))
    assert (d.tenant, d.get("requests"), d.get("num_accepted_draft_tokens")) == ("t2", 1, 12)


async def test_the_first_read_is_the_baseline_even_when_empty(redis_store):
    """History before the controller's first read is not counted; a tenant
    whose first requests come after it is (its first flush was lost)."""
    tr = TelemetryDeltaTracker()
    assert tr.update(await read_all(redis_store)) == []  # nothing yet: the baseline is empty
    stats = RequestSpecStats(prompt_tokens=10, completion_tokens=20, num_spec_steps=8, num_draft_tokens=32,
                             num_accepted_draft_tokens=12)
    await record_request(redis_store, "new", "r1", stats)
    (d,) = tr.update(await read_all(redis_store))
    assert (d.tenant, d.get("requests"), d.get("num_spec_steps")) == ("new", 1, 8)
