"""Routing policy: pure function of replica states, request and tenant policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.routing import RouteRequest, affinity_key, rank_replicas, speculation_tier
from contract.policy import SpeculationPolicy


@dataclass
class R:
    name: str
    profile: str | None = None
    healthy: bool = True
    load: float = 0.0
    supports_knobs: bool = False
    models: set = field(default_factory=lambda: {"m"})

    def serves(self, model: str) -> bool:
        return model in self.models


REQ = RouteRequest(model="m", tenant="t")
DEFAULT = SpeculationPolicy()


def names(rs):
    return [r.name for r in rs]


def test_least_load_first_and_ties_by_name():
    rs = [R("c", load=2), R("a", load=1), R("b", load=1)]
    assert names(rank_replicas(rs, REQ, DEFAULT)) == ["a", "b", "c"]


def test_unhealthy_wrong_model_and_open_breaker_are_excluded():
    rs = [R("a", healthy=False), R("b", models={"other"}), R("c"), R("d")]
    assert names(rank_replicas(rs, REQ, DEFAULT, allowed=[True, True, True, False])) == ["c"]
    assert rank_replicas([R("a", healthy=False)], REQ, DEFAULT) == []


def test_disabled_speculation_prefers_off_pool_even_if_busier():
    rs = [R("spec", profile="dspark-b8", load=0), R("off", profile="off", load=5)]
    policy = SpeculationPolicy(enabled=False)
    assert names(rank_replicas(rs, REQ, policy)) == ["off", "spec"]


def test_disabled_speculation_ranks_knob_capable_spec_replica_before_plain_spec():
    rs = [R("plain", profile="dspark-b8"), R("knob", profile="dspark-b8", supports_knobs=True, load=3)]
    policy = SpeculationPolicy(enabled=False)
    assert speculation_tier(rs[1], policy) == 1 and speculation_tier(rs[0], policy) == 2
    assert names(rank_replicas(rs, REQ, policy)) == ["knob", "plain"]


def test_preferred_profile_wins_over_load_and_falls_back():
    rs = [R("b8", profile="dspark-b8", load=9), R("b16", profile="dspark-b16", load=0)]
    policy = SpeculationPolicy(preferred_profile="dspark-b8")
    assert names(rank_replicas(rs, REQ, policy)) == ["b8", "b16"]
    rs[0].healthy = False
    assert names(rank_replicas(rs, REQ, policy)) == ["b16"]


def test_no_preference_is_pure_least_load():
    rs = [R("off", profile="off", load=3), R("b8", profile="dspark-b8", load=1)]
    assert names(rank_replicas(rs, REQ, DEFAULT)) == ["b8", "off"]


def test_affinity_is_sticky_and_spreads_keys():
    rs = [R(n) for n in "abcd"]
    picks = {rank_replicas(rs, RouteRequest("m", "t", f"session-{i}"), DEFAULT)[0].name for i in range(40)}
    assert len(picks) >= 3  # different sessions spread
    for i in range(5):
        req = RouteRequest("m", "t", f"s{i}")
        first = rank_replicas(rs, req, DEFAULT)[0].name
        rs_loaded = [R(r.name, load=(2 if r.name != first else 0)) for r in rs]
        assert rank_replicas(rs_loaded, req, DEFAULT)[0].name == first  # same key, same replica


def test_affinity_yields_to_overload():
    rs = [R("a"), R("b")]
    req = RouteRequest("m", "t", "k")
    sticky = rank_replicas(rs, req, DEFAULT)[0].name
    for r in rs:
        r.load = 100 if r.name == sticky else 0
    assert rank_replicas(rs, req, DEFAULT)[0].name != sticky


def test_affinity_key_modes():
    body = {"messages": [{"role": "system", "content": "You are X"}, {"role": "user", "content": "hello"}]}
    assert affinity_key("least_load", body, "s", 64) is None
    assert affinity_key("session_affinity", body, "s1", 64) == "s1"
    assert affinity_key("prefix_affinity", body, None, 64).startswith("You are X")
    assert affinity_key("prefix_affinity", {"prompt": "p" * 500}, None, 64) == "p" * 64
