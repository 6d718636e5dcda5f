"""Speculation profiles' launch side: the exact `vllm serve` arguments and
environment a profile implies.

The labels and their parser are part of the contract (`contract.profiles`),
because the gateway, the controller and the simulator must agree on them;
this module turns a parsed `Profile` into what vLLM needs at start-up.

Per method (``--speculative-config`` JSON; every speculative profile also gets
``--per-request-spec-decode-metrics summary``):

* ``ngram-kN``:  ``{"method":"ngram","num_speculative_tokens":N,"prompt_lookup_max":4,"prompt_lookup_min":1}``
  (no drafter; lookup window overridable), Model Runner V1.
* ``eagle3-kN``: ``{"method":"eagle3","model":DRAFTER,"num_speculative_tokens":N}``, Model Runner V1.
* ``dflash-bN``: ``{"method":"dflash","model":DRAFTER,"num_speculative_tokens":N}``, Model Runner V1.
* ``dspark-bN[-av]``: ``{"method":"dspark","model":DRAFTER,"num_speculative_tokens":N,
  "enable_adaptive_verification":BOOL}``, Model Runner V2.

The runner is pinned through ``VLLM_USE_V2_MODEL_RUNNER`` (``1`` for DSpark,
which only V2 implements; ``0`` for the others, which vLLM would otherwise move
to V2 whenever V2 supports the configuration, and whose per-request knobs were
tested on V1). ``off`` sets nothing.

Usage::

    from contract.profiles import parse_profile
    from drafters.profiles import vllm_launch_args, vllm_env
    p = parse_profile("dspark-b8-av")          # Profile(block_size=8, adaptive=True, method="dspark")
    argv = vllm_launch_args(p, target_model="Qwen/Qwen3-8B", drafter_path="/ckpt/dspark-qwen3-8b-b8")
    env = vllm_env(p)                          # {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    argv = vllm_launch_args(parse_profile("ngram-k4"), "Qwen/Qwen3-8B", prompt_lookup_max=3)
"""

from __future__ import annotations

import json

from contract.profiles import Profile

# Prompt-lookup window of ngram profiles: match the last 1..4 tokens of the context
# (the window used on this bed, tests/vllm_support; vLLM's own default is 5..5).
NGRAM_PROMPT_LOOKUP_MIN = 1
NGRAM_PROMPT_LOOKUP_MAX = 4

_DRAFTER_KIND = {"eagle3": "an EAGLE-3", "dflash": "a DFlash", "dspark": "a DSpark"}


def drafter_kind(profile: Profile) -> str:
    """'a DSpark' / 'an EAGLE-3' / 'a DFlash' drafter: for messages."""
    return _DRAFTER_KIND.get(profile.method, "a")


def speculative_config(
    profile: Profile,
    drafter_path: str | None = None,
    *,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> dict | None:
    """The ``--speculative-config`` JSON object for this profile (None for ``off``).

    ``drafter_path`` is required by eagle3 / dflash / dspark and ignored by
    ``off`` and ``ngram`` (which draft from the prompt). ``prompt_lookup_min`` /
    ``prompt_lookup_max`` override the ngram window (ValueError on other methods)."""
    lookup_given = prompt_lookup_min is not None or prompt_lookup_max is not None
    if lookup_given and profile.method != "ngram":
        raise ValueError(f"prompt_lookup_min/max apply to ngram profiles only, not {profile.label}")
    if not profile.speculative:
        return None
    if profile.method == "ngram":
        lo = NGRAM_PROMPT_LOOKUP_MIN if prompt_lookup_min is None else prompt_lookup_min
        hi = NGRAM_PROMPT_LOOKUP_MAX if prompt_lookup_max is None else prompt_lookup_max
        if prompt_lookup_min is not None and prompt_lookup_max is None:
            hi = max(hi, lo)  # only the minimum raised: widen the window, as a single value would
        for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        return {
            "method": "ngram",
            "num_speculative_tokens": profile.num_speculative_tokens,
            "prompt_lookup_max": hi,
            "prompt_lookup_min": lo,
        }
    if not drafter_path:
        raise ValueError(f"profile {profile.label} needs {drafter_kind(profile)} drafter checkpoint path")
    cfg = {
        "method": profile.method,
        "model": drafter_path,
        "num_speculative_tokens": profile.num_speculative_tokens,
    }
    if profile.method == "dspark":
        cfg["enable_adaptive_verification"] = profile.adaptive
    return cfg


def vllm_launch_args(
    profile: Profile,
    target_model: str,
    drafter_path: str | None = None,
    extra_args: list[str] | None = None,
    executable: tuple[str, ...] = ("vllm", "serve"),
    *,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> list[str]:
    """argv for ``vllm serve`` running ``target_model`` under ``profile``.

    Speculative profiles add ``--speculative-config``,
    ``--enable-per-request-metrics`` and ``--per-request-spec-decode-metrics
    summary`` (the per-request decode time and ``metrics.speculative_decoding``
    the gateway records per tenant).
    """
    argv = [*executable, target_model]
    cfg = speculative_config(profile, drafter_path, prompt_lookup_min=prompt_lookup_min,
                             prompt_lookup_max=prompt_lookup_max)
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        # Per request: the engine's decode time (`metrics.generation_time_ms`, what a probe's two arms
        # are compared by) and `metrics.speculative_decoding` (what the gateway records per tenant).
        argv += ["--enable-per-request-metrics", "--per-request-spec-decode-metrics", "summary"]
    return argv + list(extra_args or [])


def vllm_env(profile: Profile) -> dict[str, str]:
    """Environment a profile needs: the model runner it runs on (DSpark and adaptive
    verification exist only on Model Runner V2; ngram / EAGLE-3 / DFlash are pinned to V1)."""
    runner = profile.model_runner
    if runner is None:
        return {}
    return {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"}


__all__ = ["NGRAM_PROMPT_LOOKUP_MAX", "NGRAM_PROMPT_LOOKUP_MIN", "drafter_kind", "speculative_config",
           "vllm_launch_args", "vllm_env"]
