"""Per-request confidence floor inside vLLM's DSpark adaptive verification (V2 runner).

Where: the model-runner worker. `GPUModelRunner.add_requests` (V2; the CPU V2
runner subclasses it) is wrapped to remember each new request's
`specgate_min_confidence`; `_remove_request` forgets it.
`AdaptiveVerificationManager.get_num_tokens` -- the host-side step that
chooses the global draft budget from the (one step stale) confidences -- is
wrapped so that, before the stock cost model runs, every floored request's
eligible draft slots are cut at its threshold (`confidence.floor_draft_counts`).
The stock code then stashes those shortened counts as the per-request
capacities that the GPU admission kernel (`_assign_draft_token_budget`) ranks
within, so the budget and the admitted slots always agree (no extra host sync,
CUDA graphs untouched).

Without adaptive verification vLLM computes no confidences at all (the DSpark
confidence head only runs under adaptive verification, and the drafts of the
V2 runner live on the GPU until verified), so a floor cannot be honoured there:
such a replica advertises only `max_draft`, and a `specgate_min_confidence`
that reaches it anyway is ignored with a warning (request runs as stock).
"""

from __future__ import annotations

import logging
from typing import Any

from contract.knobs import parse_knobs

from .guard import patch_once, run_guarded

logger = logging.getLogger("specgate.vllm_ext")

_MARK = "_specgate_confidence_floor_patched"
_FLOORS_ATTR = "_specgate_floors"


def _floors(runner: Any) -> dict[str, float]:
    floors = getattr(runner, _FLOORS_ATTR, None)
    if floors is None:
        floors = {}
        setattr(runner, _FLOORS_ATTR, floors)
    return floors


def install_runner(runner_cls: type) -> bool:
    """Wrap the V2 model runner's request bookkeeping. Idempotent."""

    def _record_floors(self, scheduler_output) -> None:
        manager = getattr(self, "adaptive_verification", None)
        for new_req in scheduler_output.scheduled_new_reqs:
            params = getattr(new_req, "sampling_params", None)
            knobs = parse_knobs(getattr(params, "extra_args", None)) if params is not None else None
            if knobs is None or knobs.min_confidence is None:
                continue
            if manager is None:
                logger.warning(
                    "specgate: request %s sets specgate_min_confidence but this replica runs without "
                    "DSpark adaptive verification, which is the only place vLLM computes draft "
                    "confidences; the threshold is ignored (the replica does not advertise it)",
                    new_req.req_id,
                )
                continue
            if knobs.min_confidence > 0.0:
                _floors(manager)[new_req.req_id] = knobs.min_confidence

    def wrap_add(orig_add):
        def add_requests(self, scheduler_output):
            result = orig_add(self, scheduler_output)
            run_guarded("confidence-floor bookkeeping", None, _record_floors, self, scheduler_output)
            return result

        return add_requests

    def wrap_remove(orig_remove):
        def _remove_request(self, req_id):
            manager = getattr(self, "adaptive_verification", None)
            if manager is not None:
                _floors(manager).pop(req_id, None)
            return orig_remove(self, req_id)

        return _remove_request

    return patch_once(runner_cls, _MARK, {"add_requests": wrap_add, "_remove_request": wrap_remove})


def install_manager(manager_cls: type) -> bool:
    """Wrap AdaptiveVerificationManager.get_num_tokens with the floor. Idempotent."""
    if manager_cls.__dict__.get(_MARK):
        return False  # before importing torch: a second install costs nothing
    import torch

    from .confidence import apply_floor_to_batch, floor_draft_counts

    def _floored(self, num_tokens_per_req, draft_tokens):
        floors: dict[str, float] | None = getattr(self, _FLOORS_ATTR, None)
        if floors:
            req_ids = [r for r in num_tokens_per_req if r in floors and draft_tokens.get(r)]
            if req_ids:
                slots = [self.req_states.req_id_to_index[r] for r in req_ids]
                stale = self._stale_confidences[self._stale_idx].np[slots]
                counts = floor_draft_counts(
                    torch.from_numpy(stale.copy()),
                    torch.tensor([len(draft_tokens[r]) for r in req_ids], dtype=torch.int32),
                    torch.tensor([floors[r] for r in req_ids], dtype=torch.float64),
                )
                return apply_floor_to_batch(num_tokens_per_req, draft_tokens, req_ids, counts.tolist())
        return num_tokens_per_req, draft_tokens

    def wrap_get(orig_get):
        def get_num_tokens(self, num_tokens_per_req, draft_tokens):
            num_tokens_per_req, draft_tokens = run_guarded(
                "confidence floor", (num_tokens_per_req, draft_tokens), _floored, self, num_tokens_per_req, draft_tokens
            )
            return orig_get(self, num_tokens_per_req, draft_tokens)

        return get_num_tokens

    return patch_once(manager_cls, _MARK, {"get_num_tokens": wrap_get})
