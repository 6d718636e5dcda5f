"""Capture, the pure half: which requests are mirrored to the capture replica,
how their token ids are read, and how the gateway's injected ids are taken
out of a whole response again. No I/O here (the queue and its workers are
`gateway.capture_mirror`).

The flow, and why each step is where it is:

1. When the request is routed (its policy is known), `sampled` decides
   whether it is a capture candidate: the tenant's resolved policy has a
   `capture` block (opt-in: without one a tenant is never captured), a
   capture target is configured, the request's shape has one output
   (`shape_refusal`), a `fraction` draw, and room in the tenant's hourly
   budget. Decided up front because the answer changes the upstream request:
   a candidate is sent with `return_token_ids: true`.
2. The response goes to the client as it would without capture: a stream's
   injected ids are stripped by the ledger's tap
   (`gateway.stream.taps.LedgerTap`, the same tap, hence the same bytes, as
   every stream the gateway can continue), a whole body's by `strip_token_ids`
   (byte-exact to the replica's own body). One difference remains for streams
   that cannot be continued (penalties, logprobs, tools, structured output):
   vLLM writes unasked ids as explicit `null`s in each chunk, the tap leaves
   the injected keys out -- equal as JSON, not as bytes.
3. The relay leaves what it saw in `ctx.capture_seen` (`StreamSeen`, or a
   whole body's `WholeIds`); the plan itself is never changed.
4. After the response is complete, `stream_sample` / `whole_sample` read the
   prompt and completion ids, only for a request that finished (`stop` or
   `length`), was not continued on another replica, and whose ids agree with
   the usage the replica reported; `sample_outcome` then decides between the
   queue and a counted drop (too long, budget, queue full).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .stream.shape import one_prompt_one_output

if TYPE_CHECKING:
    from contract.policy import CaptureSpec

    from .stream.taps import LedgerTap

HOUR_S = 3600.0
# A request that ended otherwise (abort, error, content filter, tool-call
# parsing failures) is not a faithful sample of the target's output.
CAPTURED_FINISH = frozenset({"stop", "length"})

# Outcomes (`specgate_capture_requests_total{outcome}`).
SENT, FAILED, DROPPED_QUEUE, DROPPED_BUDGET, TOO_LONG = "sent", "failed", "dropped_queue", "dropped_budget", "too_long"


def shape_refusal(body: dict[str, Any], endpoint: str) -> str | None:
    """Why a request cannot be captured whatever its tenant's policy (None: it
    can): a sample is one prompt and one completion (`gateway.stream.shape`,
    the rule continuation shares)."""
    return one_prompt_one_output(body, endpoint)


class HourlyBudget:
    """Per tenant, the captures enqueued in the last hour (a sliding window,
    exact: at most `limit` in any hour), per gateway instance. Memory is
    bounded by the limit per tenant. `has_room` is asked when the request
    starts (no ids are injected for a request that could not be captured),
    `take` when its sample is enqueued, so nothing is reserved for requests
    that end without a sample and nothing can leak."""

    def __init__(self) -> None:
        self._sent: dict[str, deque[float]] = {}

    def _window(self, tenant: str, now: float) -> deque[float]:
        q = self._sent.get(tenant)
        if q is None:
            q = self._sent[tenant] = deque()
        while q and q[0] <= now - HOUR_S:
            q.popleft()
        return q

    def has_room(self, tenant: str, limit: int, now: float) -> bool:
        return len(self._window(tenant, now)) < limit

    def take(self, tenant: str, limit: int, now: float) -> bool:
        q = self._window(tenant, now)
        if len(q) >= limit:
            return False
        q.append(now)
        return True

    def used(self, tenant: str, now: float) -> int:
        return len(self._window(tenant, now))


def sampled(spec: CaptureSpec | None, target_url: str | None, draw: float) -> bool:
    """The fraction draw of an opted-in tenant (`draw` uniform in [0, 1)).
    False for a tenant without `capture` and while no target is configured."""
    return spec is not None and bool(target_url) and draw < spec.fraction


@dataclass(frozen=True, slots=True)
class CapturePlan:
    """A capture candidate, as decided when the request was routed: who, and
    within which budget."""

    tenant: str
    label: str  # the tenant's metrics label
    model: str  # the request's model
    limit: int  # the tenant's max_per_hour, as of the decision


# A whole body's (prompt ids, completion ids, finish_reason).
WholeIds = tuple[list[int], list[int], str | None]


@dataclass(frozen=True, slots=True)
class StreamSeen:
    """What the relay saw of a captured stream: the tap that relayed it (its
    ledger, complete after `tap.ledger_so_far()`; `saw_done`, `error`: the
    stream's end as relayed) and whether it broke mid-way (continued, or
    ended with an error event)."""

    tap: LedgerTap
    broken: bool


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


def whole_body_ids(obj: Any, chat: bool) -> WholeIds | None:
    """(prompt ids, completion ids, finish_reason) of a whole n=1 response
    sent with `return_token_ids` (chat: prompt ids at the top level;
    completions: on the choice); None when they are missing."""
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list) or len(obj["choices"]) != 1:
        return None
    choice = obj["choices"][0]
    if not isinstance(choice, dict):
        return None
    prompt = _ids(obj.get("prompt_token_ids") if chat else choice.get("prompt_token_ids"))
    completion = _ids(choice.get("token_ids"))
    if prompt is None or completion is None:
        return None
    return prompt, completion, choice.get("finish_reason")


def _agrees(prompt: list[int], completion: list[int], finish: Any, usage: Any) -> bool:
    """The ids are the whole request: it finished, and the replica's own usage
    counts exactly these many prompt and completion tokens (a replica that
    withheld ids for part of the output, e.g. hidden reasoning, fails here)."""
    if finish not in CAPTURED_FINISH or not prompt or not isinstance(usage, dict):
        return False
    return usage.get("prompt_tokens") == len(prompt) and usage.get("completion_tokens") == len(completion)


def stream_sample(seen: StreamSeen, usage: Any, continued: bool) -> tuple[list[int], list[int]] | None:
    """A finished stream's (prompt ids, completion ids), or None: not a sample
    (broken, continued on another replica, no [DONE], not finished, ids
    missing or disagreeing with usage)."""
    tap = seen.tap
    if continued or seen.broken:
        return None
    ledger = tap.ledger_so_far()  # the tap parses the events it relayed only when asked
    if ledger.prompt_ids is None:
        return None
    if not tap.saw_done or tap.error is not None:  # the relayed stream did not end as a whole one does
        return None
    if len(ledger.parts) != 1:
        return None
    prompt, completion = list(ledger.prompt_ids), list(ledger.sent_ids)
    return (prompt, completion) if _agrees(prompt, completion, ledger.finish_reason, usage) else None


def whole_sample(whole: WholeIds | None, usage: Any) -> tuple[list[int], list[int]] | None:
    """A whole response's (prompt ids, completion ids), or None: not a sample."""
    if whole is None:
        return None
    prompt, completion, finish = whole
    return (prompt, completion) if _agrees(prompt, completion, finish, usage) else None


