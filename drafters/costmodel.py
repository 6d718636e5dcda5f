"""Roofline cost model of one vLLM engine step on a Hopper GPU, with and without a DSpark drafter.

Why: the controller must predict whether speculation pays on a replica *right
now*; that depends on whether the GPU is weight-streaming (memory-bound, extra
verify tokens are almost free) or compute-bound (every verified token costs
its FLOPs).  There is no GPU here, so this module is the physics every other
part (acceptance model, simulator, sim replica, controller) shares.  All
functions are pure; times are seconds.

Model (per engine step, target model, tensor parallel 1)::

    T(n, B, L) = t0 + max( (W + B*L*kappa) / BW_eff ,  (2*P*n' + 4*n'*L*d_attn*layers) / F_eff )
                 [+ t_eager when n exceeds the largest CUDA-graph capture size]

* ``n`` tokens in the step (decode tokens + verified draft tokens + prefill
  chunk), ``n'`` = n padded up to vLLM's CUDA-graph capture sizes
  (1, 2, 4, 8, 16, 24, ... 512); past 512 the step runs eagerly (no padding,
  ``t_eager`` launch overhead).
* ``B`` sequences, ``L`` mean context per sequence, ``kappa`` KV bytes per
  token, ``W`` weight bytes, ``P`` parameters.
* Drafter (DSpark = one parallel pass over the block + a small sequential
  Markov correction per position)::

    T_d(B, k, L) = t0_d + max(W_d / BW_eff, 2*P_d*B*(k+1) / F_eff) + k * (t_markov + 2*P_markov*B / F_eff)

  ``P_d`` = 5 transformer layers of the target's width + fc over the 3 aux
  hidden states + the (shared) LM head, all computed for the k+1 block slots.

Fitted values and sources (nothing here was measured on hardware):

* Peak: H100 SXM 989 TFLOP/s dense BF16, 3.35 TB/s HBM3; H200 989 TFLOP/s,
  4.8 TB/s HBM3e (NVIDIA datasheets).
* ``bw_eff = 0.80`` and ``t0 = 0.70 ms`` reproduce Qwen3-8B on 1xH100, c=1, no
  speculation, TPOT 6.78 ms (HF card Dogacel/Qwen3-8B-DSpark, vLLM) -> model 6.83 ms.
* ``flops_eff = 0.30`` of peak (~297 TFLOP/s effective over a whole verify
  forward incl. attention, norms, sampling and rejection), fitted to
  TensorRT-LLM PR #16813 (static DSpark block 7 on Qwen3-8B, GSM8K: 3.24x at
  c=1 -> 1.01x at c=64).  The GEMM-only prior (~0.6) cannot reproduce parity
  at c=64 with any plausible acceptance length; the survey notes the same
  (0.25-0.4 implied).  Consequence for the compute-bound knee n*: at a loaded
  decode batch (B=64, mean context 2k tokens, the reference point the
  "150-220 tokens/step" figure is quoted at) n* = 155 (H200) / 222 (H100);
  at short context it is 77 / 111.
* Drafter: DSpark Qwen3-8B on H100 c=1 costs ~2.1 ms/step (Dogacel card:
  8.9 ms per step vs 6.8 ms without drafting) -> ``t0_d = 0.75 ms`` + weights
  (1.64 B params = 3.3 GB BF16) + 7 x 45 us Markov steps = 2.3 ms in this model (slightly above the
  card, toward TRT-LLM's heavier c=1 drafting cost).
* Resulting errors (tests/drafters/test_calibration.py, drafters/calibration.py):
  TPOT 6.83 vs 6.78 ms (+0.7%); Dogacel c=1 1.74x vs 1.76x (-1%); TRT block-7
  GSM8K c=1 3.73x vs 3.24x (+15%), c=64 1.13x vs 1.01x (+12%); knee at
  B=64/2k 222 vs 220 (H100), 155 vs 155 (H200).  Known misses: TRT Qwen3-14B
  c=16 3.58x vs 2.34x (+53%), Dogacel c=32 1.07x vs 1.29x (-17%).
* Qwen3-8B: 36 layers, hidden 4096, 32 q / 8 kv heads x 128, FFN 12288,
  vocab 151936, 8.19 B params (16.4 GB BF16), 147 KB KV/token.
  Qwen3-14B: 40 layers, hidden 5120, 40 q / 8 kv heads x 128, FFN 17408,
  14.8 B params (29.6 GB), 164 KB KV/token (HF configs).

Host (CPU) time per step -- the per-request term.  Everything above is the
GPU; the engine core's own CPU work also grows with the batch: every
scheduled request costs scheduler time beyond its tokens, and a V1 ngram
replica searches every request's context for its proposal on the CPU.
``HostSpec`` holds those costs and ``host_time_s`` / ``ngram_propose_time_s``
price a step's host work.  Whether it adds to the step depends on vLLM's
scheduling mode (``SYNCHRONOUS_METHODS``, ``step_wall_time_s``): vLLM 0.32
turns async scheduling on by default and off for the CPU ``ngram`` proposer
(``vllm/config/vllm.py`` 1585-1610: "Async scheduling not supported with
ngram-based speculative decoding"), so on ngram replicas the host work runs
between GPU steps and adds to every step, while elsewhere it overlaps the
GPU step and only a host slower than the GPU would show.  Measured by
``bench/host_cost.py`` (run it with ``.venv-vllm/bin/python``) with vLLM
0.32.0's own code on the project's 2-core Xeon development VM (the
engine-core scheduler and the ngram proposer are CPU code, the same in GPU
builds):

* ``Scheduler.schedule()`` + ``update_from_output()`` (ngram K=8 config, no
  prefix caching, 1000-token prompts, every request decoding; median of 50
  steps) at B = 1/16/64/256: 35 / 181 / 620 / 2365 us without drafts, 40 /
  220 / 769 / 3180 us with 4 draft tokens per request -> 27 us + 9.3 us per
  scheduled request + 2.75 us per request with drafts (fit within 4 %).
* ``NgramProposer.propose`` (the numba prompt lookup, K=8, lookup 1..4,
  random token contexts; vLLM caps it at one numba thread; best of 7 calls)
  over B = 1..256 requests of 256..3072 context tokens: 8.3 us + 1.26 us per
  request + 0.84 ns per context token (fit within 26 %).

A second run of the script read 26.5 us + 9.6 us + 3.0 us and 8.1 us + 1.23 us
+ 0.80 ns: the run-to-run spread on the shared VM is a few per cent.

The model runner's per-request input preparation and the output processor
are not in these figures (they need a GPU runner), so the host term is a
lower bound, and a faster host CPU than this VM's would shrink it.

Limits: TP=1 only; no MoE; prefill attention is treated like decode attention
(FLOPs over the mean context); no overlap of drafter and verifier; KV
capacity is modelled in the simulator, not here.

Usage::

    from drafters.costmodel import get_gpu, get_model, step_time_s, spec_step_time_s, knee_tokens, static_speedup
    gpu, model = get_gpu("h200"), get_model("qwen3-8b")
    t_plain = step_time_s(gpu, model, tokens=32, batch=32, context=1500)          # 32 decode seqs
    t_spec = spec_step_time_s(gpu, model, batch=32, num_draft=8, context=1500)    # drafter + verify 32*9 tokens
    n_star = knee_tokens(gpu, model, batch=32, context=1500)                      # compute-bound knee
    su = static_speedup(gpu, model, batch=32, context=1500, num_draft=8, tokens_per_step=5.0)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

from .spec import DrafterSpec

# vLLM V1 default cudagraph_capture_sizes: [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16).
CUDA_GRAPH_SIZES: tuple[int, ...] = tuple([1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16)))


@dataclass(frozen=True)
class GpuSpec:
    """One GPU and the measured-effective fractions of its peaks."""

    name: str
    peak_bw: float  # bytes/s
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bytes: float  # memory capacity
    bw_eff: float = 0.80
    flops_eff: float = 0.30
    step_overhead_s: float = 0.70e-3  # t0: launch/scheduling/sampling per step (CUDA graphs on)
    eager_overhead_s: float = 1.5e-3  # extra per step when not captured in a CUDA graph
    drafter_overhead_s: float = 0.75e-3  # t0_d
    markov_step_s: float = 45e-6  # one sequential Markov-head correction (launch bound)

    @property
    def bw(self) -> float:
        return self.peak_bw * self.bw_eff

    @property
    def flops(self) -> float:
        return self.peak_flops * self.flops_eff


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only target model in BF16."""

    name: str
    hf_id: str
    n_params: float
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.n_layers * self.n_kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def attn_flops_per_token_per_ctx(self) -> float:
        # QK^T and PV: 2 matmuls x 2 FLOP x (heads*head_dim) per layer per context token.
        return 4.0 * self.n_heads * self.head_dim * self.n_layers

    @property
    def layer_params(self) -> float:
        h, d = self.hidden, self.head_dim
        attn = h * (self.n_heads * d) * 2 + h * (self.n_kv_heads * d) * 2
        return attn + 3 * h * self.intermediate

    @property
    def lm_head_params(self) -> float:
        return float(self.vocab * self.hidden)


