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
# Integer knobs: their upper bound; a smaller value means less speculation.
INTEGER_KNOBS = {"specgate_max_draft": MAX_DRAFT_LIMIT, "specgate_max_batch": MAX_BATCH_LIMIT}
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
        if key in INTEGER_KNOBS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnobError(f"'{param}' must be an integer", param)
            if not 0 <= value <= INTEGER_KNOBS[key]:
                raise KnobError(f"'{param}' must be between 0 and {INTEGER_KNOBS[key]}", param)
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
    (`max_draft`, `max_batch`, `min_confidence`); the policy only adds knobs
    the replica honours, so a replica without adaptive verification is never
    sent a confidence floor it would ignore.
    """
    if "max_draft" not in replica_knobs:
        return client
    wanted = {k: v for k, v in policy.vllm_xargs().items() if k.removeprefix("specgate_") in replica_knobs}
    if not wanted:
        return client
    out = dict(client) if client else {}
    for key, limit in wanted.items():
        asked = out.get(key)
        if asked is None:
            out[key] = limit
        elif key in INTEGER_KNOBS:  # a smaller cap / threshold is less speculation
            out[key] = min(int(asked), int(limit))
        else:  # specgate_min_confidence: a higher floor is less speculation
            out[key] = max(float(asked), float(limit))
    return out
