"""The simulated vLLM engine: one replica's continuous-batching step loop.

Why one class for both uses: the discrete-event simulator (``des.py``, virtual
time) and the HTTP sim replica (``server.py``, real time) must behave
identically, so both drive this engine and only differ in how they wait for a
step's duration.  It is a *simulation*: there is no model, tokens are
counts, acceptance is drawn from ``drafters.acceptance`` and step time comes
from ``drafters.costmodel``.

Per ``step(now)`` (mirrors vLLM V1's scheduler, simplified):

1. Schedule running requests first (decode = 1 token + its drafts, or the
   next prefill chunk), then admit waiting requests FCFS while
   ``max_num_seqs``, the per-step token budget ``max_num_batched_tokens``
   (chunked prefill) and KV-cache capacity allow.  If decoding would overflow
   the KV cache, the newest running request is preempted (recompute).
2. Speculation for decoding requests: cap k_r = min(profile block size,
   vLLM batch-size->K table entry if configured, request's
   ``specgate_max_draft`` -- 0 in a step with more requests than its
   ``specgate_max_batch`` --, remaining tokens - 1).  On adaptive-verification
   (``-av``) profiles, confidence-head cumulative confidences are drawn, the
   draft is cut at the first position below the request's
   ``specgate_min_confidence``, and only the global top-B slots are verified;
   other profiles compute no confidences and ignore the floor (exactly what
   ``drafters.vllm_ext`` can do on real vLLM).  Accepted prefix ~ Bernoulli
   chain; emitted = accepted + 1 (bonus token).
3. Duration = drafter time + verify-step roofline over (decode + verified
   drafts + prefill chunk) tokens.  The step's K is the profile's block, cut by
   vLLM's batch-size->K table when configured and by ``drafters.vllm_ext`` to
   the largest ``specgate_max_draft`` among the scheduled requests (stock if
   any is uncapped).  Whenever that K > 0 the DSpark drafter runs its parallel
   pass over the *full block* for every decoding request (vLLM's V2 runner
   truncates the drafts afterwards), so a per-request cap saves verification,
   not drafting; when K = 0 -- every scheduled request capped at 0 -- the
   drafter's pass is skipped (vLLM's "K=0" path).

Counters follow vLLM's /metrics semantics (``EngineCounters``): a "draft" is
one request-step with >= 1 drafted token; drafted tokens include ones
trimmed by adaptive verification (they count as rejected).

Usage::

    from drafters.sim.engine import EngineConfig, ReplicaEngine, EngineRequest
    eng = ReplicaEngine(EngineConfig(gpu="h200", model="qwen3-8b", profile="dspark-b8"))
    eng.add_request(EngineRequest("r1", prompt_tokens=300, max_tokens=200, workload="gsm8k"), now=0.0)
    t = 0.0
    while eng.has_work():
        out = eng.step(t)           # mutates state; tokens become visible at t + out.duration_s
        t += out.duration_s
    eng.counters.acceptance_length
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import acceptance as acc
from .. import costmodel as cm
from ..profiles import Profile, parse_profile
from ..vllm_ext.knobs import cap_at, step_draft_len

# Histogram buckets (vLLM's, trimmed).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0)
ITER_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class BucketHistogram:
    """Cumulative-bucket histogram (Prometheus semantics) with vectorised observe."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = np.asarray(bounds, dtype=float)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self.sum += float(value)
        self.count += 1

    def observe_many(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        np.add.at(self.counts, np.searchsorted(self.bounds, values, side="left"), 1)
        self.sum += float(np.sum(values))
        self.count += int(len(values))

    def cumulative(self) -> list[tuple[str, float]]:
        """[(le, cumulative count)] including '+Inf'."""
        cum = np.cumsum(self.counts)
        out = [(_fmt(b), float(c)) for b, c in zip(self.bounds, cum[:-1])]
        out.append(("+Inf", float(cum[-1])))
        return out


def _fmt(b: float) -> str:
    return str(float(b))


@dataclass
class EngineConfig:
    """One simulated replica."""

    gpu: str = "h200"
    model: str = "qwen3-8b"
    profile: str = "off"
    drafter_family: str = "dspark"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    # vLLM `num_speculative_tokens_per_batch_size`: ((start_bs, end_bs, K), ...) inclusive, keyed on #scheduled reqs.
    spec_k_table: tuple[tuple[int, int, int], ...] | None = None
    kv_capacity_tokens: int | None = None  # override the cost model's estimate
    seed: int = 0
    name: str = "sim-0"

    @property
    def profile_obj(self) -> Profile:
        return parse_profile(self.profile)


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
        "id", "tenant", "workload", "prompt_tokens", "max_tokens", "max_draft", "min_confidence", "max_batch", "arrival_s",
        "prefilled", "output", "first_token_s", "last_token_s", "finish_s", "finished", "finish_reason",
        "spec_steps", "draft_tokens", "accepted_tokens", "accept", "logit_accept", "preset", "user", "replica",
        "admitted_s", "preemptions", "_recompute", "natural_stop",
    )

    def __init__(self, id: str, prompt_tokens: int, max_tokens: int, workload: str = "chat", tenant: str = "default",
                 max_draft: int | None = None, min_confidence: float | None = None, arrival_s: float | None = None,
                 user: Any = None, natural_stop: bool = False, max_batch: int | None = None):
        self.id = id
        self.max_batch = max_batch  # specgate_max_batch: no drafting in steps with more requests
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
        self.accept: np.ndarray | None = None
        self.logit_accept: np.ndarray | None = None
        self.preset: acc.WorkloadPreset | None = None
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
class EngineCounters:
    """Cumulative counters with vLLM /metrics meaning."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(acc.MAX_POSITIONS, dtype=np.int64))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    request_success: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    busy_s: float = 0.0
    verified_draft_tokens: int = 0
    iteration_tokens: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITER_TOKEN_BUCKETS))
    ttft: BucketHistogram = field(default_factory=lambda: BucketHistogram(TTFT_BUCKETS))
    itl: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITL_BUCKETS))
    tpot: BucketHistogram = field(default_factory=lambda: BucketHistogram(ITL_BUCKETS))
    e2e: BucketHistogram = field(default_factory=lambda: BucketHistogram(E2E_BUCKETS))

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts, exactly as vLLM's spec-decode logger computes it."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def snapshot(self) -> dict[str, float]:
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens, "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens, "num_preemptions": self.num_preemptions,
            "steps": self.steps, "busy_s": self.busy_s, "iteration_tokens_sum": self.iteration_tokens.sum,
            "verified_draft_tokens": self.verified_draft_tokens,
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

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class ReplicaEngine:
    """Continuous-batching engine model of one vLLM replica (see module docstring)."""

    def __init__(self, config: EngineConfig, rng: np.random.Generator | None = None):
        self.config = config
        self.gpu = cm.get_gpu(config.gpu)
        self.model = cm.get_model(config.model)
        self.profile = config.profile_obj
        self.rng = rng if rng is not None else np.random.default_rng(config.seed)
        self.kv_capacity = config.kv_capacity_tokens or cm.kv_capacity_tokens(
            self.gpu, self.model, config.gpu_memory_utilization)
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self.counters = EngineCounters()
        self.last_cost: cm.StepCost | None = None
        self.last_step: StepOutcome | None = None
        self._kv_used = 0

    # ------------------------------------------------------------------ state
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self._kv_used / self.kv_capacity) if self.kv_capacity else 0.0

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def mean_context(self) -> float:
        return self._kv_used / len(self.running) if self.running else 0.0

    def add_request(self, req: EngineRequest, now: float) -> None:
        if req.preset is None:
            req.preset = acc.get_preset(req.workload, self.config.drafter_family)
        if req.accept is None:
            draw = acc.sample_request(req.preset, self.rng)
            req.accept, req.logit_accept = draw.accept, draw.logit_accept
        req.replica = self.config.name
        if req.arrival_s is None:
            req.arrival_s = now
        self.waiting.append(req)

    def abort(self, req_id: str, now: float) -> EngineRequest | None:
        """Drop a request (client went away); frees its KV."""
        for lst in (self.running, self.waiting):
            for i, r in enumerate(lst):
                if r.id == req_id:
                    del lst[i]
                    if lst is self.running:
                        self._kv_used -= r.context
                    r.finished, r.finish_reason, r.finish_s = True, "abort", now
                    self.counters.request_success["abort"] = self.counters.request_success.get("abort", 0) + 1
                    return r
        return None

    # ------------------------------------------------------------------ step
    def _spec_cap(self, num_reqs: int) -> int:
        k = self.profile.block_size
        if k and self.config.spec_k_table:
            k = lookup_k_table(self.config.spec_k_table, num_reqs, k)
        return k

    def step(self, now: float) -> StepOutcome:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        decode: list[EngineRequest] = []
        prefill: list[tuple[EngineRequest, int]] = []
        k_base = self._spec_cap(max(1, len(self.running)))

        # Reserve KV for decode growth; preempt newest if it would overflow.
        while self.running:
            growth = sum(1 + k_base if not r.in_prefill else 0 for r in self.running)
            if self._kv_used + growth <= self.kv_capacity or len(self.running) == 1:
                break
            victim = self.running.pop()
            self._kv_used -= victim.context
            victim._recompute = victim.output
            victim.prefilled = 0
            victim.preemptions += 1
            self.counters.num_preemptions += 1
            self.waiting.insert(0, victim)

        # Running requests first, each with its draft slots reserved (as vLLM's scheduler does),
        # then new requests from the waiting queue.
        cap_list: list[int] = []
        running_now = len(self.running)  # the plugin's pre-schedule trim counts the running requests
        for r in self.running:
            if budget <= 0:
                break
            if r.in_prefill:
                chunk = min(r.prefill_target - r.prefilled, budget)
                prefill.append((r, chunk))
                budget -= chunk
            else:
                cap = cap_at(r.max_draft, r.max_batch, running_now)
                k = k_base if cap is None else min(k_base, cap)
                k = max(0, min(k, r.max_tokens - r.output - 1, budget - 1))
                decode.append(r)
                cap_list.append(k)
                budget -= 1 + k
        # Admission (FCFS) of waiting requests.
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            need = r.prefill_target - r.prefilled
            if self._kv_used + need > self.kv_capacity and self.running:
                break
            self.waiting.pop(0)
            self.running.append(r)
            if r.admitted_s is None:
                r.admitted_s = now
            chunk = min(need, budget)
            prefill.append((r, chunk))
            budget -= chunk

        n_sched = len(decode) + len(prefill)
        if n_sched == 0:
            out = StepOutcome(now, 0.0, [], [], 0, 0, None)
            self.last_step = out
            return out
        k_step = self._spec_cap(n_sched)
        # drafters.vllm_ext's safety net: caps at the step's final batch (a request
        # above its max_batch drafts nothing), then the step drafts no more than
        # the largest cap among the scheduled requests
        # (SchedulerOutput.num_spec_tokens_to_schedule).
        step_caps = [cap_at(r.max_draft, r.max_batch, n_sched) for r in decode]
        cap_list = [k if c is None else min(k, c) for k, c in zip(cap_list, step_caps)]
        k_step = step_draft_len(step_caps + [cap_at(r.max_draft, r.max_batch, n_sched) for r, _ in prefill], k_step)
        block = self.profile.block_size  # the drafter's parallel pass always covers the whole block

        # ---------------- speculation (vectorised over decoding requests)
        drafted = verified = accepted = None
        draft_time = 0.0
        spec_idx: list[int] = []
        caps = np.minimum(np.asarray(cap_list, dtype=np.int64), k_step)  # batch-size table: K by #scheduled
        if k_step > 0 and decode:
            spec_idx = np.nonzero(caps > 0)[0].tolist()
        if spec_idx:
            sreqs = [decode[i] for i in spec_idx]
            kcap = caps[spec_idx]
            kmax = int(kcap.max())
            logits = np.stack([r.logit_accept[:kmax] for r in sreqs])
            accept_p = np.stack([r.accept[:kmax] for r in sreqs])
            sig_c = np.array([r.preset.sigma_conf for r in sreqs])[:, None]
            pos = np.arange(kmax)[None, :]
            in_cap = pos < kcap[:, None]
            conf = np.cumprod(1.0 / (1.0 + np.exp(-(logits + self.rng.normal(0.0, 1.0, logits.shape) * sig_c))), axis=1)
            # The confidence head only runs under adaptive verification (vLLM V2 DSpark), so only
            # -av replicas can honour a per-request confidence floor (as drafters/vllm_ext does).
            theta = np.array([(r.min_confidence or 0.0) if self.profile.adaptive else 0.0 for r in sreqs])[:, None]
            ok = (conf >= theta) & in_cap
            # drafted = first position that fails the threshold (or the cap)
            drafted = np.where(ok.all(axis=1), kmax, np.argmin(ok, axis=1))
            drafted = np.minimum(drafted, kcap)
            if self.profile.adaptive:
                slot_mask = pos < drafted[:, None]
                scores = conf[slot_mask]
                batch_ctx = self._mean_ctx(decode, prefill)
                nondraft = len(decode) + sum(c for _, c in prefill)
                dtime = cm.drafter_time_s(self.gpu, self.model, len(decode), block, batch_ctx)
                _, thr = acc.adaptive_verification_budget(
                    scores, n_sched, nondraft, dtime,
                    lambda n: cm.step_time_array_s(self.gpu, self.model, n, n_sched, batch_ctx))
                verified = np.where(slot_mask & (conf >= thr), 1, 0).sum(axis=1)
            else:
                verified = drafted
            fails = (self.rng.random(conf.shape) >= accept_p) | (pos >= verified[:, None])
            accepted = np.where(fails.any(axis=1), np.argmax(fails, axis=1), kmax)
            accepted = np.minimum(accepted, verified)

        if k_step > 0 and decode:
            # The drafter proposes a full block for every decoding request in the batch (vLLM drafts
            # batch-wide); per-request caps and the step's K only trim what is verified.
            draft_time = cm.drafter_time_s(self.gpu, self.model, len(decode), block, self._mean_ctx(decode, prefill))

        # ---------------- time
        n_verified = int(verified.sum()) if verified is not None else 0
        n_prefill = sum(c for _, c in prefill)
        num_tokens = len(decode) + n_verified + n_prefill
        ctx = self._mean_ctx(decode, prefill)
        cost = cm.step_breakdown(self.gpu, self.model, num_tokens, n_sched, ctx)
        duration = cost.time_s + draft_time
        end = now + duration

        # ---------------- apply
        c = self.counters
        emissions: list[tuple[EngineRequest, int]] = []
        finished: list[EngineRequest] = []
        itl_samples: list[float] = []
        emitted_by_idx = np.ones(len(decode), dtype=np.int64)
        if spec_idx:
            drafted_l, accepted_l = drafted.tolist(), accepted.tolist()
            for j, i in enumerate(spec_idx):
                r = decode[i]
                d, a = drafted_l[j], accepted_l[j]
                if d > 0:
                    r.spec_steps += 1
                    r.draft_tokens += d
                    r.accepted_tokens += a
                    c.num_drafts += 1
                    c.num_draft_tokens += d
                    c.num_accepted_tokens += a
                emitted_by_idx[i] = a + 1
            c.verified_draft_tokens += n_verified
            if accepted is not None and len(accepted):
                hist = np.bincount(accepted, minlength=kmax + 1)  # accepted prefix lengths
                c.accepted_per_pos[:kmax] += (hist[::-1].cumsum()[::-1])[1:kmax + 1]
        for i, r in enumerate(decode):
            n = min(int(emitted_by_idx[i]), r.max_tokens - r.output)
            r.output += n
            self._kv_used += n
            emissions.append((r, n))
            if r.last_token_s is not None:
                itl_samples.append(end - r.last_token_s)
            r.last_token_s = end
            c.generation_tokens += n
        for r, chunk in prefill:
            r.prefilled += chunk
            self._kv_used += chunk
            c.prompt_tokens += chunk if not r._recompute else 0
            if not r.in_prefill:
                if r._recompute:  # resumed after preemption: no new token, back to decode
                    r._recompute = 0
                    r.prefilled = r.prompt_tokens  # context = prompt + output again
                    continue
                r.output += 1
                self._kv_used += 1
                c.generation_tokens += 1
                r.first_token_s = end
                r.last_token_s = end
                c.ttft.observe(end - r.arrival_s)
                emissions.append((r, 1))
        for r, n in emissions:
            if r.output >= r.max_tokens and not r.finished:
                r.finished, r.finish_reason, r.finish_s = True, ("stop" if r.natural_stop else "length"), end
                finished.append(r)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            for r in finished:
                self._kv_used -= r.context
                c.request_success[r.finish_reason] = c.request_success.get(r.finish_reason, 0) + 1
                c.e2e.observe(end - r.arrival_s)
                if r.output > 1 and r.first_token_s is not None:
                    c.tpot.observe((end - r.first_token_s) / (r.output - 1))
        if itl_samples:
            c.itl.observe_many(np.asarray(itl_samples))
        c.iteration_tokens.observe(num_tokens)
        c.steps += 1
        c.busy_s += duration
        self.last_cost = cost
        out = StepOutcome(now, duration, emissions, finished, num_tokens, n_sched, cost, draft_time)
        self.last_step = out
        return out

    def _mean_ctx(self, decode: list[EngineRequest], prefill: list[tuple[EngineRequest, int]]) -> float:
        n = len(decode) + len(prefill)
        if not n:
            return 0.0
        total = sum(r.context for r in decode) + sum(r.prefilled + chunk / 2 for r, chunk in prefill)
        return total / n


__all__ = [
    "EngineConfig", "EngineRequest", "EngineCounters", "ReplicaEngine", "StepOutcome", "BucketHistogram",
    "vllm_batch_k_table", "lookup_k_table", "TTFT_BUCKETS", "ITL_BUCKETS", "E2E_BUCKETS", "ITER_TOKEN_BUCKETS",
]
