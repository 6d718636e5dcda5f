"""Routing policy: a pure function of (replica states, request, tenant policy).

    rank_replicas(replicas, RouteRequest, policy, mode, now) -> [replica, ...]

The proxy tries the returned replicas in order (failover walks down the list).
Which replicas a policy may use and which profile it wants are the routing
model in `contract.routing` (the controller prices placements on the same
functions); the ranking, in priority order:

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
4. placement (`placement_tier`): 0 = a replica the policy's `placement`
   names (the controller places tenants apart where sharing steps costs more
   than balance gains), or the policy names none; 1 = placed elsewhere;
5. within the best tiers: least load (gateway in-flight + replica gauges), or,
   with affinity modes, a rendezvous hash of the session/prefix key so the
   same conversation lands on the same replica (prefix-cache reuse) unless
   that replica is `affinity_slack` requests busier than the least loaded one.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple, Protocol, Sequence

from contract.policy import SpeculationPolicy
from contract.routing import FLEET_ONLY, canary_arm, drafter_order, drafter_tier, placement_tier, speculation_tier

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
        order = FLEET_ONLY  # what drafter_order gives such a policy, without the calls (every request of most tenants)
    else:
        order = drafter_order(policy, canary_arm(policy, request.arm_key))
    tiers: dict[int, tuple[int, int, int]] = {}
    eligible = []
    for i, r in enumerate(replicas):
        if not (r.healthy and r.serves(request.model) and (allowed is None or allowed[i])):
            continue
        d = drafter_tier(r, order)
        if d is None:
            continue
        tiers[id(r)] = (d, speculation_tier(r, policy), placement_tier(r.name, policy))
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
