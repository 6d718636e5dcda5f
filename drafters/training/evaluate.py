"""Offline evaluation: teacher-forced acceptance length of a drafter on held-
out samples.

The drafter is fed the captured target hidden states, exactly as vLLM feeds it
when serving (drafters.training.layers). For an anchor p in the completion
(a position whose token the target has just produced: the bonus token of a
verification step), the drafter drafts one block greedily -- the backbone's
logits for the block's slots, then the vanilla Markov bias chained slot by slot
from the anchor token, as vLLM's DSpark speculator samples
(`v1/worker/gpu/spec_decode/dspark/speculator.py` `_sample_sequential`) --
and the block's acceptance length is 1 + the number of leading draft tokens
equal to the target's own greedy next tokens (argmax of the target's logits,
from the captured pre-norm last hidden state through the verifier's norm and
LM head; for a greedy completion these are the completion's tokens).

Two numbers per drafter:
- `acceptance_length` (served-equivalent): the anchors a temperature-0 replica
  would actually visit -- start at the first completion token, draft, accept
  `a`, jump to the next bonus token p + a + 1. With greedy verification the
  target's output is its greedy continuation whatever the drafter proposes, so
  (hidden states of a prefill and of verification steps being the same up to
  float rounding) this is the mean per-step acceptance length vLLM reports for
  the request at temperature 0 (`metrics.speculative_decoding`:
  1 + accepted / steps), except that vLLM also counts the last, truncated steps
  at max_tokens.
- `acceptance_all_anchors`: every completion position with a full block of
  known targets as anchor (more anchors, less variance; not what one request
  sees).
At temperature > 0 vLLM accepts by rejection sampling; these greedy numbers
are then an upper-bound-like proxy, not the served value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from .dataset import Sample


@dataclass
class EvalResult:
    samples: int
    steps: int  # served-equivalent draft steps
    acceptance_length: float
    anchors: int
    acceptance_all_anchors: float
    per_sample: list[float]  # served-equivalent acceptance per held-out sample

    def to_json(self) -> dict:
        return asdict(self)


@torch.no_grad()
def target_next_tokens(model, sample: Sample) -> torch.Tensor:
    """The target's greedy next token at every position [T] (draft vocab = target vocab)."""
    logits = model.verifier_lm_head(model.verifier_norm(sample.last[None].to(model.fc.weight.device)))
    return logits[0].argmax(-1).cpu()


def _to_target_vocab(model, ids: torch.Tensor) -> torch.Tensor:
    if getattr(model, "use_draft_vocab", False) and model.d2t is not None:
        return ids + model.d2t.to(ids.device)[ids]  # speculators' d2t holds offsets
    return ids


@torch.no_grad()
def draft_blocks(model, sample: Sample, anchors: Sequence[int]) -> torch.Tensor:
    """Greedy drafts [len(anchors), block_size] (target vocab) for the given anchors."""
    device = model.fc.weight.device
    block = model.block_size
    t = sample.tokens
    n = len(anchors)
    pad = block
    feats = torch.cat([sample.features, sample.features.new_zeros(pad, sample.features.shape[1])])[None].to(device)
    last = torch.cat([sample.last, sample.last.new_zeros(pad, sample.last.shape[1])])[None].to(device)
    ids = torch.cat([sample.input_ids, torch.zeros(pad, dtype=torch.long)])[None].to(device)
    mask = torch.zeros(1, t + pad, device=device)
    mask[0, list(anchors)] = 1
    docs = torch.cat([torch.zeros(t, dtype=torch.long), torch.full((pad,), -1, dtype=torch.long)])[None].to(device)
    pos = torch.arange(t + pad, device=device)[None]
    hidden, logits, _targets, _mask, _idx = model._backbone_forward(
        feats, ids, mask, last, docs, pos, max_anchors=n)
    hidden = hidden.view(n, block, -1)
    logits = logits.view(n, block, -1)
    prev = torch.zeros(n, block, dtype=torch.long, device=device)
    prev[:, 0] = ids[0, torch.as_tensor(list(anchors), device=device)]
    drafts = torch.zeros(n, block, dtype=torch.long, device=device)
    for k in range(block):
        lk = logits[:, k]
        if model.markov_head is not None:
            lk = lk + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden)[:, k]
        d = _to_target_vocab(model, lk.argmax(-1))
        drafts[:, k] = d
        if k + 1 < block:
            prev[:, k + 1] = d
    return drafts.cpu()


def _accepted(draft: torch.Tensor, truth: torch.Tensor) -> int:
    n = min(len(draft), len(truth))
    eq = (draft[:n] == truth[:n]).tolist()
    a = 0
    for ok in eq:
        if not ok:
            break
        a += 1
    return a


@torch.no_grad()
def evaluate(model, samples: Sequence[Sample]) -> EvalResult:
    """Both acceptance numbers (module docstring) over `samples`."""
    was_training = model.training
    model.eval()
    block = model.block_size
    steps = accepted = 0
    anchors_total = accepted_all = 0
    per_sample = []
    try:
        for s in samples:
            truth = target_next_tokens(model, s)  # truth[p + k] = the token slot k of anchor p should draft
            t = s.tokens
            cand = list(range(s.prompt_tokens, t))
            if not cand:
                continue
            drafts = dict(zip(cand, draft_blocks(model, s, cand)))
            # served-equivalent walk
            p, s_steps, s_acc = s.prompt_tokens, 0, 0
            while p < t:
                a = _accepted(drafts[p], truth[p:p + block])
                s_steps += 1
                s_acc += a
                p += a + 1
            steps += s_steps
            accepted += s_acc
            per_sample.append(1 + s_acc / s_steps)
            for p in cand:
                if p + block <= t:
                    anchors_total += 1
                    accepted_all += _accepted(drafts[p], truth[p:p + block])
    finally:
        model.train(was_training)
    return EvalResult(
        samples=len(per_sample), steps=steps,
        acceptance_length=(1 + accepted / steps) if steps else 0.0,
        anchors=anchors_total,
        acceptance_all_anchors=(1 + accepted_all / anchors_total) if anchors_total else 0.0,
        per_sample=[round(x, 4) for x in per_sample],
    )
