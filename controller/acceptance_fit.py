"""Acceptance arithmetic shared by the estimators and the decision.

The controller models a tenant's drafts with one number, the conditional
per-position acceptance `a`: position i of a draft survives with probability
a**i (cumulative), so a draft capped at k tokens yields
tau(k) = 1 + a + a**2 + ... + a**k tokens per verification step. It is
fitted to drafted and accepted totals; the geometric shape is what DSpark's
measured per-position survival follows (s_i ~ s1 * r**(i-1)). Where a tenant
has enough proposals with vLLM's per-request `acceptance_histogram`, its
measured survival per position (`Proposal.survival`, from
`controller.estimators`) replaces the geometric shape in the tokens a draft
yields: a whole-match drafter such as ngram (a copy accepted whole or left
early) does not follow it, and extrapolated along it from a cap of 4 a
tenant's drafts of 8 were priced at 3.4 accepted tokens where they gave 4.8.
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
    # Measured: [i-1] = the share of proposals whose drafts are accepted up to position i at
    # least (short proposals included); None = not enough histograms, the geometric shape.
    survival: tuple[float, ...] | None = None

    def drafted(self, length: int) -> float:
        """Mean draft tokens verified per decode step."""
        return self.rate * self.fill * length

    def tokens(self, a: float, length: int) -> float:
        """Mean tokens emitted per decode step (bonus token included): in a
        share `rate` of the steps a proposal, whose accepted drafts are the
        measured survival summed over the `length` positions, or (without
        one) `a`'s geometric survival over `fill` x `length` tokens."""
        if self.survival:
            return 1.0 + self.rate * survival_sum(self.survival, length)
        return 1.0 + self.rate * expected_accepted(a, self.fill * length)


def survival_sum(survival: tuple[float, ...], length: int) -> float:
    """Expected accepted drafts of a proposal allowed `length` positions: the survival summed
    over them, continued past the measured positions at the last position's conditional rate."""
    if length <= 0:
        return 0.0
    total = sum(survival[:length])
    if length > len(survival) and survival[-1] > 0:
        prev = survival[-2] if len(survival) > 1 else 1.0
        r, s = min(survival[-1] / prev, 0.9999) if prev > 0 else 0.0, survival[-1]
        total += s * r * (1.0 - r ** (length - len(survival))) / (1.0 - r)
    return total


def survival_from_counts(reach: list[float], survived: list[float], q_prior: float, pseudo_steps: float) -> tuple[float, ...]:
    """PURE: the survival per position from per-position counts (`contract.telemetry`'s
    `survival_reach_{i}`, `survival_accepted_{i}`). Each position's conditional rate
    q_i = survived_i / reach_i is shrunk by `pseudo_steps` toward the previous position's (the
    first toward `q_prior`, the tenant's geometric acceptance), so a position without evidence
    continues the shape measured before it instead of falling to a prior that another drafter's
    shape set; the survival is the running product of the q_i."""
    out, q, s = [], q_prior, 1.0
    for r, n in zip(reach, survived):
        q = (n + pseudo_steps * q) / (r + pseudo_steps)
        s *= min(max(q, 0.0), 1.0)
        out.append(s)
    return tuple(out)


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
# The measured survival replaces the geometric shape once this many (decayed) proposal steps
# with histograms back it; each position's rate is shrunk by SURVIVAL_PSEUDO_STEPS.
SURVIVAL_MIN_STEPS = 30.0
SURVIVAL_PSEUDO_STEPS = 20.0


def method_proposal(method: str) -> Proposal:
    """The proposal prior of a speculation method (`ALWAYS_PROPOSES` for a trained drafter)."""
    return PROPOSAL_PRIOR.get(method, ALWAYS_PROPOSES)
