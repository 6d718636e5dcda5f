"""The wedge watchdog's decisions (`gateway.health`), with time passed in:
which replicas are ejected, and when one is never ejected."""

from __future__ import annotations

from contract.settings import load_settings
from contract.vllm_metrics import VllmMetricsSnapshot
from gateway.health import HealthMonitor, note_progress, wedge_reason
from gateway.replicas import Registry


def _monitor(names=("a", "b"), **gateway):
    settings = load_settings(
        replicas=[{"url": f"http://{n}.invalid:8000", "name": n, "model": "m"} for n in names],
        gateway={"wedge_after_s": 3.0, "metrics_interval_s": 1.0, **gateway},
    )
    registry = Registry.from_settings(settings)
    for r in registry:
        r.healthy = True
    seen = []
    return HealthMonitor(registry, settings.gateway, on_wedged=lambda r, why: seen.append((r.name, why))), registry, seen


def test_an_unanswered_probe_ejects_after_wedge_after_s_and_tells_the_request_path():
    monitor, registry, seen = _monitor()
    a = registry.get("a")
    a.unanswered_since = 100.0
    assert monitor.watch(102.9) == []
    assert [r.name for r in monitor.watch(103.0)] == ["a"]
    assert seen == [("a", "no answer")] and not a.healthy and a.wedged == "no answer"
    assert monitor.watch(110.0) == []  # ejected once


def test_frozen_counters_with_running_requests_eject_but_idle_or_moving_ones_do_not():
    a = Registry.from_settings(load_settings(replicas=[{"url": "http://a.invalid:8000", "name": "a"}])).get("a")
    busy = VllmMetricsSnapshot(num_requests_running=2, generation_tokens=50.0)
    note_progress(a, busy, 10.0)
    note_progress(a, busy, 11.0)
    assert a.frozen_since == 11.0
    assert wedge_reason(a, 13.9, 3.0, 3.0) is None and wedge_reason(a, 14.0, 3.0, 3.0) == "no progress"
    note_progress(a, VllmMetricsSnapshot(num_requests_running=2, generation_tokens=51.0), 12.0)
    assert a.frozen_since is None  # a token moved
    note_progress(a, VllmMetricsSnapshot(num_requests_running=0, generation_tokens=51.0), 13.0)
    assert a.frozen_since is None  # idle is not frozen
    note_progress(a, VllmMetricsSnapshot(num_requests_running=3), 14.0)
    assert a.frozen_since is None  # no counters exported: nothing to judge


def test_progress_is_judged_over_at_least_three_scrapes():
    monitor, registry, _ = _monitor(wedge_after_s=1.0, metrics_interval_s=2.0)
    registry.get("a").frozen_since = 0.0
    assert monitor.watch(5.9) == []
    assert [r.name for r in monitor.watch(6.0)] == ["a"]


def test_the_last_routable_replica_of_a_model_is_never_ejected():
    monitor, registry, seen = _monitor()
    registry.get("b").healthy = False
    registry.get("a").unanswered_since = 0.0
    assert monitor.watch(100.0) == [] and seen == []
    assert registry.get("a").healthy


def test_unhealthy_replicas_are_checked_more_often_than_healthy_ones():
    monitor, registry, _ = _monitor(health_interval_s=2.0, health_unhealthy_interval_s=0.5)
    a, b = registry.get("a"), registry.get("b")
    a.last_check = b.last_check = 100.0
    b.healthy = False
    assert monitor.due(100.6) == [b]
    assert monitor.due(102.0) == [a, b]
    a.breaker.on_failure(101.0)
    a.breaker.opened_at = 101.0  # its breaker open: checked as often as an unhealthy one
    assert monitor.due(100.6) == [a, b]
