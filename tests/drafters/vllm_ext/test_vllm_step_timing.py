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


def caught_up(server, timeout_s: float = 30.0) -> tuple[VllmMetricsSnapshot, float]:
    """A scrape taken once the exported table has caught up with the engine: the API server asks
    the engine core only every second, so right after a run (this test's, or the previous
    test's) the table may still lag vLLM's own counters. Both count since the engine started, so
    caught up is every draft token vLLM verified lying in some timed step. Returns the scrape and
    the draft tokens still missing from the table when the wait gave up (0 when it caught up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = scrape(server)
        missing = (snap.spec_num_draft_tokens or 0.0) - sum(c.draft_tokens for c in snap.engine_steps.values())
        if missing == 0 or time.monotonic() > deadline:
            return snap, missing
        time.sleep(0.5)


def test_timed_steps_account_for_every_verified_draft_in_cells_of_their_shape(vllm_ngram_server):
    server = vllm_ngram_server
    wait_idle(server)
    before, missing = caught_up(server)
    assert missing == 0, f"the table lags vLLM's draft count by {missing} tokens at rest"
    greedy(server, 48)  # alone, drafting
    greedy(server, 48, xargs={"specgate_max_draft": 0})  # alone, K=0: the drafter does not run
    asyncio.run(together(server, 5, 512))
    after, missing = caught_up(server)
    cells = deltas(before, after)
    drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    assert drafted > 0 and missing == 0 and sum(c.draft_tokens for c in cells.values()) == drafted, (drafted, cells)
    for (batch, tokens, drafting), c in cells.items():
        assert batch / 2 < c.requests / c.steps <= batch, (batch, c)
        assert tokens / 2 < c.tokens / c.steps <= tokens, (tokens, c)
        assert 0 < c.seconds / c.steps < 5, c
        assert c.draft_tokens <= c.tokens - c.requests
    assert any(d == 0 and c.draft_tokens == 0 for (_, _, d), c in cells.items()), cells  # the K=0 request
    assert any(b >= 2 for (b, _, _) in cells), cells  # the five sent together shared steps
    assert any(d == 1 and c.draft_tokens > 0 for (_, _, d), c in cells.items()), cells
