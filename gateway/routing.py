"""Routing policy: a pure function of (replica states, request, tenant policy).

    rank_replicas(replicas, RouteRequest, policy, mode, now) -> [replica, ...]

The proxy tries the returned replicas in order (failover walks down the list).
Ranking, in priority order:

1. eligibility: healthy, serves the model, circuit breaker lets a request in,
   and -- for a replica reserved to a tenant drafter (`ReplicaConfig.drafter`)
   -- the tenant's policy names that drafter (`drafter`, or `canary.drafter`);
2. drafter fit (`drafter_tier`): the replicas of the drafter this request's
   arm wants first (the canary's for the share of requests `canary_arm`
   picks, else the tenant's own drafter, else the shared fleet), then the
   other arms' replicas the tenant may use, so a preference never fails a
   request while any eligible replica is up;
3. speculation fit (tier): 0 = the replica's profile is the one the tenant's
   policy wants (`preferred_profile`, or `off` when speculation is disabled);
   1 = neutral (no preference, or a knob-capable replica that can be told
   `specgate_max_draft=0` per request); 2 = a mismatching pool;
4. within the best tiers: least load (gateway in-flight + replica gauges), or,
   with affinity modes, a rendezvous hash of the session/prefix key so the
   same conversation lands on the same replica (prefix-cache reuse) unless
   that replica is `affinity_slack` requests busier than the least loaded one.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple, Protocol, Sequence

from contract.policy import SpeculationPolicy

AFFINITY_SLACK = 8.0


class ReplicaLike(Protocol):
    name: str
    profile: str | None
    healthy: bool
    drafter: str | None  # a tenant drafter it is reserved to (read with getattr: None when absent)

    @property
    def load(self) -> float: ...
    @property
    def supports_knobs(self) -> bool: ...
    def serves(self, model: str) -> bool: ...


class RouteRequest(NamedTuple):
    """What routing needs of one request (a tuple: built on every request)."""

    model: str
    tenant: str
    affinity_key: str | None = None  # session id or prompt prefix, per routing mode
    arm_key: str = ""  # what the canary arm is drawn from: the session id if any, else the request id


def wanted_profile(policy: SpeculationPolicy) -> str | None:
    if not policy.enabled:
        return "off"
    return policy.preferred_profile


def speculation_tier(replica: ReplicaLike, policy: SpeculationPolicy) -> int:
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


def canary_arm(policy: SpeculationPolicy, arm_key: str) -> bool:
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


def drafter_order(policy: SpeculationPolicy, in_canary: bool) -> tuple[str | None, ...]:
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


_FLEET_ONLY: tuple[str | None, ...] = (None,)


def drafter_tier(replica: ReplicaLike, order: tuple[str | None, ...]) -> int | None:
    """The replica's place in `order`; None: reserved to a drafter this tenant does not use."""
    drafter = getattr(replica, "drafter", None)
    try:
        return order.index(drafter)
    except ValueError:
        return None


def _rendezvous(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{name}".encode(), digest_size=8).digest(), "big")


def rank_replicas(
    replicas: Sequence[ReplicaLike],
    request: RouteRequest,
    policy: SpeculationPolicy,
    *,
    allowed: Sequence[bool] | None = None,
    affinity_slack: float = AFFINITY_SLACK,
) -> list[ReplicaLike]:
    """Eligible replicas, best first. `allowed[i]` = replica i's breaker admits a request."""
    if policy.canary is None and policy.drafter is None:
        order = _FLEET_ONLY  # what drafter_order gives such a policy, without the calls (every request of most tenants)
    else:
        order = drafter_order(policy, canary_arm(policy, request.arm_key))
    tiers: dict[int, tuple[int, int]] = {}
    eligible = []
    for i, r in enumerate(replicas):
        if not (r.healthy and r.serves(request.model) and (allowed is None or allowed[i])):
            continue
        d = drafter_tier(r, order)
        if d is None:
            continue
        tiers[id(r)] = (d, speculation_tier(r, policy))
        eligible.append(r)
    if len(eligible) < 2:
        return eligible
    keyed = sorted(eligible, key=lambda r: (tiers[id(r)], r.load, r.name))
    if request.affinity_key is None:
        return keyed
    best_tier = tiers[id(keyed[0])]
    top = [r for r in keyed if tiers[id(r)] == best_tier]
    least = top[0].load
    near = [r for r in top if r.load <= least + affinity_slack]
    sticky = max(near, key=lambda r: _rendezvous(request.affinity_key or "", r.name))
    return [sticky] + [r for r in keyed if r is not sticky]


def affinity_key(mode: str, body: dict, session: str | None, prefix_chars: int) -> str | None:
    """The key affinity modes hash on (None for least_load)."""
    if mode == "session_affinity":
        return session
    if mode == "prefix_affinity":
        if "messages" in body and isinstance(body["messages"], list):
            parts = []
            for m in body["messages"]:
                content = m.get("content") if isinstance(m, dict) else None
                parts.append(content if isinstance(content, str) else repr(content))
                if sum(map(len, parts)) >= prefix_chars:
                    break
            text = "\x1e".join(parts)
        else:
            prompt = body.get("prompt")
            text = prompt if isinstance(prompt, str) else repr(prompt)
        return text[:prefix_chars]
    return None
