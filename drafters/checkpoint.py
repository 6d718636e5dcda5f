"""Validate a speculators-format DSpark drafter checkpoint before a replica is started with it.

Why: vLLM accepts a drafter directory and fails late (at model load, or worse,
serves with silently low acceptance) when the drafter was trained for another
verifier or uses a head vLLM does not implement.  specgate refuses such a
drafter up front with a message that says what to fix.

Reads ``config.json`` as written by ``speculators`` 0.9
(``DSparkSpeculatorConfig.save_pretrained``; fields: ``speculators_model_type``,
``block_size``, ``sample_from_anchor``, ``markov_rank``, ``markov_head_type``,
``enable_confidence_head``, ``aux_hidden_state_layer_ids``, ``mask_token_id``,
``transformer_layer_config``, ``speculators_config.{proposal_methods,verifier}``).

Errors (refuse): not a DSpark/DFlash config; missing fields vLLM reads
(``block_size``, ``aux_hidden_state_layer_ids``, ``transformer_layer_config``
with its sizes, ``speculators_config.verifier.name_or_path``); verifier name
different from the replica's target; a Markov head other than ``vanilla``
(vLLM's ``qwen3_dspark.py`` implements only the vanilla head); drafter width
or vocabulary incompatible with a known target; aux layer ids outside the
target; a profile drafting more tokens than the checkpoint proposes.
Warnings (serve, but know): no Markov head (pure DFlash drafting), no
confidence head with an adaptive-verification profile (vLLM falls back to its
online logistic estimator), ``sample_from_anchor`` absent (vLLM treats it as
False: block_size - 1 tokens), ``mask_token_id`` absent, a profile drafting
fewer tokens than the checkpoint proposes (truncation).

Usage::

    from drafters.checkpoint import validate_checkpoint
    report = validate_checkpoint("/ckpt/dspark-qwen3-8b-b8", target_model="Qwen/Qwen3-8B", profile="dspark-b8-av")
    if not report.ok:
        raise SystemExit("\\n".join(report.errors))
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.profiles import parse_profile

from . import costmodel

SUPPORTED_TYPES = ("dspark", "dflash")
VLLM_MARKOV_HEADS = ("vanilla",)
_LAYER_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")


@dataclass
class ValidationReport:
    path: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        i = self.info
        return (f"{i.get('type', '?')} drafter for {i.get('verifier', '?')}: block_size={i.get('block_size')}, "
                f"speculative_tokens={i.get('speculative_tokens')}, markov={i.get('markov_head_type')}"
                f"(rank {i.get('markov_rank')}), confidence_head={i.get('confidence_head')}")


def load_config(path: str | Path) -> dict:
    """The checkpoint's config.json as a dict (``path`` = directory or the file)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise FileNotFoundError(f"no config.json at {p}")
    with p.open() as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{p} does not contain a JSON object")
    return data


def _norm_model_id(name: str) -> str:
    return name.strip().rstrip("/").lower()


def verifier_matches(verifier: str, target: str) -> tuple[bool, bool]:
    """(matches, only by basename).  HF ids compare exactly (case-insensitive); a local
    path matches an HF id when their last components agree (``/models/Qwen3-8B`` ~ ``Qwen/Qwen3-8B``)."""
    v, t = _norm_model_id(verifier), _norm_model_id(target)
    if v == t:
        return True, False
    vb, tb = v.rsplit("/", 1)[-1], t.rsplit("/", 1)[-1]
    return (vb == tb and bool(vb)), True


def _known_target(target: str) -> costmodel.ModelSpec | None:
    try:
        return costmodel.get_model(target)
    except KeyError:
        base = _norm_model_id(target).rsplit("/", 1)[-1]
        for spec in costmodel.MODELS.values():
            if spec.hf_id.lower().rsplit("/", 1)[-1] == base:
                return spec
    return None


