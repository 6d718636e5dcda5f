"""Build the DSpark drafter to train: fresh from the target's config, or warm-
started from the tenant's current drafter.

Why `DSparkDraftModel.from_training_args` and not `from_pretrained`: it is how
speculators' own trainer creates a drafter (`train/cli.py`), so the saved
checkpoint is the real speculators format; a warm start then loads the current
drafter's weights into that model (strict about everything but the verifier-
owned tensors speculators never saves), which also lets the verifier be the
local `--target` directory rather than whatever path the old checkpoint names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..spec import DrafterSpec
from .layers import default_target_layer_ids

# Names of the tensors a speculators DSpark checkpoint omits (reloaded from the verifier).
_VERIFIER_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight", "lm_head.weight",
                   "t2d", "d2t")


def read_checkpoint_config(path: str | Path) -> dict:
    with open(Path(path) / "config.json") as f:
        return json.load(f)


def resolve_spec(target_config: Any, *, init_config: dict | None = None, profile: str | None = None,
                 block_size: int | None = None, markov_rank: int | None = None,
                 target_layer_ids: list[int] | None = None, mask_token_id: int | None = None) -> DrafterSpec:
    """Explicit options win, then the served profile (block size), then the
    current drafter's config, then defaults (block 8, Markov rank 256 as
    speculators, feature layers `default_target_layer_ids`). Pure."""
    init = init_config or {}
    n_layers = int(target_config.num_hidden_layers)
    if block_size is None and profile:
        from contract.profiles import parse_profile

        prof = parse_profile(profile)
        if prof.method != "dspark":
            raise ValueError(f"profile {prof.label} does not serve a DSpark drafter")
        block_size = prof.num_speculative_tokens  # sample_from_anchor: one token per block slot
    block = block_size or init.get("block_size") or 8
    rank = markov_rank if markov_rank is not None else init.get("markov_rank", 256)
    layers = target_layer_ids or init.get("aux_hidden_state_layer_ids") or default_target_layer_ids(n_layers)
    mask = mask_token_id if mask_token_id is not None else init.get("mask_token_id")
    if mask is None:
        mask = int(target_config.vocab_size) - 1  # an id the tokenizer's merges do not produce
    tl = init.get("transformer_layer_config") or {}
    return DrafterSpec(
        block_size=int(block), markov_rank=int(rank), target_layer_ids=tuple(int(i) for i in layers),
        mask_token_id=int(mask), draft_layers=int(tl.get("num_hidden_layers", 1)),
        markov_head_type=str(init.get("markov_head_type", "vanilla")),
        enable_confidence_head=bool(init.get("enable_confidence_head", True)),
    )


def build(target_dir: str, spec: DrafterSpec, *, attn_impl: str = "sdpa", init_from: str | None = None):
    """A DSparkDraftModel for the target at `target_dir` (its verifier path), in
    float32, weights from `init_from` when given."""
    from speculators.models.dspark import DSparkDraftModel
    from transformers import AutoConfig

    target_config = AutoConfig.from_pretrained(target_dir)
    layer_config = AutoConfig.from_pretrained(target_dir)
    layer_config.num_hidden_layers = spec.draft_layers
    if getattr(layer_config, "layer_types", None):
        layer_config.layer_types = layer_config.layer_types[: spec.draft_layers]
    model = DSparkDraftModel.from_training_args(
        layer_config,
        verifier_name_or_path=str(target_dir),
        draft_vocab_size=int(target_config.vocab_size),
        target_layer_ids=list(spec.target_layer_ids),
        mask_token_id=spec.mask_token_id,
        block_size=spec.block_size,
        markov_rank=spec.markov_rank,
        markov_head_type=spec.markov_head_type,
        enable_confidence_head=spec.enable_confidence_head,
        draft_attn_impl=attn_impl,
    )
    model = model.float()
    if init_from:
        load_weights(model, init_from)
    return model


def load_weights(model, ckpt_dir: str | Path) -> None:
    """Load a speculators checkpoint's trained tensors into `model`; refuses a
    checkpoint whose shapes or tensor names do not fit (another target or
    architecture) instead of silently training from scratch."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(ckpt_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {ckpt_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    own = model.state_dict()
    bad = [k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    unknown = [k for k in state if k not in own]
    if bad or unknown:
        raise ValueError(f"checkpoint {ckpt_dir} does not fit this drafter: shape mismatch {bad[:5]}, "
                         f"unknown tensors {unknown[:5]}")
    missing = [k for k in own if k not in state and k not in _VERIFIER_OWNED]
    if missing:
        raise ValueError(f"checkpoint {ckpt_dir} lacks trained tensors {missing[:5]}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)


def trainable_parameters(model):
    return [p for p in model.parameters() if p.requires_grad]
