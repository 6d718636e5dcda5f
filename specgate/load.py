"""`specgate load`: a mixed-tenant workload for `specgate up`, printing controller switches live
and, at the end, what each phase gained (per tenant: tok/s, TTFT, TPOT, acceptance), plus an HTML
report with the same over time.

Why: the point of specgate is visible only under changing load -- speculation pays at low
concurrency and stops paying when the replicas turn compute-bound. The default `step` pattern
runs light -> heavy -> light so that a newcomer sees the controller switch speculation off for
the heavy phase and back on after it, printed as the admin API's decision history records it,
and sees in the per-phase figures what that did to throughput and latency.

Every figure is observed, not modelled: requests are streamed (`stream_options.include_usage`
for the final usage chunk, which carries vLLM's `metrics.speculative_decoding` through the
gateway; `return_token_ids` so each chunk's token count is exact), and the policies come from
the admin API. The arithmetic is in `specgate.load_stats`, the drawing in `specgate.report`.

Pure parts (`rate_at`, `phases`, `pick_tenant`, `build_request`, `format_decision`,
`new_decisions`, `parse_stream_line`) are separate from the I/O (`run_load`): an open-loop Poisson
arrival process (arrivals do not wait for completions, as real clients don't), bounded by
`max_inflight`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import orjson

from contract.profiles import parse_profile
from contract.telemetry import RequestSpecStats

from testbed.phases import Phase, lay_out
from testbed.report import policy_knobs

from .load_stats import (
    RequestRecord,
    at_seconds,
    bin_width,
    chunk_tokens,
    format_tables,
    phase_stats,
    policy_timeline,
    time_series,
)

# Where the controller's terms (rho, a, gain_vs_off, k full->0, tenant *, ...) are explained: the
# checkout's file when there is one (an installed package has no docs/), else the repository path.
_DOC = Path(__file__).resolve().parents[1] / "docs" / "controller.md"
GLOSSARY = f"{_DOC if _DOC.is_file() else 'docs/controller.md'}#glossary"

# What each demo tenant sends. The prompts differ in kind (chat, code, bulk summarisation) and in
# length; `workload` is also passed to the simulated replicas as a hint of which calibrated
# acceptance preset the request follows (ignored by real vLLM, which measures it).
WORKLOADS: dict[str, dict] = {
    "chat": {
        "weight": 0.4,
        "sim_preset": "chat",
        "max_tokens": (64, 192),
        "prompts": [
            "Can you explain how a heat pump works, in simple words?",
            "What should I pack for a three-day hike in autumn?",
            "Tell me about the history of the printing press.",
        ],
    },
    "code": {
        "weight": 0.35,
        "sim_preset": "code",
        "max_tokens": (128, 320),
        "prompts": [
            "Write a Python function that merges overlapping intervals, with tests.",
            "Implement an LRU cache in Python with O(1) get and put.",
            "Write a SQL query returning the top 3 customers by revenue per month.",
        ],
    },
    "batch": {
        "weight": 0.25,
        "sim_preset": "gsm8k",
        "max_tokens": (32, 96),
        "prompts": [
            "Summarise the following support ticket in one sentence: the app crashes on start after the update.",
            "Classify the sentiment of: 'The delivery was late but the product is great.'",
        ],
    },
}


@dataclass(frozen=True)
class TenantKey:
    id: str
    key: str
    workload: str


@dataclass(frozen=True)
class LoadTarget:
    gateway_url: str
    admin_key: str
    model: str
    tenants: tuple[TenantKey, ...]
    max_block: int = 8  # largest draft block among the replicas: where "no cap" is drawn in the report


@dataclass(frozen=True)
class LoadConfig:
    rps: float = 40.0
    duration_s: float = 120.0
    pattern: str = "step"  # step | constant
    light_fraction: float = 0.1  # light phases run at this fraction of rps
    max_inflight: int = 256
    seed: int = 0
    poll_s: float = 1.0
    report_s: float = 10.0
    request_timeout_s: float = 60.0
    report_path: Path | None = None  # HTML report written at the end; None: none


def default_report_path(now: float | None = None) -> Path:
    """Beside `specgate up`'s state file (XDG cache), one file per run, so runs can be compared."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specgate" / f"load-{stamp}.html"


