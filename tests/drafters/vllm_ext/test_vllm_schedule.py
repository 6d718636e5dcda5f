"""`specgate_schedule` on a REAL vLLM CPU server (ngram K=4, V1 runner): each
request drafts by its own batch -> draft-length schedule, step by step, and its
greedy text stays the text of the run without speculation.

The batch a schedule is looked up at is the step's number of requests (the rule
of vLLM's `num_speculative_tokens_per_batch_size`). Steps of one request come
from running the request alone; steps of two or three from running it while
one or two long streaming neighbours (T=1, capped at 0 drafts) decode beside it
for its whole life, proven by the replica's running requests before the request
and after its response (bed_validity.greedy_beside). The neighbours do not
draft: the step's draft length (the largest cap in the step) is then the
request's own schedule entry, and a neighbour lasts longest at a token a step. The per-request `acceptance_histogram` has one
slot per accepted length: a step capped at c drafts never fills a slot above c.
"""

from __future__ import annotations

import pytest

from tests.vllm_support.fixtures import NGRAM_K

from .bed_validity import greedy, greedy_beside

# `timing`: the neighbours must be seen running before the greedy request and outlive it, which
# rests on the engine and the test's poller keeping pace; beside the parallel suite's other
# workers on two cores every attempt missed that (the neighbours finished unseen, twice in
# fresh-clone runs), so scripts/test.sh runs these alone, before the parallel suite.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timing]

MAX_TOKENS = 64
SCHEDULE = "specgate_schedule"
NON_DRAFTING = {"specgate_max_draft": 0}


@pytest.fixture(scope="module")
def stock(vllm_ngram_server):
    text, spec = greedy(vllm_ngram_server, MAX_TOKENS)
    assert spec["num_draft_tokens"] > 0 and spec["num_accepted_draft_tokens"] > 0, (
        f"precondition: ngram must draft and be accepted for this prompt, got {spec}")
    return text, spec


def beside(server, neighbours: int, xargs: dict, attempts: int = 6) -> tuple[str, dict]:
    """The greedy request with `xargs` while `neighbours` T=1 non-drafting streams decode for all its life."""
    for _ in range(attempts):
        text, spec, overlap = greedy_beside(server, [1.0] * neighbours, MAX_TOKENS, xargs=xargs,
                                            neighbour_xargs=NON_DRAFTING)
        if overlap.proven:
            break
    overlap.check()
    return text, spec


def assert_capped(spec: dict, cap: int) -> None:
    steps, drafted, hist = spec["num_spec_steps"], spec["num_draft_tokens"], spec["acceptance_histogram"]
    assert drafted <= cap * steps, spec
    assert len(hist) == NGRAM_K + 1 and all(n == 0 for n in hist[cap + 1:]), spec


def test_alone_a_request_drafts_its_batch_one_entry(vllm_ngram_server, stock):
    text, spec = greedy(vllm_ngram_server, MAX_TOKENS, xargs={SCHEDULE: [1, 2, 8, 4]})
    assert text == stock[0]
    assert spec["num_draft_tokens"] > 0 and spec["num_draft_tokens"] < stock[1]["num_draft_tokens"]
    assert_capped(spec, 2)
    text, spec = greedy(vllm_ngram_server, MAX_TOKENS, xargs={SCHEDULE: [1, 0, 8, 4]})
    assert text == stock[0]
    assert spec["num_draft_tokens"] == spec["num_spec_steps"] == 0  # 0 at batch one: no drafting at all
    text, spec = greedy(vllm_ngram_server, MAX_TOKENS, xargs={SCHEDULE: [1, NGRAM_K]})
    assert (text, spec) == stock  # the schedule's entry is stock K: stock behaviour


def test_beside_neighbours_the_same_request_follows_its_larger_batch_entries(vllm_ngram_server, stock):
    """One schedule, [1 -> 0, 2 -> 1, 3 -> 3, above -> 0]: nothing alone, one token per
    step beside one neighbour, up to three beside two."""
    xargs = {SCHEDULE: [1, 0, 2, 1, 3, 3]}
    text, spec = beside(vllm_ngram_server, 1, xargs)
    assert text == stock[0]
    assert spec["num_spec_steps"] > 0 and spec["num_draft_tokens"] == spec["num_spec_steps"]  # exactly 1 a step
    assert_capped(spec, 1)
    text, spec = beside(vllm_ngram_server, 2, xargs)
    assert text == stock[0]
    assert spec["num_draft_tokens"] > spec["num_spec_steps"] > 0  # more than one token in some steps
    assert_capped(spec, 3)


def test_a_schedule_that_stops_above_batch_one_stops_beside_a_neighbour(vllm_ngram_server, stock):
    text, spec = beside(vllm_ngram_server, 1, {SCHEDULE: [1, 3]})
    assert text == stock[0]
    assert spec["num_draft_tokens"] == spec["num_spec_steps"] == 0
