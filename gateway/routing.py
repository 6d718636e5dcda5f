"""Routing policy: a pure function of (replica states, request, tenant policy).

    rank_replicas(replicas, RouteRequest, policy, mode, now) -> [replica, ...]

The proxy tries the returned replicas in order (failover walks down the list).
Ranking, in priority order:

1. eligibility: healthy, serves the model, circuit breaker lets a request in;
2. speculation fit (tier): 0 = the replica's profile is the one the tenant's
   policy wants (`preferred_profile`, or `off` when speculation is disabled);
   1 = neutral (no preference, or a knob-capable replica that can be told
   `specgate_max_draft=0` per request); 2 = a mismatching pool;
3. within the best tier: least load (gateway in-flight + replica gauges), or,
   with affinity modes, a rendezvous hash of the session/prefix key so the
   same conversation lands on the same replica (prefix-cache reuse) unless
   that replica is `affinity_slack` requests busier than the least loaded one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol, Sequence

from contract.policy import SpeculationPolicy

AFFINITY_SLACK = 8.0


class ReplicaLike(Protocol):
    name: str
    profile: str | None
    healthy: bool

    @property
    def load(self) -> float: ...
    @property
    def supports_knobs(self) -> bool: ...
    def serves(self, model: str) -> bool: ...


@dataclass(frozen=True)
class RouteRequest:
    model: str
    tenant: str
    affinity_key: str | None = None  # session id or prompt prefix, per routing mode


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
    eligible = [
        r
        for i, r in enumerate(replicas)
        if r.healthy and r.serves(request.model) and (allowed is None or allowed[i])
    ]
    if not eligible:
        return []
    keyed = sorted(eligible, key=lambda r: (speculation_tier(r, policy), r.load, r.name))
    if request.affinity_key is None or len(keyed) == 1:
        return keyed
    best_tier = speculation_tier(keyed[0], policy)
    top = [r for r in keyed if speculation_tier(r, policy) == best_tier]
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
