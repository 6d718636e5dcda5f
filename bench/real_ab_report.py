"""bench/real_ab.py's figures, as pure functions over its block records.

Why a module of its own: the arithmetic (what a segment's tok/s, TPOT and goodput
are; how blocks become ratios with intervals) must be the same when a run prints
its report and when `--report-only` re-reads a saved JSON, and it must not need
the processes.

Definitions:

* a segment is a scenario's phase (mixed, similar) or the whole ramp; its figures
  pool the measured windows of its phases;
* client tok/s: tokens streamed to the clients inside the windows (real_sweep_load.py)
  over their length; engine tok/s: the replica's `vllm:generation_tokens` delta
  between the scrapes at each window's edges over the time between them;
* TPOT p50/p99 per tenant over the requests that finished inside the windows;
  goodput: those requests whose TPOT met the target, per second (`vllm bench
  serve --goodput tpot:<ms>`); the first, random-length request of each
  worker has no TPOT and counts in neither;
* ratios: testbed/crossover.py, controller / baseline with a 95 % interval;
  "best static": the baseline the controller compares worst against.
"""

from __future__ import annotations

import statistics
from typing import Any

from real_sweep_report import tenant_changes

from controller.step_cost import described_curve, described_points
from testbed.crossover import Block, Ratio, crossover_ratios, fmt_ratio, geometric_mean, worst_case
from testbed.report import table
from testbed.stats import percentile

CONTROLLER = "controller"
K_TABLE = "k-table"
# The single-threshold batch-size -> K tables (K=8 in steps of <= B requests, 0 above)
# besides the k-tables: always-off is B=0, always-on B >= max_num_seqs, and vLLM's own flag.
OTHER_TABLES = ("always-on", "always-off", "vllm-table")
COST_THRESHOLD = 0.03  # issue 30: a tenant never drafts where that costs it more than 3 %
STEP_COST_TARGET = 0.10  # issue 30: the learner's step time within 10 % of the measured steps (median)
STEP_COST_MIN_EVIDENCE_S = 1.0  # a binned point counts with at least this much engine time behind it


def k_table_b(policy: str, table_b: int) -> int | None:
    """The B of a k-table baseline: `k-table` is `--table-b`, `k-table@B` names its own
    (several in one invocation are the grid of vLLM's table, measured interleaved with the
    rest, so the tuned table is read off the same blocks); None for any other policy."""
    if policy == K_TABLE:
        return table_b
    name, at, b = policy.partition("@")
    if name == K_TABLE and at and b.isdigit() and int(b) > 0:
        return int(b)
    return None


def is_table(policy: str) -> bool:
    """One of the tables the tuned table is picked from."""
    return policy in OTHER_TABLES or k_table_b(policy, 1) is not None


def tuned_table(by_table: dict[str, Ratio]) -> Ratio | None:
    """The controller against the tuned table: the table it compares worst against, i.e.
    the best of those measured, picked after the fact from the same blocks (a grid search
    an operator would run first; picking the best of noisy estimates favours the table)."""
    return min(by_table.values(), key=lambda r: r.ratio) if by_table else None


# ---------------------------------------------------------------------------
# one side of one block


def segments_of(trace: Any, scenario: Any, tpot_target_ms: float) -> dict[str, dict]:
    """Per segment of the scenario: the pooled figures of its phases' windows."""
    out: dict[str, dict] = {}
    for name, _ in scenario.segments:
        windows = [w for w in trace.windows if scenario.segment_of(w.phase.name) == name]
        if windows:
            out[name] = segment_stats(windows, trace.samples, scenario.tenants, tpot_target_ms)
    return out


