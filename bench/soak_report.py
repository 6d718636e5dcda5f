"""The report of bench/soak.py: windows, per-window tables and the verdicts.

Pure functions over the run's result dict (what soak.py writes to result.json),
so an earlier run can be re-read: `bench/soak.py --report-only PATH`.

Definitions (also in docs/benchmarks.md):

* a window is a fault's span plus the run's margin (kill: SIGKILL -> the
  restarted replica answers /health; stop: SIGSTOP -> SIGCONT; redis: kill ->
  the new Redis answers PING; gateway: SIGTERM -> the new instance answers
  /ready 200; hostile: the burst), and `calm`: after the warm-up, before the
  first fault. A request belongs to every window it was in flight in.
* outcomes: `ok`; `status` (an HTTP status other than 200, counted per status
  and error code); `error_event` (200, then a `data: {"error": ...}` event);
  `cut` (200, then the connection ended without [DONE] and without an error
  event, or a truncated non-streaming body); `conn_error` (no response:
  refused, reset); `hung` (still open after the hang bound).
* admitted (budgets) = answered 200; counted at its send time, per tenant, in
  every rolling `budget_window_s` (60 s); over-admission = the most admitted in
  any such window that ends inside the window, minus the limit.
* stall = the longest time a client waited for anything: for streams the
  largest gap between send, headers, events and the end; for the rest, the
  whole request.
* token-exact: every request is `ignore_eos` against sim replicas whose output
  is deterministic, so a complete response's text must be byte-identical to
  `synthetic_text(0, max_tokens)` (a stream the gateway continued on another
  replica included) and its usage must count `max_tokens` completion tokens; a
  stream that ended early (error event, cut, hung) must be a prefix of it.
* broken stream = one that had its first byte from a replica before that
  replica was SIGKILLed or SIGSTOPped and was still open then. The gateways'
  `specgate_continuations_total{outcome}` (and prefill tokens, the splice
  histogram, `specgate_upstream_attempts_total`) are summed over both
  instances from the run's start to its end; the verdict counts
  continued / (continued + broken streams that ended with an error event).
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.stats import percentile  # noqa: E402

REQ_FIELDS = (
    "id", "kind", "gw", "tenant", "stream", "endpoint", "max_tokens", "t_send", "t_hdr", "t_first", "t_end", "status",
    "code", "replica", "retry_after", "outcome", "error_event", "t_error", "done", "chunks", "tokens", "max_gap", "err",
    "ctoks", "text_check", "text_diff", "ids_leak",
)  # fmt: skip

BAD = ("error_event", "cut", "conn_error", "hung")


def fmt_s(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def records_of(result: dict) -> list[dict]:
    fields = result["fields"]
    missing = {f: None for f in REQ_FIELDS if f not in fields}  # an earlier run's result.json
    return [{**missing, **dict(zip(fields, row))} for row in result["records"]]


def end_of(r: dict) -> float:
    return r["t_end"] if r["t_end"] is not None else math.inf


def overlapping(recs: list[dict], start: float, end: float) -> list[dict]:
    return [r for r in recs if r["t_send"] < end and end_of(r) > start]


def sent_in(recs: list[dict], start: float, end: float) -> list[dict]:
    return [r for r in recs if start <= r["t_send"] < end]


def stall(r: dict) -> float:
    if r["stream"] and r["outcome"] != "status":
        return r["max_gap"] or 0.0
    return end_of(r) - r["t_send"]


def replica_failure(r: dict) -> bool:
    """What a replica fault must not cause: no answer, a cut, a hang, an error event or a 5xx."""
    return r["outcome"] in BAD or (r["outcome"] == "status" and (r["status"] or 0) >= 500)


# ---------------------------------------------------------------------------
# windows


def build_windows(result: dict) -> list[dict]:
    plan = result["plan"]
    margin = plan["margin_s"]
    events = [e for e in result["events"] if "at" in e]
    first = min((e["at"] for e in events), default=plan["duration_s"])
    # calm ends 2 s before the first fault, so requests straddling it do not count as calm
    wins = [{"name": "calm", "kind": "calm", "start": plan["warmup_s"], "end": max(plan["warmup_s"] + 1, first - 2)}]
    for e in sorted(events, key=lambda e: e["at"]):
        kind = e["kind"]
        if kind == "kill":
            back = e.get("healthy_at") or e.get("restart_at") or e["at"]
            name = f"kill {e['target']}"
        elif kind == "stop":
            back = e.get("cont_at") or e["at"] + e.get("duration_s", 0)
            name = f"stop {e['target']} {e.get('duration_s', 0):g}s"
        elif kind == "redis":
            back = e.get("up_at") or e.get("restart_at") or e["at"] + e.get("duration_s", 0)
            name = f"redis down {e.get('duration_s', 0):g}s"
        elif kind == "gateway":
            back = e.get("ready_at") or e.get("restart_at") or e.get("exit_at") or e["at"]
            name = f"SIGTERM {e['target']}"
        elif kind == "hostile":
            back = e.get("end_at") or e["at"] + e.get("duration_s", 0)
            name = "hostile burst"
        else:
            continue
        wins.append({"name": name, "kind": kind, "start": e["at"], "back": back, "end": back + margin, "event": e})
    return wins


# ---------------------------------------------------------------------------
# budgets


def rolling_usage(rs: list[dict], window_s: float) -> list[tuple[float, int, int]]:
    """(time, requests, tokens) admitted in the `window_s` ending at each admission of `rs` (sorted by send time)."""
    out, j, toks = [], 0, 0
    for i, r in enumerate(rs):
        toks += r["tokens"] or 0
        while rs[j]["t_send"] <= r["t_send"] - window_s:
            toks -= rs[j]["tokens"] or 0
            j += 1
        out.append((r["t_send"], i - j + 1, toks))
    return out


def weighted_usage(rs: list[dict], window_s: float, wall0: float) -> list[tuple[float, float, float]]:
    """(time, requests, tokens) by the store's own measure at each admission of `rs`: sliding
    windows weighted by the previous one (previous bucket x (1 - elapsed share of the current) +
    current bucket, buckets aligned to the epoch), from the bench's clock (`wall0` + send time)."""
    buckets: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    out = []
    for r in rs:
        e = wall0 + r["t_send"]
        idx = int(e // window_s)
        elapsed = (e - idx * window_s) / window_s
        cur = buckets[idx]
        cur[0] += 1
        cur[1] += r["tokens"] or 0
        prev = buckets.get(idx - 1, [0.0, 0.0])
        out.append((r["t_send"], prev[0] * (1 - elapsed) + cur[0], prev[1] * (1 - elapsed) + cur[1]))
    return out


def peak(series, start: float = float("-inf"), end: float = float("inf"), exclude: list[tuple[float, float]] = ()) -> tuple:
    """Highest requests and highest tokens of a usage series over points in [start, end), outside `exclude`."""
    best_n = best_t = 0
    for t, n, toks in series:
        if start <= t < end and not any(a <= t < b for a, b in exclude):
            best_n, best_t = max(best_n, n), max(best_t, toks)
    return best_n, best_t


class Budget:
    """Rolling admitted requests / tokens per budgeted tenant (admitted = answered 200)."""

    def __init__(self, recs: list[dict], tenants: list[dict], window_s: float, wall0: float | None = None):
        self.window_s = window_s
        self.limits = {t["id"]: t for t in tenants if t.get("requests_per_minute") or t.get("tokens_per_minute")}
        self.adm: dict[str, list[dict]] = defaultdict(list)
        for r in recs:
            if r["tenant"] in self.limits and r["status"] == 200:
                self.adm[r["tenant"]].append(r)
        for rs in self.adm.values():
            rs.sort(key=lambda r: r["t_send"])
        self.roll = {tenant: rolling_usage(rs, window_s) for tenant, rs in self.adm.items()}
        # The gateway's own measure, reconstructed at each admission.
        self.wall0 = wall0
        self.est = {} if wall0 is None else {tenant: weighted_usage(rs, window_s, wall0) for tenant, rs in self.adm.items()}

    def est_in(self, tenant: str, start: float, end: float, exclude: list[tuple[float, float]] = ()) -> tuple[float, float]:
        """Highest weighted-window usage (requests, tokens) the gateway's store would have seen in [start, end)."""
        return peak(self.est.get(tenant, ()), start, end, exclude)

    def max_in(self, tenant: str, start: float, end: float, exclude: list[tuple[float, float]] = ()) -> tuple[int, int]:
        """Most requests / tokens admitted in a rolling window ending in [start, end)."""
        return peak(self.roll.get(tenant, ()), start, end, exclude)

    def _per_gateway(self, tenant: str, start: float, end: float) -> dict[str, list[dict]]:
        rs = [r for r in self.adm.get(tenant, ()) if start <= r["t_send"] < end]
        return {gw: [r for r in rs if r["gw"] == gw] for gw in sorted({r["gw"] for r in rs})}

    def per_instance(self, tenant: str, start: float, end: float) -> dict[str, tuple[int, int]]:
        """Per gateway: most requests / tokens admitted within [start, end) in any rolling window."""
        return {gw: peak(rolling_usage(mine, self.window_s)) for gw, mine in self._per_gateway(tenant, start, end).items()}

    def per_instance_weighted(self, tenant: str, start: float, end: float) -> dict[str, tuple[float, float]]:
        """Per gateway: the highest usage of its local window during [start, end) -- what
        `budget_failure_mode: local` enforces against the share: the same weighted sliding window
        as the store's (epoch-aligned buckets), holding only that instance's admissions from the
        outage's start (the local window starts empty)."""
        if self.wall0 is None:
            return {}
        return {gw: peak(weighted_usage(mine, self.window_s, self.wall0)) for gw, mine in self._per_gateway(tenant, start, end).items()}

    def describe(self, tenant: str) -> str:
        t = self.limits[tenant]
        parts = []
        if t.get("requests_per_minute"):
            parts.append(f"{t['requests_per_minute']} req")
        if t.get("tokens_per_minute"):
            parts.append(f"{t['tokens_per_minute']} tok")
        return "/".join(parts) + f" per {self.window_s:g}s"


# ---------------------------------------------------------------------------
# per-window figures


def outcome_line(recs: list[dict]) -> dict:
    c = Counter(r["outcome"] for r in recs)
    statuses = Counter(f"{r['status']}" + (f"/{r['code']}" if r["code"] and r["status"] != 429 else "")
                       for r in recs if r["outcome"] == "status")  # fmt: skip
    ok_lat = [r["t_end"] - r["t_send"] for r in recs if r["outcome"] == "ok"]
    ttft = [r["t_first"] - r["t_send"] for r in recs if r["outcome"] == "ok" and r["stream"] and r["t_first"]]
    return {
        "reqs": len(recs),
        "ok": c["ok"],
        "status": dict(statuses.most_common()),
        "error_event": c["error_event"],
        "cut": c["cut"],
        "conn_error": c["conn_error"],
        "hung": c["hung"],
        "p50": percentile(ok_lat, 50),
        "p99": percentile(ok_lat, 99),
        "ttft_p99": percentile(ttft, 99),
        "max_stall": max((stall(r) for r in recs), default=None),
    }


def status_text(d: dict) -> str:
    return " ".join(f"{k}x{v}" for k, v in d.items()) or "-"


def share(recs: list[dict]) -> Counter:
    return Counter(r["replica"] for r in recs if r["replica"])


def share_text(c: Counter) -> str:
    total = sum(c.values())
    return " ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(c.items())) if total else "-"


def probe_stats(probes: list[list], gw: str, start: float, end: float) -> dict:
    lat = [p[2] for p in probes if p[1] == gw and start <= p[0] < end and p[2] is not None]
    fails = Counter(str(p[3]) for p in probes if p[1] == gw and start <= p[0] < end and (p[2] is None or p[3] != 200))
    return {"n": len(lat) + sum(fails.values()), "p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat, default=None),
            "fails": dict(fails)}  # fmt: skip


def sample_max(samples: list[list], gw: str, col: int, start: float, end: float) -> float | None:
    vals = [s[col] for s in samples if s[1] == gw and start <= s[0] < end and s[col] is not None]
    return max(vals, default=None)


def sample_sum(samples: list[list], gw: str, col: int, start: float, end: float) -> int:
    return sum(s[col] or 0 for s in samples if s[1] == gw and start <= s[0] < end)


def attempts_delta(e: dict, target: str) -> str:
    """Upstream attempts on `target` by outcome in the window, summed over the gateways (their /metrics)."""
    before, after = e.get("attempts_before") or {}, e.get("attempts_after") or {}
    total: Counter = Counter()
    for gw, counts in after.items():
        if counts is None or before.get(gw) is None:
            return "n/a (a gateway's /metrics was not readable)"
        for key, v in counts.items():
            replica, _, outcome = key.partition("|")
            if replica == target:
                total[outcome] += v - before[gw].get(key, 0.0)
    return " ".join(f"{k} {v:.0f}" for k, v in sorted(total.items()) if v) or "none"


def log_summary(result: dict, start: float, end: float) -> str:
    logs = [x for x in result.get("logs", []) if start <= x[0] < end]
    if not logs:
        return "none"
    c = Counter((x[3], x[4]) for x in logs)
    exc = sum(1 for x in logs if x[5])
    top = "; ".join(f"{n}x {lg}: {msg}" for (lg, msg), n in c.most_common(4))
    return f"{len(logs)} lines ({exc} with a traceback): {top}"


# ---------------------------------------------------------------------------
# the report


def render(result: dict) -> str:
    plan, settings = result["plan"], result.get("settings") or {}
    recs = records_of(result)
    wins = build_windows(result)
    calm = wins[0]
    window_s = float(settings.get("budget_window_s", 60))
    hi = float(settings.get("health_interval_s", 2.0))
    budget = Budget(recs, plan["tenants"], window_s, result.get("wall0"))
    gws = sorted({r["gw"] for r in recs}) or ["gw-a", "gw-b"]
    out: list[str] = []
    w = out.append

    w("")
    w(f"soak: {plan['rps']:g} req/s for {plan['duration_s']:g} s{' (quick)' if plan['quick'] else ''}, "
      f"{plan['replicas']} sim replicas, 2 gateways, hang bound {plan['hang_s']:g} s, {len(recs)} requests "
      f"({result.get('client_cap_skips', 0)} not sent: client cap); run dir {result.get('run_dir')}")
    keys = ("health_interval_s", "wedge_after_s", "budget_failure_mode", "drain_pre_s", "drain_deadline_s",
            "header_timeout_s", "max_header_bytes", "first_byte_timeout_s", "breaker_open_s", "max_connections",
            "max_continuations")
    w("gateway settings: " + "  ".join(f"{k}={settings[k]}" for k in keys if k in settings)
      + (f"  overrides {plan['gw_set']}" if plan.get("gw_set") else ""))
    w("tenants: " + "  ".join(f"{t['id']} {int(100 * t['weight'])}%"
                              + (f" rpm={t['requests_per_minute']}" if t.get("requests_per_minute") else "")
                              + (f" tpm={t['tokens_per_minute']}" if t.get("tokens_per_minute") else "")
                              for t in plan["tenants"]))  # fmt: skip
    w("")

    # -- summary table
    whole = {"name": "whole run", "kind": "all", "start": 0.0, "end": math.inf}
    header = (f"{'window':<20} {'span s':>11} {'reqs':>6} {'ok':>6} {'err-ev':>6} {'cut':>4} {'conn':>5} {'hung':>4} "
              f"{'p50 s':>6} {'p99 s':>6} {'stall':>6}  failed by status")  # fmt: skip
    w(header)
    w("-" * len(header))
    per_win = []
    for win in [*wins, whole]:
        rs = overlapping(recs, win["start"], win["end"])
        o = outcome_line(rs)
        per_win.append((win, rs, o))
        span = "all" if win is whole else f"{win['start']:.0f}-{win['end']:.0f}"
        w(f"{win['name']:<20} {span:>11} {o['reqs']:>6} {o['ok']:>6} {o['error_event']:>6} {o['cut']:>4} "
          f"{o['conn_error']:>5} {o['hung']:>4} {fmt_s(o['p50']):>6} {fmt_s(o['p99']):>6} {fmt_s(o['max_stall'], 1):>6}"
          f"  {status_text(o['status'])}")  # fmt: skip
    w("(reqs: requests in flight at any time in the window; p50/p99: latency of ok requests; stall: the longest wait "
      "of any request, see docs/benchmarks.md)")

    # -- budgets per window
    if budget.limits:
        w("")
        w(f"budget: most admitted (answered 200) in any rolling {window_s:g} s ending in the window | the same by the "
          "gateway's weighted window (previous bucket x (1 - elapsed) + current) | limit")
        w(f"{'window':<20} " + " ".join(f"{t + ' ' + budget.describe(t):>30}" for t in budget.limits))
        for win, _, _ in per_win:
            cells = []
            for t, lim in budget.limits.items():
                n, toks = budget.max_in(t, win["start"], win["end"])
                en, et = budget.est_in(t, win["start"], win["end"])
                if lim.get("requests_per_minute"):
                    cells.append(f"{n} | {en:.0f} | {lim['requests_per_minute']} req")
                else:
                    cells.append(f"{toks} | {et:.0f} | {lim['tokens_per_minute']} tok")
            w(f"{win['name']:<20} " + " ".join(f"{c:>30}" for c in cells))

    # -- details per window
    verdict_data: dict = {"kills": [], "stops": [], "redis": [], "gateway": [], "hostile": []}
    w("")
    w(f"== calm: window {calm['start']:.1f}-{calm['end']:.1f} s")
    w(f"  served by: {share_text(share(sent_in(recs, calm['start'], calm['end'])))}")
    w(f"  gateway log lines: {log_summary(result, calm['start'], calm['end'])}")
    cpu = [s_[4] for s_ in result["samples"] if s_[1] == "bench" and s_[4] is not None]
    span = [s_[0] for s_ in result["samples"] if s_[1] == "bench" and s_[4] is not None]
    if len(cpu) > 1 and span[-1] > span[0]:
        w(f"  the bench's own CPU over the run: {100 * (cpu[-1] - cpu[0]) / (span[-1] - span[0]):.0f}% of a core")
    for gw in gws:
        c = probe_stats(result["probes"], gw, calm["start"], calm["end"])
        w(f"  /health {gw}: p50 {fmt_ms(c['p50'])} p99 {fmt_ms(c['p99'])} max {fmt_ms(c['max'])} ms (n {c['n']}, "
          f"failed {c['fails'] or 0}); max RSS {fmt_s(sample_max(result['samples'], gw, 2, calm['start'], calm['end']), 0)} MB")
    for win, rs, o in per_win[1:-1]:
        e = win["event"]
        w("")
        w(f"== {win['name']}: window {win['start']:.1f}-{win['end']:.1f} s")
        if win["kind"] == "kill":
            verdict_data["kills"].append(detail_kill(w, recs, e, hi, plan))
        elif win["kind"] == "stop":
            verdict_data["stops"].append(detail_stop(w, recs, e, calm, settings))
        elif win["kind"] == "redis":
            verdict_data["redis"].append(detail_redis(w, recs, e, budget, result, gws))
        elif win["kind"] == "gateway":
            verdict_data["gateway"].append(detail_gateway(w, recs, e, result, settings))
        elif win["kind"] == "hostile":
            verdict_data["hostile"].append(detail_hostile(w, e, calm, result, gws, settings))
        w(f"  gateway log lines in the window: {log_summary(result, win['start'], win['end'])}")
        if e.get("error"):
            w(f"  the bench's fault action failed: {e['error']}")

    w("")
    verdict_data["continuation"] = detail_continuation(w, recs, result, verdict_data)

    w("")
    w("verdicts (issue 13, 'Done when'; issue 14, stream continuation):")
    for ok, line in verdicts(recs, per_win, verdict_data, budget, wins, plan, settings):
        w(f"  {'PASS' if ok is True else 'FAIL' if ok is False else 'n/a '}  {line}")
    return "\n".join(out)


def detail_kill(w, recs: list[dict], e: dict, hi: float, plan: dict) -> dict:
    at, target = e["at"], e["target"]
    healthy = e.get("healthy_at")
    down_end = healthy or e.get("restart_at") or at
    w(f"  SIGKILL {target} at {at:.1f}, restarted {fmt_s(e.get('restart_at'), 1)}, answered /health {fmt_s(healthy, 1)}")
    no_byte = [r for r in recs if r["t_send"] < at < end_of(r) and (r["t_hdr"] is None or r["t_hdr"] > at)]
    during = sent_in(recs, at, down_end)
    hit = {r["id"]: r for r in no_byte + during}.values()
    failed = [r for r in hit if replica_failure(r)]
    w(f"  hit by the kill (in flight without a first byte at the kill: {len(no_byte)}; sent while {target} was down: "
      f"{len(during)}): {len(hit)}, ok or budget-refused {len(hit) - len(failed)} "
      f"({100 * (len(hit) - len(failed)) / max(1, len(hit)):.1f}%)"
      + (f"; FAILED {Counter(r['outcome'] + ('/' + str(r['status']) if r['status'] not in (None, 200) else '') for r in failed)}" if failed else ""))  # fmt: skip
    mid = [r for r in recs if r["replica"] == target and r["t_hdr"] is not None and r["t_hdr"] <= at < end_of(r)]
    w(f"  upstream attempts on {target} in the window (gateways' /metrics): {attempts_delta(e, target)}")
    w(f"  had their first byte from {target} before the kill: {len(mid)} -> {dict(Counter(r['outcome'] for r in mid))} "
      "(expected: streams continued on another replica end ok, token-exact; with max_continuations 0, or when no "
      "continuation is possible, with an error event)")
    c = share(during)
    others = sum(v for k, v in c.items() if k != target)
    w(f"  served while {target} was down ({at:.1f}-{down_end:.1f}): {share_text(c)}; healthy replicas' share "
      f"{100 * others / max(1, sum(c.values())):.1f}%")
    delays = {}
    if healthy is not None:
        restart = e.get("restart_at") or at
        for gw in sorted({r["gw"] for r in recs}):
            first = [r["t_send"] for r in recs if r["gw"] == gw and r["replica"] == target and r["t_send"] >= restart]
            if first:
                delays[gw] = min(first) - healthy
            elif sum(1 for r in recs if r["gw"] == gw and r["t_send"] >= healthy and r["replica"]) >= 2 * plan["replicas"]:
                delays[gw] = None  # it routed enough requests, none to the restarted replica
            # else: too little traffic through this gateway after the restart to tell (out of rotation, run ended)
        w("  restarted replica answering /health -> its first routed request: "
          + "  ".join(f"{gw} {fmt_s(d)} s" if d is not None else f"{gw} none" for gw, d in delays.items())
          + f"  (health_interval_s {hi:g})")
    return {"hit": len(hit), "failed": failed, "mid": mid, "delays": delays, "target": target}


def detail_stop(w, recs: list[dict], e: dict, calm: dict, settings: dict) -> dict:
    at, target = e["at"], e["target"]
    cont = e.get("cont_at") or at + e.get("duration_s", 0)
    w(f"  SIGSTOP {target} at {at:.1f}, SIGCONT at {cont:.1f}")
    rs = overlapping(recs, at, cont)
    stalls = sorted(rs, key=stall, reverse=True)
    calm_stall = [stall(r) for r in overlapping(recs, calm["start"], calm["end"])]
    w(f"  stall of the {len(rs)} requests in flight while stopped: p50 {fmt_s(percentile([stall(r) for r in rs], 50))} "
      f"p99 {fmt_s(percentile([stall(r) for r in rs], 99))} max {fmt_s(stall(stalls[0]) if stalls else None)} s "
      f"(calm: p99 {fmt_s(percentile(calm_stall, 99))} max {fmt_s(max(calm_stall, default=None))})")
    for r in stalls[:3]:
        w(f"    worst: #{r['id']} {'stream' if r['stream'] else 'non-stream'} via {r['gw']}->{r['replica']} "
          f"sent {r['t_send']:.1f} {r['outcome']}{'/' + str(r['status']) if r['status'] not in (None, 200) else ''} "
          f"stall {stall(r):.2f} s")
    mid = [r for r in recs if r["replica"] == target and r["t_hdr"] is not None and r["t_hdr"] <= at < end_of(r)]
    ends = [end_of(r) - at for r in mid]
    w(f"  in flight on {target} with a first byte at SIGSTOP: {len(mid)} -> {dict(Counter(r['outcome'] for r in mid))}, "
      f"ended {fmt_s(min(ends, default=None))}..{fmt_s(max(ends, default=None))} s after SIGSTOP")
    w(f"  upstream attempts on {target} in the window (gateways' /metrics): {attempts_delta(e, target)}")
    routed = [r for r in sent_in(recs, at, cont) if r["replica"] == target]
    late = [r["t_send"] - at for r in routed]
    w(f"  sent while stopped and answered by {target} (after SIGCONT): {len(routed)}"
      + (f", sent {min(late):.1f}..{max(late):.1f} s after SIGSTOP" if late else ""))
    c = share(sent_in(recs, at, cont))
    others = sum(v for k, v in c.items() if k != target)
    w(f"  served while stopped: {share_text(c)}; healthy replicas' share {100 * others / max(1, sum(c.values())):.1f}%")
    mid_ids = {r["id"] for r in mid}
    failed = [r for r in rs if replica_failure(r) and not (r["id"] in mid_ids and r["outcome"] == "error_event")]
    w(f"  failures among them (other than error events ending streams mid-flight on {target}): "
      f"{dict(Counter(r['outcome'] + ('/' + str(r['status']) if r['status'] not in (None, 200) else '') for r in failed))}")
    return {"max_stall": stall(stalls[0]) if stalls else None, "worst": stalls[:3], "failed": failed, "mid": mid}


def detail_redis(w, recs: list[dict], e: dict, budget: Budget, result: dict, gws: list[str]) -> dict:
    at = e["at"]
    up = e.get("up_at") or e.get("restart_at") or at
    w(f"  Redis SIGKILLed at {at:.1f}, restarted (empty) {fmt_s(e.get('restart_at'), 1)}, answering {fmt_s(up, 1)}")
    during = sent_in(recs, at, up)
    for label, group in (("budgeted", [r for r in during if r["tenant"] in budget.limits]),
                         ("unbudgeted", [r for r in during if r["tenant"] not in budget.limits])):
        o = outcome_line(group)
        ra = Counter(bool(r["retry_after"]) for r in group if r["status"] == 503)
        w(f"  sent during the outage, {label}: {o['reqs']} ok {o['ok']} status {status_text(o['status'])} "
          f"err-ev {o['error_event']} cut {o['cut']} conn {o['conn_error']} hung {o['hung']}"
          + (f" (503 with Retry-After: {ra[True]}/{ra[True] + ra[False]})" if ra else ""))
    rot = [x for x in result["rotation"] if at <= x[0] < up + 5]
    if rot:
        w("  /ready transitions: " + ", ".join(f"{x[1]} {'in' if x[2] else 'out'} at {x[0]:.1f} ({x[3]})" for x in rot))
    live = len(gws)
    checks = []
    for tenant, lim in budget.limits.items():
        inst = budget.per_instance(tenant, at, up)
        local = budget.per_instance_weighted(tenant, at, up)
        parts = []
        for kind, key, idx in (("req", "requests_per_minute", 0), ("tok", "tokens_per_minute", 1)):
            if not lim.get(key):
                continue
            share_ = math.ceil(lim[key] / live)
            cells = [f"{gw} {inst.get(gw, (0, 0))[idx]} (local window {local.get(gw, (0, 0))[idx]:.0f})" for gw in gws]
            if local:  # what local mode enforces; the rolling count is information
                worst = max((local.get(gw, (0, 0))[idx] for gw in gws), default=0)
            else:
                worst = max((inst.get(gw, (0, 0))[idx] for gw in gws), default=0)
            checks.append((tenant, kind, round(worst, 1), share_))
            parts.append(f"{kind}: {', '.join(cells)} (share {share_})")
        around_n, around_t = budget.max_in(tenant, at, up + budget.window_s)
        w(f"  {tenant}: admitted per instance during the outage {'; '.join(parts)}; most in a rolling window ending "
          f"in the outage or the {budget.window_s:g} s after: {around_n} req / {around_t} tok "
          f"(limit {budget.describe(tenant)}; the restarted Redis is empty)")
    return {"checks": checks, "span": (at, up)}


def detail_gateway(w, recs: list[dict], e: dict, result: dict, settings: dict) -> dict:
    at, target = e["at"], e["target"]
    out_at = next((x[0] for x in result["rotation"] if x[1] == target and not x[2] and x[0] >= at), None)
    back_at = next((x[0] for x in result["rotation"] if x[1] == target and x[2] and x[0] >= at), None)
    exit_s = (e["exit_at"] - at) if e.get("exit_at") else None
    w(f"  SIGTERM {target} at {at:.1f}: out of rotation (/ready not 200) after {fmt_s(out_at - at if out_at else None)} s, "
      f"exited after {fmt_s(exit_s, 1)} s with {e.get('exit_code')}, restarted {fmt_s(e.get('restart_at'), 1)}, "
      f"/ready 200 {fmt_s(e.get('ready_at'), 1)}, back in rotation {fmt_s(back_at, 1)}")
    inflight = [r for r in recs if r["gw"] == target and r["t_send"] < at < end_of(r) and r["kind"] == "load"]
    after = [r for r in recs if r["gw"] == target and r["t_send"] >= at and (out_at is None or r["t_send"] <= out_at + 0.2)]
    for label, group in (("in flight on it at SIGTERM", inflight), ("sent to it after SIGTERM, before the LB took it out", after)):
        o = outcome_line(group)
        w(f"  {label}: {o['reqs']} ok {o['ok']} status {status_text(o['status'])} err-ev {o['error_event']} cut {o['cut']} "
          f"conn {o['conn_error']} hung {o['hung']}")
    probes = [r for r in recs if r["id"] in set(e.get("probes", []))]
    for r in probes:
        w(f"  long stream #{r['id']} (started {r['t_send'] - at:+.1f} s): {r['outcome']}"
          f"{' code ' + str(r['code']) if r['code'] else ''}{' [DONE]' if r['done'] else ''}, ended "
          f"{fmt_s(end_of(r) - at, 1)} s after SIGTERM, {r['chunks']} events")
    other = [r for r in recs if r["gw"] != target and at <= r["t_send"] < (e.get("ready_at") or at)]
    o = outcome_line(other)
    w(f"  other gateway meanwhile: {o['reqs']} ok {o['ok']} status {status_text(o['status'])} err-ev {o['error_event']} "
      f"cut {o['cut']} conn {o['conn_error']} hung {o['hung']} p99 {fmt_s(o['p99'])} s")
    return {"out_s": (out_at - at) if out_at else None, "exit_s": exit_s, "exit_code": e.get("exit_code"),
            "bad": [r for r in inflight + after if r["outcome"] in ("cut", "conn_error", "hung")],
            "probes": probes}  # fmt: skip


def detail_hostile(w, e: dict, calm: dict, result: dict, gws: list[str], settings: dict) -> dict:
    at, end = e["at"], e.get("end_at") or e["at"] + e.get("duration_s", 0)
    st = e.get("stats") or {}
    w(f"  burst {at:.1f}-{end:.1f}: {e.get('conns')} trickling connections (1 byte/s, reconnecting when closed) "
      f"+ {len(st.get('big', []))} oversized headers")
    probes = {}
    for gw in gws:
        b = probe_stats(result["probes"], gw, at, end)
        c = probe_stats(result["probes"], gw, calm["start"], calm["end"])
        probes[gw] = (b, c)
        w(f"  /health {gw}: burst p50 {fmt_ms(b['p50'])} p99 {fmt_ms(b['p99'])} max {fmt_ms(b['max'])} ms "
          f"(n {b['n']}, failed {b['fails'] or 0}) vs calm p50 {fmt_ms(c['p50'])} p99 {fmt_ms(c['p99'])} "
          f"max {fmt_ms(c['max'])} ms")
    lag_b = [x[1] for x in result["lag"] if at <= x[0] < end]
    lag_c = [x[1] for x in result["lag"] if calm["start"] <= x[0] < calm["end"]]
    w(f"  the bench's own event-loop lag p99: burst {fmt_ms(percentile(lag_b, 99))} ms, calm {fmt_ms(percentile(lag_c, 99))} ms")
    life = st.get("lifetimes", [])
    w(f"  trickle: opened {st.get('opened')} (max concurrent {st.get('max_concurrent')}), refused/failed to connect "
      f"{st.get('refused')}, closed by the gateway {st.get('closed_by_server')} (lifetime p50 {fmt_s(percentile(life, 50), 1)} "
      f"max {fmt_s(max(life, default=None), 1)} s), responses {st.get('responses')}, still open at the end "
      f"{st.get('open_at_end')} (oldest {fmt_s(max(st.get('open_at_end_ages') or [], default=None), 1)} s)")
    for b in st.get("big", []):
        w(f"  {b['size_mb']} MiB header to {b['gateway']}: {b.get('result')!r} after {fmt_s(b.get('seconds'), 3)} s "
          f"({b.get('bytes_sent_before', 0) / 2**20:.1f} MiB sent before)")
    for gw in gws:
        w(f"  {gw}: max RSS {fmt_s(sample_max(result['samples'], gw, 2, at, end + 5), 0)} MB, max open fds "
          f"{fmt_s(sample_max(result['samples'], gw, 3, at, end + 5), 0)} (calm "
          f"{fmt_s(sample_max(result['samples'], gw, 2, calm['start'], calm['end']), 0)} MB, "
          f"{fmt_s(sample_max(result['samples'], gw, 3, calm['start'], calm['end']), 0)} fds)")
    return {"probes": probes, "stats": st}


CONTINUATION_OUTCOMES = ("continued", "exhausted", "unsupported", "failed")


def metric_sum(series: list, name: str, **labels: str) -> float:
    """Sum of the run's deltas of the series `name` whose labels include `labels`."""
    return sum(v for n, lab, v in series if n == name and all(lab.get(k) == x for k, x in labels.items()))


def hist_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Quantile `q` from cumulative histogram buckets [(le, count)] (+Inf included), by linear
    interpolation inside the bucket, as PromQL's histogram_quantile; in the +Inf bucket, the highest
    finite bound. None without observations."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lo, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lo
            if count == below:
                return le
            return lo + (le - lo) * (rank - below) / (count - below)
        lo, below = le, count
    return lo


def _outcomes(rs: list[dict]) -> str:
    return " ".join(f"{k} {v}" for k, v in Counter(r["outcome"] for r in rs).most_common()) or "none"


def detail_continuation(w, recs: list[dict], result: dict, vd: dict) -> dict:
    """Stream continuation (issue 14): the gateways' continuation and attempt counters over the run,
    the splice latency, what clients saw of streams broken by a kill or a SIGSTOP, and the
    token-exactness of every response against the sim replicas' deterministic text."""
    gm = result.get("gateway_metrics")
    series = (gm or {}).get("series", [])
    present = any(f.startswith("specgate_continuation") for f in (gm or {}).get("families", []))
    w("== stream continuation (gateways' /metrics, both instances summed, run start -> end"
      + (f", scraped every {gm.get('interval_s', 0):g} s" if gm else "") + ")")
    if gm is None:
        w("  gateway metrics not scraped (a run from before the soak read them): continuation metrics absent")
    else:
        fails = gm.get("failures") or {}
        w(f"  scrapes: {gm.get('scrapes')}" + (f", failed {fails}" if fails else "")
          + "; a restarted gateway loses what it counted after its last scrape")
        if not present:
            w("  continuation metrics absent (the gateways export no specgate_continuation* series): counted as 0")
    by = {o: metric_sum(series, "specgate_continuations_total", outcome=o) for o in CONTINUATION_OUTCOMES}
    for n, lab, v in series:  # an outcome the gateway added since
        if n == "specgate_continuations_total" and lab.get("outcome") not in by:
            by[lab.get("outcome")] = metric_sum(series, n, outcome=lab.get("outcome"))
    continued = by["continued"]
    prefill = metric_sum(series, "specgate_continuation_prefill_tokens_total")
    w("  continuations: " + ", ".join(f"{k} {v:.0f}" for k, v in by.items())
      + f"; prompt tokens re-prefilled {prefill:.0f}" + (f" ({prefill / continued:.0f} per continuation)" if continued else ""))
    buckets = [(float(lab["le"]), v) for n, lab, v in series if n == "specgate_continuation_splice_seconds_bucket"]
    n_splice = metric_sum(series, "specgate_continuation_splice_seconds_count")
    s_splice = metric_sum(series, "specgate_continuation_splice_seconds_sum")
    p50, p99 = hist_quantile(buckets, 0.5), hist_quantile(buckets, 0.99)
    w(f"  splice (break -> first continued byte to the client): n {n_splice:.0f}, p50 {fmt_ms(p50)} ms, "
      f"p99 {fmt_ms(p99)} ms, mean {fmt_ms(s_splice / n_splice if n_splice else None)} ms (from the histogram's buckets)")
    att: Counter = Counter()
    for n, lab, v in series:
        if n == "specgate_upstream_attempts_total":
            att[lab.get("outcome")] += v
    failed_att = sum(v for k, v in att.items() if k != "ok")
    w("  upstream attempts: " + (" ".join(f"{k} {v:.0f}" for k, v in sorted(att.items()) if v) or "none")
      + f"; failed before the first byte (then failed over, or the request failed): {failed_att:.0f}")

    streams = [r for r in recs if r["stream"]]
    mid = {r["id"]: r for d in vd.get("kills", []) + vd.get("stops", []) for r in d.get("mid", []) if r["stream"]}
    broken = list(mid.values())
    broken_err = [r for r in broken if r["outcome"] == "error_event"]
    errs = [r for r in streams if r["outcome"] == "error_event"]
    drain = [r for r in errs if r["id"] not in mid and (r["kind"] == "drain_probe" or r["code"] == "shutting_down")]
    drain_ids = {r["id"] for r in drain}
    other = [r for r in errs if r["id"] not in mid and r["id"] not in drain_ids]
    cut = [r for r in streams if r["outcome"] == "cut"]
    w(f"  client side: {len(broken)} streams had their first byte from a replica before it was killed or stopped "
      f"and were still open -> {_outcomes(broken)}; streams ended with an error event over the run: {len(errs)} "
      f"(after a kill/stop {len(broken_err)}, the drain {len(drain)}, other {len(other)}"
      + (f": {dict(Counter(str(r['code']) for r in other))}" if other else "") + f"); cut silently: {len(cut)}")
    checks = {}
    for label, group in (("streams", streams), ("non-streaming", [r for r in recs if not r["stream"]])):
        c = Counter(r["text_check"] for r in group if r["text_check"])
        checks[label] = c
    ok = [r for r in recs if r["outcome"] == "ok"]
    usage_bad = [r for r in ok if r["ctoks"] != r["max_tokens"]]
    mismatched = [r for r in recs if r["text_check"] == "mismatch"]
    checked = sum(sum(c.values()) for c in checks.values())
    if checked:
        w("  token-exact text (the sim's synthetic_text(0, max_tokens), byte for byte; partial = error event/cut: a "
          "prefix): " + "; ".join(f"{label}: " + (" ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none")
                                  for label, c in checks.items())
          + f"; ok responses whose usage.completion_tokens != max_tokens: {len(usage_bad)}"
          + (f" (e.g. {[(r['id'], r['ctoks'], r['max_tokens']) for r in usage_bad[:3]]})" if usage_bad else ""))
        for r in mismatched[:3]:
            w(f"    mismatch #{r['id']} {r['endpoint']} {'stream' if r['stream'] else 'whole'} via {r['gw']}->"
              f"{r['replica']} {r['outcome']}: {r['text_diff']}")
        leaks = sum(1 for r in recs if r["ids_leak"])
        w(f"  responses carrying token_ids / prompt_token_ids the client did not ask for: {leaks}")
    else:
        w("  token-exact text: not checked (a run from before the soak checked it)")
    return {"metrics": gm is not None, "present": present, "continued": continued, "by": by,
            "broken": broken, "broken_err": broken_err, "cut": cut, "checks": checks, "checked": checked,
            "mismatched": mismatched, "usage_bad": usage_bad}


def verdicts(recs, per_win, vd, budget: Budget, wins, plan, settings) -> list[tuple[bool | None, str]]:
    out: list[tuple[bool | None, str]] = []
    whole = per_win[-1][2]
    hi = float(settings.get("health_interval_s", 2.0))
    out.append((whole["hung"] == 0, f"0 hung requests (bound {plan['hang_s']:g} s): {whole['hung']} of {whole['reqs']}"))
    streams = [r for r in recs if r["stream"]]
    cut_s = sum(1 for r in streams if r["outcome"] == "cut")
    cut_n = whole["cut"] - cut_s
    out.append((whole["cut"] == 0, f"0 streams cut without an error event: {cut_s} of {len(streams)} streams"
                + (f" (+{cut_n} truncated non-streaming bodies)" if cut_n else "")))
    if vd["kills"]:
        hit = sum(k["hit"] for k in vd["kills"])
        failed = [r for k in vd["kills"] for r in k["failed"]]
        line = (f"failover before the first byte for requests hit by a kill: {hit - len(failed)} of {hit} "
                f"ok or budget-refused over {len(vd['kills'])} kills")
        if failed:
            line += f"; failed: {dict(Counter(r['outcome'] + '/' + str(r['status']) for r in failed))}"
        out.append((not failed, line))
    else:
        out.append((None, "failover on a kill: no kill in the schedule"))
    # budgets
    # The restarted Redis is empty: a rolling window forgets the outage after one window, the
    # weighted one (previous bucket x (1 - elapsed) + current) only after two.
    redis_spans = [(d["span"][0], d["span"][1] + budget.window_s) for d in vd["redis"]]
    redis_spans2 = [(d["span"][0], d["span"][1] + 2 * budget.window_s) for d in vd["redis"]]
    worst, strict = [], []
    for tenant, lim in budget.limits.items():
        n, toks = budget.max_in(tenant, 0, math.inf, exclude=redis_spans)
        en, et = budget.est_in(tenant, 0, math.inf, exclude=redis_spans2)
        for key, unit, got, est in (("requests_per_minute", "req", n, en), ("tokens_per_minute", "tok", toks, et)):
            if lim.get(key):
                # budget leases may hold up to budget_lease_fraction of a limit per instance: allowed on top
                slack = 2 * float(settings.get("budget_lease_fraction", 0.01)) * lim[key] + 1
                worst.append((est - lim[key] - slack, f"{tenant} {est:.0f}/{lim[key]} {unit}"))
                strict.append(f"{tenant} {got}/{lim[key]} {unit} ({100 * (got - lim[key]) / lim[key]:+.0f}%)")
    if worst:
        out.append((all(d <= 0 for d, _ in worst), "no over-admission outside the Redis outage (and the "
                    f"{2 * budget.window_s:g} s after it) by the gateway's weighted window (+ lease slack): "
                    + ", ".join(s for _, s in worst)))
        out.append((None, f"(info) the same in any rolling window, outside the outage and the {budget.window_s:g} s "
                    "after it (stricter than the gateway's weighted window): " + ", ".join(strict)))
    if vd["redis"]:
        checks = [c for d in vd["redis"] for c in d["checks"]]
        over = [c for c in checks if c[2] > c[3]]
        out.append((not over, f"through the Redis outage ({settings.get('budget_failure_mode', '?')} mode) each instance "
                    "admits at most its share (limit / live instances) in its local weighted window "
                    "(docs/gateway.md's bound: the local window starts empty, so this is on top of what the shared "
                    "window held): "
                    + ", ".join(f"{t} {k} {n}/{s}" for t, k, n, s in checks)))
    else:
        out.append((None, "budget through a Redis outage: no outage in the schedule"))
    # restarted replica
    delays = [(k["target"], gw, d) for k in vd["kills"] for gw, d in k["delays"].items()]
    if delays:
        slack = 2 * 2 / plan["rps"] + 0.25
        known = [d for _, _, d in delays if d is not None]
        missing = [f"{t}@{gw}" for t, gw, d in delays if d is None]
        worst_d = max(known, default=None)
        ok = not missing and worst_d is not None and worst_d <= hi + slack
        out.append((ok, f"restarted replica back in rotation within one health interval ({hi:g} s + {slack:.2f} s for "
                    f"arrival spacing and the bench's 0.1 s poll): worst {fmt_s(worst_d)} s"
                    + (f"; never routed: {missing}" if missing else "")))
    else:
        out.append((None, "restarted replica back in rotation: no kill measured"))
    if vd["stops"]:
        m = max((s["max_stall"] or 0) for s in vd["stops"])
        failed = [r for s in vd["stops"] for r in s["failed"]]
        bound = 5 + hi
        out.append((m <= bound and not failed, f"a wedged replica costs no client more than ~5 s + one health interval "
                    f"({bound:g} s): worst stall {m:.2f} s"
                    + (f"; failures {dict(Counter(r['outcome'] + '/' + str(r['status']) for r in failed))}" if failed else "")))
    else:
        out.append((None, "wedged replica: no SIGSTOP in the schedule"))
    if vd["hostile"]:
        h = vd["hostile"][0]
        cells, ok = [], True
        for gw, (b, c) in h["probes"].items():
            if b["p99"] is None or c["p99"] is None:
                ok = False
                cells.append(f"{gw} no probes")
                continue
            allowed = max(2 * c["p99"], c["p99"] + 0.025)
            good = b["p99"] <= allowed and b["p50"] <= c["p50"] + 0.005 and not b["fails"]
            ok = ok and good
            cells.append(f"{gw} p50 {fmt_ms(b['p50'])} vs {fmt_ms(c['p50'])} ms, p99 {fmt_ms(b['p99'])} vs "
                         f"{fmt_ms(c['p99'])} ms (allowed {fmt_ms(allowed)}), failed {sum(b['fails'].values())}")
        out.append((ok, "hostile burst does not move /health latency beyond noise (p50 +5 ms, p99 max(2x, +25 ms), "
                    "no failures): " + "; ".join(cells)))
        big = h["stats"].get("big", [])
        if big:
            good = [b for b in big if " 431" in f" {b.get('result', '')}" and (b.get("seconds") or 99) < 1.0]
            out.append((len(good) == len(big), (f"oversized headers answered 431 within 1 s: {len(good)} of {len(big)} "
                        f"({', '.join(repr(b.get('result')) + ' ' + fmt_s(b.get('seconds'), 3) + ' s' for b in big)})")))
        st = h["stats"]
        limit = float(settings.get("header_timeout_s", 10.0)) + 5
        life_max = max([0, *(st.get("lifetimes") or []), *(st.get("open_at_end_ages") or [])])
        out.append((life_max <= limit, (f"trickling connections closed by the header timeout or refused (none older than "
                    f"{limit:g} s): oldest {life_max:.1f} s, {st.get('closed_by_server')} closed, {st.get('refused')} "
                    f"refused, {st.get('open_at_end')} open at the burst's end")))
    else:
        out.append((None, "hostile burst: not in the schedule"))
    if vd["gateway"]:
        g = vd["gateway"][0]
        pre = float(settings.get("drain_pre_s", 5.0))
        dl = float(settings.get("drain_deadline_s", 20.0))
        probes_ok = all(r["outcome"] in ("ok", "error_event") and (r["outcome"] == "ok" or r["done"]) for r in g["probes"])
        ok = (g["out_s"] is not None and g["out_s"] <= 1.0 and g["exit_code"] == 0 and g["exit_s"] is not None
              and g["exit_s"] <= pre + dl + 2 and not g["bad"] and probes_ok)
        out.append((ok, (f"SIGTERM drain: /ready out after {fmt_s(g['out_s'])} s (<= 1), exit {g['exit_code']} after "
                    f"{fmt_s(g['exit_s'], 1)} s (<= {pre + dl + 2:g}), requests on it cut/refused/hung: {len(g['bad'])}, "
                    f"long streams: {[r['outcome'] + (' +[DONE]' if r['done'] else '') for r in g['probes']]}")))
    else:
        out.append((None, "SIGTERM drain: not in the schedule"))
    cd = vd.get("continuation")
    if cd is not None:
        if cd["checked"]:
            st, ws = cd["checks"]["streams"], cd["checks"]["non-streaming"]
            bad = len(cd["mismatched"]) + len(cd["usage_bad"])
            out.append((bad == 0, f"token-exact: every stream's text is the sim's synthetic text, byte-identical when "
                        f"complete (continued or not), a prefix when it ended early: exact {st['exact']}, prefix "
                        f"{st['prefix']}, mismatch {st['mismatch']} of {sum(st.values())} streams answered 200 (non-streaming: "
                        f"exact {ws['exact']}, mismatch {ws['mismatch']}); ok responses with usage != max_tokens: "
                        f"{len(cd['usage_bad'])}"))
        else:
            out.append((None, "token-exact text: not checked in this run"))
        continued, errs, cut = cd["continued"], len(cd["broken_err"]), len(cd["cut"])
        broken = continued + errs
        client = (f"; client side: {len(cd['broken'])} streams open on a replica when it was killed or stopped -> "
                  f"{_outcomes(cd['broken'])}")
        line = (f">= 99% of broken streams continued (broken = continued + ended with an error event after their "
                f"replica was killed or stopped), none silently cut: continued {continued:.0f} of {broken:.0f}"
                + (f" ({100 * continued / broken:.1f}%)" if broken else "") + f", error events {errs}, cut {cut}")
        if not cd["present"]:
            line += " [continuation metrics absent: counted as 0]" + client
        if broken == 0:
            out.append((False if cut else None, line + ("" if cd["broken"] else " (no stream broken by a fault)")))
        else:
            out.append((continued >= 0.99 * broken and cut == 0, line + (client if cd["present"] else "")))
    conn = whole["conn_error"]
    out.append((conn == 0, f"(extra) requests with no response at all (refused/reset): {conn}"))
    return out
