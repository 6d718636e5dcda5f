"""ReplicaState.load: the gateway's exact in-flight count plus what the lagging gauges add."""

from __future__ import annotations

import pytest

from contract.vllm_metrics import VllmMetricsSnapshot
from gateway.replicas import ReplicaState
from gateway.routing import RouteRequest, rank_replicas
from contract.policy import SpeculationPolicy


def scraped(name: str, inflight_then: int, running: float, waiting: float = 0.0) -> ReplicaState:
    st = ReplicaState(name=name, url=f"http://{name}", profile="off", configured_model="m", healthy=True)
    st.open_attempts = inflight_then
    st.observe_metrics(VllmMetricsSnapshot(num_requests_running=running, num_requests_waiting=waiting), at=0.0)
    return st


def test_own_requests_are_not_counted_twice():
    """A replica whose requests finished since the scrape is as free as its
    in-flight count says: the stale gauge held our own requests."""
    busy_then = scraped("a", inflight_then=10, running=10)
    busy_then.open_attempts = 6  # four finished since
    steady = scraped("b", inflight_then=8, running=8)
    assert busy_then.load == pytest.approx(6)
    assert steady.load == pytest.approx(8)
    assert rank_replicas([steady, busy_then], RouteRequest("m", "t"), SpeculationPolicy())[0].name == "a"


def test_other_gateways_requests_and_the_queue_still_count():
    shared = scraped("a", inflight_then=4, running=10, waiting=2)  # 8 requests came from elsewhere
    assert shared.load == pytest.approx(4 + 8 + 2)
    shared.observe_metrics(None, at=1.0)  # a failed scrape keeps the last gauges
    assert shared.load == pytest.approx(4 + 8 + 2)


def test_the_replica_view_shows_the_engine_fixes_a_scrape_reported():
    st = scraped("a", inflight_then=0, running=0)
    assert st.describe()["engine_fixes"] == []
    st.observe_metrics(
        VllmMetricsSnapshot(ext_knobs=frozenset({"max_draft"}), ext_engine_fixes=frozenset({"expand_batch_to_tokens"})),
        at=1.0,
    )
    assert st.describe()["engine_fixes"] == ["expand_batch_to_tokens"]
