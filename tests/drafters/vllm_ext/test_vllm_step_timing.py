"""Engine steps timed in the worker and served on a REAL vLLM CPU server's /metrics
(drafters/vllm_ext/step_timing.py; the shared ngram server, K=4, V1 runner).

The counters must agree with vLLM's own: every draft token the engine verified
(`vllm:spec_decode_num_draft_tokens_total`) lies in exactly one timed step, and
each cell holds steps of its own shape (requests and forward tokens within the
cell's power-of-two bounds). A request capped at 0 running alone makes steps in
which the drafter does not run (K=0), and those land in drafting="0" cells.
"""

from __future__ import annotations

import concurrent.futures
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


def test_timed_steps_account_for_every_verified_draft_in_cells_of_their_shape(vllm_ngram_server):
    server = vllm_ngram_server
    wait_idle(server)
    before = scrape(server)
    greedy(server, 48)  # alone, drafting
    greedy(server, 48, xargs={"specgate_max_draft": 0})  # alone, K=0: the drafter does not run
    with concurrent.futures.ThreadPoolExecutor(5) as pool:  # five at once, long enough to share steps
        list(pool.map(lambda i: greedy(server, 256, prompt=f"{i} the cat sat on the mat. the cat sat on the"), range(5)))
    # The API server asks the workers every second: wait, bounded, until the table has caught up.
    deadline = time.monotonic() + 30
    while True:
        after = scrape(server)
        cells = deltas(before, after)
        drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
        timed_drafts = sum(c.draft_tokens for c in cells.values())
        if timed_drafts == drafted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert drafted > 0 and timed_drafts == drafted, (drafted, cells)
    for (batch, tokens, drafting), c in cells.items():
        assert batch / 2 < c.requests / c.steps <= batch, (batch, c)
        assert tokens / 2 < c.tokens / c.steps <= tokens, (tokens, c)
        assert 0 < c.seconds / c.steps < 5, c
        assert c.draft_tokens <= c.tokens - c.requests
    assert any(d == 0 and c.draft_tokens == 0 for (_, _, d), c in cells.items()), cells  # the K=0 request
    assert any(b >= 2 for (b, _, _) in cells), cells  # the five together
    assert any(d == 1 and c.draft_tokens > 0 for (_, _, d), c in cells.items()), cells
