"""Source of the provisioned Grafana dashboard (docker/grafana/dashboards/specgate.json).

Why generated: a Grafana dashboard is ~2,000 lines of JSON in which panel ids, grid positions and
datasource references must stay consistent; writing the panels as data here keeps the PromQL
readable and reviewable. `python docker/grafana/dashboard.py` rewrites the JSON; the test
tests/stack/test_dashboard.py checks the committed JSON is exactly this output, that every
expression parses (promtool) and that every metric it names is exported by a live gateway,
controller and simulated replica.

Metric sources: `specgate_*` (gateway; `specgate_controller_*` controller), `vllm:*` (each vLLM
replica or simulator), `DCGM_FI_*` (dcgm-exporter; the simulator exports the same names), `up`
(Prometheus). The `replica` label on vllm:* series is added by Prometheus' scrape config.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "specgate.json"
PROM = {"type": "prometheus", "uid": "specgate-prometheus"}
RI = "$__rate_interval"
T = 'tenant=~"$tenant"'
R = 'replica=~"$replica"'


def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict:
    target = {"datasource": PROM, "expr": expr, "legendFormat": legend or "__auto", "refId": ref}
    if instant:
        target["instant"] = True
        target["range"] = False
    return target


def timeseries(title, targets, unit="short", desc="", w=12, h=8, min_=None, thresholds=None, stack=False):
    defaults = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10 if not stack else 40,
                                         "showPoints": "never", "stacking": {"mode": "normal" if stack else "none"}}}
    if min_ is not None:
        defaults["min"] = min_
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
        defaults["custom"]["thresholdsStyle"] = {"mode": "line+area"}
    return {"type": "timeseries", "title": title, "description": desc, "datasource": PROM, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "mean"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "_w": w, "_h": h}


def state_timeline(title, targets, mappings, desc="", w=12, h=8):
    return {"type": "state-timeline", "title": title, "description": desc, "datasource": PROM, "targets": targets,
            "fieldConfig": {"defaults": {"mappings": mappings, "color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute",
                                                        "steps": [{"color": "red", "value": None},
                                                                  {"color": "green", "value": 1}]}},
                            "overrides": []},
            "options": {"showValue": "auto", "mergeValues": True, "rowHeight": 0.8,
                        "legend": {"displayMode": "list", "placement": "bottom"}},
            "_w": w, "_h": h}


def table(title, targets, desc="", w=12, h=8):
    return {"type": "table", "title": title, "description": desc, "datasource": PROM, "targets": targets,
            "fieldConfig": {"defaults": {}, "overrides": []},
            "transformations": [{"id": "labelsToFields", "options": {"mode": "columns"}},
                                {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}],
            "options": {"showHeader": True}, "_w": w, "_h": h}


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_w": 24, "_h": 1}


def pct(metric: str, by: str, selector: str, qs=(0.5, 0.9, 0.99), legend_by: str = "") -> list[dict]:
    refs = "ABCDEFGH"
    out = []
    for i, quant in enumerate(qs):
        grouping = f"le, {by}" if by else "le"
        legend = f"p{int(quant * 100)}" + (f" {{{{{legend_by}}}}}" if legend_by else "")
        out.append(q(f"histogram_quantile({quant}, sum by ({grouping}) (rate({metric}_bucket{{{selector}}}[{RI}])))",
                     legend, refs[i]))
    return out


ON_OFF = [{"type": "value", "options": {"0": {"text": "off", "color": "red"}, "1": {"text": "on", "color": "green"}}}]
UP_DOWN = [{"type": "value", "options": {"0": {"text": "down", "color": "red"}, "1": {"text": "up", "color": "green"}}}]


def panels() -> list[dict]:
    return [
        row("Speculation: acceptance, regime, decisions"),
        timeseries(
            "Acceptance length per tenant (gateway, per-request metrics)",
            [q(f"1 + sum by (tenant) (rate(specgate_spec_accepted_tokens_total{{{T}}}[{RI}]))"
               f" / sum by (tenant) (rate(specgate_spec_steps_total{{{T}}}[{RI}]))", "{{tenant}}")],
            desc="Tokens emitted per verification step for each tenant's requests: 1 + accepted draft tokens / "
                 "verification steps, from vLLM's per-request metrics.speculative_decoding that the gateway records.",
            min_=1),
        timeseries(
            "Acceptance length per replica (vLLM counters)",
            [q(f"1 + sum by (replica) (rate(vllm:spec_decode_num_accepted_tokens_total{{{R}}}[{RI}]))"
               f" / sum by (replica) (rate(vllm:spec_decode_num_drafts_total{{{R}}}[{RI}]))", "{{replica}}"),
             q(f"max by (replica) (specgate_controller_replica_acceptance_length{{{R}}})", "{{replica}} (controller)", "B")],
            desc="AL = 1 + accepted / drafts (vLLM's formula). Dashed: the controller's smoothed estimate.",
            min_=1),
        timeseries(
            "rho (compute-bound index) per replica",
            [q(f"max by (replica) (specgate_controller_replica_rho{{{R}}})", "{{replica}}")],
            desc="Tokens verified per engine step / the roofline knee of the replica's GPU+model. Above ~1 the step "
                 "is compute-bound: extra draft tokens cost more than they save and the controller turns "
                 "speculation down or off.",
            min_=0, thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.7},
                                {"color": "red", "value": 1}]),
        timeseries(
            "Tokens per engine step per replica",
            [q(f"sum by (replica) (rate(vllm:iteration_tokens_total_sum{{{R}}}[{RI}]))"
               f" / sum by (replica) (rate(vllm:iteration_tokens_total_count{{{R}}}[{RI}]))", "{{replica}}"),
             q(f"max by (replica) (specgate_controller_replica_batch{{{R}}})", "{{replica}} batch (controller)", "B")],
            desc="vLLM's iteration_tokens histogram (tokens per step, despite its name) and the controller's "
                 "smoothed running batch."),
        state_timeline(
            "Speculation on/off per tenant (controller policy)",
            [q(f"max by (tenant) (specgate_controller_policy_enabled{{{T}}})", "{{tenant}}")],
            ON_OFF,
            desc="The policy the active controller publishes; annotations carry each change and its reason.",
            w=24, h=7),
        timeseries(
            "Draft cap (max_draft) and load threshold (max_batch) per tenant",
            [q(f"max by (tenant) (specgate_controller_policy_max_draft{{{T}}})", "{{tenant}} max_draft"),
             q(f"max by (tenant) (specgate_controller_policy_max_batch{{{T}}})", "{{tenant}} max_batch", "B")],
            desc="specgate_max_draft sent to replicas in vllm_xargs; 0 = no speculation; -1 = replica default. "
                 "specgate_max_batch: the engine stops drafting the tenant's requests in steps of more requests "
                 "(-1 = none).",
            w=8),
        timeseries(
            "Confidence floor per tenant",
            [q(f"max by (tenant) (specgate_controller_policy_min_confidence{{{T}}})", "{{tenant}}")],
            desc="specgate_min_confidence: drafts are cut at the first position whose cumulative confidence "
                 "falls below it.", unit="percentunit", w=8),
        timeseries(
            "Estimated per-position acceptance per tenant (controller)",
            [q(f"max by (tenant) (specgate_controller_tenant_acceptance{{{T}}})", "{{tenant}}")],
            desc="Decayed, shrunk-to-fleet-mean estimate of each tenant's conditional per-position acceptance.",
            unit="percentunit", w=8),
        timeseries(
            "Controller decisions",
            [q("sum by (outcome) (rate(specgate_controller_decisions_total[" + RI + "]))", "{{outcome}}"),
             q("sum (rate(specgate_controller_policy_changes_total[" + RI + "]))", "policy changes", "B"),
             q("max (specgate_controller_is_leader) by (instance)", "leader {{instance}}", "C"),
             q("max (specgate_controller_paused)", "paused", "D")],
            desc="Per-tenant decisions by outcome (hold/on/off), published changes, which instance holds the "
                 "Redis leader lock, admin pause."),
        table(
            "Fleet plan (recommended replica profiles)",
            [q("max by (replica, current, recommended) (specgate_controller_fleet_plan) == 1", "", "A", instant=True)],
            desc="Which profile each replica should be launched with, as the controller recommends it (a "
                 "restart applies it: the default `recommend` actuator changes nothing, see /admin/fleet-plan's "
                 "recommendation; the `kubernetes` one scales the per-profile pools)."),

        row("Traffic and latency"),
        timeseries(
            "Requests/s per tenant",
            [q(f"sum by (tenant) (rate(specgate_requests_total{{{T}}}[{RI}]))", "{{tenant}}")],
            unit="reqps", stack=True),
        timeseries(
            "Generated tokens/s",
            [q(f"sum by (tenant) (rate(specgate_tokens_total{{{T}, kind=\"completion\"}}[{RI}]))", "{{tenant}}"),
             q(f"sum by (replica) (rate(vllm:generation_tokens_total{{{R}}}[{RI}]))", "{{replica}} (vLLM)", "B")],
            desc="Completion tokens per tenant (gateway accounting) and per replica (vLLM).", unit="short"),
        timeseries(
            "TTFT percentiles (replicas, vLLM)",
            pct("vllm:time_to_first_token_seconds", "", R),
            unit="s", w=8),
        timeseries(
            "TPOT percentiles (replicas, vLLM)",
            pct("vllm:request_time_per_output_token_seconds", "", R),
            desc="Time per output token of finished requests.", unit="s", w=8),
        timeseries(
            "Upstream TTFT percentiles (seen by the gateway)",
            pct("specgate_upstream_ttft_seconds", "", R),
            unit="s", w=8),
        timeseries(
            "Gateway-added latency",
            pct("specgate_gateway_overhead_seconds", "stream", "", qs=(0.5, 0.99), legend_by="stream"),
            desc="Time spent in the gateway itself (auth, budgets, routing, proxying) excluding the replica's time; "
                 "for streams, up to the first byte. Also returned per response in a header.",
            unit="s"),
        timeseries(
            "End-to-end latency p99 per tenant",
            [q(f"histogram_quantile(0.99, sum by (le, tenant) (rate(specgate_request_duration_seconds_bucket{{{T}}}[{RI}])))",
               "{{tenant}}")],
            unit="s"),
        timeseries(
            "Rate-limit rejections",
            [q(f"sum by (tenant, limit) (rate(specgate_budget_rejections_total{{{T}}}[{RI}]))", "{{tenant}} {{limit}}"),
             q(f"sum by (tenant) (rate(specgate_requests_total{{{T}, status=\"429\"}}[{RI}]))", "{{tenant}} HTTP 429", "B")],
            desc="Requests denied by per-tenant request/token budgets (enforced atomically in Redis across gateways).",
            unit="reqps"),
        timeseries(
            "Errors by status",
            [q(f"sum by (status) (rate(specgate_requests_total{{{T}, status!~\"2..\"}}[{RI}]))", "{{status}}")],
            unit="reqps"),

        row("Replicas"),
        state_timeline(
            "Replica health (gateway view)",
            [q(f"max by (replica) (specgate_replica_healthy{{{R}}})", "{{replica}}"),
             q("max by (replica) (up{job=\"replica\"})", "{{replica}} scrape", "B")],
            UP_DOWN,
            desc="Routable per the gateway's health checks and circuit breaker; 'scrape' is Prometheus reaching "
                 "the replica's /metrics."),
        timeseries(
            "Running / waiting requests",
            [q(f"sum by (replica) (vllm:num_requests_running{{{R}}})", "{{replica}} running"),
             q(f"sum by (replica) (vllm:num_requests_waiting{{{R}}})", "{{replica}} waiting", "B"),
             q(f"sum by (replica) (specgate_replica_inflight{{{R}}})", "{{replica}} gateway in-flight", "C")]),
        timeseries(
            "KV cache usage",
            [q(f"max by (replica) (vllm:kv_cache_usage_perc{{{R}}})", "{{replica}}")],
            unit="percentunit", min_=0, w=8),
        timeseries(
            "GPU activity (DCGM)",
            [q("avg by (instance) (DCGM_FI_PROF_SM_ACTIVE)", "{{instance}} SM active"),
             q("avg by (instance) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)", "{{instance}} tensor pipe", "B"),
             q("avg by (instance) (DCGM_FI_PROF_DRAM_ACTIVE)", "{{instance}} DRAM", "C"),
             q("avg by (instance) (DCGM_FI_DEV_GPU_UTIL) / 100", "{{instance}} GPU_UTIL", "D")],
            desc="GPU_UTIL reads ~100% whenever decode is busy; SM/tensor/DRAM activity tell compute-bound from "
                 "memory-bound.", unit="percentunit", w=8),
        timeseries(
            "Upstream attempts and breakers",
            [q(f"sum by (replica, outcome) (rate(specgate_upstream_attempts_total{{{R}}}[{RI}]))", "{{replica}} {{outcome}}"),
             q(f"max by (replica) (specgate_replica_breaker_open{{{R}}})", "{{replica}} breaker open", "B")],
            w=8),
    ]


def annotations() -> dict:
    return {"list": [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "Speculation on/off", "datasource": PROM, "enable": True, "iconColor": "orange",
         "expr": "changes(max by (tenant) (specgate_controller_policy_enabled)[2m:10s]) > 0",
         "step": "10s", "titleFormat": "speculation switched for {{tenant}}",
         "textFormat": "tenant {{tenant}}: policy enabled flag changed (see Decision reasons)",
         "tagKeys": "tenant", "useValueForTime": False},
        {"name": "Draft cap changes", "datasource": PROM, "enable": False, "iconColor": "yellow",
         "expr": "changes(max by (tenant) (specgate_controller_policy_max_draft)[2m:10s]) > 0",
         "step": "10s", "titleFormat": "max_draft changed for {{tenant}}", "tagKeys": "tenant"},
        # Decision reasons (free text with the numbers behind each decision) come from the admin API's
        # decision history through the Infinity JSON datasource (docker/grafana/provisioning).
        {"name": "Decision reasons", "datasource": INFINITY, "enable": True, "iconColor": "purple",
         "target": {"refId": "Anno", "type": "json", "source": "url", "format": "table", "parser": "backend",
                    "url": DECISIONS_URL, "url_options": {"method": "GET"}, "root_selector": DECISIONS_ROOT,
                    "columns": DECISIONS_COLUMNS},
         "mappings": {"time": {"source": "field", "value": "time"}, "text": {"source": "field", "value": "text"},
                      "tags": {"source": "field", "value": "tags"}}},
    ]}


# Admin API decision history (controller/admin router, served by every gateway) read by the
# "Decision reasons" annotation; tests/stack/test_dashboard.py checks the live fields.
INFINITY = {"type": "yesoreyeram-infinity-datasource", "uid": "specgate-admin"}
DECISIONS_PATH = "/admin/decisions"
DECISIONS_URL = "http://gateway-1:8000" + DECISIONS_PATH
DECISIONS_ROOT = "data"
DECISIONS_FIELDS = {"time": "at", "tenant": "tenant", "text": "reason"}
DECISIONS_COLUMNS = [
    {"selector": DECISIONS_FIELDS["time"], "text": "time", "type": "timestamp"},  # ISO-8601 UTC (admin API)
    {"selector": DECISIONS_FIELDS["text"], "text": "text", "type": "string"},
    {"selector": DECISIONS_FIELDS["tenant"], "text": "tags", "type": "string"},
]


def templating() -> dict:
    def var(name, query, label):
        return {"name": name, "label": label, "type": "query", "datasource": PROM,
                "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
                "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}
    return {"list": [
        var("tenant", "label_values(specgate_requests_total, tenant)", "Tenant"),
        var("replica", "label_values(specgate_replica_healthy, replica)", "Replica"),
    ]}


def layout(items: list[dict]) -> list[dict]:
    """Assign ids and grid positions left-to-right, top-to-bottom on Grafana's 24-column grid."""
    out, x, y, row_h = [], 0, 0, 0
    for pid, panel in enumerate(items, start=1):
        w, h = panel.pop("_w"), panel.pop("_h")
        if x + w > 24 or panel["type"] == "row":
            y += row_h
            x, row_h = 0, 0
        panel["id"] = pid
        panel["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x += w
        row_h = max(row_h, h)
        if panel["type"] == "row":
            y += h
            x, row_h = 0, 0
        out.append(panel)
    return out


def dashboard() -> dict:
    return {
        "uid": "specgate-overview",
        "title": "specgate: speculation, tenants, replicas",
        "description": "Acceptance per tenant and replica, compute-bound regime, the controller's speculation "
                       "decisions, latency and health of the specgate stack.",
        "tags": ["specgate", "vllm", "speculative-decoding"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "annotations": annotations(),
        "templating": templating(),
        "panels": layout(panels()),
        "links": [{"title": "Traces (Jaeger)", "type": "link", "url": "http://localhost:16686", "targetBlank": True}],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