def segment_stats(windows: list[Any], samples: list[Any], tenants: tuple[str, ...], tpot_target_ms: float) -> dict:
    span = sum(w.end - w.measure_start for w in windows)
    spans = [(w.measure_start, w.end) for w in windows]
    inside = [s for s in samples if any(a <= s.end < b for a, b in spans)]
    generated = elapsed = 0.0
    for w in windows:
        for first, last in w.scrapes.values():
            if first and last:
                generated += last["generation_tokens"] - first["generation_tokens"]
                elapsed += last["at"] - first["at"]
    per_tenant = {}
    for tenant in tenants:
        mine = [s for s in inside if s.tenant == tenant]
        tpots = [s.tpot_s * 1000 for s in mine if s.tpot_s is not None]
        steps, accepted = sum(s.spec_steps for s in mine), sum(s.accepted for s in mine)
        per_tenant[tenant] = {
            "tok_s": sum(w.streamed.get(tenant, 0) for w in windows) / span,
            "requests": len(mine),
            "tpot_p50_ms": percentile(tpots, 50),
            "tpot_p99_ms": percentile(tpots, 99),
            "goodput_rps": sum(1 for t in tpots if t <= tpot_target_ms) / span,
            "acceptance_length": 1 + accepted / steps if steps else None,
        }
    return {
        "tok_s": sum(sum(w.streamed.values()) for w in windows) / span,
        "engine_tok_s": generated / elapsed if elapsed > 0 else None,
        "seconds": span,
        "spans": spans,
        "tenants": per_tenant,
    }


# ---------------------------------------------------------------------------
# across blocks


def _side(block: dict, policy: str) -> dict | None:
    return next((s for s in block["sides"] if s["policy"] == policy), None)


def _value(seg: dict | None, key: str, tenant: str | None) -> float | None:
    if not seg:
        return None
    return (seg["tenants"].get(tenant) or {}).get(key) if tenant else seg.get(key)


def ratios(blocks: list[dict], segment: str, key: str = "tok_s", tenant: str | None = None) -> dict[str, Ratio]:
    """controller / each baseline over one scenario's blocks, on one figure."""
    data = []
    for block in blocks:
        ctl, base = _side(block, CONTROLLER), _side(block, block["baseline"])
        if ctl is None or base is None:
            continue
        a = _value(ctl["segments"].get(segment), key, tenant)
        b = _value(base["segments"].get(segment), key, tenant)
        if a is not None and b is not None:
            data.append(Block(block["baseline"], block["side"], a, b))
    return crossover_ratios(data)


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def policy_figures(blocks: list[dict], segment: str, tenants: list[str]) -> dict[str, dict]:
    """Median over the blocks each policy ran in: tok/s, engine tok/s, per tenant TPOT and goodput."""
    out: dict[str, dict] = {}
    for policy in [CONTROLLER, *dict.fromkeys(b["baseline"] for b in blocks)]:
        segs = [s["segments"].get(segment) for b in blocks for s in b["sides"] if s["policy"] == policy]
        segs = [s for s in segs if s]
        out[policy] = {
            "blocks": len(segs),
            "tok_s": _median([s["tok_s"] for s in segs]),
            "engine_tok_s": _median([s["engine_tok_s"] for s in segs]),
            "tenants": {
                t: {k: _median([_value(s, k, t) for s in segs])
                    for k in ("tok_s", "tpot_p50_ms", "tpot_p99_ms", "goodput_rps", "acceptance_length")}
                for t in tenants
            },
        }  # fmt: skip
    return out


def changes_per_minute(blocks: list[dict], segment: str, tenants: list[str]) -> dict[str, dict | None]:
    """Policy changes inside the segment's windows, per tenant: the most any block saw, and
    over all blocks per minute (one change in a 12 s window reads 5 a minute: quote both)."""
    out: dict[str, dict | None] = {}
    for tenant in tenants:
        worst = None
        total = minutes = 0.0
        for block in blocks:
            ctl = _side(block, CONTROLLER)
            seg = (ctl or {}).get("segments", {}).get(segment)
            decisions = ((ctl or {}).get("controller") or {}).get("decisions")
            if not seg or decisions is None:
                continue
            changes = tenant_changes(decisions, tenant)
            n = sum(1 for c in changes if any(a <= c["at"] < b for a, b in seg["spans"]))
            worst = n if worst is None else max(worst, n)
            total, minutes = total + n, minutes + seg["seconds"] / 60
        out[tenant] = {"most_in_a_block": worst, "per_minute": total / minutes} if minutes else None
    return out