def validate_config(config: dict, target_model: str, profile: str | None = None, path: str = "<config>") -> ValidationReport:
    """Pure check of a parsed config.json against the replica's target and profile."""
    r = ValidationReport(path)
    err, warn = r.errors.append, r.warnings.append
    mtype = config.get("speculators_model_type")
    r.info["type"] = mtype
    if mtype not in SUPPORTED_TYPES:
        err(f"not a DSpark drafter: speculators_model_type={mtype!r} (expected 'dspark')")
        return r
    if mtype == "dflash":
        warn("speculators_model_type is 'dflash': no Markov/confidence heads; serve it with method 'dflash'")

    block = config.get("block_size")
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        err(f"block_size must be a positive integer (vLLM uses it as the default num_speculative_tokens), got {block!r}")
        block = None
    r.info["block_size"] = block

    anchor = config.get("sample_from_anchor")
    if anchor is None:
        if mtype == "dspark":
            warn("sample_from_anchor is absent: vLLM treats it as False (block_size - 1 draft tokens), "
                 "speculators' DSpark default is True")
        anchor = False
    spec_cfg = config.get("speculators_config")
    proposal_tokens = None
    verifier = None
    if not isinstance(spec_cfg, dict):
        err("speculators_config is missing: vLLM detects speculators checkpoints by this key")
    else:
        methods = spec_cfg.get("proposal_methods")
        if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
            err("speculators_config.proposal_methods[0] is missing (vLLM reads speculative_tokens from it)")
        else:
            proposal_tokens = methods[0].get("speculative_tokens")
            if isinstance(proposal_tokens, bool) or not isinstance(proposal_tokens, int) or proposal_tokens <= 0:
                err(f"speculators_config.proposal_methods[0].speculative_tokens must be a positive integer, "
                    f"got {proposal_tokens!r}")
                proposal_tokens = None
        ver = spec_cfg.get("verifier")
        verifier = ver.get("name_or_path") if isinstance(ver, dict) else None
        if not isinstance(verifier, str) or not verifier:
            err("speculators_config.verifier.name_or_path is missing: cannot tell which target the drafter was "
                "trained for")
            verifier = None
    r.info["verifier"] = verifier
    expected_tokens = (block if anchor else block - 1) if block else None
    if proposal_tokens is not None and expected_tokens is not None and proposal_tokens != expected_tokens:
        warn(f"speculative_tokens={proposal_tokens} but block_size={block} with sample_from_anchor={anchor} "
             f"implies {expected_tokens}")
    r.info["speculative_tokens"] = proposal_tokens or expected_tokens

    if verifier is not None:
        ok, by_base = verifier_matches(verifier, target_model)
        if not ok:
            err(f"verifier mismatch: the drafter was trained for {verifier!r} but the replica serves "
                f"{target_model!r}; a drafter only predicts the hidden states of its own verifier")
        elif by_base:
            warn(f"verifier {verifier!r} matched target {target_model!r} by name only (local path?)")

    if mtype == "dspark":
        rank = config.get("markov_rank", 256)
        head = config.get("markov_head_type", "vanilla")
        r.info["markov_rank"], r.info["markov_head_type"] = rank, head
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            err(f"markov_rank must be an integer >= 0, got {rank!r}")
        elif rank == 0:
            warn("markov_rank=0: no Markov head, the drafter behaves like DFlash (lower acceptance)")
        elif head not in VLLM_MARKOV_HEADS:
            err(f"markov_head_type={head!r} cannot be served: vLLM implements only the 'vanilla' Markov head "
                f"(qwen3_dspark.py); retrain with --markov-head-type vanilla")
        conf = config.get("enable_confidence_head", True)
        r.info["confidence_head"] = bool(conf)
    else:
        conf = False
        r.info["confidence_head"] = False

    aux = config.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(x, int) and not isinstance(x, bool) for x in aux):
        err(f"aux_hidden_state_layer_ids must be a non-empty list of layer indices (vLLM sets target_layer_ids "
            f"from it), got {aux!r}")
        aux = None
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        err("transformer_layer_config is missing (vLLM builds the drafter's layers from it)")
        layer = None
    else:
        missing = [f for f in _LAYER_FIELDS if f not in layer]
        if missing:
            err(f"transformer_layer_config lacks {', '.join(missing)}")
    if config.get("mask_token_id") is None:
        warn("mask_token_id is absent: the runtime must resolve the mask token from the tokenizer")

    spec = _known_target(target_model)
    if spec is not None and layer is not None:
        target_hidden = config.get("target_hidden_size") or layer.get("hidden_size")
        if target_hidden is not None and target_hidden != spec.hidden:
            err(f"drafter expects target hidden size {target_hidden}, but {spec.hf_id} has {spec.hidden}")
        vocab = layer.get("vocab_size")
        if vocab is not None and vocab != spec.vocab:
            err(f"drafter vocab_size {vocab} differs from {spec.hf_id}'s {spec.vocab}")
        if aux is not None and any(not 0 <= x <= spec.n_layers for x in aux):
            err(f"aux_hidden_state_layer_ids {aux} fall outside {spec.hf_id}'s {spec.n_layers} layers")

    if profile:
        try:
            prof = parse_profile(profile)
        except ValueError as exc:
            err(str(exc))
        else:
            r.info["profile"] = prof.label
            avail = r.info["speculative_tokens"]
            if not prof.speculative:
                warn("profile 'off' does not use a drafter")
            elif avail is not None and prof.num_speculative_tokens > avail:
                err(f"profile {prof.label} drafts {prof.num_speculative_tokens} tokens but the checkpoint proposes "
                    f"{avail} per block; use {prof.method}-b{avail} or a checkpoint trained with block_size "
                    f"{prof.num_speculative_tokens}")
            elif avail is not None and prof.num_speculative_tokens < avail:
                warn(f"profile {prof.label} truncates the checkpoint's {avail}-token block")
            if prof.adaptive and not conf:
                warn("adaptive verification without a confidence head: vLLM uses its online logistic estimator")
    return r


def validate_checkpoint(path: str | Path, target_model: str, profile: str | None = None) -> ValidationReport:
    """Load ``path``/config.json and validate it (file problems become errors, never exceptions)."""
    try:
        config = load_config(path)
    except (OSError, ValueError) as exc:
        r = ValidationReport(str(path))
        r.errors.append(f"cannot read drafter config: {exc}")
        return r
    return validate_config(config, target_model, profile, str(path))


__all__ = ["ValidationReport", "load_config", "validate_config", "validate_checkpoint", "verifier_matches",
           "SUPPORTED_TYPES", "VLLM_MARKOV_HEADS"]
