"""Type and range checks for the OpenAI sampling fields, at parse time.

A bad `temperature` or `max_tokens` should cost the client one 400 from the
gateway, not routing, a budget admission and a replica slot before the engine
rejects it. The ranges are the OpenAI API reference's; `n` is bounded by
`MAX_N` (the gateway relays up to that many choices; more is a request no
replica should be asked to fan out). `max_tokens` is also held to the
model's context length where the replicas' /v1/models cards give one
(`check_fits_context`). Only the fields listed are checked;
every other field passes through untouched. A plain table and `isinstance`
checks: no model validation on the request path.
"""

from __future__ import annotations

from typing import Any

from .errors import GatewayError

MAX_N = 128  # choices per request; OpenAI's own bound for `n`
MAX_STOP = 4  # stop sequences, as OpenAI
MAX_TOP_LOGPROBS = 20  # as OpenAI


def _number(lo: float, hi: float):
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return "must be a number"
        if not lo <= v <= hi:
            return f"must be between {lo:g} and {hi:g}"
        return None

    return check


def _int(lo: int, hi: int | None = None):
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return "must be an integer"
        if v < lo:
            return f"must be at least {lo}"
        if hi is not None and v > hi:
            return f"must be at most {hi}"
        return None

    return check


def _any_int(v: Any) -> str | None:
    return "must be an integer" if isinstance(v, bool) or not isinstance(v, int) else None


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be a boolean"


def _stop(v: Any) -> str | None:
    if isinstance(v, str):
        return None
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return None if len(v) <= MAX_STOP else f"must have at most {MAX_STOP} sequences"
    return "must be a string or an array of strings"


# Generous upper bound for token counts where the model's own limit is the
# replica's to judge: a JSON number past it (`1e12`) is no token count.
_MAX_TOKENS = 2**31 - 1

CHECKS = {
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "max_tokens": _int(1, _MAX_TOKENS),
    "max_completion_tokens": _int(1, _MAX_TOKENS),
    "n": _int(1, MAX_N),
    "stream": _bool,
    "stop": _stop,
    "seed": _any_int,
    "top_logprobs": _int(0, MAX_TOP_LOGPROBS),
}
# `logprobs` is a boolean on chat, an integer (0-5) on completions.
_LOGPROBS = {"chat": _bool, "completions": _int(0, 5)}


def check_sampling(body: dict[str, Any], kind: str) -> None:
    """Raise the OpenAI 400 (`invalid_request_error`, `param` the field) for
    the first listed field with a wrong type or range. `null` is the field
    left unset, as OpenAI treats it."""
    for key, value in body.items():
        if value is None:
            continue
        check = CHECKS.get(key)
        if check is None:
            if key != "logprobs":
                continue
            check = _LOGPROBS["chat" if kind == "chat" else "completions"]
        problem = check(value)
        if problem is not None:
            raise GatewayError(400, f"'{key}' {problem}; got {_show(value)}.", param=key, code="invalid_value")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_COMPLETION_LIMITS = ("max_tokens", "max_completion_tokens")


def completion_limit(body: dict[str, Any]) -> int | None:
    """The request's largest completion-token limit (`max_tokens`,
    `max_completion_tokens`; None: it sets none)."""
    limits = [v for v in (body.get(k) for k in _COMPLETION_LIMITS) if type(v) is int]
    return max(limits) if limits else None


def fits_context(replica: Any, model: str, limit: int | None) -> bool:
    """Whether `replica` can take a request for `model` with completion limit
    `limit`: its card's context length is unknown or at least the limit.
    Routing (and so failover) skips the others: a request the longest
    context admits (`check_fits_context`) must not fail over to a replica
    with a shorter one and come back with that replica's 400."""
    if limit is None:
        return True
    n = replica.context_lengths.get(model, 0)
    return n == 0 or limit <= n


def context_lengths(cards: list[dict[str, Any]]) -> dict[str, int]:
    """{model id: context length} from a replica's /v1/models cards (vLLM's
    `max_model_len`); cards without a usable one are left out."""
    out = {}
    for card in cards:
        n = card.get("max_model_len")
        if type(n) is int and n > 0:
            out[card["id"]] = n
    return out


def check_fits_context(body: dict[str, Any], model: str, replicas: list) -> None:
    """Raise the OpenAI 400 when `max_tokens` (or `max_completion_tokens`)
    is greater than the model's context length, the bound vLLM itself
    applies (`max_tokens=N cannot be greater than max_model_len=M`); a limit
    up to it is served, clamped by the engine to what the prompt leaves. The
    longest context over the replicas that serve the model counts (routing
    may pick any of them); with no card giving a length, the replica judges,
    as before."""
    for key in _COMPLETION_LIMITS:
        value = body.get(key)
        if type(value) is not int:
            continue
        longest = max((r.context_lengths.get(model, 0) for r in replicas if r.serves(model)), default=0)
        if longest and value > longest:
            raise GatewayError(
                400,
                f"'{key}' cannot be greater than the model's context length of {longest} tokens; got {value}.",
                param=key,
                code="invalid_value",
            )
