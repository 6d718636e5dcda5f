"""Confidence-threshold arithmetic for DSpark drafts -- PURE functions on tensors.

DSpark's confidence head (or, without trained head weights, vLLM's online
acceptance estimator) gives, per request and draft position i, the probability
c_i that draft token i is accepted given tokens < i were. The chance that the
whole prefix 0..i survives verification is the running product
``survival_i = c_0 * ... * c_i`` -- exactly the slot score vLLM's adaptive
verification ranks by.

`specgate_min_confidence = theta` cuts a request's draft at the first position
whose survival falls below theta: positions 0..j-1 are kept, where j is the
first i with survival_i < theta. theta = 0 keeps everything (stock), theta = 1
keeps only positions the head is certain about.

With adaptive verification the cut is a per-request *floor on slot scores*
applied before vLLM picks its global draft budget: `floor_draft_counts` lowers
each request's eligible slot count, the stock cost model then chooses the
budget among the remaining slots only, and the stock GPU admission
(`_assign_draft_token_budget`) ranks within those capacities. These functions
are kept free of vLLM so that they are unit-tested on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def confidence_cut_lengths(confidences: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
    """Number of leading draft positions whose cumulative confidence stays >= theta.

    confidences: [num_reqs, num_steps] per-position confidences in [0, 1].
    thetas:      [num_reqs] per-request thresholds in [0, 1] (0 = no cut).
    Returns int32 [num_reqs]. The cut is a prefix: a later position can never
    be kept once an earlier one was cut (survival only falls, and the prefix
    product below makes that hold even for out-of-range inputs).
    """
    if confidences.dim() != 2:
        raise ValueError(f"confidences must be [num_reqs, num_steps], got {tuple(confidences.shape)}")
    if thetas.shape != confidences.shape[:1]:
        raise ValueError(f"thetas must be [{confidences.shape[0]}], got {tuple(thetas.shape)}")
    survival = confidences.to(torch.float64).cumprod(dim=1)
    keep = survival >= thetas.to(torch.float64)[:, None]
    return keep.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)


def floor_draft_counts(
    confidences: torch.Tensor, scheduled_drafts: torch.Tensor, thetas: torch.Tensor
) -> torch.Tensor:
    """Per-request eligible draft slots after the confidence floor: min(scheduled, cut)."""
    cut = confidence_cut_lengths(confidences, thetas)
    return torch.minimum(scheduled_drafts.to(torch.int32), cut)


def apply_floor_to_batch(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, Sequence[int]],
    floored_req_ids: Sequence[str],
    floored_counts: Sequence[int],
) -> tuple[dict[str, int], dict[str, list[int]]]:
    """New (num_tokens_per_req, draft_tokens) with floored requests' drafts shortened.

    The inputs are the scheduler's dicts and are not mutated. A request whose
    floor leaves no draft loses its entry in draft_tokens (it is then a plain
    decode for the budget, like a request the scheduler gave no drafts).
    """
    tokens = dict(num_tokens_per_req)
    drafts = {req_id: list(ids) for req_id, ids in draft_tokens.items()}
    for req_id, count in zip(floored_req_ids, floored_counts, strict=True):
        current = drafts.get(req_id)
        if not current or count >= len(current):
            continue
        tokens[req_id] -= len(current) - count
        if count <= 0:
            del drafts[req_id]
        else:
            drafts[req_id] = current[:count]
    return tokens, drafts
