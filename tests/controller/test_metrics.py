"""The controller's Prometheus gauges: each refresh shows exactly the latest series."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest

from controller.metrics import ControllerMetrics


def _curve(flat_ms: float) -> dict:
    return {"flat_ms": flat_ms, "knee_tokens": 4.0, "slope_ms_per_token": 0.5, "draft_ms_per_request": 0.1,
            "request_ms": 0.2, "points": 7}


def _flat(m: ControllerMetrics) -> dict[str, float]:
    return {s.labels["replica"]: s.value for metric in m.step_flat.collect() for s in metric.samples}


def test_a_refresh_replaces_the_series_and_drops_what_is_gone():
    m = ControllerMetrics()
    m.observe_step_costs({"r0": _curve(30.0), "r1": _curve(40.0)})
    assert _flat(m) == {"r0": 0.03, "r1": 0.04}
    m.observe_step_costs({"r1": _curve(50.0)})
    assert _flat(m) == {"r1": 0.05}
    m.observe_step_costs({})
    assert _flat(m) == {}


def test_a_scrape_during_refreshes_never_misses_a_series_that_stays():
    """prometheus_client collects in the scraping thread; clear-then-set let a scrape see a
    replica's series missing, which Prometheus marks stale (the dashboard test saw it)."""
    m = ControllerMetrics()
    m.observe_step_costs({"r0": _curve(30.0)})
    stop, missing = threading.Event(), []

    def scrape():
        while not stop.is_set():
            text = generate_latest(m.registry).decode()
            if 'specgate_controller_replica_step_flat_seconds{replica="r0"}' not in text:
                missing.append(text)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(3000):
            m.observe_step_costs({"r0": _curve(30.0 + i % 7)})
    finally:
        stop.set()
        scraper.join()
    assert not missing
