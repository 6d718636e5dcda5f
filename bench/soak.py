"""Soak: two real gateways on one real Redis, simulated replicas, a bounded mixed
load, and a fault schedule; every request classified, one table per fault window.

What runs (all loopback, all subprocesses this bench starts and stops itself):

* its own `redis-server` on a free private port, persistence off (`--save ""
  --appendonly no`); never the Redis on 6379, because the schedule stops it;
* `--replicas` (default 4) simulated replicas (`specgate sim-replica`, profile
  dspark-b8, real GPU speed), each a process of its own, so it can be
  SIGKILLed, SIGSTOPped and restarted on the same port;
* two `specgate gateway` instances (gw-a, gw-b) with one YAML config each
  (written next to their logs): the same replicas, the same tenants
  (`free` unlimited; `rpm` and `small` with requests_per_minute, `tok` with
  tokens_per_minute, each offered more than its limit so budgets bite), the
  shared Redis. Gateway settings are the defaults (what should be measured)
  unless `--gw-set key=value` overrides one.

The load: open-loop Poisson arrivals at `--rps`, spread over the gateways a
"load balancer" keeps in rotation (it polls each gateway's /ready every 100 ms
and sends only to those answering 200 -- to all when none does); half streams
(`stream_options.include_usage`), chat and completions, 8-64 tokens
(`ignore_eos`), four tenants. Each request is bounded by `--hang-s` (60 s):
past it, it counts as hung. A /health probe per gateway every 100 ms (a fresh
connection each time) measures what a normal client sees.

The fault schedule (`--duration` 360 s; `--quick`: 240 s, 40 s slots, shorter
faults): a replica SIGKILLed at the start of every slot and restarted after
`--restart-delay`; in the following slots, one replica SIGSTOPped (20 s, then
SIGCONT), Redis SIGKILLed for 30 s and restarted empty on the same port, a
hostile-client burst (30 s: `--hostile-conns` connections trickling a header
at 1 byte/s, reconnecting when closed, plus `--big-headers` requests with a
48 MiB header), and gw-b SIGTERMed (two long streams started on it just
before, to see the drain deadline) and restarted once it has exited.

Every request is classified (bench/soak_report.py): ok, failed with a status
(per status and error code), stream ended with an SSE error event, cut
silently (ended without [DONE] and without an error event), connection error,
hung; which replica served it (`x-specgate-replica`). Every response's text is
checked against the sim replicas' deterministic output
(`drafters.sim.server.synthetic_text(0, max_tokens)`; the requests are
`ignore_eos`): byte-identical when complete -- a stream the gateway continued
on another replica after a kill included (issue 14) -- a prefix when it ended
early. The gateways' /metrics are scraped at the start, every
`METRICS_INTERVAL_S` and at the end, for the run's deltas of
`specgate_continuations_total{outcome}`, the re-prefilled tokens, the splice
latency histogram and `specgate_upstream_attempts_total` (missing series count
as 0; the report says when the continuation metrics are absent). The report
prints a summary row and a detail block per window (the fault's span plus
`--margin`), a stream-continuation block, then one PASS/FAIL line per "Done
when" criterion of issue 13 and two for issue 14 (token-exact text; >= 99% of
broken streams continued, none silently cut).

    .venv/bin/python bench/soak.py --rps 200                     # the issue's run (~7 min)
    .venv/bin/python bench/soak.py --quick --rps 30              # compressed schedule, 240 s
    .venv/bin/python bench/soak.py --quick --faults kill,redis   # a subset of the faults
    .venv/bin/python bench/soak.py --report-only .cache/specgate/soak/<run>/result.json

Logs, the gateway YAMLs and result.json go to .cache/specgate/soak/<time>/
(printed first); `--json PATH` writes the raw results there too. Ctrl-C or
SIGTERM stops every process it started (process groups; they also die with
the bench through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak_report
from drafters.sim.server import synthetic_text  # the sim replicas' deterministic output (token-exactness check)
from testbed.procs import free_port, signal_group, spawn

try:
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

MODEL = "soak-sim"
PROFILE = "dspark-b8"
FAULT_KINDS = ("kill", "stop", "redis", "hostile", "gateway")
METRICS_INTERVAL_S = 2.0  # gateways' /metrics scrape for the run's continuation / attempt deltas
WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "heat", "pump", "merge", "interval", "cache", "query", "ticket",
         "summary", "autumn", "printing", "press", "customer", "revenue", "month", "python", "function", "tests")


# ---------------------------------------------------------------------------
# plan


@dataclass
class Plan:
    rps: float
    duration_s: float
    quick: bool
    replicas: int
    hang_s: float
    stream_frac: float
    seed: int
    slot_s: float
    offset_s: float
    warmup_s: float
    margin_s: float
    restart_delay_s: float
    stop_s: float
    redis_s: float
    hostile_s: float
    hostile_conns: int
    big_headers: int
    big_header_mb: int
    drain_probes: int
    max_inflight: int
    faults: tuple[str, ...]
    gw_set: dict = field(default_factory=dict)
    schedule: list[dict] = field(default_factory=list)
    tenants: list[dict] = field(default_factory=list)

    @property
    def replica_names(self) -> list[str]:
        return [f"r{i}" for i in range(self.replicas)]


def make_schedule(plan: Plan) -> list[dict]:
    """Kills at the start of every slot (rotating over all replicas but the one
    that is stopped); the other faults, one per slot, `offset_s` into slots 1..4
    (stop, redis, hostile, gateway: the gateway last, because its drain can run
    long). Faults that do not fit in `duration_s` are left out (and printed)."""
    names = plan.replica_names
    stop_target = names[-1]
    kill_targets = names[:-1] if "stop" in plan.faults and len(names) > 2 else names
    slots = []
    t = plan.slot_s
    while t + plan.slot_s <= plan.duration_s + 1e-9:
        slots.append(t)
        t += plan.slot_s
    events: list[dict] = []
    if "kill" in plan.faults:
        for i, start in enumerate(slots):
            events.append({"kind": "kill", "at": start, "target": kill_targets[i % len(kill_targets)]})
    others = [k for k in ("stop", "redis", "hostile", "gateway") if k in plan.faults]
    durations = {"stop": plan.stop_s, "redis": plan.redis_s, "hostile": plan.hostile_s, "gateway": None}
    offset = plan.offset_s if "kill" in plan.faults else 0.0
    for i, kind in enumerate(others):
        if i >= len(slots):
            print(f"[soak] no slot left for the {kind} fault (duration {plan.duration_s:g} s): skipped", file=sys.stderr)
            continue
        ev = {"kind": kind, "at": slots[i] + offset}
        if durations[kind] is not None:
            ev["for"] = durations[kind]
        if kind == "stop":
            ev["target"] = stop_target
        if kind == "gateway":
            ev["target"] = "gw-b"
        events.append(ev)
    return sorted(events, key=lambda e: e["at"])


def api_key(tenant: str) -> str:
    return f"sk-soak-{tenant}-{os.getpid()}"


def build_body(rng: random.Random, stream: bool, chat: bool, max_tokens: int) -> bytes:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
    if chat:
        body: dict = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    else:
        body = {"model": MODEL, "prompt": prompt}
    body["max_tokens"] = max_tokens
    body["ignore_eos"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def make_tenants(rps: float) -> list[dict]:
    """Weights of the offered load and limits below what each budgeted tenant is
    offered (so the budget is exercised): `rpm` at 60% of its offered rate
    (>= 200/min: the gateway's budget leases apply), `small` at most 120/min
    (decided per request), `tok` at 60% of its offered tokens (the gateway's
    own estimate: prompt chars/4 + 1 + max_tokens)."""
    per_min = rps * 60
    est_tokens = 1 + 24 * 5.9 / 4 + 36  # mean prompt chars/4 + 1 + mean max_tokens (8..64)
    return [
        {"id": "free", "weight": 0.40},
        {"id": "rpm", "weight": 0.25, "requests_per_minute": max(30, round(0.6 * 0.25 * per_min))},
        {"id": "small", "weight": 0.15, "requests_per_minute": max(10, min(120, round(0.5 * 0.15 * per_min)))},
        {"id": "tok", "weight": 0.20, "tokens_per_minute": max(1000, round(0.6 * 0.20 * per_min * est_tokens))},
    ]


# ---------------------------------------------------------------------------
# processes


class Proc:
    """One child in its own process group; start() again restarts it with the same argv."""

    everyone: ClassVar[list[Proc]] = []

    def __init__(self, name: str, argv: list[str], log_path: Path, port: int):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.stopped = False  # SIGSTOPped
        Proc.everyone.append(self)

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(self.argv)}   # {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = spawn(self.argv, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.stopped = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is None:
            return
        signal_group(self.proc, sig, only_if_exists=True)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    async def wait_exit(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.proc is not None and self.proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)
        return self.proc.returncode if self.proc else None

    def stop_sync(self, grace_s: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.stopped:
            self.signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)  # the group: nothing of it survives
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_everything() -> None:
    for p in reversed(Proc.everyone):
        with contextlib.suppress(Exception):
            p.stop_sync(grace_s=3.0)


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


async def wait_until(check, timeout_s: float, interval_s: float = 0.1) -> float | None:
    """Poll the async `check` until true; the monotonic time it became true, or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return time.monotonic()
        await asyncio.sleep(interval_s)
    return None


async def http_ok(session: aiohttp.ClientSession, url: str, timeout_s: float = 1.0) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


# ---------------------------------------------------------------------------
# the bench


METRIC_PREFIXES = ("specgate_continuation", "specgate_upstream_attempts")  # the gateway series the report sums


def metric_samples(text: str) -> tuple[dict, set]:
    """The samples of the METRIC_PREFIXES families in a /metrics exposition, parsed by
    prometheus_client's parser (only those lines are handed to it): {(sample name, labels as a sorted
    tuple): value} (no `_created`), and the names of the families present."""
    from prometheus_client.parser import text_string_to_metric_families

    def wanted(line: str) -> bool:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            return len(parts) > 2 and parts[2].startswith(METRIC_PREFIXES)
        return line.startswith(METRIC_PREFIXES)

    kept = [line for line in text.splitlines() if wanted(line)]
    samples, families = {}, set()
    for fam in text_string_to_metric_families("\n".join(kept) + "\n"):
        if not fam.name.endswith("_created"):
            families.add(fam.name)
        for smp in fam.samples:
            if not smp.name.endswith("_created"):
                samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return samples, families


class MetricDeltas:
    """Counter (and histogram bucket) series summed over both gateways from the run's start to its
    end. Each gateway is scraped every few seconds: within one process a series adds what it grew by
    since the last scrape (a drop counts as a reset: its new value counts in full), and a new process
    (a restarted gateway) counts in full, so a restart loses only what the old process counted after
    its last scrape."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.last: dict[str, tuple[int | None, dict]] = {}
        self.total: dict = defaultdict(float)
        self.families: set = set()
        self.scrapes: Counter = Counter()
        self.failures: Counter = Counter()

    def observe(self, gw: str, pid: int | None, samples: dict, families: set, baseline: bool = False) -> None:
        self.scrapes[gw] += 1
        self.families |= families
        last_pid, prev = self.last.get(gw, (None, {}))
        if last_pid != pid:
            prev = {}
        if not baseline:
            for key, value in samples.items():
                before = prev.get(key, 0.0)
                self.total[key] += value - before if value >= before else value
        self.last[gw] = (pid, {**prev, **samples})

    def to_json(self) -> dict:
        return {"interval_s": self.interval_s, "families": sorted(self.families), "scrapes": dict(self.scrapes),
                "failures": dict(self.failures),
                "series": [[name, dict(labels), value] for (name, labels), value in sorted(self.total.items())]}


class Req:
    __slots__ = soak_report.REQ_FIELDS

    def __init__(self, **kw):
        for f in soak_report.REQ_FIELDS:
            setattr(self, f, kw.get(f))

    def row(self) -> list:
        return [getattr(self, f) for f in soak_report.REQ_FIELDS]


class Soak:
    def __init__(self, plan: Plan, run_dir: Path):
        self.plan = plan
        self.run_dir = run_dir
        self.rng = random.Random(plan.seed)
        self.t0 = 0.0
        self.wall0 = 0.0
        self.redis_port = free_port()
        self.prefix = f"soak-{os.getpid()}:"
        py = sys.executable
        self.redis = Proc("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--protected-mode", "no"], run_dir / "redis.log", self.redis_port)
        self.replicas: dict[str, Proc] = {}
        for name in plan.replica_names:
            port = free_port()
            argv = [py, "-m", "specgate.cli", "sim-replica", "--profile", PROFILE, "--host", "127.0.0.1", "--port",
                    str(port), "--name", name, "--served-model-name", MODEL, "--seed", str(plan.seed + len(self.replicas))]
            self.replicas[name] = Proc(name, argv, run_dir / f"{name}.log", port)
        self.config = self._gateway_config()
        self.gateways: dict[str, Proc] = {}
        for name in ("gw-a", "gw-b"):
            path = run_dir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(self.config, sort_keys=False))
            port = free_port()
            argv = [py, "-m", "specgate.cli", "gateway", "--config", str(path), "--port", str(port)]
            self.gateways[name] = Proc(name, argv, run_dir / f"{name}.log", port)
        self.settings = self._effective_settings(run_dir / "gw-a.yaml")
        self.in_rotation = {name: False for name in self.gateways}
        self.records: list[Req] = []
        self.events: list[dict] = []  # what the schedule did, with measured times
        self.rotation_log: list[list] = []  # [t, gw, in_rotation, status]
        self.probes: list[list] = []  # [t, gw, latency_s or None, status or error]
        self.samples: list[list] = []  # [t, gw, rss_mb, fds, cpu_s, new_log_lines, tracebacks]
        self.lag: list[list] = []  # [t, event-loop lag s]
        self.hostile: dict = {}
        self.gw_metrics = MetricDeltas(METRICS_INTERVAL_S)
        self.client_cap_skips = 0
        self.inflight: set[asyncio.Task] = set()
        self.running = True
        self.session: aiohttp.ClientSession | None = None

    # -- config ---------------------------------------------------------------

    def _gateway_config(self) -> dict:
        tenants = []
        for t in self.plan.tenants:
            entry = {"id": t["id"], "api_key_sha256": hashlib.sha256(api_key(t["id"]).encode()).hexdigest()}
            for k in ("requests_per_minute", "tokens_per_minute"):
                if t.get(k):
                    entry[k] = t[k]
            tenants.append(entry)
        return {
            "replicas": [{"url": f"http://127.0.0.1:{p.port}", "name": n, "model": MODEL, "profile": PROFILE}
                         for n, p in self.replicas.items()],
            "tenants": tenants,
            "redis_url": f"redis://127.0.0.1:{self.redis_port}/0",
            "redis_prefix": self.prefix,
            "log_level": "WARNING",
            "gateway": dict(self.plan.gw_set),
        }

    def _effective_settings(self, path: Path) -> dict:
        """The gateway settings the instances run with (contract defaults + --gw-set)."""
        try:
            from contract.settings import load_settings

            saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SPECGATE_")}
            try:
                return load_settings(path).gateway.model_dump(mode="json")
            finally:
                os.environ.update(saved)
        except Exception as exc:  # noqa: BLE001 (the bench must still run against a gateway whose settings moved)
            print(f"[soak] could not read the gateway settings ({exc}); using the bench's assumptions", file=sys.stderr)
            return {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, **kw) -> dict:
        self.events.append(kw)
        return kw

    # -- start-up -------------------------------------------------------------

    async def start_stack(self, session: aiohttp.ClientSession) -> None:
        self.redis.start()
        if await wait_until(self._redis_up, 20) is None:
            raise RuntimeError(f"redis-server did not start:\n{self.redis.log_tail()}")
        for p in self.replicas.values():
            p.start()
        for name, p in self.replicas.items():
            if await wait_until(lambda p=p: http_ok(session, f"http://127.0.0.1:{p.port}/health"), 60) is None:
                raise RuntimeError(f"replica {name} did not start:\n{p.log_tail()}")
        for p in self.gateways.values():
            p.start()
        for name, p in self.gateways.items():
            if await wait_until(lambda p=p: self._gateway_ready(session, p, all_replicas=True), 90, 0.25) is None:
                raise RuntimeError(f"gateway {name} not ready with every replica healthy:\n{p.log_tail()}")
            self.in_rotation[name] = True

    async def _redis_up(self) -> bool:
        return await asyncio.to_thread(redis_ping, self.redis_port)

    async def _gateway_ready(self, session, p: Proc, all_replicas: bool = False) -> bool:
        if not p.alive():
            raise RuntimeError(f"gateway {p.name} exited with {p.proc.returncode}:\n{p.log_tail()}")
        if not await http_ok(session, f"http://127.0.0.1:{p.port}/ready"):
            return False
        if not all_replicas:
            return True
        try:
            async with session.get(f"http://127.0.0.1:{p.port}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                body = await r.json(content_type=None)
            return set(self.plan.replica_names) <= set(body.get("healthy_replicas", []))
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return False

    # -- load -----------------------------------------------------------------

    def pick_gateway(self) -> str:
        live = [g for g, ok in self.in_rotation.items() if ok]
        return self.rng.choice(live or list(self.gateways))

    async def arrivals(self, session: aiohttp.ClientSession) -> None:
        plan = self.plan
        tenants = [t["id"] for t in plan.tenants]
        weights = [t["weight"] for t in plan.tenants]
        next_t = self.now()
        while True:
            next_t += self.rng.expovariate(plan.rps)
            if next_t >= plan.duration_s:
                break
            delay = next_t - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(self.inflight) >= plan.max_inflight:
                self.client_cap_skips += 1
                continue
            tenant = self.rng.choices(tenants, weights)[0]
            stream = self.rng.random() < plan.stream_frac
            chat = self.rng.random() < 0.75
            max_tokens = self.rng.randint(8, 64)
            self.launch(session, self.pick_gateway(), tenant, stream, chat, max_tokens, "load")

    def launch(self, session, gw: str, tenant: str, stream: bool, chat: bool, max_tokens: int, kind: str) -> Req:
        rec = Req(id=len(self.records), kind=kind, gw=gw, tenant=tenant, stream=stream,
                  endpoint="chat" if chat else "completions", max_tokens=max_tokens, t_send=self.now())
        self.records.append(rec)
        body = build_body(self.rng, stream, chat, max_tokens)
        task = asyncio.create_task(self.request(session, rec, body))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return rec

    async def request(self, session: aiohttp.ClientSession, rec: Req, body: bytes) -> None:
        try:
            await asyncio.wait_for(self._request(session, rec, body), self.plan.hang_s)
        except TimeoutError:
            rec.outcome = "hung"
        except asyncio.CancelledError:
            if rec.outcome is None:
                rec.outcome = "hung"  # still open when the bench ended it
            rec.t_end = self.now()
            raise
        except Exception as exc:  # noqa: BLE001 (a bench bug must not lose the request)
            rec.outcome = rec.outcome or "conn_error"
            rec.err = f"bench:{type(exc).__name__}: {exc}"[:200]
        if rec.t_end is None:
            rec.t_end = self.now()

    async def _request(self, session: aiohttp.ClientSession, rec: Req, body: bytes) -> None:
        gw = self.gateways[rec.gw]
        chat = rec.endpoint == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        headers = {"Authorization": f"Bearer {api_key(rec.tenant)}", "Content-Type": "application/json"}
        last = rec.t_send
        gap = 0.0
        pieces: list[str] = []  # the text the client received, checked against the sim's synthetic text
        try:
            async with session.post(f"http://127.0.0.1:{gw.port}{path}", data=body, headers=headers) as resp:
                now = self.now()
                rec.t_hdr = now
                gap = now - last
                last = now
                rec.status = resp.status
                rec.replica = resp.headers.get("x-specgate-replica")
                rec.retry_after = resp.headers.get("retry-after")
                if resp.status != 200:
                    raw = await resp.read()
                    rec.code = error_code(raw)
                    rec.outcome = "status"
                elif rec.stream:
                    rec.chunks = 0
                    async for line in resp.content:
                        now = self.now()
                        gap = max(gap, now - last)
                        last = now
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            rec.done = True
                            continue
                        rec.chunks += 1
                        if rec.t_first is None:
                            rec.t_first = now
                        obj = parse_json(payload)
                        code = sse_error(obj)
                        if code is not None:
                            rec.error_event = True
                            rec.code = code
                            rec.t_error = now
                        elif isinstance(obj, dict):
                            read_chunk(obj, chat, pieces, rec)
                    rec.outcome = "error_event" if rec.error_event else ("ok" if rec.done else "cut")
                else:
                    raw = await resp.read()
                    data = parse_json(raw)
                    if isinstance(data, dict):
                        read_body(data, chat, pieces, rec)
                        rec.outcome = "ok" if data.get("choices") is not None else "cut"
                    else:
                        rec.outcome = "cut"
                        rec.err = "truncated JSON body"
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            now = self.now()
            gap = max(gap, now - last)
            rec.err = f"{type(exc).__name__}: {exc}"[:200]
            if rec.t_hdr is None:
                rec.outcome = "conn_error"
            elif rec.error_event:
                rec.outcome = "error_event"
            else:
                rec.outcome = "cut"
        finally:
            end = self.now()
            rec.t_end = end
            rec.max_gap = max(gap, end - last)
            if rec.status == 200:  # a request still open here (hung, cancelled) is checked as a partial text
                rec.text_check, rec.text_diff = text_check("".join(pieces), rec.max_tokens, rec.outcome == "ok")

    # -- watchers -------------------------------------------------------------

    async def rotation(self, session: aiohttp.ClientSession) -> None:
        """The load balancer: /ready every 100 ms per gateway; 200 = in rotation."""

        async def one(name: str, p: Proc):
            while self.running:
                status: int | str
                try:
                    async with session.get(f"http://127.0.0.1:{p.port}/ready",
                                           timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                        await r.read()
                        status = r.status
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    status = type(exc).__name__
                ok = status == 200
                if ok != self.in_rotation[name]:
                    self.in_rotation[name] = ok
                    self.rotation_log.append([self.now(), name, ok, status])
                await asyncio.sleep(0.1)

        await asyncio.gather(*(one(n, p) for n, p in self.gateways.items()))

    async def health_probe(self) -> None:
        """A normal client: GET /health on a fresh connection every 100 ms per gateway."""
        conn = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def one(name: str, p: Proc):
                while self.running:
                    start = time.monotonic()
                    t = self.now()
                    try:
                        async with session.get(f"http://127.0.0.1:{p.port}/health",
                                               timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                            await r.read()
                            self.probes.append([t, name, time.monotonic() - start, r.status])
                    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                        self.probes.append([t, name, None, type(exc).__name__])
                    await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - start)))

            await asyncio.gather(*(one(n, p) for n, p in self.gateways.items()))

    async def lag_monitor(self) -> None:
        while self.running:
            start = time.monotonic()
            await asyncio.sleep(0.1)
            self.lag.append([self.now(), time.monotonic() - start - 0.1])

    async def sampler(self) -> None:
        """Each gateway's RSS, open fds, CPU seconds and new log lines, every second."""
        offsets = {n: 0 for n in self.gateways}
        tick = os.sysconf("SC_CLK_TCK")
        while self.running:
            t = self.now()
            for name, p in self.gateways.items():
                rss = fds = cpu = None
                if p.alive():
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                            if line.startswith("VmRSS:"):
                                rss = int(line.split()[1]) / 1024
                        fds = len(os.listdir(f"/proc/{p.pid}/fd"))
                        stat = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
                        cpu = (int(stat[11]) + int(stat[12])) / tick
                lines = tracebacks = 0
                with contextlib.suppress(OSError), open(p.log_path, "rb") as fh:  # noqa: ASYNC230 (small reads)
                        fh.seek(offsets[name])
                        chunk = fh.read()
                        offsets[name] += len(chunk)
                        lines = chunk.count(b"\n")
                        tracebacks = chunk.count(b"Traceback")
                self.samples.append([t, name, rss, fds, cpu, lines, tracebacks])
            own = os.times()
            self.samples.append([t, "bench", None, None, own.user + own.system, 0, 0])
            await asyncio.sleep(1.0)

    # -- faults ---------------------------------------------------------------

    async def run_schedule(self, session: aiohttp.ClientSession) -> None:
        tasks = [asyncio.create_task(self._at(ev, session)) for ev in self.plan.schedule]
        await asyncio.gather(*tasks)

    async def _at(self, ev: dict, session) -> None:
        delay = ev["at"] - self.now() - (1.0 if ev["kind"] == "gateway" else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        handler = getattr(self, f"fault_{ev['kind']}")
        try:
            await handler(ev, session)
        except Exception as exc:  # noqa: BLE001 (a failed fault is reported, the run goes on)
            self.event(kind=ev["kind"], at=self.now(), error=f"{type(exc).__name__}: {exc}")
            print(f"[soak] fault {ev['kind']} failed: {exc}", file=sys.stderr)

    async def metrics_text(self, session, p: Proc) -> str | None:
        """A gateway's /metrics exposition (None: not readable). With `metrics_port` it is read there,
        with `metrics_token` with that bearer token."""
        port = self.settings.get("metrics_port") or p.port
        token = self.settings.get("metrics_token")
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=2)) as r:
                text = await r.text()
                return text if r.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def scrape_metrics(self, session, baseline: bool = False) -> None:
        """One scrape of every running gateway into the run's metric deltas (`baseline`: the start)."""
        for name, p in self.gateways.items():
            if not p.alive() or p.stopped:
                continue
            pid = p.pid
            text = await self.metrics_text(session, p)
            if text is None:
                self.gw_metrics.failures[name] += 1
                continue
            samples, families = await asyncio.to_thread(metric_samples, text)
            self.gw_metrics.observe(name, pid, samples, families, baseline)

    async def metrics_poller(self, session) -> None:
        while self.running:
            await asyncio.sleep(METRICS_INTERVAL_S)
            await self.scrape_metrics(session)

    async def attempts(self, session) -> dict:
        """Each gateway's `specgate_upstream_attempts_total` by "replica|outcome" (None: not readable)."""
        out: dict = {}
        for name, p in self.gateways.items():
            text = await self.metrics_text(session, p)
            if text is None:
                out[name] = None
                continue
            counts = {}
            for line in text.splitlines():
                if line.startswith("specgate_upstream_attempts_total{"):
                    labels, _, value = line.rpartition(" ")
                    lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                    counts[f"{lab.get('replica')}|{lab.get('outcome')}"] = float(value)
            out[name] = counts
        return out

    async def _replica_healthy(self, session, p: Proc) -> bool:
        return await http_ok(session, f"http://127.0.0.1:{p.port}/health", 0.5)

    async def fault_kill(self, ev: dict, session) -> None:
        p = self.replicas[ev["target"]]
        before = await self.attempts(session)
        rec = self.event(kind="kill", target=p.name, at=self.now(), attempts_before=before)
        p.signal(signal.SIGKILL)
        await p.wait_exit(10)
        await asyncio.sleep(self.plan.restart_delay_s)
        p.start()
        rec["restart_at"] = self.now()
        up = await wait_until(lambda: self._replica_healthy(session, p), 60)
        rec["healthy_at"] = (up - self.t0) if up else None
        await asyncio.sleep(self.plan.margin_s)
        rec["attempts_after"] = await self.attempts(session)

    async def fault_stop(self, ev: dict, session) -> None:
        p = self.replicas[ev["target"]]
        before = await self.attempts(session)
        rec = self.event(kind="stop", target=p.name, at=self.now(), duration_s=ev["for"], attempts_before=before)
        p.signal(signal.SIGSTOP)
        await asyncio.sleep(ev["for"])
        p.signal(signal.SIGCONT)
        rec["cont_at"] = self.now()
        await asyncio.sleep(self.plan.margin_s)
        rec["attempts_after"] = await self.attempts(session)

    async def fault_redis(self, ev: dict, session) -> None:
        rec = self.event(kind="redis", at=self.now(), duration_s=ev["for"], ready_log=[])
        self.redis.signal(signal.SIGKILL)
        await self.redis.wait_exit(10)
        await asyncio.sleep(ev["for"])
        self.redis.start()
        rec["restart_at"] = self.now()
        up = await wait_until(self._redis_up, 20, 0.05)
        rec["up_at"] = (up - self.t0) if up else None

    async def fault_gateway(self, ev: dict, session) -> None:
        name = ev["target"]
        p = self.gateways[name]
        rec = self.event(kind="gateway", target=name, probes=[])
        for _ in range(self.plan.drain_probes):  # long streams in flight at SIGTERM (ended by the drain deadline?)
            probe = self.launch(self.session, name, "free", True, True, 30000, "drain_probe")
            rec["probes"].append(probe.id)
        await asyncio.sleep(max(0.0, ev["at"] - self.now()))
        rec["at"] = self.now()
        p.signal(signal.SIGTERM)
        pre = float(self.settings.get("drain_pre_s", 5.0))
        deadline = float(self.settings.get("drain_deadline_s", 20.0))
        code = await p.wait_exit(pre + deadline + 15)
        rec["exit_at"] = self.now()
        if code is None:
            rec["exit_code"] = "SIGKILLed by the bench (still alive)"
            p.signal(signal.SIGKILL)
            await p.wait_exit(10)
        else:
            rec["exit_code"] = code
        p.start()
        rec["restart_at"] = self.now()
        up = await wait_until(lambda: self._gateway_ready(session, p), 90, 0.1)
        rec["ready_at"] = (up - self.t0) if up else None

    async def fault_hostile(self, ev: dict, session) -> None:
        plan = self.plan
        rec = self.event(kind="hostile", at=self.now(), duration_s=ev["for"], conns=plan.hostile_conns)
        end = time.monotonic() + ev["for"]
        stats = {"opened": 0, "refused": 0, "closed_by_server": 0, "responses": {}, "lifetimes": [],
                 "open_at_end": 0, "open_at_end_ages": [], "max_concurrent": 0}
        live = [0]
        ports = [p.port for p in self.gateways.values()]

        async def trickler(i: int):
            port = ports[i % len(ports)]
            await asyncio.sleep(i * 2.0 / max(1, plan.hostile_conns))  # ramp over ~2 s
            while time.monotonic() < end:
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                except (TimeoutError, OSError):
                    stats["refused"] += 1
                    await asyncio.sleep(1.0)
                    continue
                stats["opened"] += 1
                live[0] += 1
                stats["max_concurrent"] = max(stats["max_concurrent"], live[0])
                opened = time.monotonic()
                closed = False
                try:
                    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: ")
                    while time.monotonic() < end:
                        try:
                            data = await asyncio.wait_for(reader.read(4096), 1.0)
                        except TimeoutError:
                            writer.write(b"a")
                            continue
                        if data:
                            head = data.split(b"\r\n", 1)[0].decode(errors="replace")
                            parts = head.split()
                            key = parts[1] if len(parts) > 1 and parts[0].startswith("HTTP/") else head[:30]
                            stats["responses"][key] = stats["responses"].get(key, 0) + 1
                        closed = True
                        break
                except (OSError, ConnectionError):
                    closed = True
                finally:
                    age = time.monotonic() - opened
                    live[0] -= 1
                    if closed:
                        stats["closed_by_server"] += 1
                        stats["lifetimes"].append(round(age, 2))
                    else:
                        stats["open_at_end"] += 1
                        stats["open_at_end_ages"].append(round(age, 2))
                    writer.close()
                if not closed:
                    break

        async def big(i: int):
            await asyncio.sleep(3.0 + i * 0.05)
            port = ports[i % len(ports)]
            size = plan.big_header_mb << 20
            chunk = b"a" * (1 << 20)
            out = {"gateway": list(self.gateways)[i % len(ports)], "size_mb": plan.big_header_mb}
            started = time.monotonic()
            sent = [0]
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            except (TimeoutError, OSError) as exc:
                out["result"] = f"connect failed: {type(exc).__name__}"
                stats.setdefault("big", []).append(out)
                return

            async def pump():
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
                while sent[0] < size:
                    writer.write(chunk)
                    sent[0] += len(chunk)
                    await writer.drain()
                writer.write(b"\r\n\r\n")
                await writer.drain()

            pumping = asyncio.create_task(pump())
            try:
                line = await asyncio.wait_for(reader.readline(), 30)
                out["result"] = line.decode(errors="replace").strip() or "closed without a response"
            except TimeoutError:
                out["result"] = "no response in 30 s"
            except (OSError, ConnectionError) as exc:
                out["result"] = f"{type(exc).__name__}"
            out["seconds"] = round(time.monotonic() - started, 4)
            out["bytes_sent_before"] = sent[0]
            pumping.cancel()
            with contextlib.suppress(BaseException):
                await pumping
            writer.close()
            stats.setdefault("big", []).append(out)

        tasks = [asyncio.create_task(trickler(i)) for i in range(plan.hostile_conns)]
        tasks += [asyncio.create_task(big(i)) for i in range(plan.big_headers)]
        await asyncio.gather(*tasks, return_exceptions=True)
        rec["end_at"] = self.now()
        rec["stats"] = stats

    # -- the run --------------------------------------------------------------

    async def run(self) -> dict:
        conn = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0)) as side:
            print("[soak] starting redis, replicas and gateways ...", file=sys.stderr)
            self.session = session
            await self.start_stack(side)
            await self.scrape_metrics(side, baseline=True)
            self.t0 = time.monotonic()
            self.wall0 = time.time()
            print(f"[soak] load for {self.plan.duration_s:g} s at {self.plan.rps:g} req/s", file=sys.stderr)
            watchers = [asyncio.create_task(c) for c in (self.rotation(side), self.health_probe(), self.lag_monitor(),
                                                         self.sampler(), self.progress(), self.metrics_poller(side))]
            schedule = asyncio.create_task(self.run_schedule(side))
            await self.arrivals(session)
            # let the in-flight requests finish (each is bounded by hang_s)
            if self.inflight:
                await asyncio.wait(list(self.inflight), timeout=self.plan.hang_s + 5)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(schedule), 90)
            await self.scrape_metrics(side)  # the end of the run's deltas
            self.running = False
            for t in [*watchers, schedule, *self.inflight]:
                t.cancel()
            await asyncio.gather(*watchers, schedule, *self.inflight, return_exceptions=True)
        return self.result()

    async def progress(self) -> None:
        while self.running:
            await asyncio.sleep(30)
            done = [r for r in self.records if r.outcome]
            ok = sum(1 for r in done if r.outcome == "ok")
            print(f"[soak] t={self.now():5.0f}s sent {len(self.records)} done {len(done)} ok {ok} "
                  f"in flight {len(self.inflight)} rotation {self.in_rotation}", file=sys.stderr)

    def gateway_logs(self) -> list[list]:
        """The gateways' JSON log lines as [t, gw, level, logger, msg] on the bench's clock (no tracebacks)."""
        from datetime import datetime

        out = []
        for name, p in self.gateways.items():
            try:
                lines = p.log_path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                if not line.startswith("{"):
                    continue
                try:
                    d = json.loads(line)
                    t = datetime.fromisoformat(d["ts"]).timestamp() - self.wall0
                except (ValueError, KeyError, TypeError):
                    continue
                out.append([round(t, 3), name, d.get("level"), d.get("logger"), str(d.get("msg"))[:120], "exc" in d])
        return sorted(out)

    def result(self) -> dict:
        return {
            "logs": self.gateway_logs(),
            "version": 1,
            "plan": asdict(self.plan),
            "settings": self.settings,
            "gateway_config": {**self.config, "tenants": [{**t, "api_key_sha256": "..."} for t in self.config["tenants"]]},
            "run_dir": str(self.run_dir),
            "wall0": self.wall0,
            "events": self.events,
            "rotation": self.rotation_log,
            "probes": self.probes,
            "samples": self.samples,
            "lag": self.lag,
            "client_cap_skips": self.client_cap_skips,
            "gateway_metrics": self.gw_metrics.to_json(),
            "fields": list(soak_report.REQ_FIELDS),
            "records": [r.row() for r in self.records],
        }


