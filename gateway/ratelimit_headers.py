"""OpenAI-style `x-ratelimit-*` response headers from a budget decision.

Why OpenAI's names and formats: clients and SDK wrappers written against
OpenAI already read `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
to pace themselves; the same headers from the gateway let them work
unchanged. Pure functions: the admit stage calls them with the decision it
got (from the store, a lease or the local fallback); what each source knows,
and so how approximate the numbers are, is documented in docs/gateway.md.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Mapping

from contract.store import WindowDecision


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes it (Go's style): `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(decision: WindowDecision, limits: Mapping[str, int], costs: Mapping[str, int]) -> list[tuple[bytes, bytes]]:
    """The three headers per limited field the decision has an opinion on.

    `remaining` is what is left after this request when it was admitted, and
    what was left before it when it was denied (a denied request consumed
    nothing). `reset` is the time until the window counts none of the usage
    it holds (`WindowDecision.reset_s`). Fields without a limit, or not
    evaluated (a denial stops at the first field that does not fit), get no
    headers."""
    out: list[tuple[bytes, bytes]] = []
    for field, (limit_name, remaining_name, reset_name) in _NAMES:
        limit = limits.get(field, 0)
        used = decision.used.get(field)
        if not limit or used is None:
            continue
        if not decision.allowed:
            used -= costs.get(field, 0)
        remaining = max(0, min(limit, math.floor(limit - used + 1e-9)))
        out += [
            (limit_name, _number(limit)),
            (remaining_name, str(remaining).encode()),
            (reset_name, _reset(round(decision.reset_s.get(field, 0.0) * 1000))),
        ]
    return out


# Header names, and the values that repeat request after request, built once
# (these headers are on every budgeted response: the hot path).
_NAMES = tuple(
    (field, (b"x-ratelimit-limit-" + field.encode(), b"x-ratelimit-remaining-" + field.encode(), b"x-ratelimit-reset-" + field.encode()))
    for field in ("requests", "tokens")
)


@lru_cache(maxsize=256)
def _number(value: int) -> bytes:
    return str(value).encode()


@lru_cache(maxsize=8192)
def _reset(ms: int) -> bytes:
    return format_reset(ms / 1000).encode()
