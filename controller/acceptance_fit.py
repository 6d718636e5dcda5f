"""Acceptance arithmetic shared by the estimators and the decision.

The controller models a tenant's drafts with one number, the conditional
per-position acceptance `a`: position i of a draft survives with probability
a**i (cumulative), so a draft capped at k tokens yields
tau(k) = 1 + a + a**2 + ... + a**k tokens per verification step. One number
is all the per-tenant telemetry can identify (vLLM reports drafted and
accepted totals per request, not per position), and the geometric shape is
what DSpark's measured per-position survival follows (s_i ~ s1 * r**(i-1)).
"""

from __future__ import annotations

import math


def expected_accepted(a: float, k: float) -> float:
    """Expected accepted draft tokens of a k-token draft (k may be fractional: a mean)."""
    if k <= 0 or a <= 0:
        return 0.0
    a = min(a, 0.9999)
    return a * (1.0 - a**k) / (1.0 - a)


def fit_conditional_acceptance(steps: float, drafted: float, accepted: float) -> float | None:
    """Solve expected_accepted(a, drafted/steps) = accepted/steps for a (bisection).

    None when there is nothing to fit (no verification steps or no drafts).
    """
    if steps <= 0 or drafted <= 0:
        return None
    k = drafted / steps
    m = max(0.0, accepted / steps)
    if m <= 0:
        return 0.0
    if m >= k:
        return 0.9999
    lo, hi = 0.0, 0.9999
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected_accepted(mid, k) < m:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def draft_length(a: float, cap: int, min_confidence: float | None) -> int:
    """Positions actually drafted: `cap`, cut at the first position whose
    cumulative confidence a**i falls below `min_confidence`."""
    if cap <= 0:
        return 0
    if not min_confidence or min_confidence <= 0:
        return cap
    if a <= 0:
        return 0
    if a >= 1:
        return cap
    last = math.floor(math.log(min_confidence) / math.log(a) + 1e-9)
    return max(0, min(cap, last))


def tokens_per_step(a: float, drafted: int) -> float:
    """Tokens emitted per verification step (bonus token included)."""
    return 1.0 + expected_accepted(a, drafted)
