"""drafters/profiles.py: the `vllm serve` arguments and environment of each profile.
(The label parser itself is tested in tests/contract/test_profiles.py.)"""

import json

import pytest

from contract.profiles import OFF, all_profiles, parse_profile
from drafters.profiles import speculative_config, vllm_env, vllm_launch_args
from drafters.vllm_ext.discovery import advertised_knobs


def spec_of(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_launch_args_dspark_unchanged():
    argv = vllm_launch_args(parse_profile("dspark-b16-av"), "Qwen/Qwen3-8B", "/ckpt/d16")
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert spec_of(argv) == {"method": "dspark", "model": "/ckpt/d16", "num_speculative_tokens": 16,
                             "enable_adaptive_verification": True}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert vllm_env(parse_profile("dspark-b4")) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert spec_of(vllm_launch_args(parse_profile("dspark-b8"), "m", "/d"))["enable_adaptive_verification"] is False


def test_launch_args_ngram_needs_no_drafter():
    p = parse_profile("ngram-k4")
    argv = vllm_launch_args(p, "Qwen/Qwen3-8B")
    assert spec_of(argv) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                             "prompt_lookup_min": 1}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert vllm_launch_args(p, "Qwen/Qwen3-8B", "/ignored/drafter") == argv  # no model for prompt lookup
    assert vllm_env(p) == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_ngram_lookup_window_overrides():
    p = parse_profile("ngram-k8")
    assert spec_of(vllm_launch_args(p, "m", prompt_lookup_min=2, prompt_lookup_max=5))["prompt_lookup_min"] == 2
    cfg = speculative_config(p, prompt_lookup_max=3)
    assert (cfg["prompt_lookup_min"], cfg["prompt_lookup_max"], cfg["num_speculative_tokens"]) == (1, 3, 8)
    assert speculative_config(p, prompt_lookup_min=6)["prompt_lookup_max"] == 6  # window widened to the minimum
    with pytest.raises(ValueError, match="must be <="):
        speculative_config(p, prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValueError, match=">= 1"):
        speculative_config(p, prompt_lookup_min=0)
    with pytest.raises(ValueError, match="ngram profiles only"):
        speculative_config(parse_profile("dspark-b8"), "/d", prompt_lookup_max=3)


@pytest.mark.parametrize("label, method, n", [("eagle3-k4", "eagle3", 4), ("dflash-b8", "dflash", 8)])
def test_launch_args_drafter_methods(label, method, n):
    p = parse_profile(label)
    argv = vllm_launch_args(p, "Qwen/Qwen3-8B", "/ckpt/x", extra_args=["--port", "8001"])
    assert spec_of(argv) == {"method": method, "model": "/ckpt/x", "num_speculative_tokens": n}
    assert argv[-2:] == ["--port", "8001"]
    assert vllm_env(p) == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    with pytest.raises(ValueError, match=f"{label} needs an? .* drafter checkpoint path"):
        vllm_launch_args(p, "Qwen/Qwen3-8B")


def test_launch_args_off_and_missing_drafter():
    assert vllm_launch_args(OFF, "Qwen/Qwen3-8B", extra_args=["--port", "8001"]) == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--port", "8001"]
    assert speculative_config(OFF, "") is None and vllm_env(OFF) == {}
    with pytest.raises(ValueError, match="DSpark drafter"):
        vllm_launch_args(parse_profile("dspark-b8"), "Qwen/Qwen3-8B")


def test_every_profile_launches_and_advertises_what_the_plugin_does():
    for p in all_profiles():
        argv = vllm_launch_args(p, "m", "/d")
        if p.speculative:
            cfg = spec_of(argv)
            assert cfg["method"] == p.method and cfg["num_speculative_tokens"] == p.block_size
            assert ("model" in cfg) == p.needs_drafter
        else:
            assert "--speculative-config" not in argv
        # contract's knob list matches the plugin's discovery for the config this profile launches
        assert p.knobs == advertised_knobs(p.method if p.speculative else None, p.adaptive)