def drafter_params(drafter: DrafterSpec, model: ModelSpec) -> float:
    """A DSpark drafter's weights on `model`: its decoder layers, the
    projection of its feature layers, and the LM head it shares the shape of."""
    fc = drafter.aux_layers * model.hidden * model.hidden
    return drafter.draft_layers * model.layer_params + fc + model.lm_head_params


def markov_params(drafter: DrafterSpec, model: ModelSpec) -> float:
    """The vanilla Markov head: token embedding -> rank r -> vocab."""
    return drafter.markov_rank * (model.hidden + model.vocab) if drafter.markov_rank else 0.0


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(name="h100", peak_bw=3.35e12, peak_flops=989e12, hbm_bytes=80e9),
    "h200": GpuSpec(name="h200", peak_bw=4.8e12, peak_flops=989e12, hbm_bytes=141e9),
}

MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", hf_id="Qwen/Qwen3-8B", n_params=8.19e9, n_layers=36, hidden=4096,
        n_heads=32, n_kv_heads=8, head_dim=128, intermediate=12288, vocab=151936,
    ),
    "qwen3-14b": ModelSpec(
        name="qwen3-14b", hf_id="Qwen/Qwen3-14B", n_params=14.77e9, n_layers=40, hidden=5120,
        n_heads=40, n_kv_heads=8, head_dim=128, intermediate=17408, vocab=151936,
    ),
}

