import json

import pytest

from contract.profiles import OFF, PROFILE_LABELS, Profile, all_profiles, is_profile_label, parse_profile
from drafters.profiles import speculative_config, vllm_env, vllm_launch_args


def test_labels_round_trip():
    assert PROFILE_LABELS == ("off", "dspark-b4", "dspark-b4-av", "dspark-b8", "dspark-b8-av", "dspark-b16", "dspark-b16-av")
    for label in PROFILE_LABELS:
        assert parse_profile(label).label == label
    assert [p.label for p in all_profiles()] == list(PROFILE_LABELS)


def test_parse_fields():
    p = parse_profile("dspark-b8-av")
    assert p == Profile(block_size=8, adaptive=True)
    assert p.speculative and p.num_speculative_tokens == 8
    assert parse_profile(" OFF ") is OFF and not OFF.speculative


@pytest.mark.parametrize("bad", ["", "dspark", "dspark-b7", "off-av", "dspark-b8-xx", "eagle3-b8"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError, match="expected one of"):
        parse_profile(bad)
    assert not is_profile_label(bad)


def test_launch_args_speculative():
    argv = vllm_launch_args(parse_profile("dspark-b16-av"), "Qwen/Qwen3-8B", "/ckpt/d16")
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "dspark", "model": "/ckpt/d16", "num_speculative_tokens": 16,
                   "enable_adaptive_verification": True}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert vllm_env(parse_profile("dspark-b4")) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_launch_args_off_and_missing_drafter():
    assert vllm_launch_args(OFF, "Qwen/Qwen3-8B", extra_args=["--port", "8001"]) == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--port", "8001"]
    assert speculative_config(OFF, "") is None and vllm_env(OFF) == {}
    with pytest.raises(ValueError, match="drafter"):
        vllm_launch_args(parse_profile("dspark-b8"), "Qwen/Qwen3-8B")
