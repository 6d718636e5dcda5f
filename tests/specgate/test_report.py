"""The HTML report of `specgate load`, built from hand-made records: one self-contained file with
a chart per series (every tenant in each), phases marked, and the per-phase table."""

from __future__ import annotations

from contract.telemetry import RequestSpecStats
from specgate.load_stats import (
    RequestRecord,
    phase_stats,
    policy_timeline,
    time_series,
)
from specgate.report import ReportData, render_html, write_report
from testbed.phases import Phase, lay_out
from tests.specgate.report_checks import chart_svgs

PHASES = lay_out([Phase("light", 4.0, rate=1.0), Phase("heavy", 4.0, rate=10.0), Phase("light", 4.0, rate=1.0)])
TENANTS = ["chat", "code"]


def _data() -> ReportData:
    records = []
    for i in range(24):
        tenant = TENANTS[i % 2]
        sent = i * 0.5
        chunks = tuple((sent + 0.1 + j * 0.02, 2) for j in range(10))
        spec = (RequestSpecStats(num_spec_steps=10, num_draft_tokens=80, num_accepted_draft_tokens=10)
                if sent < 6 else None)
        records.append(RequestRecord(tenant, sent, 200, 20, chunks, spec))
    t0 = 1000.0
    switches = [{"tenant": "chat", "at": t0 + 6.0, "policy": {"enabled": False, "max_draft": 0}, "reason": "k full->0"},
                {"tenant": "*", "at": t0 + 6.5, "policy": {"enabled": False, "max_draft": 0}, "reason": "k full->0"}]
    return ReportData(
        title="specgate load: step pattern, peak 10 req/s, 12 s", run_lines=["hand-made"], tenants=TENANTS,
        phases=PHASES, end_s=12.5, rows=phase_stats(records, PHASES, TENANTS, 12.5),
        series=time_series(records, TENANTS, 12.5, 0.5),
        policies=policy_timeline({"chat": {"enabled": True}, "code": {"enabled": True, "max_draft": 4},
                                  "*": {"enabled": True}}, switches, t0),
        switch_lines={2: ["[t=  +6.0s] tenant chat     speculation OFF <- k full->0"]},
    )


def test_report_is_self_contained_with_a_chart_per_series(tmp_path):
    html = render_html(_data())
    svgs = chart_svgs(html)
    for key in ("throughput", "ttft", "tpot", "acceptance", "policy"):
        for tenant in TENANTS:
            assert tenant in svgs[key], f"{tenant} missing from the {key} chart"
        assert "2 heavy" in svgs[key]  # phases named on every chart
    assert "tenant * (default)" in svgs["policy"] and "off" in svgs["policy"] and "full" in svgs["policy"]
    for phase in ("1 light", "2 heavy", "3 light"):
        assert phase in html
    assert "k full-&gt;0" in html and "docs/controller.md#glossary" in html
    path = write_report(tmp_path / "sub" / "r.html", _data())
    assert path.is_file() and path.read_text().startswith("<!DOCTYPE html>")
