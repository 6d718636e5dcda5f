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
   ``specgate_max_draft`` and its ``specgate_schedule`` entry for the step's
   batch -- 0 in a step with more requests than its ``specgate_max_batch`` --,
   remaining tokens - 1: ``contract.knobs.cap_at``, as the plugin).  On adaptive-verification
   (``-av``) profiles, confidence-head cumulative confidences are drawn, the
   draft is cut at the first position below the request's
   ``specgate_min_confidence``, and only the global top-B slots are verified;
   other profiles compute no confidences and ignore the floor (exactly what
   ``drafters.vllm_ext`` can do on real vLLM).  Accepted prefix ~ Bernoulli
   chain; emitted = accepted + 1 (bonus token).  On ngram profiles a request
   proposes only when its prompt lookup matches, a copy of up to K tokens
   truncated to its cap, accepted whole or left early (``ngram_speculation``,
   ``ngram_acceptance``).
3. Duration = drafter time + verify-step roofline over (decode + verified
   drafts + prefill chunk) tokens, and the engine core's CPU time
   (``drafters.costmodel.host_time_s``: per step, per scheduled request, per
   request verifying drafts; on ngram the proposer's search over every
   sampling request's context): added to the GPU's time on ngram replicas,
   which vLLM schedules synchronously, overlapped with it (the longer of the
   two) elsewhere (``costmodel.step_wall_time_s``).  The step's K is the profile's block, cut by
   vLLM's batch-size->K table when configured and by ``drafters.vllm_ext`` to
   the largest ``specgate_max_draft`` among the scheduled requests (stock if
   any is uncapped).  Whenever that K > 0 the DSpark drafter runs its parallel
   pass over the *full block* for every decoding request (vLLM's V2 runner
   truncates the drafts afterwards), so a per-request cap saves verification,
   not drafting; when K = 0 -- every scheduled request capped at 0 -- the
   drafter's pass is skipped (vLLM's "K=0" path).  ngram has no drafter pass
   on the GPU; its CPU search runs whenever K > 0 (at K = 0 the plugin skips
   it) and costs host time.

Counters follow vLLM's /metrics semantics (``EngineCounters``): a "draft" is
one request-step with >= 1 drafted token; drafted tokens include ones
trimmed by adaptive verification (they count as rejected).

This module is the scheduler and the step loop; the records it reads and
writes live in ``engine_types`` (config, requests, step outcome) and
``counters`` (counters, histograms), the speculation draw of step 2 in
``speculation``.  All of them are re-exported here.

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

from dataclasses import replace

import numpy as np

from .. import acceptance as acc
from .. import costmodel as cm
from contract.knobs import K0_SKIPS, cap_at, step_draft_len
from contract.vllm_metrics import add_step
from .counters import (E2E_BUCKETS, ITER_TOKEN_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, BucketHistogram,
                       EngineCounters)
from .engine_types import EngineConfig, EngineRequest, StepOutcome, lookup_k_table, vllm_batch_k_table
from .ngram_acceptance import NgramPreset, get_preset as ngram_preset
from .ngram_speculation import draw_ngram_speculation
from .speculation import SpecDraws, draw_speculation