# The reference drafter the presets are priced with: 5 decoder layers, the 3
# feature layers speculators picks on Qwen3-8B, a rank-256 Markov head (only
# the counts enter the cost).
DEFAULT_DRAFTER = DrafterSpec(block_size=8, markov_rank=256, target_layer_ids=(2, 18, 33),
                              mask_token_id=MODELS["qwen3-8b"].vocab - 1, draft_layers=5)


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU parameter set by name (``h100``, ``h200``; case-insensitive)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in GPUS:
        raise KeyError(f"unknown GPU {name!r}; known: {sorted(GPUS)}")
    return GPUS[key]


def get_model(name: str) -> ModelSpec:
    """Look up a target model by short name (``qwen3-8b``) or HF id (``Qwen/Qwen3-8B``)."""
    key = name.lower()
    for spec in MODELS.values():
        if key in (spec.name, spec.hf_id.lower()):
            return spec
    raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")


def with_overrides(gpu: GpuSpec, **changes: float) -> GpuSpec:
    """A copy of ``gpu`` with some parameters changed (for sensitivity sweeps)."""
    return replace(gpu, **changes)


def pad_tokens(tokens: int, sizes: tuple[int, ...] = CUDA_GRAPH_SIZES) -> tuple[int, bool]:
    """Round a step's token count up to the next CUDA-graph capture size.

    Returns (padded tokens, captured?).  Past the largest size the step runs
    eagerly: no padding, but ``eager_overhead_s`` is paid.
    """
    if tokens <= 0:
        return 0, True
    i = bisect.bisect_left(sizes, tokens)
    if i >= len(sizes):
        return int(tokens), False
    return sizes[i], True


_SIZES_ARR = np.asarray(CUDA_GRAPH_SIZES)


