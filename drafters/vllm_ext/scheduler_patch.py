"""Per-request draft cap, enforced in vLLM's engine-core scheduler.

WHY the scheduler: it is the one place every speculative method passes through.
Drafts (or, under async scheduling, the `-1` placeholders standing in for drafts
the worker has not produced yet) sit in `request.spec_token_ids` until
`Scheduler.schedule()` turns them into `scheduled_spec_decode_tokens`; the model
runner (V1 and V2) verifies exactly the tokens listed there, and the stats
(`vllm:spec_decode_num_draft_tokens`, per-request `metrics.speculative_decoding`)
count exactly those. So trimming there caps ngram / EAGLE / DFlash on the V1
runner and DSpark on the V2 runner alike, saves the verification compute, and
keeps every counter consistent. The draft model itself still drafts for the
whole batch (vLLM drafts in one batched pass) as long as one request in the
step may draft; only a step drafted at K=0 changes that (point 3).

Two hooks, both idempotent and both no-ops for requests without the keys:
1. `schedule()` -- before the stock body, cut each running request's
   `spec_token_ids` to its cap. This is the main path: the stock code then
   budgets, allocates KV and schedules as if the drafter had proposed fewer
   tokens (the same path chunked prefill already uses).
2. `_update_after_schedule()` -- a safety net that runs inside `schedule()`
   after the batch is final but before `num_computed_tokens` advances: any
   capped request still scheduled with more draft slots than its cap (the
   stock "pad new decode requests to a uniform spec length" branch adds `-1`
   padding slots to freshly admitted requests) is trimmed, together with its
   scheduled token count.
3. `_update_after_schedule()` also sets the step's draft length
   (`SchedulerOutput.num_spec_tokens_to_schedule`, the K the runner drafts with
   after this step -- the field vLLM's own batch-size -> K table writes) to the
   largest cap among the scheduled requests (stock K if any is uncapped). The
   scheduler only *asks* for K=0 when every request is capped at 0; what the
   runner then skips is the runner's and the drafter's business (vLLM 0.32):
   the V1 ngram proposer proposes nothing; V1 EAGLE runs its first forward
   (which writes its draft KV) and returns no drafts; V1 DFlash and the V2
   runner's DFlash/DSpark would still run their full query pass (V2 DFlash
   ignores K and only masks the drafts). `draft_skip.py` makes those two run
   their context pass only at K=0 (the draft KV cache stays complete for later
   steps), so no drafter forward runs; vLLM 0.33's V2 DSpark skips its query
   pass natively (source reading) and is left alone. Either way the next
   step's verification is a plain decode step: the requests' drafts are
   trimmed to 0 here, so the runner samples without rejection sampling. That
   is what makes `specgate_max_draft: 0` for every tenant on a replica cost
   about what an `off` replica costs (plus the context pass, a K/V projection
   of the step's tokens), instead of paying a drafter whose drafts are all
   thrown away. See docs/vllm_ext.md.
4. `specgate_max_batch: B` makes a request's cap 0 in any step that runs more
   than B requests (counted as the running requests for the pre-schedule trim,
   as the step's scheduled requests for the safety net and the step's K). The
   controller sends it as its per-tenant "compute-bound above B" verdict, so
   that a load step switches drafting off at the very next engine step -- for
   requests already in flight too, which per-request caps chosen at admission
   cannot reach.
5. `specgate_schedule: [B1, K1, B2, K2, ...]` generalises both: a request's
   cap in a step of b requests is the K of the first pair with B >= b, 0 above
   the last (`contract.knobs.schedule_cap`; b counted as for max_batch) --
   vLLM's `num_speculative_tokens_per_batch_size` lookup, per request instead
   of per engine, so each tenant drafts by its own schedule in the same step.
   Beside max_draft / max_batch it is one more cap: the smallest wins.
Lossless: verification of fewer drafts is still exact rejection sampling, so
greedy output is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from contract.knobs import STOCK, RequestKnobs, parse_knobs, step_draft_len

from .guard import patch_once, run_guarded

logger = logging.getLogger("specgate.vllm_ext")

_MARK = "_specgate_draft_cap_patched"
_REQ_ATTR = "_specgate_knobs"


def knobs_for(request: Any) -> RequestKnobs:
    """Parsed knobs of a vLLM `Request`, cached on it (parsed and warned about once)."""
    cached = getattr(request, _REQ_ATTR, None)
    if cached is not None:
        return cached
    params = getattr(request, "sampling_params", None)
    knobs = parse_knobs(getattr(params, "extra_args", None)) if params is not None else STOCK
    if knobs.errors:
        logger.warning(
            "specgate: ignoring invalid knob(s) on request %s (it runs as stock vLLM): %s",
            getattr(request, "request_id", "?"),
            "; ".join(knobs.errors),
        )
    try:
        setattr(request, _REQ_ATTR, knobs)
    except AttributeError:  # a Request with __slots__ in some future version: parse each time
        pass
    return knobs


def trim_running_drafts(running: list[Any]) -> int:
    """Cut each running request's pending drafts to its cap; returns tokens removed.

    Assigns a new list instead of mutating: under async scheduling every request
    shares one read-only placeholder list.
    """
    removed = 0
    batch = len(running)
    for request in running:
        spec = request.spec_token_ids
        if not spec:
            continue
        cap = knobs_for(request).cap_at(batch)
        if cap is not None and len(spec) > cap:
            removed += len(spec) - cap
            request.spec_token_ids = list(spec[:cap])
    return removed


def enforce_caps_on_output(requests: dict[str, Any], scheduler_output: Any) -> int:
    """Trim scheduled draft slots above a request's cap in a final SchedulerOutput.

    Keeps `num_scheduled_tokens` / `total_num_scheduled_tokens` consistent with
    the shortened draft lists. Returns the number of slots removed.
    """
    spec_tokens: dict[str, list[int]] = scheduler_output.scheduled_spec_decode_tokens
    removed = 0
    batch = len(scheduler_output.num_scheduled_tokens)
    for req_id in list(spec_tokens):
        request = requests.get(req_id)
        if request is None:
            continue
        cap = knobs_for(request).cap_at(batch)
        tokens = spec_tokens[req_id]
        if cap is None or len(tokens) <= cap:
            continue
        excess = len(tokens) - cap
        if cap == 0:
            del spec_tokens[req_id]
        else:
            spec_tokens[req_id] = list(tokens[:cap])
        scheduler_output.num_scheduled_tokens[req_id] -= excess
        scheduler_output.total_num_scheduled_tokens -= excess
        removed += excess
    return removed


def lower_step_draft_len(requests: dict[str, Any], scheduler_output: Any) -> int:
    """Write `knobs.step_draft_len` into the SchedulerOutput; returns the K it holds now."""
    stock = getattr(scheduler_output, "num_spec_tokens_to_schedule", 0) or 0
    if stock <= 0 or not scheduler_output.num_scheduled_tokens:
        return stock
    # A request the scheduler does not know (cannot happen in stock vLLM) counts as uncapped.
    batch = len(scheduler_output.num_scheduled_tokens)
    caps = (knobs_for(requests[r]).cap_at(batch) if r in requests else None for r in scheduler_output.num_scheduled_tokens)
    k = step_draft_len(caps, stock)
    if k < stock:
        scheduler_output.num_spec_tokens_to_schedule = k
    return k


def install(scheduler_cls: type) -> bool:
    """Patch `scheduler_cls` (vLLM's base Scheduler) in place. Idempotent."""

    def wrap_schedule(orig_schedule):
        def schedule(self, *args, **kwargs):
            if not getattr(self, "_specgate_announced", False):
                self._specgate_announced = True
                logger.info(
                    "specgate: per-request draft cap active in %s (num_speculative_tokens=%s)",
                    type(self).__name__,
                    self.num_spec_tokens,
                )
            if self.num_spec_tokens and self.running:
                run_guarded("draft-cap trim", 0, trim_running_drafts, self.running)
            return orig_schedule(self, *args, **kwargs)

        return schedule

    def wrap_update_after(orig_update_after):
        def _update_after_schedule(self, scheduler_output):
            if scheduler_output.scheduled_spec_decode_tokens:
                run_guarded("draft-cap enforcement", 0, enforce_caps_on_output, self.requests, scheduler_output)
            # Before the stock body: the async scheduler sizes next step's draft
            # placeholders from this field there.
            run_guarded("step draft length", 0, lower_step_draft_len, self.requests, scheduler_output)
            return orig_update_after(self, scheduler_output)

        return _update_after_schedule

    return patch_once(scheduler_cls, _MARK, {"schedule": wrap_schedule, "_update_after_schedule": wrap_update_after})
