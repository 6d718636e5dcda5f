"""Metrics reference generated from the code: `python -m specgate.metrics_doc [--write FILE]`.

Why generated: a hand-written metrics table drifts from the code the first time someone renames
a label. This module instantiates each component's metrics object (each owns a private
CollectorRegistry, so nothing is started and nothing global is touched), reads name, type,
labels and help of every metric, and renders a Markdown table. `--write docs/operations.md`
replaces the section between the GENERATED METRICS markers; tests/specgate/test_metrics_doc.py
fails when the committed doc and the code disagree.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from gateway.hot_metrics import HotMetric

BEGIN = "<!-- BEGIN GENERATED METRICS -->"
END = "<!-- END GENERATED METRICS -->"

# (section title, "module:factory") -- the factory returns an object whose attributes are metrics.
SOURCES: tuple[tuple[str, str], ...] = (
    ("Gateway (`GET /metrics` on every gateway)", "gateway.metrics:GatewayMetrics"),
    ("Controller (`--metrics-port` when standalone; `GET /admin/controller/metrics` when embedded)",
     "controller.metrics:ControllerMetrics"),
)

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"),
             "gauge": ("",), "info": ("_info",), "enum": ("",)}


@dataclass(frozen=True)
class MetricInfo:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The names PromQL queries use (a counter `x` is queried as `x_total`)."""
        return tuple(self.name + s for s in _SUFFIXES.get(self.type, ("",)))


def metrics_of(obj: object) -> list[MetricInfo]:
    seen: dict[str, MetricInfo] = {}
    for value in vars(obj).values():
        if isinstance(value, MetricWrapperBase):
            family = value.describe()[0]
            seen[family.name] = MetricInfo(family.name, family.type, tuple(value._labelnames), family.documentation)
        elif isinstance(value, HotMetric):
            family = value.describe()[0]
            seen[family.name] = MetricInfo(family.name, family.type, value.labelnames, family.documentation)
    return sorted(seen.values(), key=lambda m: m.name)


def replica_metrics() -> list[MetricInfo]:
    """Metric families of a simulated replica, read through its real /metrics endpoint (in-process
    ASGI call; the engine loop is not started, so values are zero but every family is present)."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from drafters.sim.server import SimReplicaSettings, create_app

    text = TestClient(create_app(SimReplicaSettings(profile="dspark-b8"))).get("/metrics").text
    infos = []
    for fam in text_string_to_metric_families(text):
        labels: list[str] = []
        for sample in fam.samples:
            for key in sample.labels:
                if key not in labels and key not in ("le", "quantile"):
                    labels.append(key)
        infos.append(MetricInfo(fam.name, fam.type, tuple(labels), fam.documentation))
    return sorted(infos, key=lambda m: m.name)


def _load(spec: str) -> object:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)()


def collect() -> list[tuple[str, list[MetricInfo]]]:
    return [(title, metrics_of(_load(spec))) for title, spec in SOURCES]


def render() -> str:
    out = []
    for title, metrics in collect():
        out.append(f"**{title}**\n")
        out.append("| metric (as queried) | type | labels | meaning |")
        out.append("| --- | --- | --- | --- |")
        for m in metrics:
            names = ", ".join(f"`{n}`" for n in m.sample_names)
            labels = ", ".join(m.labels) or "–"
            out.append(f"| {names} | {m.type} | {labels} | {m.help.replace('|', '/')} |")
        out.append("")
    out.append("**Replicas** (`GET /metrics` on each replica: vLLM's own names, which real vLLM and "
               "`specgate sim-replica` both export; `DCGM_FI_*` as dcgm-exporter names them; `specgate_ext_info` "
               "from the `drafters.vllm_ext` plugin). Listed from a simulated `dspark-b8` replica's exposition:\n")
    out.append("| metric (as queried) | type | labels | meaning |")
    out.append("| --- | --- | --- | --- |")
    for m in replica_metrics():
        names = ", ".join(f"`{n}`" for n in m.sample_names)
        out.append(f"| {names} | {m.type} | {', '.join(m.labels) or '–'} | {m.help.replace('|', '/')} |")
    return "\n".join(out).rstrip() + "\n"


def replace_section(doc: str, body: str) -> str:
    start, end = doc.index(BEGIN), doc.index(END)
    return doc[: start + len(BEGIN)] + "\n" + body + doc[end:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    body = render()
    if args[:1] == ["--write"] and len(args) == 2:
        path = Path(args[1])
        path.write_text(replace_section(path.read_text(), body))
        print(f"updated {path}")
    elif args:
        print("usage: python -m specgate.metrics_doc [--write docs/operations.md]", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
