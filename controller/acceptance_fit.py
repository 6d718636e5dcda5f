"""Acceptance arithmetic shared by the estimators and the decision.

The controller models a tenant's drafts with one number, the conditional
per-position acceptance `a`: position i of a draft survives with probability
a**i (cumulative), so a draft capped at k tokens yields
tau(k) = 1 + a + a**2 + ... + a**k tokens per verification step. It is
fitted to drafted and accepted totals; the geometric shape is what DSpark's
measured per-position survival follows (s_i ~ s1 * r**(i-1)). vLLM's
per-request `acceptance_histogram` would identify the survival per position
(a whole-match drafter such as ngram does not follow the geometric shape);
it is not used yet (docs/controller.md, Known limits).
"""

from __future__ import annotations

import math
from typing import NamedTuple


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


class Proposal(NamedTuple):
    """How often and how fully a request proposes when it may draft `length`
    tokens: in a share `rate` of its decode steps, `fill` x `length` tokens on
    average. A trained drafter (DSpark, DFlash, EAGLE-3) proposes its whole
    cap every step (`ALWAYS_PROPOSES`); ngram prompt lookup proposes only where it finds
    its last tokens earlier in the context, and then the copy that followed,
    often shorter than the cap. Pricing ngram as a full block every step put
    ~9 verified tokens per request-step where the bed verified ~3, and the
    controller switched a tenant off that gained from drafting."""

    rate: float = 1.0
    fill: float = 1.0

    def drafted(self, length: int) -> float:
        """Mean draft tokens verified per decode step."""
        return self.rate * self.fill * length

    def tokens(self, a: float, length: int) -> float:
        """Mean tokens emitted per decode step (bonus token included): a
        proposal of `fill` x `length` tokens in a share `rate` of the steps."""
        return 1.0 + self.rate * expected_accepted(a, self.fill * length)


ALWAYS_PROPOSES = Proposal()

# The conditional acceptance assumed before a tenant has evidence, per method:
# a trained drafter's (DSpark, DFlash, EAGLE-3) 0.7; prompt lookup's 0.3, the
# CPU bed's two tenants midway (greedy text ~0.5, T=1 text ~0). Estimates are
# shrunk toward it by a pseudo-count (`controller.estimators`), never toward
# other tenants' data.
ACCEPTANCE_PRIOR = 0.7
METHOD_ACCEPTANCE_PRIOR: dict[str, float] = {"ngram": 0.3}


def method_acceptance_prior(method: str) -> float:
    return METHOD_ACCEPTANCE_PRIOR.get(method, ACCEPTANCE_PRIOR)


# Weak priors per method for the methods that may not propose, each with the
# pseudo-count behind it (decode steps for the rate, full-proposal tokens for
# the fill): the estimate becomes the tenant's own after a few requests. The
# ngram values are the CPU bed's two tenants midway (greedy text proposed in
# ~0.4 of its decode steps, T=1 text in ~0.2, ~5.5 of 8 tokens a proposal:
# the calibration notes of drafters/sim/ngram_acceptance.py), never another
# tenant's data.
PROPOSAL_PRIOR: dict[str, Proposal] = {"ngram": Proposal(rate=0.3, fill=0.7)}
PRIOR_DECODE_STEPS = 50.0
PRIOR_FULL_TOKENS = 100.0


def method_proposal(method: str) -> Proposal:
    """The proposal prior of a speculation method (`ALWAYS_PROPOSES` for a trained drafter)."""
    return PROPOSAL_PRIOR.get(method, ALWAYS_PROPOSES)
