"""The provisioned Grafana dashboard: generated from docker/grafana/dashboard.py, every PromQL
expression parsed by the real `promtool`, and every metric it names exported by a LIVE stack
(gateway + embedded controller + simulated replicas, started with `specgate up` on loopback and
sent real traffic) -- so a renamed metric breaks this test, not the dashboard in production.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from datetime import datetime

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.specgate.conftest import start_up, stop
from tests.stack.conftest import REPO, require_tool
from tests.stack.promql import metric_names, substitute_grafana_vars

DASHBOARD = REPO / "docker" / "grafana" / "dashboards" / "specgate.json"
# Series Prometheus itself creates for every target; no exporter exports them.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Exported only by dcgm-exporter on real GPUs (the simulator exports the four DCGM names the
# dashboard queries; these would be listed here if it did not).
REAL_GPU_ONLY: set[str] = set()


def _generator():
    spec = importlib.util.spec_from_file_location("specgate_dashboard", REPO / "docker" / "grafana" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _expressions(dash: dict) -> list[tuple[str, str]]:
    """(where, expr) for every Prometheus query: panel targets, annotations, template variables."""
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]))
    for ann in dash["annotations"]["list"]:
        if ann.get("expr"):
            out.append((f"annotation {ann['name']!r}", ann["expr"]))
    for var in dash["templating"]["list"]:
        query = var["query"]["query"]
        inner = query[len("label_values("):-1].split(",")[0]
        out.append((f"variable {var['name']}", inner))
    return out


def test_committed_json_is_the_generator_output():
    assert DASHBOARD.read_text() == _generator().render(), "run: python docker/grafana/dashboard.py"


def test_dashboard_structure_covers_the_required_views():
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for needle in ("acceptance length per tenant", "acceptance length per replica", "rho", "on/off per tenant",
                   "ttft", "tpot", "gateway-added latency", "rate-limit rejections", "replica health",
                   "generated tokens/s"):
        assert needle in titles, needle
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "specgate-prometheus"
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24
    names = {a["name"] for a in dash["annotations"]["list"]}
    assert {"Speculation on/off", "Decision reasons"} <= names


def test_datasources_provisioned_match_the_dashboard():
    prov = yaml.safe_load((REPO / "docker" / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text())
    uids = {d["uid"]: d for d in prov["datasources"]}
    dash_uids = {p["datasource"]["uid"] for p in _dashboard()["panels"] if "datasource" in p}
    dash_uids |= {a["datasource"]["uid"] for a in _dashboard()["annotations"]["list"] if a.get("datasource")}
    dash_uids.discard("-- Grafana --")
    assert dash_uids <= set(uids), dash_uids - set(uids)
    assert uids["specgate-prometheus"]["url"] == "http://prometheus:9090"
    dashboards = yaml.safe_load((REPO / "docker" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml").read_text())
    assert dashboards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_every_expression_parses_with_promtool(tmp_path):
    """`promtool check rules` parses each expression with Prometheus' own PromQL parser."""
    exprs = _expressions(_dashboard())
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": substitute_grafana_vars(expr)} for i, (_, expr) in enumerate(exprs)
    ]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([require_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout

    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (a (b)"}]}]}))
    proc = subprocess.run([require_tool("promtool"), "check", "rules", str(bad)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0  # the parser check is not vacuous


def _exported_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count", "_created"],
                    "summary": ["_sum", "_count", "_created"], "gauge": [""], "info": ["_info"]}.get(family.type, [""])
        names |= {family.name + s for s in suffixes}  # families with no sample yet still count
        names |= {s.name for s in family.samples}
    return names


def _traffic(state: dict, seconds: float) -> None:
    """Real requests from every tenant (plain and streaming) for `seconds`, plus one bad key."""
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=state["gateway_url"], timeout=30, trust_env=False) as client:
        client.get("/v1/models", headers={"Authorization": "Bearer sk-nope"})
        while True:
            for tenant in state["tenants"]:
                auth = {"Authorization": f"Bearer {tenant['key']}"}
                body = {"model": state["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                        "vllm_xargs": {"sim_workload": "chat"}}
                assert client.post("/v1/chat/completions", json=body, headers=auth).status_code == 200
                assert client.post("/v1/chat/completions", json={**body, "stream": True}, headers=auth).status_code == 200
            if time.monotonic() >= deadline:
                return


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory):
    up = start_up(tmp_path_factory.mktemp("dash"))
    try:
        state = up.wait_ready()
        _traffic(state, 0)
        time.sleep(3.5)  # a few controller ticks: regimes, policies and gauges get values
        yield state
    finally:
        stop(up)


@pytest.fixture(scope="module")
def live_metrics(live_stack):
    """Every component's /metrics text and the admin decision history of the live stack."""
    state = live_stack
    admin = {"Authorization": f"Bearer {state['admin_key']}"}
    with httpx.Client(base_url=state["gateway_url"], timeout=30, trust_env=False) as client:
        texts = {"gateway": client.get("/metrics").text,
                 "controller": client.get("/admin/controller/metrics", headers=admin).text}
        decisions = client.get("/admin/decisions", headers=admin).json()
    for r in state["replicas"]:
        texts[r["name"]] = httpx.get(r["url"] + "/metrics", timeout=10).text
    return {"texts": texts, "decisions": decisions}


def test_dashboard_metrics_are_exported_by_the_live_stack(live_metrics):
    exported = set()
    for text in live_metrics["texts"].values():
        exported |= _exported_names(text)
    assert any(n.startswith("vllm:") for n in exported) and any(n.startswith("specgate_controller_") for n in exported)
    missing = {}
    for where, expr in _expressions(_dashboard()):
        for name in metric_names(expr) - exported - PROMETHEUS_SYNTHETIC - REAL_GPU_ONLY:
            missing.setdefault(name, []).append(where)
    assert not missing, f"dashboard queries metrics no live component exports: {json.dumps(missing, indent=1)}"


def test_decision_reason_annotation_reads_real_admin_fields(live_metrics):
    gen = _generator()
    payload = live_metrics["decisions"]
    rows = payload[gen.DECISIONS_ROOT] if gen.DECISIONS_ROOT else payload
    assert rows, "the embedded controller recorded no decision (first decisions are changes)"
    for field in gen.DECISIONS_FIELDS.values():
        assert field in rows[0], f"admin decision history has no field {field!r}: {sorted(rows[0])}"
    at = rows[0][gen.DECISIONS_FIELDS["time"]]  # the column type "timestamp" parses ISO-8601
    assert isinstance(at, str) and at.endswith("Z") and datetime.fromisoformat(at).tzinfo is not None, at
    assert next(c["type"] for c in gen.DECISIONS_COLUMNS if c["text"] == "time") == "timestamp"


# Panels that are legitimately empty on a short healthy run (no budget hit, no errors, no switch).
MAY_BE_EMPTY = {
    "Rate-limit rejections": "no tenant exceeds its budget in this run",
    "Errors by status": "all requests succeed",
    "Speculation on/off": "annotation: no policy switch within the scrape window",
    "Draft cap changes": "annotation: no policy switch within the scrape window",
    "Upstream attempts and breakers": "attempt counters exist, but may not move between two scrapes",
}


@pytest.fixture(scope="module")
def prometheus_results(live_stack, tmp_path_factory):
    """A real Prometheus scrapes the live stack like docker/prometheus/prometheus.yml does (same job
    names and `replica` labels), then evaluates every dashboard expression with its query engine."""
    binary = require_tool("prometheus")
    state = live_stack
    tmp = tmp_path_factory.mktemp("prom")
    gw = state["gateway_url"].split("//", 1)[1]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "gateway", "static_configs": [{"targets": [gw]}]},
            {"job_name": "controller", "metrics_path": "/admin/controller/metrics",
             "authorization": {"credentials": state["admin_key"]}, "static_configs": [{"targets": [gw]}]},
            {"job_name": "replica", "static_configs": [
                {"targets": [r["url"].split("//", 1)[1]], "labels": {"replica": r["name"]}} for r in state["replicas"]]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    from testbed.procs import free_port

    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("prometheus did not become ready")
        _traffic(state, 12)  # a dozen 1 s scrapes while requests flow
        time.sleep(2)
        results = {}
        for where, expr in _expressions(_dashboard()):
            promql = expr.replace("$__rate_interval", "10s").replace("$__interval", "5s")
            promql = promql.replace("$tenant", ".*").replace("$replica", ".*").replace("[2m:10s]", "[30s:1s]")
            resp = httpx.get(base + "/api/v1/query", params={"query": promql}, timeout=10).json()
            results[where] = resp
        targets = httpx.get(base + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return {"results": results, "targets": targets}
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_prometheus_scrapes_every_live_component(prometheus_results):
    targets = prometheus_results["targets"]
    assert {t["labels"]["job"] for t in targets} == {"gateway", "controller", "replica"}
    assert all(t["health"] == "up" for t in targets), [(t["scrapeUrl"], t["lastError"]) for t in targets]


def test_every_dashboard_query_evaluates_on_live_data(prometheus_results):
    """Prometheus' engine runs each query (catches vector-matching and label mistakes that a
    parser cannot) and every panel that should show data does."""
    errors, empty = {}, []
    for where, resp in prometheus_results["results"].items():
        if resp.get("status") != "success":
            errors[where] = resp.get("error")
            continue
        if not resp["data"]["result"] and not any(name in where for name in MAY_BE_EMPTY):
            empty.append(where)
    assert not errors, errors
    assert not empty, f"queries with no data on a live stack: {empty}"
