"""The request path's plain-dict metric families expose what prometheus_client's
own Counter and Histogram expose for the same updates."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.hot_metrics import HotCounter, HotHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_same_exposition_as_prometheus_client_for_the_same_updates():
    ref, hot = CollectorRegistry(), CollectorRegistry()
    ref_c = Counter("x_requests", "Requests", ["tenant", "status"], registry=ref)
    ref_h = Histogram("x_latency_seconds", "Latency", ["tenant"], buckets=BUCKETS, registry=ref)
    hot_c = HotCounter("x_requests", "Requests", ["tenant", "status"], hot)
    hot_h = HotHistogram("x_latency_seconds", "Latency", ["tenant"], hot, BUCKETS)
    rng = random.Random(7)
    for _ in range(2000):
        tenant, status = rng.choice(["a", "b", "other"]), rng.choice(["200", "429", "503"])
        n = rng.choice([1, 3, 17])
        ref_c.labels(tenant, status).inc(n)
        hot_c.inc((tenant, status), n)
        # bucket bounds themselves, values between them, beyond the last and zero
        v = rng.choice([0.0, 0.005, 0.01, 2.5, 7.0, rng.random(), rng.random() / 100])
        ref_h.labels(tenant).observe(v)
        hot_h.observe((tenant,), v)
    assert _without_created(generate_latest(hot)) == _without_created(generate_latest(ref))
    assert hot_c.value("a", "200") == ref_c.labels("a", "200")._value.get()


def test_nan_is_summed_but_falls_in_no_bucket_as_in_prometheus_client():
    ref, hot = CollectorRegistry(), CollectorRegistry()
    ref_h = Histogram("x", "x", buckets=BUCKETS, registry=ref)
    hot_h = HotHistogram("x", "x", [], hot, BUCKETS)
    for v in (0.5, math.nan):
        ref_h.observe(v)
        hot_h.observe((), v)
    assert _without_created(generate_latest(hot)) == _without_created(generate_latest(ref))


def test_counter_refuses_a_negative_amount_and_parses_as_a_counter():
    r = CollectorRegistry()
    c = HotCounter("x_tokens", "Tokens", ["kind"], r)
    with pytest.raises(ValueError):
        c.inc(("prompt",), -1)
    c.inc(("prompt",), 5)
    (family,) = text_string_to_metric_families(generate_latest(r).decode())
    assert family.type == "counter" and [(s.name, s.labels, s.value) for s in family.samples] == [("x_tokens_total", {"kind": "prompt"}, 5.0)]


def test_a_name_taken_in_the_registry_is_refused():
    r = CollectorRegistry(auto_describe=True)
    Counter("x_requests", "Requests", registry=r)
    with pytest.raises(ValueError):
        HotCounter("x_requests", "Requests", [], r)


def test_unsorted_buckets_are_refused():
    with pytest.raises(ValueError):
        HotHistogram("x", "x", [], CollectorRegistry(), (1.0, 0.5))
