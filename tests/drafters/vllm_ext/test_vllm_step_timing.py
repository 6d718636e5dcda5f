"""Engine steps timed in the worker and served on a REAL vLLM CPU server's /metrics
(drafters/vllm_ext/step_timing.py; the shared ngram server, K=4, V1 runner).

The counters must agree with vLLM's own: every draft token the engine verified
(`vllm:spec_decode_num_draft_tokens_total`) lies in exactly one timed step, and
each cell holds steps of its own shape (requests and forward tokens within the
cell's power-of-two bounds). A request capped at 0 running alone makes steps in
which the drafter does not run (K=0), and those land in drafting="0" cells.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from contract.vllm_metrics import StepCell, VllmMetricsSnapshot, parse_vllm_metrics

from .bed_validity import greedy, wait_idle

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def scrape(server) -> VllmMetricsSnapshot:
    return parse_vllm_metrics(httpx.get(server.url + "/metrics", timeout=30).text)


def deltas(before: VllmMetricsSnapshot, after: VllmMetricsSnapshot) -> dict:
    out = {}
    for key, cell in after.engine_steps.items():
        d = cell.minus(before.engine_steps.get(key, StepCell()))
        if d.steps > 0:
            out[key] = d
    return out


async def together(server, n: int, max_tokens: int) -> None:
    """`n` greedy requests sent at the same moment from one event loop (so they share engine steps;
    one after another from threads, each building its own client, they did not overlap at all)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
        bodies = [{"model": server.model, "prompt": f"{i} the cat sat on the mat. the cat sat on the",
                   "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True} for i in range(n)]  # fmt: skip
        for r in await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies)):
            assert r.status_code == 200, r.text


def settled(server, timeout_s: float = 30.0) -> VllmMetricsSnapshot:
    """A scrape taken once the exported table holds every step the engine has run: the API
    server asks the engine core only every second, so right after a run (this test's or the
    previous test's) the table may still lag. Settled is the engine idle and two scrapes more
    than a poll apart reading the same table.

    Not "the table's drafts equal vLLM's counter since start": vLLM leaves out the drafts of a
    request aborted while its step ran (Scheduler.update_from_output skips finished requests),
    and the tests before this one on the shared server abort their neighbours by closing the
    connection; the engine still ran those steps, so the table counts them. Equality holds only
    over a window in which no request is aborted, such as this test's."""
    deadline = time.monotonic() + timeout_s
    wait_idle(server)
    last = scrape(server)
    while True:
        time.sleep(1.5)  # more than SPECGATE_STEP_STATS_INTERVAL_S (1 s)
        snap = scrape(server)
        if snap.engine_steps == last.engine_steps and (snap.num_requests_running, snap.num_requests_waiting) == (0, 0):
            return snap
        assert time.monotonic() < deadline, "the step table kept changing with the engine at rest"
        last = snap


def test_timed_steps_account_for_every_verified_draft_in_cells_of_their_shape(vllm_ngram_server):
    server = vllm_ngram_server
    before = settled(server)
    greedy(server, 48)  # alone, drafting
    greedy(server, 48, xargs={"specgate_max_draft": 0})  # alone, K=0: the drafter does not run
    asyncio.run(together(server, 5, 512))
    after = settled(server)
    cells = deltas(before, after)
    drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    assert drafted > 0 and sum(c.draft_tokens for c in cells.values()) == drafted, (drafted, cells)
    for (batch, tokens, drafting), c in cells.items():
        assert batch / 2 < c.requests / c.steps <= batch, (batch, c)
        assert tokens / 2 < c.tokens / c.steps <= tokens, (tokens, c)
        assert 0 < c.seconds / c.steps < 5, c
        assert c.draft_tokens <= c.tokens - c.requests
    assert any(d == 0 and c.draft_tokens == 0 for (_, _, d), c in cells.items()), cells  # the K=0 request
    assert any(b >= 2 for (b, _, _) in cells), cells  # the five sent together shared steps
    assert any(d == 1 and c.draft_tokens > 0 for (_, _, d), c in cells.items()), cells