def step_cost_fit(blocks: list[dict]) -> dict | None:
    """Each controller's learned step cost at the end of each block against the engine-timed
    points it was fitted on (`/admin/replicas` -> regime.step_cost; points with at least
    `STEP_COST_MIN_EVIDENCE_S` behind them), priced as the learner prices them (`StepPoint.
    predicted_s`: a point's prefill bursts included). In-sample: the same binned points.
    None when no controller exported an engine-timed curve."""
    errors: list[float] = []
    per_block: list[float] = []
    shapes: list[tuple[float, float, float]] = []
    for block in blocks:
        for side in block["sides"]:
            replicas = ((side.get("controller") or {}).get("replicas") or {}).get("data") or []
            for replica in replicas:
                sc = (replica.get("regime") or {}).get("step_cost") or {}
                if not sc.get("learned") or sc.get("source") != "engine-timed steps":
                    continue
                curve = described_curve(sc)
                mine = [abs(p.predicted_s(curve) / p.step_s - 1.0) for p in described_points(sc)
                        if p.weight >= STEP_COST_MIN_EVIDENCE_S and p.step_s > 0]
                if mine:
                    errors += mine
                    per_block.append(statistics.median(mine))
                    shapes.append((sc["flat_ms"], sc["knee_tokens"], sc["slope_ms_per_token"]))
    if not errors:
        return None
    return {
        "points": len(errors), "curves": len(per_block), "median_error": statistics.median(errors),
        "per_curve": (min(per_block), max(per_block)),
        "flat_ms": (min(f for f, _, _ in shapes), max(f for f, _, _ in shapes)),
        "knee_tokens": (min(k for _, k, _ in shapes), max(k for _, k, _ in shapes)),
        "slope_ms_per_token": (min(x for _, _, x in shapes), max(x for _, _, x in shapes)),
    }  # fmt: skip


def summarize(blocks: list[dict], tpot_target_ms: float) -> dict:
    summary: dict[str, Any] = {"tpot_target_ms": tpot_target_ms, "scenarios": {}}
    for name in dict.fromkeys(b["scenario"] for b in blocks):
        mine = [b for b in blocks if b["scenario"] == name]
        first = mine[0]["sides"][0]
        segments = list(first["segments"])
        tenants = list(next(iter(first["segments"].values()))["tenants"]) if segments else []
        baselines = list(dict.fromkeys(b["baseline"] for b in mine))
        entry: dict[str, Any] = {"baselines": baselines, "segments": {}, "load_cpu_share": _median([b["load_cpu_share"] for b in mine])}
        # Results saved before the kept controllers existed have no flag: their controller was fresh per block.
        entry["warm_controller"] = all(b.get("warm_controller", False) for b in mine)
        entry["gateway_cpu_share"] = {
            p: _median([s.get("gateway_cpu_share") for b in mine for s in b["sides"] if s["policy"] == p])
            for p in [CONTROLLER, *baselines]
        }
        for seg in segments:
            client, engine = ratios(mine, seg), ratios(mine, seg, "engine_tok_s")
            entry["segments"][seg] = {
                "figures": policy_figures(mine, seg, tenants),
                "client": client,
                "engine": engine,
                "best_static": worst_case(client, baselines),
                "best_static_engine": worst_case(engine, baselines),
                "tenant_ratios": {t: ratios(mine, seg, "tok_s", t) for t in tenants},
                "changes_per_minute": changes_per_minute(mine, seg, tenants),
            }
        geomeans = {}  # table -> the geomean over segments, where it was measured in every one
        for baseline in filter(is_table, baselines):
            per_segment = [entry["segments"][s]["client"].get(baseline) for s in segments]
            if segments and all(per_segment):
                geomeans[baseline] = geometric_mean(per_segment)
        entry["geomean_vs_tables"] = geomeans
        entry["geomean_vs_k_table"] = geomeans.get(K_TABLE)
        entry["geomean_vs_vllm_table"] = geomeans.get("vllm-table")
        entry["geomean_vs_tuned_table"] = tuned_table(geomeans)
        entry["step_cost"] = step_cost_fit(mine)
        summary["scenarios"][name] = entry
    summary["verdicts"] = verdicts(summary)
    return summary


# ---------------------------------------------------------------------------
# verdicts (issue 30's "done when")


