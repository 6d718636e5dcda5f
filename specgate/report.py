"""The HTML report of a `specgate load` run: one self-contained file to look at.

Why: the printed tables say what each phase gained, but a load step and the controller's answer
to it are seen best as a picture -- throughput, TTFT, acceptance and each tenant's policy over
time, phase boundaries marked -- and the compose stack's Grafana needs Docker. The report needs
nothing but a browser: matplotlib draws each chart to SVG, embedded as a data URI (no fetch, no
script, and the SVGs' internal ids cannot collide), with the figures from `specgate.load_stats`.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from testbed.phases import Phase

from .load_stats import (
    ALL,
    LEGEND,
    PhaseTenantStats,
    PolicyPoint,
    Series,
    draft_cap,
    phase_windows,
)

GLOSSARY = "docs/controller.md#glossary"

# The charts, in page order: (key, title). Tests look for each key.
CHARTS = (
    ("throughput", "Output tokens per second (received)"),
    ("policy", "Speculation policy in force: draft cap per tenant (off = speculation disabled, full = no cap)"),
    ("ttft", "Time to first token, p50 (solid) and p99 (dotted), by send time"),
    ("tpot", "Time per output token, p50, by send time"),
    ("acceptance", "Mean acceptance length (1 + accepted / verification steps), by completion time"),
)


@dataclass(frozen=True)
class ReportData:
    title: str
    run_lines: Sequence[str]  # what was run: pattern, rate, model, gateway
    tenants: Sequence[str]
    phases: Sequence[Phase]
    end_s: float
    rows: Sequence[PhaseTenantStats]
    series: Series
    policies: dict[str, list[PolicyPoint]]
    switch_lines: dict[int, list[str]] = field(default_factory=dict)  # phase index -> printed switch lines
    full_cap: int = 8  # where "no cap" is drawn on the policy chart (largest replica block)


def _colors(tenants: Sequence[str]) -> dict[str, str]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    out = {t: cmap(i % 10) for i, t in enumerate(tenants)}
    out[ALL] = "black"
    return out


def _phase_marks(ax, phases: Sequence[Phase], end_s: float, label: bool) -> None:
    """Boundaries as dashed lines; the phases at the peak rate shaded; names on top."""
    peak = max((p.rate for p in phases), default=0.0)
    for p, (lo, hi) in zip(phases, phase_windows(phases, end_s)):
        if len(phases) > 1 and p.rate >= peak:
            ax.axvspan(p.start_s, p.end_s, color="0.92", zorder=0)
        if p.start_s > 0:
            ax.axvline(p.start_s, color="0.4", linestyle="--", linewidth=1, zorder=1)
        if label:
            ax.text((p.start_s + min(p.end_s, hi)) / 2, 1.01, f"{p.label} ({p.rate:g} req/s)",
                    transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=9, color="0.25")
    ax.set_xlim(0, max(end_s, phases[-1].end_s if phases else end_s))


def _nan(values: Sequence[float | None], scale: float = 1.0) -> list[float]:
    return [math.nan if v is None else v * scale for v in values]


def _figure():
    from matplotlib.figure import Figure

    # Fixed margins (not a layout engine): every chart's time axis spans the same pixels, so the
    # phase boundaries line up from chart to chart; the legend lives in the right margin.
    fig = Figure(figsize=(12, 3.3))
    fig.subplots_adjust(left=0.07, right=0.83, top=0.88, bottom=0.15)
    return fig, fig.add_subplot()


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: small, searchable
        fig.savefig(buf, format="svg")
    return buf.getvalue()


def chart_svgs(data: ReportData) -> dict[str, str]:
    """One SVG per chart key in CHARTS."""
    s, tenants, colors = data.series, list(data.tenants), _colors(list(data.tenants) + ["*"])
    mid = [t + s.bin_s / 2 for t in s.starts]
    out: dict[str, str] = {}

    fig, ax = _figure()
    for t in tenants:
        ax.plot(mid, s.tok_s[t], color=colors[t], label=t, linewidth=1.5)
    ax.plot(mid, s.tok_s[ALL], color="black", label="all tenants", linewidth=2)
    ax.set_ylabel("tok/s")
    _finish(ax, data, "throughput")
    out["throughput"] = _svg(fig)

    fig, ax = _figure()
    for t in tenants:
        ax.plot(mid, _nan(s.ttft_p50[t], 1000), color=colors[t], label=f"{t} p50", marker=".", linewidth=1.5)
        ax.plot(mid, _nan(s.ttft_p99[t], 1000), color=colors[t], linestyle=":", linewidth=1)
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    _finish(ax, data, "ttft")
    out["ttft"] = _svg(fig)

    fig, ax = _figure()
    for t in tenants:
        ax.plot(mid, _nan(s.tpot_p50[t], 1000), color=colors[t], label=t, marker=".", linewidth=1.5)
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    _finish(ax, data, "tpot")
    out["tpot"] = _svg(fig)

    fig, ax = _figure()
    for t in tenants:
        ax.plot(mid, _nan(s.acceptance_length[t]), color=colors[t], label=t, marker="o", markersize=3, linewidth=1.5)
    ax.set_ylabel("tokens per step")
    ax.set_ylim(bottom=1.0)
    _finish(ax, data, "acceptance")
    out["acceptance"] = _svg(fig)

    fig, ax = _figure()
    order = [t for t in tenants if t in data.policies] + [t for t in data.policies if t not in tenants]
    caps = [draft_cap(p, data.full_cap) for ps in data.policies.values() for p in ps]
    top = max([data.full_cap, *caps])
    for i, t in enumerate(order):
        points = data.policies[t]
        xs = [p.at_s for p in points] + [data.end_s]
        ys = [draft_cap(p, data.full_cap) for p in points]
        ys.append(ys[-1])
        offset = (i - (len(order) - 1) / 2) * 0.08 * top / 4  # overlapping tenants stay visible
        ax.step(xs, [y + offset for y in ys], where="post", color=colors.get(t, "0.5"), linewidth=2,
                label=f"tenant {t}" if t != "*" else "tenant * (default)")
        ax.plot([p.at_s for p in points[1:]], [draft_cap(p, data.full_cap) + offset for p in points[1:]],
                linestyle="none", marker="o", markersize=4, color=colors.get(t, "0.5"))
    ticks = sorted({0, top, *caps})
    ax.set_yticks(ticks, [("off" if v == 0 else "full" if v == data.full_cap else str(v)) for v in ticks])
    ax.set_ylim(-0.6, top + 0.8)
    ax.set_ylabel("draft cap")
    _finish(ax, data, "policy")
    out["policy"] = _svg(fig)
    return out


def _finish(ax, data: ReportData, key: str) -> None:
    _phase_marks(ax, data.phases, data.end_s, label=True)
    ax.set_xlabel("seconds since the run started")
    ax.grid(True, alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def _fmt(x: float | None, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    return "–" if x is None else format(x * scale, fmt) + unit


def _table(data: ReportData) -> str:
    head = ("<tr><th>phase</th><th>tenant</th><th>ok / sent</th><th>out tok/s</th><th>TTFT p50</th>"
            "<th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>spec reqs</th><th>mean acc len</th>"
            "<th>acc rate</th><th>drafted</th><th>accepted</th></tr>")
    body = []
    for r in data.rows:
        cls = ' class="all"' if r.tenant == ALL else ""
        body.append(
            f"<tr{cls}><td>{html.escape(r.phase.label)}</td><td>{html.escape(r.tenant)}</td><td>{r.ok} / {r.sent}</td>"
            f"<td>{r.tok_s:.1f}</td><td>{_fmt(r.ttft_p50, '.0f', 1000, ' ms')}</td><td>{_fmt(r.ttft_p99, '.0f', 1000, ' ms')}</td>"
            f"<td>{_fmt(r.tpot_p50, '.1f', 1000, ' ms')}</td><td>{_fmt(r.tpot_p99, '.1f', 1000, ' ms')}</td>"
            f"<td>{r.spec_requests}</td><td>{_fmt(r.mean_acceptance_length, '.2f')}</td>"
            f"<td>{_fmt(r.acceptance_rate, '.0%')}</td><td>{r.drafted}</td><td>{r.accepted}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1250px}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:26px 0 6px}
table{border-collapse:collapse;font-size:13px} th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f2f2f2} td:nth-child(-n+2){text-align:left} tr.all td{font-weight:600;background:#fafafa}
figure{margin:8px 0 18px} figcaption{font-weight:600;font-size:14px;margin-bottom:2px} img{width:100%;height:auto}
pre{background:#f6f6f6;padding:8px;font-size:12px;white-space:pre-wrap} .note{color:#555;font-size:13px}
"""