class ReplicaEngine:
    """Continuous-batching engine model of one vLLM replica (see module docstring)."""

    def __init__(self, config: EngineConfig, rng: np.random.Generator | None = None):
        self.config = config
        self.gpu = cm.get_gpu(config.gpu)
        self.model = cm.get_model(config.model)
        self.profile = config.profile_obj
        self.ngram = self.profile.method == "ngram"
        self.rng = rng if rng is not None else np.random.default_rng(config.seed)
        self.kv_capacity = config.kv_capacity_tokens or cm.kv_capacity_tokens(
            self.gpu, self.model, config.gpu_memory_utilization)
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self.counters = EngineCounters()
        self.last_cost: cm.StepCost | None = None
        self.last_step: StepOutcome | None = None
        self._kv_used = 0

    def engine_fixes(self) -> frozenset[str]:
        """What the replica's plugin would list in `specgate_ext_info{engine_fixes}`:
        the K=0 drafter skip of its method (contract.knobs.K0_SKIPS), unless the truth
        is an engine that runs the drafter at K=0 anyway (`k0_pays_drafter`), as the
        plugin reports an engine whose sources it did not verify."""
        site = K0_SKIPS.get(self.profile.method) if self.profile.speculative else None
        return frozenset({site}) if site and not self.config.k0_pays_drafter else frozenset()

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

    def _drift(self, workload: str, now: float) -> float:
        """Logits a workload's acceptance has moved by ``now`` (``EngineConfig.acceptance_drift``)."""
        return sum(rate for w, rate in self.config.acceptance_drift if w == workload) * now / 60.0

    def _ngram_truth(self, workload: str, now: float) -> NgramPreset:
        """How prompt lookup behaves for ``workload``'s requests admitted at ``now``: its preset,
        under the ngram perturbations of ``EngineConfig`` (the defaults leave it as calibrated)."""
        cfg = self.config
        preset = replace(ngram_preset(dict(cfg.ngram_behaves_as).get(workload, workload)), name=workload)
        scale = float(np.prod([f for w, f in cfg.ngram_propose_scale if w == workload]))
        drift = self._drift(workload, now)
        if scale != 1.0:
            preset = replace(preset, propose_rate=min(1.0, preset.propose_rate * scale))
        if drift:
            whole = min(max(preset.whole_match, 1e-6), 1.0 - 1e-6)
            preset = replace(preset, whole_match=float(1.0 / (1.0 + np.exp(-(np.log(whole / (1.0 - whole)) + drift)))))
        return preset

    def add_request(self, req: EngineRequest, now: float) -> None:
        if self.ngram:
            req.preset = self._ngram_truth(req.workload, now)  # the lookup's behaviour: no per-request draw
        elif req.preset is None:
            req.preset = acc.get_preset(req.workload, self.config.drafter_family)
        if req.accept is None and not self.ngram:
            draw = acc.sample_request(req.preset, self.rng)
            req.accept, req.logit_accept = draw.accept, draw.logit_accept
            drift = self._drift(req.workload, now)
            if drift:
                # A workload whose drafts get better or worse as the trace goes on.
                req.logit_accept = req.logit_accept + drift
                req.accept = 1.0 / (1.0 + np.exp(-req.logit_accept))
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
                cap = cap_at(r.max_draft, r.max_batch, running_now, r.schedule)
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
        step_caps = [cap_at(r.max_draft, r.max_batch, n_sched, r.schedule) for r in decode]
        cap_list = [k if c is None else min(k, c) for k, c in zip(cap_list, step_caps)]
        k_step = step_draft_len(step_caps + [cap_at(r.max_draft, r.max_batch, n_sched, r.schedule) for r, _ in prefill], k_step)
        block = self.profile.block_size  # the drafter's parallel pass always covers the whole block

        # ---------------- speculation (vectorised over decoding requests; see speculation.py)
        ctx = self._mean_ctx(decode, prefill)
        spec: SpecDraws | None = None
        draft_time = 0.0
        caps = np.minimum(np.asarray(cap_list, dtype=np.int64), k_step)  # batch-size table: K by #scheduled
        def pass_s(context: float) -> float:  # the drafter's pass at a context (the truth, or AV's belief)
            return cfg.drafter_cost_scale * cm.drafter_time_s(self.gpu, self.model, len(decode), block, context)

        # The drafter proposes a full block for every decoding request in the batch (vLLM drafts
        # batch-wide); per-request caps and the step's K only trim what is verified. A step capped
        # at K=0 skips the pass, unless the truth says the runner drafts anyway (k0_pays_drafter).
        # ngram drafts on the CPU (host time below), not on the GPU.
        searching = bool(decode) and (k_step > 0 or bool(block and cfg.k0_pays_drafter))
        if searching and not self.ngram:
            draft_time = pass_s(ctx)
        if k_step > 0 and decode and self.ngram:
            spec = draw_ngram_speculation(decode, caps, k_propose=self._spec_cap(n_sched), rng=self.rng)
        elif k_step > 0 and decode:
            av_ctx = cfg.av_profile_context
            av_draft = None if av_ctx is None else pass_s(av_ctx)
            spec = draw_speculation(decode, prefill, caps, profile=self.profile, gpu=self.gpu, model=self.model,
                                    rng=self.rng, n_sched=n_sched, batch_ctx=ctx, draft_time_s=draft_time,
                                    av_context=av_ctx, av_draft_time_s=av_draft)

        # ---------------- time
        n_verified = int(spec.verified.sum()) if spec is not None else 0
        n_prefill = sum(c for _, c in prefill)
        num_tokens = len(decode) + n_verified + n_prefill
        cost = cm.step_breakdown(self.gpu, self.model, num_tokens, n_sched, ctx)
        verifying = int(np.count_nonzero(spec.drafted)) if spec is not None else 0  # requests with drafts scheduled
        host = cm.host_time_s(n_sched, verifying)
        if searching and self.ngram:
            # vLLM's proposer searches every request that samples this step: the decoding ones
            # and those whose prefill completes (it skips the rest), each over its whole context.
            sampling = decode + [r for r, chunk in prefill if r.prefilled + chunk >= r.prefill_target]
            host += cfg.drafter_cost_scale * cm.ngram_propose_time_s(len(sampling),
                                                                     float(sum(r.context for r in sampling)))
        duration = cm.step_wall_time_s(cost.time_s + draft_time, host, self.profile.method)
        end = now + duration

        # ---------------- apply
        c = self.counters
        generated_before = c.generation_tokens
        emissions: list[tuple[EngineRequest, int]] = []
        finished: list[EngineRequest] = []
        itl_samples: list[float] = []
        emitted_by_idx = np.ones(len(decode), dtype=np.int64)
        if spec is not None:
            drafted_l, accepted_l = spec.drafted.tolist(), spec.accepted.tolist()
            for j, i in enumerate(spec.idx):
                r = decode[i]
                d, a = drafted_l[j], accepted_l[j]
                if d > 0:
                    r.spec_steps += 1
                    r.draft_tokens += d
                    r.accepted_tokens += a
                    h = r.accepted_hist
                    if h is None or len(h) <= a:
                        h = r.accepted_hist = (h or []) + [0] * (a + 1 - len(h or []))
                    h[a] += 1
                    c.num_drafts += 1
                    c.num_draft_tokens += d
                    c.num_accepted_tokens += a
                emitted_by_idx[i] = a + 1
            c.verified_draft_tokens += n_verified
            if len(spec.accepted):
                kmax = spec.kmax
                hist = np.bincount(spec.accepted, minlength=kmax + 1)  # accepted prefix lengths
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
        # vLLM's iteration_tokens: prompt tokens computed + tokens generated in
        # the step (v1/metrics/loggers.py) -- emitted tokens, not the forward
        # work: rejected and trimmed drafts are not in it.
        c.iteration_tokens.observe(n_prefill + c.generation_tokens - generated_before)
        add_step(c.step_cells, n_sched, num_tokens, n_verified, k_step > 0, duration)
        c.steps += 1
        c.busy_s += duration
        self.last_cost = cost
        out = StepOutcome(now, duration, emissions, finished, num_tokens, n_sched, cost, draft_time, host)
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
