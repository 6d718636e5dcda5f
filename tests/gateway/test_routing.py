"""Routing policy: pure function of replica states, request and tenant policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.policy import CanarySpec, SpeculationPolicy
from contract.routing import FLEET_ONLY, canary_arm, drafter_order, placement_tier, speculation_tier
from gateway.routing import RouteRequest, affinity_key, rank_replicas


@dataclass
class R:
    name: str
    profile: str | None = None
    healthy: bool = True
    load: float = 0.0
    supports_knobs: bool = False
    models: set = field(default_factory=lambda: {"m"})
    drafter: str | None = None

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


def test_placement_wins_over_load_after_profile_fit_and_fails_over():
    rs = [R("r0", profile="dspark-b8", load=0), R("r1", profile="dspark-b8", load=7),
          R("r2", profile="dspark-b16", load=0)]
    placed = SpeculationPolicy(placement=("r1",))
    assert placement_tier("r1", placed) == 0 and placement_tier("r0", placed) == 1
    assert placement_tier("r0", DEFAULT) == 0  # no placement: every replica fits
    assert names(rank_replicas(rs, REQ, placed)) == ["r1", "r0", "r2"]
    # Profile fit ranks first: a placement never pulls a request onto a mismatching pool.
    both = SpeculationPolicy(preferred_profile="dspark-b16", placement=("r1",))
    assert names(rank_replicas(rs, REQ, both)) == ["r2", "r1", "r0"]
    # A preference, not a filter: with the placed replica down the others serve.
    rs[1].healthy = False
    assert names(rank_replicas(rs, REQ, placed)) == ["r0", "r2"]
    # Affinity keeps to the placed replicas while they are within the slack.
    rs[1].healthy = True
    for i in range(8):
        assert rank_replicas(rs, RouteRequest("m", "t", f"s{i}"), placed)[0].name == "r1"


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


# -- tenant drafters: reserved replicas, preference with fallback, canary arms --

def fleet():
    return [R("shared", load=0), R("own", drafter="alpha-v1", load=5), R("cand", drafter="alpha-v2", load=9),
            R("other", drafter="beta-v1", load=0)]


def test_reserved_replicas_never_serve_tenants_whose_policy_does_not_name_their_drafter():
    for policy in (DEFAULT, SpeculationPolicy(preferred_profile="dspark-b8"), SpeculationPolicy(drafter="gamma-v1")):
        for i in range(50):
            assert names(rank_replicas(fleet(), RouteRequest("m", "t", arm_key=f"r{i}"), policy)) == ["shared"]


def test_a_tenant_drafter_is_preferred_over_less_loaded_shared_replicas_and_falls_back_to_them():
    policy = SpeculationPolicy(drafter="alpha-v1")
    assert names(rank_replicas(fleet(), REQ, policy)) == ["own", "shared"]
    rs = fleet()
    rs[1].healthy = False
    assert names(rank_replicas(rs, REQ, policy)) == ["shared"]


def test_canary_arm_is_deterministic_and_near_the_share():
    policy = SpeculationPolicy(canary=CanarySpec(drafter="alpha-v2", share=0.2))
    keys = [f"req-{i}" for i in range(20_000)]
    arms = [canary_arm(policy, k) for k in keys]
    assert arms == [canary_arm(policy, k) for k in keys]  # same key, same arm
    assert abs(sum(arms) / len(keys) - 0.2) < 0.015
    other = SpeculationPolicy(canary=CanarySpec(drafter="alpha-v3", share=0.2))
    assert [canary_arm(other, k) for k in keys] != arms  # a new candidate draws a fresh subset
    assert not any(canary_arm(DEFAULT, k) for k in keys)


def test_a_policy_without_drafter_or_canary_ranks_as_its_drafter_order_says():
    """rank_replicas skips drafter_order for such a policy (most requests): same order."""
    assert drafter_order(DEFAULT, True) == drafter_order(DEFAULT, False) == FLEET_ONLY
    assert names(rank_replicas(fleet(), RouteRequest("m", "alpha"), DEFAULT)) == ["shared"]


def test_canary_arm_goes_to_the_candidate_the_rest_to_the_incumbent_each_falling_back_to_the_other():
    policy = SpeculationPolicy(drafter="alpha-v1", canary=CanarySpec(drafter="alpha-v2", share=0.5))
    assert drafter_order(policy, True) == ("alpha-v2", "alpha-v1", None)
    assert drafter_order(policy, False) == ("alpha-v1", None, "alpha-v2")
    firsts = {}
    for i in range(400):
        req = RouteRequest("m", "alpha", arm_key=f"r{i}")
        ranked = names(rank_replicas(fleet(), req, policy))
        assert "other" not in ranked
        firsts[i] = ranked[0]
        assert ranked == (["cand", "own", "shared"] if canary_arm(policy, req.arm_key) else ["own", "shared", "cand"])
    assert 150 < sum(f == "cand" for f in firsts.values()) < 250
    rs = fleet()
    rs[2].healthy = False  # the candidate is down: its arm is served by the incumbent
    assert {rank_replicas(rs, RouteRequest("m", "alpha", arm_key=f"r{i}"), policy)[0].name for i in range(100)} == {"own"}


def test_canary_without_a_tenant_drafter_splits_between_candidate_and_shared():
    policy = SpeculationPolicy(canary=CanarySpec(drafter="alpha-v2", share=0.3))
    seen = {rank_replicas(fleet(), RouteRequest("m", "alpha", arm_key=f"r{i}"), policy)[0].name for i in range(200)}
    assert seen == {"cand", "shared"}


def test_drafter_preference_ranks_before_profile_fit_and_affinity_stays_within_the_best_tiers():
    rs = [R("s-b8", profile="dspark-b8"), R("own-b16", profile="dspark-b16", drafter="alpha-v1", load=3),
          R("own-b8", profile="dspark-b8", drafter="alpha-v1", load=4)]
    policy = SpeculationPolicy(drafter="alpha-v1", preferred_profile="dspark-b8")
    assert names(rank_replicas(rs, REQ, policy)) == ["own-b8", "own-b16", "s-b8"]
    for i in range(30):
        assert rank_replicas(rs, RouteRequest("m", "alpha", f"session-{i}"), policy)[0].name == "own-b8"
