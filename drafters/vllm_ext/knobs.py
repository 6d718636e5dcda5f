"""Per-request speculation knobs carried in `SamplingParams.extra_args`.

The gateway puts them into `vllm_xargs` (which vLLM copies verbatim into
`extra_args`); the plugin reads them in the engine core (draft cap) and in the
model-runner worker (confidence floor). Parsing is a PURE function so that the
rules can be tested without vLLM, and so both processes agree on them.

WHY lenient-but-safe parsing: the gateway already rejects bad values with a 400,
but a client talking to the replica directly (or an old gateway) may still send
junk. Junk must never crash the engine core -- a crash there kills every request
on the replica -- so an invalid value is reported and ignored, and the request
runs exactly as stock vLLM would run it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

MAX_DRAFT_KEY = "specgate_max_draft"
MIN_CONFIDENCE_KEY = "specgate_min_confidence"
MAX_BATCH_KEY = "specgate_max_batch"
KNOB_NAMES = ("max_draft", "min_confidence", "max_batch")
KEYS = (MAX_DRAFT_KEY, MIN_CONFIDENCE_KEY, MAX_BATCH_KEY)


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
