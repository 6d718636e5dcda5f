"""Checkpoint validation against configs written by the real speculators 0.9 package."""

import json

import pytest

from drafters.checkpoint import load_config, validate_checkpoint, validate_config, verifier_matches


def test_real_good_checkpoint_passes(speculators_checkpoints):
    r = validate_checkpoint(speculators_checkpoints / "good-8b-b8", "Qwen/Qwen3-8B", "dspark-b8-av")
    assert r.ok, r.errors
    assert r.info["speculative_tokens"] == 8 and r.info["markov_head_type"] == "vanilla"
    assert r.info["verifier"] == "Qwen/Qwen3-8B"
    r14 = validate_checkpoint(speculators_checkpoints / "good-14b-b8" / "config.json", "Qwen/Qwen3-14B")
    assert r14.ok, r14.errors


def test_real_verifier_mismatch_refused(speculators_checkpoints):
    r = validate_checkpoint(speculators_checkpoints / "good-8b-b8", "Qwen/Qwen3-14B")
    assert not r.ok
    assert any("verifier mismatch" in e and "Qwen/Qwen3-8B" in e for e in r.errors)
    # the width check catches it too
    assert any("hidden size 4096" in e for e in r.errors)


@pytest.mark.parametrize("name,head", [("gated-8b", "gated"), ("rnn-8b", "rnn")])
def test_real_non_vanilla_markov_refused(speculators_checkpoints, name, head):
    r = validate_checkpoint(speculators_checkpoints / name, "Qwen/Qwen3-8B")
    assert not r.ok
    assert any(f"markov_head_type='{head}'" in e and "vanilla" in e for e in r.errors)


def test_real_warnings(speculators_checkpoints):
    r = validate_checkpoint(speculators_checkpoints / "no-markov-8b", "Qwen/Qwen3-8B", "dspark-b8-av")
    assert r.ok and any("markov_rank=0" in w for w in r.warnings)
    assert any("confidence head" in w for w in r.warnings)
    r = validate_checkpoint(speculators_checkpoints / "good-8b-b16", "Qwen/Qwen3-8B", "dspark-b8")
    assert r.ok and any("truncates" in w for w in r.warnings)


def test_real_profile_longer_than_block_refused(speculators_checkpoints):
    r = validate_checkpoint(speculators_checkpoints / "good-8b-b8", "Qwen/Qwen3-8B", "dspark-b16")
    assert not r.ok and any("drafts 16 tokens" in e for e in r.errors)


def test_missing_fields_vllm_needs(speculators_checkpoints, tmp_path):
    base = load_config(speculators_checkpoints / "good-8b-b8")
    for key, needle in [("block_size", "block_size"), ("aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids"),
                        ("transformer_layer_config", "transformer_layer_config"),
                        ("speculators_config", "speculators_config")]:
        cfg = dict(base)
        del cfg[key]
        r = validate_config(cfg, "Qwen/Qwen3-8B")
        assert not r.ok and any(needle in e for e in r.errors), (key, r.errors)
    cfg = json.loads(json.dumps(base))
    del cfg["speculators_config"]["verifier"]["name_or_path"]
    r = validate_config(cfg, "Qwen/Qwen3-8B")
    assert any("verifier.name_or_path" in e for e in r.errors)
    cfg = dict(base)
    del cfg["sample_from_anchor"]
    r = validate_config(cfg, "Qwen/Qwen3-8B")
    assert any("sample_from_anchor" in w for w in r.warnings)


def test_unreadable_and_wrong_type(tmp_path):
    r = validate_checkpoint(tmp_path / "nope", "Qwen/Qwen3-8B")
    assert not r.ok and "cannot read" in r.errors[0]
    (tmp_path / "config.json").write_text("{not json")
    assert not validate_checkpoint(tmp_path, "Qwen/Qwen3-8B").ok
    r = validate_config({"speculators_model_type": "eagle3"}, "Qwen/Qwen3-8B")
    assert not r.ok and "not a DSpark drafter" in r.errors[0]


def test_verifier_matching():
    assert verifier_matches("Qwen/Qwen3-8B", "qwen/qwen3-8b") == (True, False)
    assert verifier_matches("Qwen/Qwen3-8B", "/models/Qwen3-8B/") == (True, True)
    assert verifier_matches("Qwen/Qwen3-8B", "Qwen/Qwen3-14B")[0] is False