def _meets(r: Ratio | None, point: float, reach: float) -> str:
    if r is None:
        return "not measured"
    ok = r.ratio >= point and (r.high is None or r.high >= reach)
    return f"{'met' if ok else 'MISSED'}: {fmt_ratio(r)}"


def _tuned(entry: dict, target: float) -> str:
    r = entry.get("geomean_vs_tuned_table")
    tables = ", ".join(sorted(entry.get("geomean_vs_tables") or {}))
    return f"{_meets(r, target, target)} (vs {r.baseline}, the best of {tables})" if r else "not measured"


def verdicts(summary: dict) -> list[str]:
    out = []
    scen = summary["scenarios"]
    if "mixed" in scen:
        for seg, data in scen["mixed"]["segments"].items():
            out.append(f"(a) {seg}: controller / best static >= 0.98 with the interval reaching 1.00: "
                       f"{_meets(data['best_static'], 0.98, 1.0)} (vs {data['best_static'].baseline if data['best_static'] else '-'})")  # fmt: skip
        out.append(f"(a) geomean controller / k-table >= 1.03: {_meets(scen['mixed']['geomean_vs_k_table'], 1.03, 1.03)}")
        out.append(f"(a) geomean controller / the tuned table >= 1.03: {_tuned(scen['mixed'], 1.03)}")
        if scen["mixed"].get("geomean_vs_vllm_table"):
            out.append(f"(a) geomean controller / vLLM's table (engine flag) >= 1.03: "
                       f"{_meets(scen['mixed']['geomean_vs_vllm_table'], 1.03, 1.03)}")
        for seg, data in scen["mixed"]["segments"].items():
            for base in ("hand-set", "always-off"):
                r = data["tenant_ratios"].get("temp1", {}).get(base)
                if r is not None:
                    paid = r.ratio < 1 - COST_THRESHOLD and (r.high is None or r.high < 1.0)
                    out.append(f"(a) {seg}: temp1's tok/s controller / {base} (temp1 off): {fmt_ratio(r)}"
                               f"{' -- temp1 PAYS more than 3 %' if paid else ''}")  # fmt: skip
                    break
        rates = [v["per_minute"] for d in scen["mixed"]["segments"].values() for v in d["changes_per_minute"].values() if v]
        if rates:
            out.append(f"(a) policy changes per tenant per minute in steady windows <= 1: "
                       f"{'met' if max(rates) <= 1 else 'MISSED'} (max {max(rates):.1f}, over each phase's windows)")  # fmt: skip
    if "ramp" in scen:
        data = scen["ramp"]["segments"].get("ramp")
        if data:
            out.append(f"(b) ramp: controller / best static >= 1.00: {_meets(data['best_static'], 1.0, 1.0)}")
            out.append(f"(b) ramp: controller / k-table >= 1.02: {_meets(data['client'].get('k-table'), 1.02, 1.02)}")
            out.append(f"(b) ramp: controller / the tuned table >= 1.02: {_tuned(scen['ramp'], 1.02)}")
    if "similar" in scen:
        out.append(f"(c) similar: geomean controller / k-table >= 0.98: {_meets(scen['similar']['geomean_vs_k_table'], 0.98, 0.98)}")
        out.append(f"(c) similar: geomean controller / the tuned table >= 0.98: {_tuned(scen['similar'], 0.98)}")
    fits = {name: e["step_cost"] for name, e in scen.items() if e.get("step_cost")}
    if fits:
        worst = max(f["median_error"] for f in fits.values())
        out.append(f"the learned step cost within {STEP_COST_TARGET:.0%} of the engine-timed steps (median |error|, "
                   f"in-sample): {'met' if worst <= STEP_COST_TARGET else 'MISSED'} ("
                   + ", ".join(f"{n} {f['median_error']:.1%} over {f['points']} points" for n, f in fits.items()) + ")")
    return out


# ---------------------------------------------------------------------------
# printing