def render_html(data: ReportData) -> str:
    svgs = chart_svgs(data)
    figures = []
    for key, title in CHARTS:
        uri = "data:image/svg+xml;base64," + base64.b64encode(svgs[key].encode()).decode()
        figures.append(f'<figure class="chart" data-chart="{key}"><figcaption>{html.escape(title)}</figcaption>'
                       f'<img alt="{html.escape(title)}" src="{uri}"></figure>')
    switches = []
    for phase in data.phases:
        lines = data.switch_lines.get(phase.index, [])
        switches.append(f"phase {phase.label}: {len(lines) or 'no'} policy change(s)")
        switches.extend(lines)
    run = "".join(f"<li>{html.escape(line)}</li>" for line in data.run_lines)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(data.title)}</title><style>{_CSS}</style></head>
<body>
<h1>{html.escape(data.title)}</h1>
<ul class="note">{run}</ul>
<h2>Per phase and tenant</h2>
{_table(data)}
<p class="note">{html.escape(LEGEND.strip())}. Latencies in ms; grey rows sum every tenant.</p>
<h2>Over time</h2>
<p class="note">Dashed lines mark phase boundaries; the shaded phase runs at the peak rate. Bins of {data.series.bin_s:g} s.
Dots on the policy chart are the controller's published changes.</p>
{''.join(figures)}
<h2>Controller policy changes</h2>
<pre>{html.escape(chr(10).join(switches))}</pre>
<p class="note">What <code>rho</code>, <code>a</code>, <code>gain_vs_off</code>, <code>k full-&gt;0</code>,
<code>tenant *</code> and the other terms mean: the Glossary in {html.escape(GLOSSARY)} of the specgate repository.</p>
</body></html>
"""


def write_report(path: Path, data: ReportData) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(data), encoding="utf-8")
    return path.resolve()
