"""Per-request speculation knobs (`vllm_xargs.specgate_*`): their names, the
one strict parser for client input (the gateway answers 400), the one lenient
parser for the engine side (the vLLM plugin and the simulator never fail a
request), the merge of a client's knobs with the tenant's policy, and the
per-step rules (`cap_at`, `step_draft_len`).

The gateway puts the knobs into `vllm_xargs` (which vLLM copies verbatim into
`SamplingParams.extra_args`); the plugin reads them in the engine core (draft
cap, load threshold) and in the model-runner worker (confidence floor).
Everything here is pure and imports nothing beyond the standard library,
because the plugin loads this module inside vLLM's own environment.

WHY lenient-but-safe parsing: the gateway already rejects bad values with a 400,
but a client talking to the replica directly (or an old gateway) may still send
junk. Junk must never crash the engine core -- a crash there kills every request
on the replica -- so an invalid value is reported and ignored, and the request
runs exactly as stock vLLM would run it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol

MAX_DRAFT_KEY = "specgate_max_draft"
MIN_CONFIDENCE_KEY = "specgate_min_confidence"
MAX_BATCH_KEY = "specgate_max_batch"
KNOB_NAMES = ("max_draft", "min_confidence", "max_batch")
KEYS = (MAX_DRAFT_KEY, MIN_CONFIDENCE_KEY, MAX_BATCH_KEY)
KEY_PREFIX = "specgate_"

MAX_DRAFT_LIMIT = 64  # no DSpark profile drafts more than 16; 64 leaves headroom for other drafters
MAX_BATCH_LIMIT = 1 << 16
# Integer knobs: their upper bound for client input; a smaller value means less speculation.
INTEGER_KNOBS = {MAX_DRAFT_KEY: MAX_DRAFT_LIMIT, MAX_BATCH_KEY: MAX_BATCH_LIMIT}


@dataclass(frozen=True)
class RequestKnobs:
    """What one request asked for; None = key absent or invalid (= stock behaviour)."""

    max_draft: int | None = None
    min_confidence: float | None = None
    # Draft only while the step's batch (requests scheduled together) is at
    # most this: the controller's per-tenant "compute-bound above B" verdict,
    # applied by the engine at every step -- also to requests already in
    # flight when a load step arrives, which a per-request cap set at
    # admission cannot reach.
    max_batch: int | None = None
    errors: tuple[str, ...] = field(default=())

    @property
    def is_stock(self) -> bool:
        return self.max_draft is None and self.min_confidence is None and self.max_batch is None

    def cap_at(self, batch: int) -> int | None:
        """The draft cap in a step of `batch` requests (None = uncapped)."""
        return cap_at(self.max_draft, self.max_batch, batch)


def cap_at(max_draft: int | None, max_batch: int | None, batch: int) -> int | None:
    """A request's draft cap in a step of `batch` requests: 0 above its
    `max_batch`, else its `max_draft` (None = uncapped). Shared by the plugin
    and the simulator (drafters.sim)."""
    if max_batch is not None and batch > max_batch:
        return 0
    return max_draft


STOCK = RequestKnobs()


def _parse_count(key: str, value: Any) -> tuple[int | None, str | None]:
    """A non-negative integer (int, integral float or digit string)."""
    if isinstance(value, bool):  # bool is an int subclass; True is not a count
        return None, f"{key} must be an integer >= 0, got boolean {value!r}"
    if isinstance(value, int):
        parsed = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None, f"{key} must be an integer >= 0, got {value!r}"
        parsed = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text.lstrip("+").isdigit():
            return None, f"{key} must be an integer >= 0, got {value!r}"
        parsed = int(text)
    else:
        return None, f"{key} must be an integer >= 0, got {type(value).__name__}"
    if parsed < 0:
        return None, f"{key} must be an integer >= 0, got {parsed}"
    return parsed, None


def _parse_min_confidence(value: Any) -> tuple[float | None, str | None]:
    if isinstance(value, bool):
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got boolean {value!r}"
    if isinstance(value, (int, float)):
        parsed = float(value)
    elif isinstance(value, str):
        try:
            parsed = float(value.strip())
        except ValueError:
            return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {value!r}"
    else:
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {type(value).__name__}"
    if not math.isfinite(parsed) or not 0.0 <= parsed <= 1.0:
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {value!r}"
    return parsed, None


def parse_knobs(extra_args: Mapping[str, Any] | None) -> RequestKnobs:
    """Read the specgate keys from a request's extra_args. Never raises."""
    if not extra_args or not isinstance(extra_args, Mapping):
        return STOCK
    if not any(key in extra_args for key in KEYS):
        return STOCK
    errors: list[str] = []
    max_draft = min_confidence = max_batch = None
    if MAX_DRAFT_KEY in extra_args:
        max_draft, err = _parse_count(MAX_DRAFT_KEY, extra_args[MAX_DRAFT_KEY])
        if err:
            errors.append(err)
    if MIN_CONFIDENCE_KEY in extra_args:
        min_confidence, err = _parse_min_confidence(extra_args[MIN_CONFIDENCE_KEY])
        if err:
            errors.append(err)
    if MAX_BATCH_KEY in extra_args:
        max_batch, err = _parse_count(MAX_BATCH_KEY, extra_args[MAX_BATCH_KEY])
        if err:
            errors.append(err)
    return RequestKnobs(max_draft=max_draft, min_confidence=min_confidence, max_batch=max_batch, errors=tuple(errors))