def _f(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def report_scenario(name: str, entry: dict) -> str:
    out = []
    for seg, data in entry["segments"].items():
        fig = data["figures"]
        tenants = list(next(iter(fig.values()))["tenants"])
        out.append(f"-- {name} / {seg}: median over blocks (the controller "
                   f"{'kept and warmed' if entry.get('warm_controller') else 'fresh per block'})")  # fmt: skip
        rows = []
        for policy, f in fig.items():
            per = [f"{_f(f['tenants'][t]['tok_s'])} / {_f(f['tenants'][t]['tpot_p50_ms'])} / {_f(f['tenants'][t]['tpot_p99_ms'])}"
                   f" / {_f(f['tenants'][t]['goodput_rps'], 2)}" for t in tenants]  # fmt: skip
            rows.append([policy, str(f["blocks"]), _f(f["tok_s"]), _f(f["engine_tok_s"]), *per])
        out.append(table(["policy", "blocks", "tok/s", "engine tok/s",
                          *[f"{t}: tok/s / TPOT p50 / p99 ms / goodput req/s" for t in tenants]], rows))  # fmt: skip
        out.append(f"-- {name} / {seg}: controller / baseline, 95 % interval (crossover fit)")
        rows = [[b, fmt_ratio(data["client"].get(b)), fmt_ratio(data["engine"].get(b)),
                 *[fmt_ratio(data["tenant_ratios"][t].get(b)) for t in tenants]]
                for b in entry["baselines"]]  # fmt: skip
        best = data["best_static"]
        rows.append([f"best static ({best.baseline if best else '-'})", fmt_ratio(best), fmt_ratio(data["best_static_engine"]),
                     *["" for _ in tenants]])  # fmt: skip
        out.append(table(["baseline", "client tok/s", "engine tok/s", *[f"{t} tok/s" for t in tenants]], rows))
        cpm = ", ".join(f"{t} {_f(v['per_minute'], 1)} (at most {v['most_in_a_block']} in a block)"
                        for t, v in data["changes_per_minute"].items() if v)  # fmt: skip
        out.append(f"controller policy changes per minute over the windows: {cpm}")
    if entry.get("geomean_vs_k_table"):
        out.append(f"geomean over segments, controller / k-table: {fmt_ratio(entry['geomean_vs_k_table'])}")
    if entry.get("geomean_vs_vllm_table"):
        out.append(f"geomean over segments, controller / vllm-table (engine flag): {fmt_ratio(entry['geomean_vs_vllm_table'])}")
    if entry.get("geomean_vs_tables"):
        out.append("geomean over segments, controller / each table: "
                   + "; ".join(f"{b} {fmt_ratio(r)}" for b, r in entry["geomean_vs_tables"].items()))
    fit = entry.get("step_cost")
    if fit:
        out.append(f"learned step cost against its engine-timed points (in-sample, >= {STEP_COST_MIN_EVIDENCE_S:.0f} s each): "
                   f"median |error| {fit['median_error']:.1%} over {fit['points']} points of {fit['curves']} curves "
                   f"(per curve {fit['per_curve'][0]:.1%}-{fit['per_curve'][1]:.1%}); flat {fit['flat_ms'][0]:.0f}-"
                   f"{fit['flat_ms'][1]:.0f} ms, knee {fit['knee_tokens'][0]:.1f}-{fit['knee_tokens'][1]:.1f} tokens, "
                   f"{fit['slope_ms_per_token'][0]:.2f}-{fit['slope_ms_per_token'][1]:.2f} ms a token above it")
    out.append(f"load generator: {_f((entry['load_cpu_share'] or 0) * 100)} % of a core (median over blocks)")
    shares = {p: v for p, v in (entry.get("gateway_cpu_share") or {}).items() if v is not None}
    if shares:
        out.append("gateway process CPU, % of a core (median over blocks): " + ", ".join(f"{p} {v * 100:.0f}" for p, v in shares.items()))
    return "\n".join(out)


def print_report(blocks: list[dict], tpot_target_ms: float) -> dict:
    summary = summarize(blocks, tpot_target_ms)
    for name, entry in summary["scenarios"].items():
        print(f"\n== scenario {name} (TPOT target {tpot_target_ms:.0f} ms)\n{report_scenario(name, entry)}")
    print("\n== targets (issue 30)\n" + "\n".join(summary["verdicts"]))
    return summary
