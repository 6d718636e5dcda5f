"""The engine core's CPU time per step, measured with vLLM's own code (no model, no GPU).

Why: `drafters.costmodel.HostSpec` prices the per-request host work of a vLLM
step (scheduler bookkeeping, and on ngram replicas the prompt-lookup search);
on ngram replicas vLLM schedules synchronously, so that work adds to every
step. This prints the two measurements its figures come from, so they can be
re-taken on another machine:

* `Scheduler.schedule()` + `update_from_output()` (+ `update_draft_token_ids`
  with drafts) for B decoding requests, median over 50 steps, with and
  without draft tokens; and the least-squares fit a + b*B + c*B_drafting;
* `NgramProposer.propose` (numba prompt lookup) over B requests of a given
  context length, best of 7 calls; and the fit a + b*B + c*context tokens.

Run inside .venv-vllm (it needs vllm; the scheduler is built from a
config.json alone, weights are never loaded):

    .venv-vllm/bin/python bench/host_cost.py            # ~1 min on 2 cores
"""

from __future__ import annotations

import json
import tempfile
import time
import types
from pathlib import Path

import numpy as np

BATCHES = (1, 16, 64, 256)
CONTEXTS = (256, 1024, 3072)
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1e6, "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def fit(rows: list[tuple[float, float, float]], times: list[float]) -> np.ndarray:
    """Least squares on relative error of times ~ x . (1, u, v)."""
    a = np.array([[1.0, u, v] for u, v, _ in rows]) / np.asarray(times)[:, None]
    return np.linalg.lstsq(a, np.ones(len(times)), rcond=None)[0]


def scheduler_times() -> list[tuple[int, int, float]]:
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    model_dir = Path(tempfile.mkdtemp(prefix="host-cost-"))
    (model_dir / "config.json").write_text(json.dumps(QWEN3_8B))
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=4096, dtype="bfloat16")
    pc = ParallelConfig()
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=8, prompt_lookup_min=1, prompt_lookup_max=4,
                             target_model_config=mc, target_parallel_config=pc)
    cc = CacheConfig(block_size=16, enable_prefix_caching=False)
    cc.num_gpu_blocks = 200_000
    vc = VllmConfig(model_config=mc, parallel_config=pc, cache_config=cc, speculative_config=spec,
                    scheduler_config=SchedulerConfig(max_num_seqs=512, max_num_batched_tokens=65536,
                                                     max_model_len=4096, is_encoder_decoder=False))
    kv = KVCacheConfig(num_blocks=200_000, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16))])
    out = []
    for drafts in (0, 4):
        for b in BATCHES:
            sched = Scheduler(vc, kv, StructuredOutputManager(vc), block_size=16, log_stats=True)
            for i in range(b):
                sched.add_request(Request(f"r{i}", list(range(1000)), SamplingParams(max_tokens=100_000,
                                                                                     ignore_eos=True), None))
            times = []
            for _ in range(60):
                t = time.perf_counter()
                so = sched.schedule()
                ids = [r.req_id for r in so.scheduled_new_reqs] + list(so.scheduled_cached_reqs.req_ids)
                sampled = [[5] * (3 if so.scheduled_spec_decode_tokens.get(r) else 1) for r in ids]
                sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                                               sampled_token_ids=sampled))
                if drafts:
                    sched.update_draft_token_ids(DraftTokenIds(ids, [[7] * drafts for _ in ids]))
                times.append(time.perf_counter() - t)
            out.append((b, drafts, float(np.median(times[10:]))))
    return out


def proposer_times() -> list[tuple[int, int, float]]:
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    ns = types.SimpleNamespace
    max_len = 4096
    cfg = ns(speculative_config=ns(prompt_lookup_min=1, prompt_lookup_max=4, num_speculative_tokens=8),
             model_config=ns(max_model_len=max_len), scheduler_config=ns(max_num_seqs=max(BATCHES)),
             parallel_config=ns(tensor_parallel_size=1))
    proposer = NgramProposer(cfg)  # compiles the numba search
    rng = np.random.default_rng(0)
    out = []
    for ctx in CONTEXTS:
        for b in BATCHES:
            tokens = rng.integers(0, 150_000, size=(b, max_len), dtype=np.int32)
            lengths = np.full(b, ctx, dtype=np.int32)
            best = float("inf")
            for _ in range(7):
                t = time.perf_counter()
                proposer.propose(8, [[1]] * b, lengths, tokens)
                best = min(best, time.perf_counter() - t)
            out.append((b, ctx, best))
    return out


def main() -> None:
    sched = scheduler_times()
    print("scheduler (schedule + update_from_output), per step:")
    for b, d, t in sched:
        print(f"  B={b:4d} drafts/request={d}: {t * 1e6:8.1f} us  ({t * 1e6 / b:5.2f} us per request)")
    x = fit([(b, b * (d > 0), 0.0) for b, d, _ in sched], [t for *_, t in sched])
    print(f"  fit: {x[0] * 1e6:.1f} us + {x[1] * 1e6:.2f} us per request + {x[2] * 1e6:.2f} us per request with drafts")
    prop = proposer_times()
    print("ngram proposer (NgramProposer.propose, K=8, lookup 1..4):")
    for b, ctx, t in prop:
        print(f"  B={b:4d} context={ctx:5d}: {t * 1e6:8.1f} us")
    x = fit([(b, b * ctx, 0.0) for b, ctx, _ in prop], [t for *_, t in prop])
    print(f"  fit: {x[0] * 1e6:.1f} us + {x[1] * 1e6:.2f} us per request + {x[2] * 1e9:.2f} ns per context token")


if __name__ == "__main__":
    main()
