"""`specgate load`: pure parts (arrival rate, request mix, decision feed) and, end to end, the
issue's promise -- against a real `specgate up`, the step workload makes the controller switch
speculation off under load and back on after it, printed as it happens -- and a short run's
per-phase table and HTML report. (Per-phase statistics: test_load_stats.py; the report's
rendering: test_report.py.)"""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from specgate.load import (
    WORKLOADS,
    LoadConfig,
    TenantKey,
    build_request,
    format_decision,
    new_decisions,
    phase_name,
    pick_tenant,
    rate_at,
)
from specgate.up import make_plan, settings_for
from tests.specgate.conftest import REPO
from tests.specgate.report_checks import chart_svgs


def test_step_pattern_is_light_heavy_light():
    cfg = LoadConfig(rps=30, duration_s=90, light_fraction=0.1)
    assert [rate_at(t, cfg) for t in (0, 29.9, 30, 59.9, 60, 89)] == [3, 3, 30, 30, 3, 3]
    assert [phase_name(t, cfg) for t in (0, 45, 80)] == ["light", "heavy", "light"]
    assert rate_at(10, LoadConfig(rps=7, pattern="constant")) == 7


def test_requests_follow_each_tenants_workload():
    rng = random.Random(1)
    tenants = (TenantKey("chat", "k1", "chat"), TenantKey("code", "k2", "code"), TenantKey("batch", "k3", "batch"))
    counts = {t.id: 0 for t in tenants}
    for _ in range(3000):
        counts[pick_tenant(tenants, rng).id] += 1
    assert counts["chat"] > counts["code"] > counts["batch"] > 0
    body = build_request(tenants[1], "m", rng)
    lo, hi = WORKLOADS["code"]["max_tokens"]
    assert lo <= body["max_tokens"] <= hi and body["model"] == "m"
    assert body["messages"][0]["content"] in WORKLOADS["code"]["prompts"]
    assert body["vllm_xargs"] == {"sim_workload": "code"}
    # Streamed with the final usage chunk (usage + metrics.speculative_decoding) and token ids per chunk.
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True


def test_decision_feed_reports_each_change_once_in_time_order():
    seen: set = set()
    history = [  # newest first, as the admin API returns it
        {"tenant": "chat", "at": 12.0, "changed": True, "policy": {"enabled": True, "max_draft": 4}, "reason": "on"},
        {"tenant": "chat", "at": 11.0, "changed": True, "policy": {"enabled": False, "max_draft": 0}, "reason": "off"},
    ]
    fresh = new_decisions(history, seen)
    assert [d["reason"] for d in fresh] == ["off", "on"]
    assert new_decisions(history, seen) == []
    line = format_decision(fresh[0], t0_wall=10.0)
    assert "t=  +1.0s" in line and "OFF" in line and "<- off" in line
    assert "max_draft=4" in format_decision(fresh[1], t0_wall=10.0)


def test_up_plan_is_valid_gateway_configuration(tmp_path):
    tokens = iter(f"tok{i}" for i in range(100))
    plan = make_plan(port=9999, replica_ports=(1, 2, 3), state_file=tmp_path / "s.json", token=lambda n: next(tokens))
    assert [r.name for r in plan.replicas] == ["sim-dspark-b8-1", "sim-dspark-b8-2", "sim-off-1"]
    settings = settings_for(plan)  # the real pydantic Settings validates names, URLs, hashes
    assert [r.profile for r in settings.replicas] == ["dspark-b8", "dspark-b8", "off"]
    assert settings.admin_key == plan.admin_key and settings.redis_url is None
    assert all(t.api_key_sha256 != t.id for t in settings.tenants)
    with pytest.raises(ValueError):
        make_plan(profiles=())
    with pytest.raises(ValueError):
        make_plan(profiles=("off",), replica_ports=(1, 2))


@pytest.mark.slow
def test_load_makes_the_controller_switch_off_and_back_on(up_factory):
    up = up_factory()
    up.wait_ready()
    proc = subprocess.run(
        [sys.executable, "-m", "specgate.cli", "load", "--rps", "30", "--duration", "90", "--state-file",
         str(up.state_file), "--no-report"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    switches = re.findall(r"\[t=\s*([+-][\d.]+)s\] tenant (\S+)\s+speculation (ON|OFF)", out)
    offs = [(float(t), tenant) for t, tenant, state in switches if state == "OFF" and tenant != "*"]
    assert offs, "no tenant was switched off under load:\n" + out
    first_off = min(t for t, _ in offs)
    back_on = [(float(t), tenant) for t, tenant, state in switches
               if state == "ON" and float(t) > first_off and tenant in {x for _, x in offs}]
    assert back_on, "speculation did not come back on after the load dropped:\n" + out


@pytest.mark.slow
def test_short_run_prints_every_phase_and_tenant_and_writes_a_self_contained_report(up_factory, tmp_path):
    up = up_factory()
    state = up.wait_ready()
    tenants = [t["id"] for t in state["tenants"]]
    report = tmp_path / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "specgate.cli", "load", "--rps", "6", "--duration", "6", "--state-file",
         str(up.state_file), "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert out.count("docs/controller.md#glossary") == 1, out
    for index, name in ((1, "light"), (2, "heavy"), (3, "light")):
        section = out.split(f"phase {index} {name}:", 1)[1].split("policy changes in this phase", 1)[0]
        rows = {line.split()[0]: line.split() for line in section.splitlines()[2:] if line.strip()}
        assert set(rows) == {*tenants, "all"}, out
    # Something was measured: tokens, TTFT and speculation from the speculative replicas.
    heavy = out.split("phase 2 heavy:", 1)[1].split("policy changes", 1)[0]
    all_row = next(line.split() for line in heavy.splitlines() if line.strip().startswith("all "))
    ok, sent = map(int, all_row[1].split("/"))
    assert ok == sent > 0 and float(all_row[2]) > 0 and all_row[3] != "-/-", heavy
    assert int(all_row[5]) > 0 and int(all_row[7]) > 0, "no metrics.speculative_decoding arrived:\n" + heavy
    assert f"report written to {report.resolve()}" in out
    svgs = chart_svgs(report.read_text())
    for key in ("throughput", "ttft", "tpot", "acceptance", "policy"):
        assert all(t in svgs[key] for t in tenants), key

    skipped = subprocess.run(
        [sys.executable, "-m", "specgate.cli", "load", "--pattern", "constant", "--rps", "5", "--duration", "2",
         "--state-file",
         str(up.state_file), "--no-report"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert skipped.returncode == 0 and "report written" not in skipped.stdout, skipped.stdout + skipped.stderr
