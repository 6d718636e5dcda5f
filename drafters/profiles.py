"""Speculation profiles' launch side: the exact `vllm serve` arguments and
environment a profile implies.

The labels and their parser are part of the contract (`contract.profiles`),
because the gateway, the controller and the simulator must agree on them;
this module turns a parsed `Profile` into what vLLM needs at start-up.

Usage::

    from contract.profiles import parse_profile
    from drafters.profiles import vllm_launch_args, vllm_env
    p = parse_profile("dspark-b8-av")          # Profile(block_size=8, adaptive=True)
    argv = vllm_launch_args(p, target_model="Qwen/Qwen3-8B", drafter_path="/ckpt/dspark-qwen3-8b-b8")
    env = vllm_env(p)                          # {"VLLM_USE_V2_MODEL_RUNNER": "1"}
"""

from __future__ import annotations

import json

from contract.profiles import Profile


def speculative_config(profile: Profile, drafter_path: str) -> dict | None:
    """The ``--speculative-config`` JSON object for this profile (None for ``off``)."""
    if not profile.speculative:
        return None
    if not drafter_path:
        raise ValueError(f"profile {profile.label} needs a DSpark drafter checkpoint path")
    return {
        "method": "dspark",
        "model": drafter_path,
        "num_speculative_tokens": profile.num_speculative_tokens,
        "enable_adaptive_verification": profile.adaptive,
    }


def vllm_launch_args(
    profile: Profile,
    target_model: str,
    drafter_path: str | None = None,
    extra_args: list[str] | None = None,
    executable: tuple[str, ...] = ("vllm", "serve"),
) -> list[str]:
    """argv for ``vllm serve`` running ``target_model`` under ``profile``.

    Speculative profiles add ``--speculative-config`` and
    ``--per-request-spec-decode-metrics summary`` (the per-request
    ``metrics.speculative_decoding`` the gateway records per tenant).
    """
    argv = [*executable, target_model]
    cfg = speculative_config(profile, drafter_path or "")
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv + list(extra_args or [])


def vllm_env(profile: Profile) -> dict[str, str]:
    """Environment a profile needs (DSpark / adaptive verification are Model Runner V2 only)."""
    return {"VLLM_USE_V2_MODEL_RUNNER": "1"} if profile.speculative else {}


__all__ = ["speculative_config", "vllm_launch_args", "vllm_env"]