def sample_outcome(n_tokens: int, max_tokens: int, budget_room: bool, queue_full: bool) -> str | None:
    """What becomes of a finished sample: None = enqueue it; else the counted
    drop. Order: a sample too long is never sent whatever the budget; then
    the hourly budget; then the queue (a full queue is the capture replica
    falling behind, reported apart from the tenant's own cap)."""
    if n_tokens > max_tokens:
        return TOO_LONG
    if not budget_room:
        return DROPPED_BUDGET
    if queue_full:
        return DROPPED_QUEUE
    return None


# `"token_ids":[...]` / `"prompt_token_ids":[...]` as a key of a JSON object
# (after a comma: the characters before a key inside a string would be `\"`).
_IDS_FIELD = re.compile(rb',"(prompt_token_ids|token_ids)":\[[0-9,\s]*\]')
# vLLM's whole responses are pydantic `model_dump()`s: every field is there,
# unset ones `null` -- `system_fingerprint` always is; a replica that leaves
# unset fields out (the sim replica, `contract.wire`) leaves it out too.
_WRITES_NULLS = re.compile(rb'[,{]"system_fingerprint":')


def strip_token_ids(data: bytes) -> bytes:
    """A whole response sent with the gateway's `return_token_ids` as the
    replica would have sent it without: the id lists become `null` where the
    replica writes unset fields (vLLM), or are left out where it omits them;
    every other byte is untouched (no re-serialisation, so float formatting
    and key order cannot change)."""
    if _WRITES_NULLS.search(data):
        return _IDS_FIELD.sub(lambda m: b',"' + m.group(1) + b'":null', data)
    return _IDS_FIELD.sub(b"", data)