@dataclass
class LoadSummary:
    sent: int = 0
    ok: int = 0
    status: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    switches: list[dict] = field(default_factory=list)
    dropped: int = 0
    first_error: dict = field(default_factory=dict)  # status (or "stream") -> first error message seen
    records: list[RequestRecord] = field(default_factory=list)
    tokens_received: int = 0  # completion tokens streamed so far (live status line)
    initial_policies: dict[str, dict] = field(default_factory=dict)  # tenant -> policy at the start
    phases: list[Phase] = field(default_factory=list)
    t0_wall: float = 0.0  # wall clock at the run's start (decision times are wall clock)
    end_s: float = 0.0  # when the last response finished, seconds since the start
    report_path: Path | None = None
    model: str = ""


def load_target(state_file: Path, gateway_url: str | None = None) -> LoadTarget:
    data = json.loads(Path(state_file).read_text())
    tenants = tuple(TenantKey(t["id"], t["key"], t.get("workload", "chat")) for t in data["tenants"])
    if not tenants:
        raise ValueError("no tenants in state file")
    blocks = []
    for r in data.get("replicas") or []:
        try:
            blocks.append(parse_profile(r.get("profile") or "off").block_size)
        except (ValueError, AttributeError):
            pass
    return LoadTarget(gateway_url or data["gateway_url"], data["admin_key"], data.get("model") or "", tenants,
                      max(blocks, default=0) or 8)


def rate_at(t: float, cfg: LoadConfig) -> float:
    """Arrival rate (req/s) at time t: `step` = light for the first and last third, heavy between."""
    if cfg.pattern == "constant":
        return cfg.rps
    third = cfg.duration_s / 3.0
    return cfg.rps if third <= t < 2 * third else cfg.rps * cfg.light_fraction


def phase_name(t: float, cfg: LoadConfig) -> str:
    if cfg.pattern == "constant":
        return "constant"
    third = cfg.duration_s / 3.0
    return "heavy" if third <= t < 2 * third else "light"


def phases(cfg: LoadConfig) -> list[Phase]:
    """The phases `rate_at` / `phase_name` define, numbered (the step pattern has two `light`s)."""
    if cfg.pattern == "constant":
        return lay_out([Phase("constant", cfg.duration_s, rate=cfg.rps)])
    third = cfg.duration_s / 3.0
    edges = [0.0, third, 2 * third, cfg.duration_s]
    return lay_out(
        Phase(phase_name(edges[i], cfg), edges[i + 1] - edges[i], rate=rate_at(edges[i], cfg)) for i in range(3)
    )


def pick_tenant(tenants: tuple[TenantKey, ...], rng: random.Random) -> TenantKey:
    weights = [WORKLOADS.get(t.workload, WORKLOADS["chat"])["weight"] for t in tenants]
    return rng.choices(tenants, weights=weights, k=1)[0]


def build_request(tenant: TenantKey, model: str, rng: random.Random) -> dict:
    spec = WORKLOADS.get(tenant.workload, WORKLOADS["chat"])
    lo, hi = spec["max_tokens"]
    return {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(spec["prompts"])}],
        "max_tokens": rng.randint(lo, hi),
        "temperature": 1.0,
        # Streamed, so that TTFT and TPOT can be measured. The final usage chunk carries usage and
        # vLLM's metrics.speculative_decoding; token_ids on every chunk make its token count exact.
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        # Hint for simulated replicas only (real vLLM ignores unknown extra_args keys).
        "vllm_xargs": {"sim_workload": spec["sim_preset"]},
    }


@dataclass
class StreamState:
    """What one stream has delivered so far (filled by `parse_stream_line`)."""

    chunk_times: list[float] = field(default_factory=list)
    chunk_counts: list[int | None] = field(default_factory=list)  # tokens per chunk; None: unknown
    usage: dict | None = None
    metrics: dict | None = None
    error: str | None = None
    done: bool = False


def parse_stream_line(line: str, t: float, st: StreamState) -> None:
    """Fold one SSE line received at time t into `st`: chunks with tokens (by `token_ids`, or text
    when a replica sends no ids), the final usage chunk's usage and metrics, an error event."""
    if not line.startswith("data:"):
        return
    payload = line[5:].strip()
    if payload == "[DONE]":
        st.done = True
        return
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return
    if not isinstance(obj, dict):
        return
    if "error" in obj:
        err = obj["error"]
        st.error = str(err.get("message") if isinstance(err, dict) else err)[:200]
        return
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        ids = choice.get("token_ids")
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = delta.get("content") or choice.get("text") or ""
        if isinstance(ids, list) and ids:
            st.chunk_times.append(t)
            st.chunk_counts.append(len(ids))
        elif text and not isinstance(ids, list):
            st.chunk_times.append(t)
            st.chunk_counts.append(None)
    if isinstance(obj.get("usage"), dict) and obj.get("choices") == []:
        st.usage = obj["usage"]
        st.metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None