def _pad_array(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.searchsorted(_SIZES_ARR, tokens, side="left")
    graphed = idx < len(_SIZES_ARR)
    padded = np.where(graphed, _SIZES_ARR[np.minimum(idx, len(_SIZES_ARR) - 1)], tokens)
    padded = np.where(tokens <= 0, 0, padded)
    return padded, graphed


@dataclass(frozen=True)
class StepCost:
    """Breakdown of one engine step (target forward only)."""

    time_s: float
    memory_s: float  # weight + KV streaming time
    compute_s: float  # FLOP time on padded tokens (at F_eff)
    padded_tokens: int
    graphed: bool
    overhead_s: float = 0.0  # t0 (+ eager launch overhead)
    flops_eff: float = 0.0  # F_eff / peak of the GPU this was computed for

    @property
    def compute_bound(self) -> bool:
        return self.compute_s > self.memory_s

    @property
    def dram_active(self) -> float:
        """Fraction of the step the memory interface is busy (basis of DCGM_FI_PROF_DRAM_ACTIVE)."""
        return min(1.0, self.memory_s / self.time_s) if self.time_s > 0 else 0.0

    @property
    def tensor_active(self) -> float:
        """Achieved FLOP rate over peak (basis of DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): ~flops_eff when
        compute-bound, near 0 for a small memory-bound decode batch."""
        return min(1.0, self.compute_s * self.flops_eff / self.time_s) if self.time_s > 0 else 0.0


def step_breakdown(gpu: GpuSpec, model: ModelSpec, tokens: int, batch: int, context: float) -> StepCost:
    """Roofline time of one target forward over ``tokens`` tokens for ``batch`` sequences of mean ``context``."""
    if tokens <= 0 and batch <= 0:
        return StepCost(0.0, 0.0, 0.0, 0, True)
    padded, graphed = pad_tokens(int(tokens))
    mem = (model.weight_bytes + max(batch, 0) * max(context, 0.0) * model.kv_bytes_per_token) / gpu.bw
    flops = 2.0 * model.n_params * padded + model.attn_flops_per_token_per_ctx * padded * max(context, 0.0)
    comp = flops / gpu.flops
    overhead = gpu.step_overhead_s + (0.0 if graphed else gpu.eager_overhead_s)
    return StepCost(time_s=overhead + max(mem, comp), memory_s=mem, compute_s=comp, padded_tokens=padded,
                    graphed=graphed, overhead_s=overhead, flops_eff=gpu.flops_eff)


def step_time_s(gpu: GpuSpec, model: ModelSpec, tokens: int, batch: int, context: float) -> float:
    """T(tokens, batch, context): seconds for one target forward step (see module docstring)."""
    return step_breakdown(gpu, model, tokens, batch, context).time_s


def step_time_array_s(gpu: GpuSpec, model: ModelSpec, tokens: np.ndarray, batch: int, context: float) -> np.ndarray:
    """Vectorised ``step_time_s`` over candidate token counts (used by adaptive verification)."""
    tokens = np.asarray(tokens)
    padded, graphed = _pad_array(tokens)
    mem = (model.weight_bytes + batch * context * model.kv_bytes_per_token) / gpu.bw
    comp = (2.0 * model.n_params * padded + model.attn_flops_per_token_per_ctx * padded * context) / gpu.flops
    return gpu.step_overhead_s + np.maximum(mem, comp) + np.where(graphed, 0.0, gpu.eager_overhead_s)


def drafter_time_s(
    gpu: GpuSpec, model: ModelSpec, batch: int, num_draft: int, context: float = 0.0,
    drafter: DrafterSpec = DEFAULT_DRAFTER,
) -> float:
    """Seconds for the DSpark drafter to propose ``num_draft`` tokens for ``batch`` sequences.

    The drafter always runs for every speculating request (adaptive
    verification only trims what is verified).  Zero when nothing drafts.
    """
    if batch <= 0 or num_draft <= 0:
        return 0.0
    p_d = drafter_params(drafter, model)
    slots = batch * (num_draft + 1)
    padded, graphed = pad_tokens(slots)
    # Drafter KV: its own layers over the context (projected target features).
    kv = batch * context * model.kv_bytes_per_token * drafter.draft_layers / model.n_layers
    mem = (p_d * model.dtype_bytes + kv) / gpu.bw
    comp = 2.0 * p_d * padded / gpu.flops
    markov = num_draft * (gpu.markov_step_s + 2.0 * markov_params(drafter, model) * batch / gpu.flops)
    return gpu.drafter_overhead_s + max(mem, comp) + markov + (0.0 if graphed else gpu.eager_overhead_s)


def spec_step_time_s(
    gpu: GpuSpec, model: ModelSpec, batch: int, num_draft: int, context: float,
    verified_draft_tokens: int | None = None, extra_tokens: int = 0, drafting_seqs: int | None = None,
) -> float:
    """One speculative engine step: drafter for ``drafting_seqs`` (default ``batch``) + verify.

    Verify runs ``batch`` bonus/decode tokens + ``verified_draft_tokens``
    (default ``batch * num_draft``: static speculation verifies every draft)
    + ``extra_tokens`` (prefill chunk).
    """
    v = batch * num_draft if verified_draft_tokens is None else verified_draft_tokens
    drafting = batch if drafting_seqs is None else drafting_seqs
    return drafter_time_s(gpu, model, drafting, num_draft, context) + step_time_s(
        gpu, model, batch + v + extra_tokens, batch, context
    )


def knee_tokens(gpu: GpuSpec, model: ModelSpec, batch: int = 1, context: float = 0.0) -> float:
    """n*: tokens per step where the step turns compute-bound (FLOP time = streaming time).

    n* = F_eff (W + B L kappa) / (BW_eff (2P + 4 L d layers)).  Below n*
    extra verified tokens are nearly free; above it each costs ~2P/F_eff.
    """
    mem_bytes = model.weight_bytes + batch * context * model.kv_bytes_per_token
    flops_per_token = 2.0 * model.n_params + model.attn_flops_per_token_per_ctx * context
    return gpu.flops * mem_bytes / (gpu.bw * flops_per_token)


def compute_bound_index(gpu: GpuSpec, model: ModelSpec, tokens: int, batch: int, context: float) -> float:
    """rho = n / n*: < 1 memory-bound (speculation nearly free), > 1 compute-bound."""
    return tokens / knee_tokens(gpu, model, batch, context)


def marginal_token_cost_s(gpu: GpuSpec, model: ModelSpec, tokens: int, batch: int, context: float) -> float:
    """dT/dn at ``tokens`` (finite difference over one token, ignores padding staircase)."""
    mem = (model.weight_bytes + batch * context * model.kv_bytes_per_token) / gpu.bw
    per_tok = (2.0 * model.n_params + model.attn_flops_per_token_per_ctx * context) / gpu.flops
    return per_tok if per_tok * tokens >= mem else 0.0


def static_speedup(
    gpu: GpuSpec, model: ModelSpec, batch: int, context: float, num_draft: int, tokens_per_step: float,
) -> float:
    """Throughput ratio of static speculation (every request drafts ``num_draft``, emitting
    ``tokens_per_step`` on average incl. the bonus token) vs no speculation, same batch.

    SU = tau * T(B) / (T_d(B, k) + T(B (k+1))).
    """
    if num_draft <= 0:
        return 1.0
    base = step_time_s(gpu, model, batch, batch, context)
    spec = spec_step_time_s(gpu, model, batch, num_draft, context)
    return tokens_per_step * base / spec


def predicted_goodput_tok_s(
    gpu: GpuSpec, model: ModelSpec, batch: int, context: float, num_draft: int, tokens_per_step: float,
    verified_draft_tokens: int | None = None,
) -> float:
    """Output tokens/s of a batch: batch * tau / step time (tau = 1 when ``num_draft`` is 0)."""
    if batch <= 0:
        return 0.0
    if num_draft <= 0:
        return batch / step_time_s(gpu, model, batch, batch, context)
    t = spec_step_time_s(gpu, model, batch, num_draft, context, verified_draft_tokens=verified_draft_tokens)
    return batch * tokens_per_step / t


@dataclass(frozen=True)
class HostSpec:
    """The engine core's CPU time per step (see the module docstring for the measurement).

    ``step_s`` + ``request_s`` per scheduled request + ``verify_request_s``
    per request whose drafts are verified: vLLM's scheduler and its
    bookkeeping of the step's outputs. ``ngram_*``: the V1 ngram proposer's
    prompt-lookup search, per call, per request searched and per context
    token of those requests."""

    step_s: float = 27e-6
    request_s: float = 9.3e-6
    verify_request_s: float = 2.75e-6
    ngram_call_s: float = 8.3e-6
    ngram_request_s: float = 1.26e-6
    ngram_context_token_s: float = 0.84e-9


DEFAULT_HOST = HostSpec()

# Speculation methods whose vLLM 0.32 engine runs without async scheduling
# (vllm/config/vllm.py: the CPU ngram proposer is the one method it is turned off
# for; no speculation, EAGLE, DFlash and DSpark keep it on).
SYNCHRONOUS_METHODS: frozenset[str] = frozenset({"ngram"})


def host_time_s(scheduled: int, verifying: int, host: HostSpec = DEFAULT_HOST) -> float:
    """Scheduler CPU time of one step with ``scheduled`` requests, ``verifying`` of them with drafts."""
    if scheduled <= 0:
        return 0.0
    return host.step_s + host.request_s * scheduled + host.verify_request_s * max(verifying, 0)


def ngram_propose_time_s(requests: int, context_tokens: float, host: HostSpec = DEFAULT_HOST) -> float:
    """CPU time of the ngram proposer searching ``requests`` contexts of ``context_tokens`` tokens in all."""
    if requests <= 0:
        return 0.0
    return host.ngram_call_s + host.ngram_request_s * requests + host.ngram_context_token_s * max(context_tokens, 0.0)


def step_wall_time_s(device_s: float, host_s: float, method: str) -> float:
    """How long a step takes end to end: the GPU's time plus the host's where vLLM schedules
    synchronously (``SYNCHRONOUS_METHODS``), else the longer of the two (async scheduling
    overlaps the host's work for the next step with the GPU's for this one)."""
    if method in SYNCHRONOUS_METHODS:
        return device_s + host_s
    return max(device_s, host_s)


def kv_capacity_tokens(gpu: GpuSpec, model: ModelSpec, gpu_memory_utilization: float = 0.9,
                       activation_reserve_bytes: float = 4e9) -> int:
    """KV-cache tokens that fit next to the weights (vLLM's gpu_memory_utilization budget)."""
    free = gpu.hbm_bytes * gpu_memory_utilization - model.weight_bytes - activation_reserve_bytes
    free -= drafter_params(DEFAULT_DRAFTER, model) * model.dtype_bytes
    return max(0, int(free / model.kv_bytes_per_token))


def dcgm_gauges(cost: StepCost | None, busy_fraction: float) -> dict[str, float]:
    """dcgm-exporter style gauges for a replica that was busy ``busy_fraction`` of the window.

    GPU_UTIL is NVML's "a kernel was running" (reads ~100 whenever decode is
    busy: only part of the per-step host overhead leaves the GPU idle), so it
    cannot tell memory- from compute-bound; the PROF fields can: DRAM_ACTIVE
    ~ streaming time / step time (x0.9: HBM is never 100% active), TENSOR_ACTIVE
    ~ achieved FLOP rate / peak, SM_ACTIVE high whenever kernels run.
    Percent for GPU_UTIL, ratio 0..1 for PROF fields (as dcgm-exporter reports them).
    """
    busy = min(max(busy_fraction, 0.0), 1.0)
    if cost is None or cost.time_s <= 0:
        return {"DCGM_FI_DEV_GPU_UTIL": round(100.0 * busy, 2), "DCGM_FI_PROF_SM_ACTIVE": 0.0,
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0, "DCGM_FI_PROF_DRAM_ACTIVE": 0.0}
    kernel_frac = 1.0 - 0.5 * cost.overhead_s / cost.time_s
    work_frac = max(cost.memory_s, cost.compute_s) / cost.time_s
    return {
        "DCGM_FI_DEV_GPU_UTIL": round(100.0 * busy * kernel_frac, 2),
        "DCGM_FI_PROF_SM_ACTIVE": round(busy * kernel_frac * (0.55 + 0.4 * work_frac), 4),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(busy * cost.tensor_active, 4),
        "DCGM_FI_PROF_DRAM_ACTIVE": round(busy * cost.dram_active * 0.9, 4),
    }


def describe(gpu: GpuSpec, model: ModelSpec) -> str:
    """One-line summary (used by CLIs and benches)."""
    return (f"{gpu.name}+{model.name}: W={model.weight_bytes / 1e9:.1f} GB, kappa={model.kv_bytes_per_token / 1e3:.0f} KB/tok, "
            f"BW_eff={gpu.bw / 1e12:.2f} TB/s, F_eff={gpu.flops / 1e12:.0f} TFLOP/s, knee={knee_tokens(gpu, model):.0f} tok/step, "
            f"T(1)={1e3 * step_time_s(gpu, model, 1, 1, 512):.2f} ms")


__all__ = [
    "CUDA_GRAPH_SIZES", "GpuSpec", "ModelSpec", "DrafterSpec", "StepCost", "GPUS", "MODELS", "DEFAULT_DRAFTER",
    "get_gpu", "get_model", "with_overrides", "pad_tokens", "step_breakdown", "step_time_s", "step_time_array_s",
    "drafter_time_s", "spec_step_time_s", "knee_tokens", "compute_bound_index", "marginal_token_cost_s",
    "static_speedup", "predicted_goodput_tok_s", "kv_capacity_tokens", "dcgm_gauges", "describe",
    "HostSpec", "DEFAULT_HOST", "SYNCHRONOUS_METHODS", "host_time_s", "ngram_propose_time_s", "step_wall_time_s",
]
