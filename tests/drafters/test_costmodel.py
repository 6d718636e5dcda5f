import numpy as np
import pytest

from drafters.costmodel import (
    CUDA_GRAPH_SIZES, compute_bound_index, dcgm_gauges, drafter_time_s, get_gpu, get_model, knee_tokens,
    kv_capacity_tokens, marginal_token_cost_s, pad_tokens, spec_step_time_s, static_speedup, step_breakdown,
    step_time_array_s, step_time_s,
)

H100, H200 = get_gpu("h100"), get_gpu("H200")
Q8, Q14 = get_model("qwen3-8b"), get_model("Qwen/Qwen3-14B")


def test_lookup_errors():
    with pytest.raises(KeyError, match="unknown GPU"):
        get_gpu("a100")
    with pytest.raises(KeyError, match="unknown model"):
        get_model("llama")


def test_model_sizes_match_configs():
    assert Q8.weight_bytes == pytest.approx(16.4e9, rel=0.01)
    assert Q8.kv_bytes_per_token == 147456
    assert Q14.weight_bytes == pytest.approx(29.6e9, rel=0.01)
    assert Q14.kv_bytes_per_token == 163840


def test_padding_staircase():
    assert pad_tokens(1) == (1, True)
    assert pad_tokens(3) == (4, True)
    assert pad_tokens(9) == (16, True)
    assert pad_tokens(257) == (272, True)
    assert pad_tokens(512) == (512, True)
    assert pad_tokens(513) == (513, False)
    assert CUDA_GRAPH_SIZES[-1] == 512


def test_memory_bound_regime_is_flat_then_compute_bound_grows():
    t1 = step_time_s(H200, Q8, 1, 1, 500)
    t64 = step_time_s(H200, Q8, 64, 1, 500)
    assert t64 == pytest.approx(t1, rel=0.02)  # weight streaming dominates
    t512 = step_time_s(H200, Q8, 512, 1, 500)
    assert t512 > 2.5 * t1
    assert step_breakdown(H200, Q8, 512, 1, 500).compute_bound
    assert not step_breakdown(H200, Q8, 16, 16, 500).compute_bound
    assert marginal_token_cost_s(H200, Q8, 16, 16, 500) == 0.0
    assert marginal_token_cost_s(H200, Q8, 512, 16, 500) > 0.0


def test_eager_past_capture_sizes_costs_more():
    g = step_breakdown(H100, Q8, 512, 64, 0)
    e = step_breakdown(H100, Q8, 513, 64, 0)
    assert g.graphed and not e.graphed
    assert e.time_s - g.time_s > H100.eager_overhead_s * 0.9


def test_vectorised_matches_scalar():
    ns = np.array([1, 7, 100, 300, 600])
    arr = step_time_array_s(H200, Q14, ns, 32, 1200)
    assert arr == pytest.approx([step_time_s(H200, Q14, int(n), 32, 1200) for n in ns])


def test_context_raises_memory_time_and_knee():
    assert step_time_s(H100, Q8, 32, 32, 8000) > step_time_s(H100, Q8, 32, 32, 100)
    assert knee_tokens(H100, Q8, 64, 2000) > knee_tokens(H100, Q8, 1, 0)
    assert compute_bound_index(H200, Q8, 600, 64, 500) > 1 > compute_bound_index(H200, Q8, 64, 64, 500)


def test_drafter_and_spec_step():
    assert drafter_time_s(H100, Q8, 0, 8) == 0.0
    assert drafter_time_s(H100, Q8, 4, 0) == 0.0
    d1 = drafter_time_s(H100, Q8, 1, 7)
    assert 0.15 < d1 / step_time_s(H100, Q8, 1, 1, 300) < 0.45  # draft share at BS1 ~0.3
    assert spec_step_time_s(H100, Q8, 8, 4, 500) > step_time_s(H100, Q8, 8, 8, 500)
    # verifying fewer tokens (adaptive verification) is never slower
    full = spec_step_time_s(H200, Q8, 64, 8, 1000)
    trimmed = spec_step_time_s(H200, Q8, 64, 8, 1000, verified_draft_tokens=100)
    assert trimmed < full


def test_static_speedup_falls_with_batch():
    sus = [static_speedup(H200, Q8, b, 1000, 8, 5.0) for b in (1, 16, 64, 256)]
    assert sus == sorted(sus, reverse=True)
    assert sus[0] > 3 and sus[-1] < 1
    assert static_speedup(H200, Q8, 16, 1000, 0, 5.0) == 1.0


def test_kv_capacity_and_gauges():
    assert kv_capacity_tokens(H200, Q8) > kv_capacity_tokens(H100, Q8) > 100_000
    busy_mem = dcgm_gauges(step_breakdown(H200, Q8, 8, 8, 500), 1.0)
    busy_comp = dcgm_gauges(step_breakdown(H200, Q8, 512, 64, 500), 1.0)
    assert busy_mem["DCGM_FI_DEV_GPU_UTIL"] > 90 and busy_comp["DCGM_FI_DEV_GPU_UTIL"] > 90
    assert busy_comp["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] > busy_mem["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert busy_mem["DCGM_FI_PROF_DRAM_ACTIVE"] > busy_comp["DCGM_FI_PROF_DRAM_ACTIVE"]
    idle = dcgm_gauges(None, 0.0)
    assert idle["DCGM_FI_DEV_GPU_UTIL"] == 0.0
