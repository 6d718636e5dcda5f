"""Speculation profiles: the named replica configurations specgate routes between.

Why: block size, adaptive verification and the drafter are fixed when vLLM
starts (see /work/shared/notes/vllm-speculation-facts.md, "Knobs that require
restarting"), so the controller cannot retune a replica; it chooses *which
replica pool* a tenant goes to.  A profile label names a pool's configuration
and is the single source of the vLLM launch arguments it implies.

Labels: ``off``, ``dspark-b4``, ``dspark-b8``, ``dspark-b16``, each DSpark one
optionally suffixed ``-av`` (vLLM adaptive verification), e.g. ``dspark-b8-av``.

A ``dspark-bN`` profile runs ``num_speculative_tokens = N`` (vLLM's DSpark
default is the checkpoint ``block_size``; the drafter checkpoint's block size
should equal N, see ``drafters.checkpoint``).  DSpark and adaptive
verification need vLLM's Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``).

Usage::

    from drafters.profiles import parse_profile, vllm_launch_args, PROFILE_LABELS
    p = parse_profile("dspark-b8-av")          # Profile(block_size=8, adaptive=True)
    p.label, p.num_speculative_tokens, p.speculative   # "dspark-b8-av", 8, True
    argv = vllm_launch_args(p, target_model="Qwen/Qwen3-8B", drafter_path="/ckpt/dspark-qwen3-8b-b8")
    env = vllm_env(p)                          # {"VLLM_USE_V2_MODEL_RUNNER": "1"}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

BLOCK_SIZES: tuple[int, ...] = (4, 8, 16)
ADAPTIVE_SUFFIX = "-av"
PROFILE_LABELS: tuple[str, ...] = ("off",) + tuple(
    f"dspark-b{b}{suffix}" for b in BLOCK_SIZES for suffix in ("", ADAPTIVE_SUFFIX)
)
_LABEL_RE = re.compile(r"^dspark-b(\d+)(-av)?$")


@dataclass(frozen=True)
class Profile:
    """A replica's speculation configuration."""

    block_size: int = 0  # 0 = no speculation
    adaptive: bool = False

    @property
    def speculative(self) -> bool:
        return self.block_size > 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.block_size

    @property
    def label(self) -> str:
        if not self.speculative:
            return "off"
        return f"dspark-b{self.block_size}" + (ADAPTIVE_SUFFIX if self.adaptive else "")

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.label


OFF = Profile()


def parse_profile(label: str) -> Profile:
    """Parse a profile label; raises ValueError naming the accepted labels."""
    text = (label or "").strip().lower()
    if text in ("off", "none", "no-spec"):
        return OFF
    m = _LABEL_RE.match(text)
    if not m or int(m.group(1)) not in BLOCK_SIZES:
        raise ValueError(f"unknown speculation profile {label!r}; expected one of {', '.join(PROFILE_LABELS)}")
    return Profile(block_size=int(m.group(1)), adaptive=bool(m.group(2)))


def is_profile_label(label: str) -> bool:
    try:
        parse_profile(label)
    except ValueError:
        return False
    return True


def all_profiles() -> list[Profile]:
    return [parse_profile(label) for label in PROFILE_LABELS]


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


__all__ = [
    "BLOCK_SIZES", "ADAPTIVE_SUFFIX", "PROFILE_LABELS", "Profile", "OFF", "parse_profile", "is_profile_label",
    "all_profiles", "speculative_config", "vllm_launch_args", "vllm_env",
]
