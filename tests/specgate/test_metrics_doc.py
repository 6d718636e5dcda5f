"""The metrics reference in docs/operations.md is generated from the code and kept in sync."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.hot_metrics import HotCounter, HotHistogram
from specgate import metrics_doc
from tests.specgate.conftest import REPO


def test_doc_section_matches_the_code():
    doc = (REPO / "docs" / "operations.md").read_text()
    current = doc.split(metrics_doc.BEGIN, 1)[1].split(metrics_doc.END, 1)[0]
    assert current.strip() == metrics_doc.render().strip(), (
        "metrics reference is stale: run `python -m specgate.metrics_doc --write docs/operations.md`"
    )


def test_every_registered_metric_is_listed():
    from controller.metrics import ControllerMetrics
    from gateway.metrics import GatewayMetrics

    body = metrics_doc.render()
    for obj in (GatewayMetrics(), ControllerMetrics()):
        for family in obj.registry.collect():
            assert f"`{family.name}" in body, family.name


def test_sample_names_follow_the_exposition_format():
    class M:
        def __init__(self):
            r = CollectorRegistry()
            self.c = Counter("x_requests", "help", ["tenant"], registry=r)
            self.h = Histogram("x_latency_seconds", "help", registry=r)
            self.hot_c = HotCounter("x_tokens", "help", ["tenant", "kind"], r)
            self.hot_h = HotHistogram("x_ttft_seconds", "help", ["replica"], r, (0.1, 1.0))

    infos = {m.name: m for m in metrics_doc.metrics_of(M())}
    assert infos["x_requests"].sample_names == ("x_requests_total",)
    assert infos["x_requests"].labels == ("tenant",)
    assert infos["x_latency_seconds"].sample_names == (
        "x_latency_seconds_bucket", "x_latency_seconds_sum", "x_latency_seconds_count")
    assert infos["x_tokens"].sample_names == ("x_tokens_total",) and infos["x_tokens"].labels == ("tenant", "kind")
    assert infos["x_ttft_seconds"].type == "histogram" and infos["x_ttft_seconds"].labels == ("replica",)


def test_write_replaces_only_the_generated_section(tmp_path):
    doc = tmp_path / "ops.md"
    doc.write_text(f"# title\nbefore\n{metrics_doc.BEGIN}\nSTALE-ROW\n{metrics_doc.END}\nafter\n")
    assert metrics_doc.main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# title\nbefore\n") and text.endswith(f"{metrics_doc.END}\nafter\n")
    assert "STALE-ROW" not in text and "specgate_requests_total" in text