def error_code(raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error") or {}
        return str(err.get("code") or err.get("type") or "?")
    except (ValueError, AttributeError):
        return "non-json"


def parse_json(raw: bytes):
    try:
        return _loads(raw)
    except ValueError:
        return None


def sse_error(obj) -> str | None:
    """The error code of an SSE error event (`data: {"error": ...}`), else None."""
    if isinstance(obj, dict) and "error" in obj:
        err = obj["error"]
        if isinstance(err, dict):
            return str(err.get("code") or err.get("type") or "error")
        return "error"
    return None


def _usage(obj: dict, rec: Req) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        rec.tokens = usage.get("total_tokens")
        rec.ctoks = usage.get("completion_tokens")


def read_chunk(obj: dict, chat: bool, pieces: list[str], rec: Req) -> None:
    """One stream chunk: its text into `pieces`, its usage, and token ids the client did not ask for."""
    _read(obj, "delta" if chat else None, pieces, rec)


def read_body(data: dict, chat: bool, pieces: list[str], rec: Req) -> None:
    """A whole (non-streaming) response: as `read_chunk`."""
    _read(data, "message" if chat else None, pieces, rec)


def _read(obj: dict, chat_field: str | None, pieces: list[str], rec: Req) -> None:
    for c in obj.get("choices") or ():
        if not isinstance(c, dict):
            continue
        text = (c.get(chat_field) or {}).get("content") if chat_field else c.get("text")
        if isinstance(text, str):
            pieces.append(text)
        if c.get("token_ids") is not None or c.get("prompt_token_ids") is not None:
            rec.ids_leak = True
    if obj.get("prompt_token_ids") is not None:
        rec.ids_leak = True
    _usage(obj, rec)


def text_check(text: str, max_tokens: int, complete: bool) -> tuple[str, str | None]:
    """The text a client received against the sim replicas' deterministic output: every request is
    `ignore_eos`, so a complete response is exactly `synthetic_text(0, max_tokens)` (byte-identical,
    also when the gateway continued it on another replica); a partial one (error event, cut, hung)
    must be a prefix of it. ("exact" | "prefix" | "mismatch", what differs)."""
    want = synthetic_text(0, max_tokens)
    if complete and text == want:
        return "exact", None
    if not complete and want.startswith(text):
        return "prefix", None
    i = next((k for k, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
    return "mismatch", f"at char {i} of {len(text)} (want {len(want)}): got {text[i:i + 30]!r}, want {want[i:i + 30]!r}"


# ---------------------------------------------------------------------------
# entry point


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rps", type=float, default=200.0, help="offered load, req/s over both gateways (default 200)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load (default 360; --quick 240)")
    ap.add_argument("--quick", action="store_true", help="compressed schedule: 40 s slots, 10 s stop, 15 s Redis outage and burst")
    ap.add_argument("--faults", default=",".join(FAULT_KINDS), help=f"subset of {','.join(FAULT_KINDS)}")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--hang-s", type=float, default=60.0, help="a request still open after this counts as hung")
    ap.add_argument("--stream-frac", type=float, default=0.5)
    ap.add_argument("--slot", type=float, default=None, help="seconds between kills (default 60; --quick 40)")
    ap.add_argument("--restart-delay", type=float, default=2.0, help="seconds a killed replica stays down before its restart")
    ap.add_argument("--stop-s", type=float, default=None, help="SIGSTOP length (default 20; --quick 10)")
    ap.add_argument("--redis-s", type=float, default=None, help="Redis outage (default 30; --quick 15)")
    ap.add_argument("--hostile-s", type=float, default=None, help="hostile burst length (default 30; --quick 15)")
    ap.add_argument("--hostile-conns", type=int, default=800, help="trickling connections held open during the burst")
    ap.add_argument("--big-headers", type=int, default=4, help="requests with an oversized header during the burst")
    ap.add_argument("--big-header-mb", type=int, default=48)
    ap.add_argument("--drain-probes", type=int, default=2, help="long streams on the SIGTERMed gateway")
    ap.add_argument("--margin", type=float, default=None, help="seconds added after each fault's end to its window (default 8; --quick 5)")
    ap.add_argument("--max-inflight", type=int, default=5000, help="the load generator's own cap (skips are reported)")
    ap.add_argument("--gw-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a gateway setting for both instances (YAML value), e.g. --gw-set budget_failure_mode=deny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--report-only", metavar="RESULT_JSON", help="print the report of an earlier run's result.json")
    return ap.parse_args(argv)


def make_plan(a: argparse.Namespace) -> Plan:
    q = a.quick
    faults = tuple(f.strip() for f in a.faults.split(",") if f.strip())
    bad = [f for f in faults if f not in FAULT_KINDS]
    if bad:
        raise SystemExit(f"--faults: unknown {bad}; choose from {FAULT_KINDS}")
    gw_set = {}
    for item in a.gw_set:
        key, _, value = item.partition("=")
        if not key or not _:
            raise SystemExit(f"--gw-set {item!r}: expected KEY=VALUE")
        gw_set[key.strip()] = yaml.safe_load(value)
    plan = Plan(
        rps=a.rps, duration_s=a.duration or (240.0 if q else 360.0), quick=q, replicas=a.replicas, hang_s=a.hang_s,
        stream_frac=a.stream_frac, seed=a.seed, slot_s=a.slot or (40.0 if q else 60.0), offset_s=12.0 if q else 18.0,
        warmup_s=8.0 if q else 10.0, margin_s=a.margin if a.margin is not None else (5.0 if q else 8.0),
        restart_delay_s=a.restart_delay, stop_s=a.stop_s or (10.0 if q else 20.0),
        redis_s=a.redis_s or (15.0 if q else 30.0), hostile_s=a.hostile_s or (15.0 if q else 30.0),
        hostile_conns=a.hostile_conns, big_headers=a.big_headers, big_header_mb=a.big_header_mb,
        drain_probes=a.drain_probes, max_inflight=a.max_inflight, faults=faults, gw_set=gw_set,
    )  # fmt: skip
    if plan.replicas < 2:
        raise SystemExit("--replicas must be at least 2")
    plan.tenants = make_tenants(plan.rps)
    plan.schedule = make_schedule(plan)
    return plan


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report_only:
        result = json.loads(Path(a.report_only).read_text())
        print(soak_report.render(result))
        return 0
    plan = make_plan(a)
    run_dir = REPO / ".cache" / "specgate" / "soak" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"[soak] logs and result: {run_dir}", file=sys.stderr)
    print("[soak] schedule: " + "; ".join(f"{e['kind']} {e.get('target', '')} @{e['at']:g}s"
                                          + (f" for {e['for']:g}s" if "for" in e else "") for e in plan.schedule),
          file=sys.stderr)  # fmt: skip
    soak = Soak(plan, run_dir)

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored (background job)
    result = None
    try:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            result = runner.run(soak.run())
    except KeyboardInterrupt:
        print("\n[soak] interrupted: stopping every process", file=sys.stderr)
        return 130
    finally:
        stop_everything()
    text = json.dumps(result)
    (run_dir / "result.json").write_text(text)
    if a.json:
        Path(a.json).write_text(text)
    report = soak_report.render(result)
    (run_dir / "report.txt").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
