"""A tenant's captured samples as DSpark training inputs.

Reads a capture store (`drafters.capture.backends.open_store`: the directory or
Mooncake Store; format: contract/capture.py) and
turns each sample into what speculators' DSpark forward takes
(`models/dspark/core.py` `forward`): the drafter's feature layers concatenated
in ascending id order (`hidden_states [T, n_aux*H]`), the pre-norm last layer
(`verifier_last_hidden_states [T, H]`, whose norm + LM head are the target's
logits), `input_ids [T]` and a `loss_mask [T]` that is 1 on completion
positions only: an anchor p >= prompt_tokens is a position where, when
serving, the drafter starts a block (the first completion token comes from the
target's prefill), and its block predicts completion tokens p+1.. . Prompt
positions still serve as context (the drafter attends to every position before
the anchor), exactly as vLLM precomputes the prompt's context KV.

Several samples are packed into one row (speculators' layout: `document_ids`,
per-document `position_ids`), each followed by `block_size` padding positions
(document -1, loss 0) so that no block can reach into the next sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from drafters.capture.mooncake_store import MooncakeSampleStore
from drafters.capture.store import SampleKey, SampleStore

from .layers import feature_columns
from .split import split_keys


@dataclass
class Sample:
    key: str
    features: torch.Tensor  # [T, n_aux*H]
    last: torch.Tensor  # [T, H] pre-norm last hidden state
    input_ids: torch.Tensor  # [T] int64
    prompt_tokens: int

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_tokens(self) -> int:
        return max(0, self.tokens - self.prompt_tokens)


def sample_from_tensors(key: str, tensors: dict, layer_ids: Sequence[int], prompt_tokens: int,
                        target_layer_ids: Sequence[int], num_hidden_layers: int) -> Sample:
    hs = tensors["hidden_states"]
    ids = tensors["token_ids"].to(torch.long).reshape(-1)
    if hs.ndim != 3 or hs.shape[0] != ids.shape[0] or hs.shape[1] != len(layer_ids):
        raise ValueError(f"{key}: hidden_states {tuple(hs.shape)} do not match token_ids {tuple(ids.shape)} "
                         f"and layer_ids {list(layer_ids)}")
    cols, last = feature_columns(layer_ids, target_layer_ids, num_hidden_layers)
    return Sample(key=key, features=hs[:, cols].flatten(1).float(), last=hs[:, last].float(),
                  input_ids=ids, prompt_tokens=int(prompt_tokens))


@dataclass
class TenantSamples:
    train: list[Sample]
    held_out: list[Sample]
    skipped: dict[str, str]  # key -> why


def load_tenant(store: SampleStore | MooncakeSampleStore, tenant: str, target_layer_ids: Sequence[int], num_hidden_layers: int, *,
                held_out_fraction: float = 0.2, max_samples: int | None = None, min_completion: int = 2) -> TenantSamples:
    """The tenant's samples split by key hash (drafters.training.split). The
    split is taken over every present sample first, then `max_samples` keeps
    the newest training samples (memory bound), so the cap never moves a
    sample into or out of the held-out set."""
    keys = store.keys(tenant)
    train_keys, held_keys = split_keys(keys, held_out_fraction, key=lambda k: k.key)
    if max_samples is not None and max_samples > 0:
        train_keys = train_keys[-max_samples:]  # keys() is oldest first
        held_keys = held_keys[-max(1, math.ceil(max_samples * held_out_fraction)):] if held_keys else held_keys
    skipped: dict[str, str] = {}

    def load(ks: Iterable[SampleKey]) -> list[Sample]:
        out = []
        for k in ks:
            try:
                tensors, meta = store.read(k)
            except FileNotFoundError:
                skipped[k.key] = "evicted"
                continue
            if meta is None:
                skipped[k.key] = "not a specgate sample"
                continue
            if meta.tenant != tenant:  # another tenant whose id maps to the same directory name
                skipped[k.key] = f"tenant {meta.tenant!r}"
                continue
            try:
                s = sample_from_tensors(k.key, tensors, meta.layer_ids, meta.prompt_tokens, target_layer_ids,
                                        num_hidden_layers)
            except (KeyError, ValueError) as exc:
                skipped[k.key] = str(exc)
                continue
            if s.completion_tokens < min_completion:
                skipped[k.key] = f"completion of {s.completion_tokens} tokens"
                continue
            out.append(s)
        return out

    return TenantSamples(train=load(train_keys), held_out=load(held_keys), skipped=skipped)


@dataclass
class Batch:
    hidden_states: torch.Tensor  # [1, N, n_aux*H]
    verifier_last_hidden_states: torch.Tensor  # [1, N, H]
    input_ids: torch.Tensor  # [1, N]
    loss_mask: torch.Tensor  # [1, N]
    document_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    anchors: int  # positions with loss (upper bound on useful max_anchors)

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.hidden_states, self.verifier_last_hidden_states, self.input_ids,
                                                self.loss_mask, self.document_ids, self.position_ids)), self.anchors)


def pack(samples: Sequence[Sample], block_size: int, pad_id: int = 0) -> Batch:
    """One packed row: each sample, then `block_size` padding positions."""
    feats, lasts, ids, mask, docs, pos = [], [], [], [], [], []
    for d, s in enumerate(samples):
        t = s.tokens
        feats += [s.features, s.features.new_zeros(block_size, s.features.shape[1])]
        lasts += [s.last, s.last.new_zeros(block_size, s.last.shape[1])]
        ids += [s.input_ids, torch.full((block_size,), pad_id, dtype=torch.long)]
        m = torch.zeros(t + block_size)
        m[s.prompt_tokens:t] = 1
        mask.append(m)
        docs.append(torch.cat([torch.full((t,), d, dtype=torch.long), torch.full((block_size,), -1, dtype=torch.long)]))
        pos.append(torch.cat([torch.arange(t), torch.arange(t, t + block_size)]))
    loss_mask = torch.cat(mask)
    return Batch(torch.cat(feats)[None], torch.cat(lasts)[None], torch.cat(ids)[None], loss_mask[None],
                 torch.cat(docs)[None], torch.cat(pos)[None], int(loss_mask.sum().item()))


def batches(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Greedy packing in order: a batch holds samples until the next would pass
    `max_tokens` (a longer sample is truncated to it, its completion end kept)."""
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    used = 0
    for s in samples:
        if s.tokens > max_tokens:
            s = truncate(s, max_tokens)
        if cur and used + s.tokens > max_tokens:
            out.append(cur)
            cur, used = [], 0
        cur.append(s)
        used += s.tokens
    if cur:
        out.append(cur)
    return out


def truncate(s: Sample, max_tokens: int) -> Sample:
    """The first `max_tokens` positions (context before the anchors is what the
    drafter needs; a block past the cut simply is not trained)."""
    return Sample(s.key, s.features[:max_tokens], s.last[:max_tokens], s.input_ids[:max_tokens],
                  min(s.prompt_tokens, max_tokens))
