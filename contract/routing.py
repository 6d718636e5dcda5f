"""Where a policy's requests go: the one model of routing that the gateway
ranks replicas by (`gateway/routing.py`) and the controller prices a cap's
placement on (`controller/decision/placement.py`).

Why in `contract`: the controller must price a tenant's candidate cap where
the gateway will send that tenant's traffic under the policy it publishes
(a tenant switched off lands on the `off` pool; a cap fits one profile's
replicas). Written once here, the two cannot drift apart; before, the
controller mirrored the gateway's tiers and only a test kept them in step.

Two questions, each answered once:

* which replicas a request may use at all (`drafter_order`, `drafter_tier`):
  a replica reserved to a tenant drafter serves only tenants whose policy
  names that drafter (its own, or its canary's for the share `canary_arm`
  draws); the shared fleet serves everyone;
* which profile its policy wants (`wanted_profile`, `speculation_tier`):
  `off` while it does not speculate, else its preferred profile, which the
  controller sets to the smallest block that drafts its cap
  (`profile_for_cap`). A replica of that profile is tier 0, a replica that
  can be told not to draft per request (or an unlabelled one) tier 1, a
  mismatching pool tier 2;
* which replicas its placement prefers (`placement_tier`): the controller
  may place tenants apart (`SpeculationPolicy.placement`, a list of replica
  names), which ranks below drafter and profile fit and never excludes a
  replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol

from .profiles import OFF

_OFF = OFF.label  # "off": the pool of replicas that do not speculate

__all__ = ["FLEET_ONLY", "canary_arm", "drafter_order", "drafter_tier", "placement_tier", "profile_for_cap",
           "speculation_tier", "wanted_profile"]


class Steering(Protocol):
    """What routing reads of a policy (`contract.policy.SpeculationPolicy`)."""

    enabled: bool
    preferred_profile: str | None


class Routable(Protocol):
    """What routing reads of a replica (the gateway's live state, the controller's view)."""

    profile: str | None

    @property
    def supports_knobs(self) -> bool: ...


def wanted_profile(policy: Steering) -> str | None:
    """The profile the policy's requests are steered to (None: no preference)."""
    if not policy.enabled:
        return _OFF
    return policy.preferred_profile


def speculation_tier(replica: Routable, policy: Steering) -> int:
    """0: the profile the policy wants (or it wants none); 1: neutral (an
    unlabelled replica, or one that can be told `specgate_max_draft=0` for a
    policy that does not speculate); 2: a mismatching pool."""
    wanted = wanted_profile(policy)
    if wanted is None:
        return 0
    if replica.profile == wanted:
        return 0
    if not policy.enabled and replica.supports_knobs:
        return 1  # can be told specgate_max_draft=0 for this request
    if replica.profile is None:
        return 1  # unlabelled: unknown fit
    return 2


class Placed(Protocol):
    """What placement reads of a policy."""

    placement: tuple[str, ...] | None


def placement_tier(name: str, policy: Placed) -> int:
    """0: the replica called `name` is one the policy's placement names, or
    the policy has none; 1: placed elsewhere (still eligible: a placement is
    a preference, so a request fails over to the other replicas)."""
    placement = policy.placement
    return 0 if placement is None or name in placement else 1


def profile_for_cap(k: int, speculative: Iterable[tuple[int, str]]) -> str | None:
    """The profile a policy drafting at most k tokens prefers, given the
    fleet's speculative (block, profile) pairs: the smallest block that
    drafts k, when the fleet runs more than one speculative profile (with
    one, any speculative replica fits and none is preferred)."""
    spec = sorted(set(speculative))
    fitting = [p for b, p in spec if b >= k]
    return fitting[0] if fitting and len(spec) > 1 else None


def canary_arm(policy, arm_key: str) -> bool:
    """True: this request belongs to the canary's share. Deterministic (a hash
    of the canary's drafter id and the request's arm key, uniform in [0, 1),
    below `share`), so a retried request or a session's next turn stays in its
    arm, and a new canary draws a fresh subset. Why the session and not the
    prefix-affinity key: a prefix shared by many users (one system prompt)
    would put all of them in one arm and skew the share."""
    canary = policy.canary
    if canary is None:
        return False
    digest = hashlib.blake2b(f"{canary.drafter}|{arm_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < canary.share


def drafter_order(policy, in_canary: bool) -> tuple[str | None, ...]:
    """The drafters (None = the shared fleet) this request may use, preferred
    first. The incumbent arm: the tenant's own drafter, the shared fleet, then
    the candidate as a last resort; the canary arm: the candidate, then the
    incumbent's order. A drafter not listed is another tenant's: never used.
    (Telemetry is per replica, so a request served by the other arm's replica
    is counted for that arm, not mixed into this one.)"""
    order: list[str | None] = []
    canary = policy.canary.drafter if policy.canary is not None else None
    if in_canary and canary is not None:
        order.append(canary)
    for d in (policy.drafter, None, canary):
        if d not in order:
            order.append(d)
    return tuple(order)


# What drafter_order gives a policy with neither drafter nor canary (most tenants).
FLEET_ONLY: tuple[str | None, ...] = (None,)


def drafter_tier(replica, order: tuple[str | None, ...]) -> int | None:
    """The replica's place in `order`; None: reserved to a drafter this tenant does not use."""
    drafter = getattr(replica, "drafter", None)
    try:
        return order.index(drafter)
    except ValueError:
        return None
