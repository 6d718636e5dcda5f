"""Closed-loop streaming load for bench/real_sweep.py: two tenants through the
gateway, a phase trace, and what happens inside each phase's measurement window.

Why streaming and raw SSE (httpx, not the openai SDK's objects): TPOT needs the
arrival time of the first and last token of every request, and on a 2-core
machine the client shares the CPU with both replicas and the gateway, so it
parses as little as it can (one json.loads per chunk).

Each tenant has `c/2` workers; a worker sends one 64-token completion at a
time (`ignore_eos`, so every completion is exactly max_tokens long), the next
as soon as one ends; a new worker's FIRST request asks for a random length
in 1..max_tokens and is left out of TPOT. Why: requests of equal length that
start together finish together, and on a lockstep engine they stay in phase,
so the batch would swing from 0 to c/2 in waves (the resubmission burst routed
on stale gauges, re-prefilled at once); one random first length spreads the
workers' phases for good while the load still steps at once. Each worker's
prompts and first length come from a generator of its own
(`testbed.request_stream.WorkerStream`, seeded by the run's seed, the tenant
and the worker's number), so two loads with one seed send the same requests
per worker, whatever order they finish in: bench/real_ab.py's two sides serve
the same prompts, worker by worker.
`stream_options.continuous_usage_stats` puts the running
completion-token count on every chunk, so the driver knows how many tokens
each tenant received by any instant: a window's tok/s is the tokens streamed
inside it. Counting only requests that finish inside the window (kept as
`tok_s_finished`) is quantised: closed-loop requests of equal length started
together finish together, in waves ~20 s apart at c=128 on this machine, so a
window catches 2 or 3 of them (+-30% on a 60 s window). When the phase
lowers the concurrency, the surplus workers are cancelled mid-request (the
gateway aborts the upstream request), so the old phase does not leak load
into the new one beyond the settle period.

The final usage chunk carries vLLM's per-request `metrics.speculative_decoding`
(steps, drafted, accepted): each Sample keeps them, so the report gives every
tenant's acceptance per window, beside the same tenant's acceptance with the
replicas to itself (`alone` runs). SSE lines are split on LF only, as the SSE
format and the OpenAI SDK split them: httpx's `aiter_lines` also splits on
U+2028, U+0085 and the like, which vLLM writes raw inside JSON strings, and
cut a few chunks of a long run in two.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from real_sweep_stack import SERVED_MODEL, TENANTS, admin_get, api_key, scrape_replica

from testbed.phases import Phase  # a closed-loop phase: `concurrency` in total, split evenly between the tenants
from testbed.request_stream import WorkerStream

# `greedy2` (bench/real_ab.py's similar-acceptance scenario): a second greedy tenant,
# so two tenants share one acceptance and per-tenant knowledge gives nothing.
TEMPERATURE = {"greedy": 0.0, "temp1": 1.0, "greedy2": 0.0}


@dataclass
class Sample:
    """One finished request."""

    tenant: str
    end: float  # wall clock
    tokens: int
    tpot_s: float | None  # None for the first (random-length) request of a worker
    spec_steps: int = 0  # vLLM's metrics.speculative_decoding of the request (0 when absent)
    drafted: int = 0
    accepted: int = 0


@dataclass
class PhaseWindow:
    phase: Phase
    start: float  # wall clock: phase start
    measure_start: float
    end: float
    scrapes: dict[str, tuple[dict | None, dict | None]] = field(default_factory=dict)  # replica -> (start, end)
    streamed: dict[str, int] = field(default_factory=dict)  # tenant -> tokens streamed inside the window


@dataclass
class TraceResult:
    windows: list[PhaseWindow]
    samples: list[Sample]
    errors: dict[str, int]
    error_examples: dict[str, str]
    error_times: list[tuple[float, str]]
    policy_samples: list[dict]  # controller runs: /admin/tenants policies sampled every tick


async def sse_data(resp: httpx.Response):
    """The `data:` payloads of an SSE response, lines split on LF (CR stripped) only."""
    buffer = b""
    async for piece in resp.aiter_bytes():
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data: "):
                yield line[6:].rstrip(b"\r")


class ClosedLoop:
    def __init__(self, client: httpx.AsyncClient, gateway_url: str, max_tokens: int, seed: int,
                 tenants: tuple[str, ...] = TENANTS):  # fmt: skip
        self.client = client
        self.url = gateway_url + "/v1/completions"
        self.max_tokens = max_tokens
        self.seed = seed
        self.tenants = tenants  # those sending load (all, or one measured alone)
        self.samples: list[Sample] = []
        known = (*TENANTS, *(t for t in tenants if t not in TENANTS))
        self.streamed: dict[str, int] = {t: 0 for t in known}  # running token count per tenant
        self.errors: dict[str, int] = {}
        self.error_examples: dict[str, str] = {}  # kind -> the first message seen
        self.error_times: list[tuple[float, str]] = []  # (wall clock, kind), the first 200
        self.workers: dict[str, list[asyncio.Task]] = {t: [] for t in known}
        self.created: dict[str, int] = {t: 0 for t in known}  # workers started per tenant: the next one's number

    def set_concurrency(self, total: int) -> None:
        """Grow or shrink each sending tenant's worker pool to its share of total (surplus workers are cancelled)."""
        for i, tenant in enumerate(self.tenants):
            want = total // len(self.tenants) + (1 if i < total % len(self.tenants) else 0)
            pool = self.workers[tenant]
            while len(pool) < want:
                stream = WorkerStream(self.seed, tenant, self.created[tenant], self.max_tokens)
                self.created[tenant] += 1
                pool.append(asyncio.create_task(self._worker(tenant, stream)))
            while len(pool) > want:
                pool.pop().cancel()

    async def stop(self) -> None:
        tasks = [t for pool in self.workers.values() for t in pool]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.workers = {t: [] for t in self.workers}

    async def _worker(self, tenant: str, stream: WorkerStream) -> None:
        """Send `stream`'s requests one after another; a request whose connection failed is sent again."""
        request = stream.next()
        while True:
            try:
                sample = await self._one(tenant, request.prompt, request.max_tokens)
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                self._error(type(exc).__name__, repr(exc))
                await asyncio.sleep(0.5)
                continue
            if sample is not None:
                self.samples.append(sample)
            request = stream.next()

    def _error(self, kind: str, example: str = "") -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.error_examples.setdefault(kind, example[:300])
        if len(self.error_times) < 200:
            self.error_times.append((time.time(), kind))

    async def _one(self, tenant: str, text: str, length: int) -> Sample | None:
        body = {
            "model": SERVED_MODEL,
            "prompt": text,
            "max_tokens": length,
            "temperature": TEMPERATURE[tenant],
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        headers = {"Authorization": f"Bearer {api_key(tenant)}"}
        first = last = None
        tokens = 0
        spec: dict = {}
        async with self.client.stream("POST", self.url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                body = await resp.aread()
                self._error(f"http {resp.status_code}", body.decode(errors="replace"))
                await asyncio.sleep(0.5)
                return None
            async for data in sse_data(resp):
                if data == b"[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("error"):
                    self._error("stream error", json.dumps(chunk["error"]))
                    return None
                if chunk.get("choices"):
                    last = time.time()
                    first = first or last
                spec = (chunk.get("metrics") or {}).get("speculative_decoding") or spec
                usage = chunk.get("usage")
                if usage:
                    now_tokens = int(usage.get("completion_tokens") or 0)
                    self.streamed[tenant] += now_tokens - tokens
                    tokens = now_tokens
        if not tokens or first is None:
            self._error("no usage")
            return None
        tpot = (last - first) / (tokens - 1) if tokens > 1 and length == self.max_tokens else None
        return Sample(
            tenant=tenant, end=last, tokens=tokens, tpot_s=tpot, spec_steps=int(spec.get("num_spec_steps") or 0),
            drafted=int(spec.get("num_draft_tokens") or 0), accepted=int(spec.get("num_accepted_draft_tokens") or 0),
        )


async def _scrape_all(client: httpx.AsyncClient, replica_urls: dict[str, str]) -> dict[str, dict | None]:
    names = list(replica_urls)
    got = await asyncio.gather(*(scrape_replica(client, replica_urls[n]) for n in names))
    return dict(zip(names, got))


async def _sample_policies(client: httpx.AsyncClient, gateway_url: str, every_s: float, out: list[dict]) -> None:
    """The live policy of each tenant over time (controller runs): which policy a window ran under."""
    while True:
        body = await admin_get(client, gateway_url, "/admin/tenants")
        if body:
            out.append({"at": time.time(), "policies": {t["tenant"]: t.get("policy") for t in body.get("data", [])}})
        await asyncio.sleep(every_s)


async def run_trace(
    gateway_url: str,
    replica_urls: dict[str, str],
    phases: list[Phase],
    max_tokens: int,
    seed: int,
    sample_policies_s: float | None = None,
    tenants: tuple[str, ...] = TENANTS,
) -> TraceResult:
    """Drive the phase trace closed loop; scrape every replica at each window's edges."""
    # keep-alive shorter than uvicorn's 5 s, so the client never reuses a connection the gateway is closing
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512, keepalive_expiry=3.0)
    timeout = httpx.Timeout(600.0, connect=10.0)
    policy_samples: list[dict] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client, httpx.AsyncClient(timeout=10) as side:
        loop = ClosedLoop(client, gateway_url, max_tokens, seed, tenants)
        sampler = None
        if sample_policies_s:
            sampler = asyncio.create_task(_sample_policies(side, gateway_url, sample_policies_s, policy_samples))
        windows = []
        try:
            for phase in phases:
                start = time.time()
                loop.set_concurrency(phase.concurrency)
                await asyncio.sleep(max(0.0, start + phase.settle_s - time.time()))
                measure_start, streamed0 = time.time(), dict(loop.streamed)
                first = await _scrape_all(side, replica_urls)
                await asyncio.sleep(max(0.0, measure_start + phase.measure_s - time.time()))
                end, streamed1 = time.time(), dict(loop.streamed)
                last = await _scrape_all(side, replica_urls)
                window = PhaseWindow(phase, start, measure_start, end)
                window.scrapes = {n: (first[n], last[n]) for n in replica_urls}
                window.streamed = {t: streamed1[t] - streamed0[t] for t in streamed1}
                windows.append(window)
        finally:
            await loop.stop()
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
    return TraceResult(
        windows=windows, samples=loop.samples, errors=loop.errors, error_examples=loop.error_examples,
        error_times=loop.error_times, policy_samples=policy_samples,
    )