def record_of(tenant: str, sent_s: float, status: int | None, st: StreamState, replica: str | None = None,
              error: str | None = None) -> RequestRecord:
    """A finished stream as a `RequestRecord` (speculation counts read as the gateway reads them)."""
    stats = RequestSpecStats.from_response(st.usage, st.metrics)
    speculated = stats.num_draft_tokens is not None and stats.num_accepted_draft_tokens is not None
    known = sum(n for n in st.chunk_counts if n is not None)
    tokens = stats.completion_tokens if st.usage is not None else known
    if status == 200 and error is None and st.error is None and not st.done and st.usage is None:
        error = "stream ended early"
    return RequestRecord(
        tenant=tenant, sent_s=sent_s, status=status, completion_tokens=tokens,
        token_times=chunk_tokens(st.chunk_times, st.chunk_counts, tokens), spec=stats if speculated else None,
        replica=replica,
        error=error or st.error,
    )


def new_decisions(history: list[dict], seen: set[tuple]) -> list[dict]:
    """Policy changes in `history` (newest first) not seen before, oldest first; updates `seen`."""
    fresh = []
    for d in history:
        key = (d.get("tenant"), d.get("at"), d.get("reason"))
        if key in seen:
            continue
        seen.add(key)
        if d.get("changed", True):
            fresh.append(d)
    return sorted(fresh, key=lambda d: at_seconds(d.get("at")) or 0.0)


def format_decision(d: dict, t0_wall: float) -> str:
    p = d.get("policy") or {}
    state = "ON " if p.get("enabled") else "OFF"
    knobs = policy_knobs(p) if p.get("enabled") else []
    at = at_seconds(d.get("at"))
    when = f"t={at - t0_wall:+6.1f}s" if at is not None else "t=?"
    return f"  [{when}] tenant {d.get('tenant')!s:<8} speculation {state} {' '.join(knobs):<28} <- {d.get('reason', '')}"


def switch_phase(d: dict, t0_wall: float, phase_list: list[Phase]) -> int:
    """The phase a decision belongs to (before the start: the first; in the drain: the last)."""
    at = at_seconds(d.get("at"))
    t = at - t0_wall if at is not None else 0.0
    for p in phase_list:
        if t < p.end_s:
            return p.index
    return phase_list[-1].index


def run_load(target: LoadTarget, cfg: LoadConfig, out: Callable[[str], None] = print) -> LoadSummary:
    summary = asyncio.run(_run(target, cfg, out))
    _print_phases(summary, target, out)
    _print_summary(summary, out)
    if cfg.report_path is not None:
        summary.report_path = _write_report(summary, target, cfg, out)
    return summary


