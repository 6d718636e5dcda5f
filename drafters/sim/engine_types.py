"""What the simulated engine is given and gives back: its config, its requests, one step's outcome.

Why a module of its own: the discrete-event simulator, the HTTP replica and
the policies build and read these plain records (a replica's ``EngineConfig``,
an ``EngineRequest`` with its counts and timestamps, a ``StepOutcome``)
without needing the scheduler that mutates them (``engine.py``).  Also home
of vLLM's ``num_speculative_tokens_per_batch_size`` table helpers, which are
part of a replica's configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import acceptance as acc
from .. import costmodel as cm
from contract.knobs import Schedule
from contract.profiles import PROFILE_LABELS, Profile, parse_profile
from contract.settings import DEFAULT_GPU, DEFAULT_MODEL
from .ngram_acceptance import NgramPreset

# The simulator models DSpark (drafter cost, Markov/confidence heads, adaptive
# verification) and ngram prompt lookup (proposal rate, whole-match acceptance,
# CPU proposer: ngram_acceptance.py); other methods are refused at config load
# rather than mis-modelled.
SIMULATED_METHODS: tuple[str, ...] = ("off", "ngram", "dspark")
SIMULATED_PROFILE_LABELS: tuple[str, ...] = tuple(
    label for label in PROFILE_LABELS if parse_profile(label).method in SIMULATED_METHODS
)


def simulated_profile(label: str) -> Profile:
    """Parse ``label`` (contract.profiles) and refuse a method the simulator does not model."""
    profile = parse_profile(label)
    if profile.method not in SIMULATED_METHODS:
        raise ValueError(
            f"speculation profile {profile.label!r} (method {profile.method}) cannot be simulated: the simulator "
            f"models DSpark and ngram only; use one of {', '.join(SIMULATED_PROFILE_LABELS)}"
        )
    return profile


@dataclass
class EngineConfig:
    """One simulated replica."""

    gpu: str = DEFAULT_GPU
    model: str = DEFAULT_MODEL
    profile: str = "off"
    drafter_family: str = "dspark"  # DSpark profiles' acceptance presets: "dspark" or "dflash" (ngram has its own)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    # vLLM `num_speculative_tokens_per_batch_size`: ((start_bs, end_bs, K), ...) inclusive, keyed on #scheduled reqs.
    spec_k_table: tuple[tuple[int, int, int], ...] | None = None
    kv_capacity_tokens: int | None = None  # override the cost model's estimate
    # Structural perturbations of the simulated truth, for bench/control_sweep.py --sensitivity: ways the
    # machine can differ from what the controller's model assumes. The defaults are that model's assumptions.
    # the drafter's pass (on ngram: the proposer's CPU search) costs this multiple of drafters.costmodel's
    drafter_cost_scale: float = 1.0
    k0_pays_drafter: bool = False  # a step capped at K=0 still runs the drafter (vLLM 0.32's V2 runner, no plugin)
    # (workload, logit change per simulated minute): of each request's acceptance on a block drafter,
    # of the workload's whole-match rate on ngram
    acceptance_drift: tuple[tuple[str, float], ...] = ()
    # ngram only: (workload, factor) on how often its lookup finds a match; (workload, other) makes a
    # workload's text behave as another's under prompt lookup (e.g. chat that quotes its context as code does)
    ngram_propose_scale: tuple[tuple[str, float], ...] = ()
    ngram_behaves_as: tuple[tuple[str, str], ...] = ()
    # Adaptive verification prices its budget with cost tables profiled at
    # start-up at this context (vLLM 0.32: dummy runs at
    # VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN, 8192 by default) instead
    # of at the batch's real context. None: at the real context (the model).
    av_profile_context: float | None = None
    seed: int = 0
    name: str = "sim-0"

    def __post_init__(self) -> None:
        simulated_profile(self.profile)  # refuse an unknown or unsimulated label now

    @property
    def profile_obj(self) -> Profile:
        return simulated_profile(self.profile)


def vllm_batch_k_table(block_size: int, max_num_seqs: int = 1024) -> tuple[tuple[int, int, int], ...]:
    """A `num_speculative_tokens_per_batch_size` table in the style of vLLM's docs/vllm-ascend example
    ([[1,32,3],[33,64,2],[65,128,1]] for K=3): full K up to 32 seqs, ~2/3 K to 64, ~1/3 K to 128, then 0."""
    k = block_size
    return ((1, 32, k), (33, 64, max(1, round(2 * k / 3))), (65, 128, max(1, round(k / 3))), (129, max_num_seqs, 0))


def lookup_k_table(table: tuple[tuple[int, int, int], ...], num_reqs: int, k_max: int) -> int:
    """vLLM semantics: inclusive ranges from 1; gaps and tail carry the previous K; capped at k_max."""
    k = k_max
    for start, end, kk in table:
        if num_reqs >= start:
            k = kk
        if start <= num_reqs <= end:
            break
    return max(0, min(k, k_max))


class EngineRequest:
    """A request inside the simulated engine (counts only; no text)."""

    __slots__ = (
        "id", "tenant", "workload", "prompt_tokens", "max_tokens", "max_draft", "min_confidence", "max_batch", "schedule",
        "arrival_s",
        "prefilled", "output", "first_token_s", "last_token_s", "finish_s", "finished", "finish_reason",
        "spec_steps", "draft_tokens", "accepted_tokens", "accepted_hist", "accept", "logit_accept", "preset", "user", "replica",
        "admitted_s", "preemptions", "_recompute", "natural_stop",
    )

    def __init__(self, id: str, prompt_tokens: int, max_tokens: int, workload: str = "chat", tenant: str = "default",
                 max_draft: int | None = None, min_confidence: float | None = None, arrival_s: float | None = None,
                 user: Any = None, natural_stop: bool = False, max_batch: int | None = None,
                 schedule: Schedule | None = None):
        self.id = id
        self.max_batch = max_batch  # specgate_max_batch: no drafting in steps with more requests
        self.schedule = schedule  # specgate_schedule: batch -> draft length (contract.knobs)
        self.natural_stop = natural_stop  # True: the model "emits EOS" at max_tokens (finish_reason stop)
        self.tenant = tenant
        self.workload = workload
        self.prompt_tokens = max(1, int(prompt_tokens))
        self.max_tokens = max(1, int(max_tokens))
        self.max_draft = max_draft
        self.min_confidence = min_confidence
        self.arrival_s = arrival_s
        self.prefilled = 0
        self.output = 0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.finished = False
        self.finish_reason: str | None = None
        self.spec_steps = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_hist: list[int] | None = None  # [j]: its proposal steps that accepted exactly j (vLLM's histogram)
        self.accept: np.ndarray | None = None
        self.logit_accept: np.ndarray | None = None
        self.preset: acc.WorkloadPreset | NgramPreset | None = None  # the replica's method decides which
        self.user = user  # opaque (the HTTP server hangs its stream queue here)
        self.replica: str | None = None
        self.admitted_s: float | None = None
        self.preemptions = 0
        self._recompute = 0  # tokens to re-prefill after preemption (prompt + generated)

    @property
    def prefill_target(self) -> int:
        return self.prompt_tokens + self._recompute

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def context(self) -> int:
        return self.prefilled + (self.output if not self._recompute else 0)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.spec_steps if self.spec_steps else 1.0

    def spec_summary(self) -> dict[str, float | int]:
        """vLLM `metrics.speculative_decoding` (summary level) for this request."""
        return {
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "draft_acceptance_rate": round(self.accepted_tokens / self.draft_tokens, 4) if self.draft_tokens else 0.0,
            "num_spec_steps": self.spec_steps,
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_draft_tokens": self.accepted_tokens,
        }


@dataclass
class StepOutcome:
    """What one engine step did; tokens become visible at ``start_s + duration_s``."""

    start_s: float
    duration_s: float
    emissions: list[tuple[EngineRequest, int]]  # (request, tokens emitted this step)
    finished: list[EngineRequest]
    num_tokens: int  # tokens processed (unpadded): decode + verified drafts + prefill
    batch: int
    cost: cm.StepCost | None
    draft_time_s: float = 0.0
    host_s: float = 0.0  # the engine core's CPU time (drafters.costmodel.host_time_s + the ngram search)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


__all__ = ["EngineConfig", "EngineRequest", "StepOutcome", "vllm_batch_k_table", "lookup_k_table"]