def effective_draft_len(scheduled: int, knobs: RequestKnobs, batch: int = 1) -> int:
    """How many of `scheduled` draft tokens a request may keep under its cap in a step of `batch` requests."""
    cap = knobs.cap_at(batch)
    if cap is None:
        return scheduled
    return min(scheduled, cap)


def step_draft_len(caps: Iterable[int | None], stock_k: int) -> int:
    """The K a step drafts with under per-request caps: the largest cap among
    the step's requests, `stock_k` as soon as one of them is uncapped (None).
    0 -- every request capped at 0 -- means the drafter is not run at all.
    Shared by the plugin's scheduler hook and the simulator (drafters.sim)."""
    if stock_k <= 0:
        return stock_k
    k = 0
    for cap in caps:
        if cap is None or cap >= stock_k:
            return stock_k
        k = max(k, cap)
    return k


# -- client side: strict --------------------------------------------------


class KnobError(ValueError):
    """A client's knob is invalid; `param` names it for the OpenAI error body."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def validate_client_xargs(xargs: Any) -> dict[str, Any] | None:
    """Check `vllm_xargs` from a client; raise KnobError naming the bad key.

    Stricter than `parse_knobs` on purpose: a client that sends junk is told
    so (400) instead of silently getting stock behaviour. Keys without the
    `specgate_` prefix belong to other extensions and pass untouched.
    """
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        raise KnobError("'vllm_xargs' must be an object", "vllm_xargs")
    for key, value in xargs.items():
        if not key.startswith(KEY_PREFIX):
            continue
        param = f"vllm_xargs.{key}"
        if key in INTEGER_KNOBS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnobError(f"'{param}' must be an integer", param)
            if not 0 <= value <= INTEGER_KNOBS[key]:
                raise KnobError(f"'{param}' must be between 0 and {INTEGER_KNOBS[key]}", param)
        elif key == MIN_CONFIDENCE_KEY:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KnobError(f"'{param}' must be a number", param)
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise KnobError(f"'{param}' must be between 0 and 1", param)
        else:
            raise KnobError(f"unknown specgate knob '{param}'; known: {', '.join(KEYS)}", param)
    return xargs


# -- the merge -----------------------------------------------------------


class KnobPolicy(Protocol):
    """What the merge needs of a tenant policy (`contract.policy.SpeculationPolicy`)."""

    def vllm_xargs(self) -> dict[str, int | float]: ...


def merged_xargs(
    client: dict[str, Any] | None, policy: KnobPolicy, replica_knobs: frozenset[str]
) -> dict[str, Any] | None:
    """The `vllm_xargs` to send to one replica (None = leave the field absent).

    The tenant policy is a *cap*: a client may ask for less speculation than
    its policy allows (smaller `specgate_max_draft`, higher
    `specgate_min_confidence`, smaller `specgate_max_batch`), never more.
    `replica_knobs` is what the replica advertises in `specgate_ext_info`
    (`max_draft`, `max_batch`, `min_confidence`); the policy only adds knobs
    the replica honours, so a replica without adaptive verification is never
    sent a confidence floor it would ignore, and a replica without the
    extension gets the client's `vllm_xargs` untouched.
    """
    if "max_draft" not in replica_knobs:
        return client
    wanted = {k: v for k, v in policy.vllm_xargs().items() if k.removeprefix(KEY_PREFIX) in replica_knobs}
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