async def _run(target: LoadTarget, cfg: LoadConfig, out: Callable[[str], None]) -> LoadSummary:
    rng = random.Random(cfg.seed)
    summary = LoadSummary(phases=phases(cfg))
    limits = httpx.Limits(max_connections=cfg.max_inflight, max_keepalive_connections=cfg.max_inflight)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=5.0)
    async with httpx.AsyncClient(base_url=target.gateway_url, limits=limits, timeout=timeout, trust_env=False) as client:
        model = summary.model = target.model or await _model_id(client, target)
        out(f"specgate load: {cfg.pattern} pattern, peak {cfg.rps:g} req/s for {cfg.duration_s:g}s over tenants "
            f"{', '.join(t.id for t in target.tenants)}; model {model}")
        out(f"  policy lines read: [time since start] tenant, speculation ON/OFF and knobs <- the controller's "
            f"reason; terms (rho, a, gain_vs_off, k full->0, tenant *, ...): {GLOSSARY}")
        seen: set[tuple] = set()
        # Decisions made before this run are context, not news: mark them seen.
        with_history = await _decisions(client, target)
        new_decisions(with_history, seen)
        summary.initial_policies = await _policies(client, target)
        stop = asyncio.Event()
        inflight: set[asyncio.Task] = set()
        sem = asyncio.Semaphore(cfg.max_inflight)
        start = time.monotonic()
        summary.t0_wall = time.time()
        clock = lambda: time.monotonic() - start  # noqa: E731 - the run's one time base
        watcher = asyncio.create_task(_watch_decisions(client, target, seen, summary, summary.t0_wall, cfg, out, stop))
        reporter = asyncio.create_task(_report(summary, cfg, out, stop))
        phase = None
        while True:
            now = clock()
            if now >= cfg.duration_s:
                break
            if phase_name(now, cfg) != phase:
                phase = phase_name(now, cfg)
                out(f"-- t={now:5.1f}s phase {phase}: {rate_at(now, cfg):g} req/s")
            rate = max(rate_at(now, cfg), 1e-3)
            await asyncio.sleep(min(rng.expovariate(rate), 1.0))
            if clock() >= cfg.duration_s:
                break
            if sem.locked():
                summary.dropped += 1  # open loop: an arrival beyond max_inflight is counted, not queued
                continue
            tenant = pick_tenant(target.tenants, rng)
            body = build_request(tenant, model, rng)
            task = asyncio.create_task(_one(client, tenant, body, sem, summary, clock))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        out(f"-- t={clock():5.1f}s arrivals done; waiting for {len(inflight)} in-flight requests")
        if inflight:
            await asyncio.wait(inflight, timeout=cfg.request_timeout_s)
        summary.end_s = max([clock()] + [r.last_token_s for r in summary.records if r.last_token_s is not None])
        # One last look at the decision history so late switches are not missed.
        await asyncio.sleep(cfg.poll_s)
        stop.set()
        await asyncio.gather(watcher, reporter, return_exceptions=True)
    return summary


async def _one(client: httpx.AsyncClient, tenant: TenantKey, body: dict, sem: asyncio.Semaphore,
               summary: LoadSummary, clock: Callable[[], float]) -> None:
    async with sem:
        summary.sent += 1
        sent = clock()
        st = StreamState()
        status: int | None = None
        replica = None
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {tenant.key}"}) as resp:
                status, replica = resp.status_code, resp.headers.get("x-specgate-replica")
                if status != 200:
                    raw = await resp.aread()
                    if status not in summary.first_error:
                        summary.first_error[status] = _error_message(raw)
                else:
                    async for line in resp.aiter_lines():
                        before = len(st.chunk_counts)
                        parse_stream_line(line, clock(), st)
                        summary.tokens_received += sum(n or 1 for n in st.chunk_counts[before:])
        except httpx.HTTPError as exc:
            summary.errors[type(exc).__name__] += 1
            summary.records.append(record_of(tenant.id, sent, status, st, replica, error=type(exc).__name__))
            return
        if status is not None:
            summary.status[status] += 1
        rec = record_of(tenant.id, sent, status, st, replica)
        summary.records.append(rec)
        if status == 200 and rec.error is not None:
            summary.errors["stream error"] += 1
            summary.first_error.setdefault("stream", rec.error)
        if rec.ok:
            summary.ok += 1
            summary.completion_tokens += rec.completion_tokens


def _error_message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace")


async def _model_id(client: httpx.AsyncClient, target: LoadTarget) -> str:
    resp = await client.get("/v1/models", headers={"Authorization": f"Bearer {target.tenants[0].key}"})
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def _decisions(client: httpx.AsyncClient, target: LoadTarget) -> list[dict]:
    try:
        resp = await client.get("/admin/decisions", params={"limit": 200},
                                headers={"Authorization": f"Bearer {target.admin_key}"})
        if resp.status_code == 200:
            return resp.json().get("data", [])
    except (httpx.HTTPError, ValueError):
        pass
    return []


async def _policies(client: httpx.AsyncClient, target: LoadTarget) -> dict[str, dict]:
    """Each tenant's policy in force now (admin API): where the report's policy lines start."""
    try:
        resp = await client.get("/admin/tenants", headers={"Authorization": f"Bearer {target.admin_key}"})
        if resp.status_code == 200:
            return {t["tenant"]: t.get("policy") or {} for t in resp.json().get("data", []) if "tenant" in t}
    except (httpx.HTTPError, ValueError, TypeError):
        pass
    return {}


async def _watch_decisions(client, target, seen, summary, t0_wall, cfg, out, stop: asyncio.Event) -> None:
    while True:
        for d in new_decisions(await _decisions(client, target), seen):
            summary.switches.append(d)
            out(format_decision(d, t0_wall))
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.poll_s)
        except asyncio.TimeoutError:
            pass


