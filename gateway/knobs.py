"""Per-request speculation knobs (`vllm_xargs.specgate_*`): validation of
what clients send and the merge with the tenant's speculation policy.

Merge rule: the tenant policy is a *cap*. A client may ask for less
speculation than its policy allows (smaller `specgate_max_draft`, higher
`specgate_min_confidence`, smaller `specgate_max_batch`), never more. Policy knobs are only added for
replicas whose /metrics advertise the specgate extension (`specgate_ext_info`
knobs); replicas without it get the client's `vllm_xargs` untouched and are
steered by pool routing alone.
"""

from __future__ import annotations

import math
from typing import Any

from .speculation_policy import SpeculationPolicy

MAX_DRAFT_LIMIT = 64  # no DSpark profile drafts more than 16; 64 leaves headroom for other drafters
MAX_BATCH_LIMIT = 1 << 16
KNOWN_KNOBS = ("specgate_max_draft", "specgate_min_confidence", "specgate_max_batch")


class KnobError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def validate_client_xargs(xargs: Any) -> dict[str, Any] | None:
    """Check `vllm_xargs` from a client; raise KnobError naming the bad key."""
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        raise KnobError("'vllm_xargs' must be an object", "vllm_xargs")
    for key, value in xargs.items():
        if not key.startswith("specgate_"):
            continue
        param = f"vllm_xargs.{key}"
        if key == "specgate_max_draft":
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnobError(f"'{param}' must be an integer", param)
            if not 0 <= value <= MAX_DRAFT_LIMIT:
                raise KnobError(f"'{param}' must be between 0 and {MAX_DRAFT_LIMIT}", param)
        elif key == "specgate_max_batch":
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnobError(f"'{param}' must be an integer", param)
            if not 0 <= value <= MAX_BATCH_LIMIT:
                raise KnobError(f"'{param}' must be between 0 and {MAX_BATCH_LIMIT}", param)
        elif key == "specgate_min_confidence":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KnobError(f"'{param}' must be a number", param)
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise KnobError(f"'{param}' must be between 0 and 1", param)
        else:
            raise KnobError(f"unknown specgate knob '{param}'; known: {', '.join(KNOWN_KNOBS)}", param)
    return xargs


def merged_xargs(
    client: dict[str, Any] | None, policy: SpeculationPolicy, replica_knobs: frozenset[str]
) -> dict[str, Any] | None:
    """The `vllm_xargs` to send to one replica (None = leave the field absent).

    `replica_knobs` is what the replica advertises in `specgate_ext_info`
    (`max_draft`, `min_confidence`); the policy only adds knobs the replica
    honours, so a replica without adaptive verification is never sent a
    confidence floor it would ignore.
    """
    if "max_draft" not in replica_knobs:
        return client
    wanted = policy.vllm_xargs()
    if "min_confidence" not in replica_knobs:
        wanted.pop("specgate_min_confidence", None)
    if "max_batch" not in replica_knobs:
        wanted.pop("specgate_max_batch", None)
    if not wanted:
        return client
    out = dict(client) if client else {}
    cap = wanted.get("specgate_max_draft")
    if cap is not None:
        asked = out.get("specgate_max_draft")
        out["specgate_max_draft"] = cap if asked is None else min(int(asked), int(cap))
    floor = wanted.get("specgate_min_confidence")
    if floor is not None:
        asked = out.get("specgate_min_confidence")
        out["specgate_min_confidence"] = floor if asked is None else max(float(asked), float(floor))
    threshold = wanted.get("specgate_max_batch")
    if threshold is not None:
        asked = out.get("specgate_max_batch")
        out["specgate_max_batch"] = threshold if asked is None else min(int(asked), int(threshold))
    return out
