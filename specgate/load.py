"""`specgate load`: a mixed-tenant workload for `specgate up`, printing controller switches live.

Why: the point of specgate is visible only under changing load -- speculation pays at low
concurrency and stops paying when the replicas turn compute-bound. The default `step` pattern
runs light -> heavy -> light so that a newcomer sees the controller switch speculation off for
the heavy phase and back on after it, printed as the admin API's decision history records it.

Pure parts (`rate_at`, `pick_tenant`, `build_request`, `format_decision`, `new_decisions`) are
separate from the I/O (`run_load`): an open-loop Poisson arrival process (arrivals do not wait
for completions, as real clients don't), bounded by `max_inflight`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

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


@dataclass
class LoadSummary:
    sent: int = 0
    ok: int = 0
    status: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    switches: list[dict] = field(default_factory=list)
    dropped: int = 0
    first_error: dict = field(default_factory=dict)  # status -> first error message seen


def load_target(state_file: Path, gateway_url: str | None = None) -> LoadTarget:
    data = json.loads(Path(state_file).read_text())
    tenants = tuple(TenantKey(t["id"], t["key"], t.get("workload", "chat")) for t in data["tenants"])
    if not tenants:
        raise ValueError("no tenants in state file")
    return LoadTarget(gateway_url or data["gateway_url"], data["admin_key"], data.get("model") or "", tenants)


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
        # Hint for simulated replicas only (real vLLM ignores unknown extra_args keys).
        "vllm_xargs": {"sim_workload": spec["sim_preset"]},
    }


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
    return sorted(fresh, key=lambda d: d.get("at") or 0.0)


def format_decision(d: dict, t0_wall: float) -> str:
    p = d.get("policy") or {}
    state = "ON " if p.get("enabled") else "OFF"
    knobs = []
    if p.get("enabled"):
        if p.get("max_draft") is not None:
            knobs.append(f"max_draft={p['max_draft']}")
        if p.get("min_confidence") is not None:
            knobs.append(f"min_conf={p['min_confidence']:.2f}")
        if p.get("preferred_profile"):
            knobs.append(f"profile={p['preferred_profile']}")
    at = d.get("at")
    when = f"t={at - t0_wall:+6.1f}s" if isinstance(at, (int, float)) else "t=?"
    return f"  [{when}] tenant {d.get('tenant')!s:<8} speculation {state} {' '.join(knobs):<28} <- {d.get('reason', '')}"


def run_load(target: LoadTarget, cfg: LoadConfig, out: Callable[[str], None] = print) -> LoadSummary:
    return asyncio.run(_run(target, cfg, out))


async def _run(target: LoadTarget, cfg: LoadConfig, out: Callable[[str], None]) -> LoadSummary:
    rng = random.Random(cfg.seed)
    summary = LoadSummary()
    limits = httpx.Limits(max_connections=cfg.max_inflight, max_keepalive_connections=cfg.max_inflight)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=5.0)
    t0_wall = time.time()
    async with httpx.AsyncClient(base_url=target.gateway_url, limits=limits, timeout=timeout, trust_env=False) as client:
        model = target.model or await _model_id(client, target)
        out(f"specgate load: {cfg.pattern} pattern, peak {cfg.rps:g} req/s for {cfg.duration_s:g}s over tenants "
            f"{', '.join(t.id for t in target.tenants)}; model {model}")
        seen: set[tuple] = set()
        # Decisions made before this run are context, not news: mark them seen.
        with_history = await _decisions(client, target)
        new_decisions(with_history, seen)
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_decisions(client, target, seen, summary, t0_wall, cfg, out, stop))
        reporter = asyncio.create_task(_report(summary, cfg, out, stop))
        inflight: set[asyncio.Task] = set()
        sem = asyncio.Semaphore(cfg.max_inflight)
        start = time.monotonic()
        phase = None
        while True:
            now = time.monotonic() - start
            if now >= cfg.duration_s:
                break
            if phase_name(now, cfg) != phase:
                phase = phase_name(now, cfg)
                out(f"-- t={now:5.1f}s phase {phase}: {rate_at(now, cfg):g} req/s")
            rate = max(rate_at(now, cfg), 1e-3)
            await asyncio.sleep(min(rng.expovariate(rate), 1.0))
            if time.monotonic() - start >= cfg.duration_s:
                break
            if sem.locked():
                summary.dropped += 1  # open loop: an arrival beyond max_inflight is counted, not queued
                continue
            tenant = pick_tenant(target.tenants, rng)
            body = build_request(tenant, model, rng)
            task = asyncio.create_task(_one(client, tenant, body, sem, summary))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        out(f"-- t={time.monotonic() - start:5.1f}s arrivals done; waiting for {len(inflight)} in-flight requests")
        if inflight:
            await asyncio.wait(inflight, timeout=cfg.request_timeout_s)
        # One last look at the decision history so late switches are not missed.
        await asyncio.sleep(cfg.poll_s)
        stop.set()
        await asyncio.gather(watcher, reporter, return_exceptions=True)
    _print_summary(summary, out)
    return summary


async def _one(client: httpx.AsyncClient, tenant: TenantKey, body: dict, sem: asyncio.Semaphore, summary: LoadSummary):
    async with sem:
        summary.sent += 1
        try:
            resp = await client.post("/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {tenant.key}"})
        except httpx.HTTPError as exc:
            summary.errors[type(exc).__name__] += 1
            return
        summary.status[resp.status_code] += 1
        if resp.status_code != 200 and resp.status_code not in summary.first_error:
            try:
                summary.first_error[resp.status_code] = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                summary.first_error[resp.status_code] = resp.text[:200]
        if resp.status_code == 200:
            summary.ok += 1
            try:
                summary.completion_tokens += int(resp.json().get("usage", {}).get("completion_tokens", 0))
            except (ValueError, TypeError):
                pass


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
    last_sent, last_t = 0, time.monotonic()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.report_s)
            return
        except asyncio.TimeoutError:
            pass
        now = time.monotonic()
        rate = (summary.sent - last_sent) / max(now - last_t, 1e-9)
        last_sent, last_t = summary.sent, now
        non_ok = sum(v for k, v in summary.status.items() if k != 200) + sum(summary.errors.values())
        out(f"   status: {rate:5.1f} req/s sent, {summary.ok} ok, {non_ok} not ok, {summary.completion_tokens} tokens")


def _print_summary(s: LoadSummary, out) -> None:
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(s.status.items())) or "none"
    errors = ", ".join(f"{k}: {v}" for k, v in s.errors.items()) or "none"
    out(f"specgate load: done. sent {s.sent}, ok {s.ok}, statuses {{{statuses}}}, transport errors {{{errors}}}, "
        f"dropped at max_inflight {s.dropped}, completion tokens {s.completion_tokens}")
    for status, message in sorted(s.first_error.items()):
        out(f"  first HTTP {status} error: {message}")
    offs = sum(1 for d in s.switches if not (d.get("policy") or {}).get("enabled"))
    ons = len(s.switches) - offs
    out(f"controller policy changes during the run: {len(s.switches)} ({offs} to off, {ons} to on/retune)")