async def _report(summary: LoadSummary, cfg: LoadConfig, out, stop: asyncio.Event) -> None:
    last_sent, last_tokens, last_t = 0, 0, time.monotonic()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.report_s)
            return
        except asyncio.TimeoutError:
            pass
        now = time.monotonic()
        dt = max(now - last_t, 1e-9)
        rate = (summary.sent - last_sent) / dt
        tok_s = (summary.tokens_received - last_tokens) / dt
        last_sent, last_tokens, last_t = summary.sent, summary.tokens_received, now
        non_ok = sum(v for k, v in summary.status.items() if k != 200) + sum(summary.errors.values())
        out(f"   status: {rate:5.1f} req/s sent, {tok_s:7.1f} tok/s received, {summary.ok} ok, {non_ok} not ok, "
            f"{summary.completion_tokens} tokens")


def _switch_lines(s: LoadSummary) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for d in s.switches:
        lines.setdefault(switch_phase(d, s.t0_wall, s.phases), []).append(format_decision(d, s.t0_wall).strip())
    return lines


def _print_phases(s: LoadSummary, target: LoadTarget, out) -> None:
    if not s.phases:
        return
    rows = phase_stats(s.records, s.phases, [t.id for t in target.tenants], s.end_s)
    out("specgate load: per phase and tenant (what the switches gained)")
    for line in format_tables(rows, s.phases, s.end_s, _switch_lines(s)):
        out(line)


def _print_summary(s: LoadSummary, out) -> None:
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(s.status.items())) or "none"
    errors = ", ".join(f"{k}: {v}" for k, v in s.errors.items()) or "none"
    out(f"specgate load: done. sent {s.sent}, ok {s.ok}, statuses {{{statuses}}}, transport errors {{{errors}}}, "
        f"dropped at max_inflight {s.dropped}, completion tokens {s.completion_tokens}")
    for status, message in sorted(s.first_error.items(), key=lambda kv: str(kv[0])):
        out(f"  first {'stream' if status == 'stream' else f'HTTP {status}'} error: {message}")
    offs = sum(1 for d in s.switches if not (d.get("policy") or {}).get("enabled"))
    ons = len(s.switches) - offs
    out(f"controller policy changes during the run: {len(s.switches)} ({offs} to off, {ons} to on/retune)")


def report_data(s: LoadSummary, target: LoadTarget, cfg: LoadConfig) -> Any:
    """Everything the HTML report shows, from the run's observations."""
    from .report import ReportData

    tenants = [t.id for t in target.tenants]
    switch_times = [at - s.t0_wall for at in (at_seconds(d.get("at")) for d in s.switches) if at is not None]
    end = max([s.end_s, cfg.duration_s] + [t + 1.0 for t in switch_times])  # late switches stay on the charts
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(s.t0_wall))
    return ReportData(
        title=f"specgate load: {cfg.pattern} pattern, peak {cfg.rps:g} req/s, {cfg.duration_s:g} s",
        run_lines=[
            f"started {started} against {target.gateway_url}; model {s.model or target.model or '?'}",
            f"tenants {', '.join(tenants)}; sent {s.sent}, ok {s.ok}; {s.dropped} arrivals dropped at max_inflight "
            f"({cfg.max_inflight} in progress); {s.completion_tokens} completion tokens; seed {cfg.seed}",
            "every figure is what this run observed: streamed responses, their usage and "
            "metrics.speculative_decoding, and the admin API's policies and decision history",
        ],
        tenants=tenants, phases=s.phases, end_s=end,
        rows=phase_stats(s.records, s.phases, tenants, s.end_s),
        series=time_series(s.records, tenants, end, bin_width(end)),
        policies=policy_timeline(s.initial_policies, s.switches, s.t0_wall),
        switch_lines=_switch_lines(s), full_cap=target.max_block,
    )


def _write_report(s: LoadSummary, target: LoadTarget, cfg: LoadConfig, out) -> Path | None:
    try:
        from .report import write_report

        path = write_report(cfg.report_path, report_data(s, target, cfg))
    except (ImportError, OSError) as exc:
        out(f"specgate load: no HTML report ({type(exc).__name__}: {exc})")
        return None
    out(f"specgate load: report written to {path} (open file://{path} in a browser)")
    return path
