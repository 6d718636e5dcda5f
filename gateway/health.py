"""Background replica checks: liveness (/health + /v1/models) with fail and
success thresholds, the process's one scrape of each replica's /metrics
(`contract.vllm_metrics`), and the wedge watchdog.

The scrape feeds routing (load gauges, advertised knobs) and, in a
single-node process, the embedded controller (`Registry.snapshots()`), so no
replica is scraped twice by one process.

A replica turns unhealthy after `health_fail_threshold` consecutive failed
checks and healthy again after `health_success_threshold` consecutive good
ones; an unhealthy replica is checked every `health_unhealthy_interval_s`
(Envoy's `unhealthy_interval`), so a restarted one is back within it. The very first check admits on one success, so a gateway that starts
next to running replicas serves immediately. A good check also half-opens
the replica's circuit breaker, so a restarted replica is probed at once.

Wedges cost seconds, not minutes: a replica that leaves every probe
unanswered for `wedge_after_s` (SIGSTOPped, deadlocked, its host gone
silent), or whose token counters stand still while it reports running
requests (an engine stuck behind a live API server), is taken out of
rotation at once and the requests waiting on it are aborted
(`InflightRequests.abort`): those that have not sent the client a byte fail
over. It comes back when it answers again (or makes progress) and passes
its health check. The last routable replica is never ejected this way:
with nowhere else to go, waiting is the better answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import httpx

from contract.settings import GatewaySettings as Settings
from contract.vllm_metrics import VllmMetricsSnapshot, fetch_metrics

from .periodic import Loops, every
from .replicas import Registry, ReplicaState
from .sampling import context_lengths

log = logging.getLogger("specgate.gateway.health")

OnWedged = Callable[[ReplicaState, str], None]


def _probe_started(replica: ReplicaState, now: float) -> None:
    if replica.unanswered_since is None:
        replica.unanswered_since = now


def _answered(replica: ReplicaState) -> None:
    replica.unanswered_since = None
    if replica.wedged == "no answer":
        replica.wedged = None
        log.info("replica answers again", extra={"fields": {"replica": replica.name}})


async def check_replica(client: httpx.AsyncClient, replica: ReplicaState, settings: Settings, *, first: bool = False) -> None:
    ok = False
    error = None
    _probe_started(replica, time.monotonic())
    try:
        health = await client.get(replica.url + "/health", timeout=settings.health_timeout_s)
        _answered(replica)
        if health.status_code != 200:
            raise RuntimeError(f"/health answered {health.status_code}")
        models = await client.get(replica.url + "/v1/models", timeout=settings.health_timeout_s)
        if models.status_code != 200:
            raise RuntimeError(f"/v1/models answered {models.status_code}")
        payload = models.json()
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise RuntimeError("/v1/models answered without a `data` list")
        cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]]
        replica.model_cards = cards
        replica.models = frozenset(c["id"] for c in cards)
        replica.context_lengths = context_lengths(cards)
        ok = True
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    replica.last_check = now = time.monotonic()
    if ok:
        replica.consecutive_ok += 1
        replica.consecutive_fail = 0
        replica.last_error = None
        replica.breaker.on_health_ok(now)
        if replica.wedged is not None:
            return  # answers, but stays out until it makes progress again
        if not replica.healthy and (first or replica.consecutive_ok >= settings.health_success_threshold):
            replica.healthy = True
            log.info("replica healthy", extra={"fields": {"replica": replica.name}})
    else:
        replica.consecutive_fail += 1
        replica.consecutive_ok = 0
        replica.last_error = error
        if replica.healthy and replica.consecutive_fail >= settings.health_fail_threshold:
            replica.healthy = False
            log.warning("replica unhealthy", extra={"fields": {"replica": replica.name, "error": error}})


async def scrape_metrics(client: httpx.AsyncClient, replica: ReplicaState, settings: Settings) -> None:
    _probe_started(replica, time.monotonic())
    snap = await fetch_metrics(client, replica.url, settings.health_timeout_s)
    now = time.monotonic()
    if snap is not None:
        _answered(replica)
        note_progress(replica, snap, now)
    replica.observe_metrics(snap, now)


def note_progress(replica: ReplicaState, snap: VllmMetricsSnapshot, now: float) -> None:
    """Track whether the engine moves: any prompt or generated token, or any
    engine step, is progress; so is having nothing to run."""
    parts = (snap.generation_tokens, snap.prompt_tokens, snap.iteration_tokens_count)
    if all(p is None for p in parts):
        return  # nothing to judge progress by
    mark = sum(p or 0.0 for p in parts)
    moved = replica.progress_mark is None or mark != replica.progress_mark
    replica.progress_mark = mark
    if moved or snap.num_requests_running <= 0:
        replica.frozen_since = None
        if replica.wedged == "no progress":
            replica.wedged = None
            log.info("replica makes progress again", extra={"fields": {"replica": replica.name}})
    elif replica.frozen_since is None:
        replica.frozen_since = now


def wedge_reason(replica: ReplicaState, now: float, wedge_after_s: float, progress_after_s: float) -> str | None:
    """Why a routable replica should be ejected now (None: it should not). Pure."""
    if replica.unanswered_since is not None and now - replica.unanswered_since >= wedge_after_s:
        return "no answer"
    if replica.frozen_since is not None and now - replica.frozen_since >= progress_after_s:
        return "no progress"
    return None


def _has_stand_in(replica: ReplicaState, replicas: list[ReplicaState]) -> bool:
    """Another healthy replica serves one of this replica's models."""
    models = replica.models | ({replica.configured_model} if replica.configured_model else set())
    return any(o is not replica and o.healthy and any(o.serves(m) for m in models) for o in replicas)


class HealthMonitor:
    def __init__(self, registry: Registry, settings: Settings, on_wedged: OnWedged | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.on_wedged = on_wedged
        self._client = httpx.AsyncClient(timeout=settings.health_timeout_s)
        self._loops = Loops()

    async def check_all(self, first: bool = False) -> None:
        replicas = list(self.registry)
        await asyncio.gather(*(check_replica(self._client, r, self.settings, first=first) for r in replicas))
        await asyncio.gather(*(scrape_metrics(self._client, r, self.settings) for r in replicas))

    async def start(self) -> None:
        await self.check_all(first=True)
        s = self.settings
        self._loops.start(
            every(min(s.health_interval_s, s.health_unhealthy_interval_s), self._health_round, log, "health round"),
            every(s.metrics_interval_s, self._metrics_round, log, "metrics round"),
            every(min(0.5, s.wedge_after_s / 4), self._watch, log, "wedge watchdog"),
        )

    async def _health_round(self) -> None:
        now = time.monotonic()
        await asyncio.gather(*(check_replica(self._client, r, self.settings) for r in self.due(now)))

    def due(self, now: float) -> list[ReplicaState]:
        """Replicas whose check is due: every `health_interval_s` while
        healthy, every `health_unhealthy_interval_s` while unhealthy or
        while its breaker is open (a good check half-opens it)."""
        s = self.settings
        return [
            r
            for r in self.registry
            if now - r.last_check
            >= (s.health_interval_s if r.healthy and r.breaker.opened_at is None else s.health_unhealthy_interval_s) - 0.01
        ]

    async def _metrics_round(self) -> None:
        await asyncio.gather(*(scrape_metrics(self._client, r, self.settings) for r in list(self.registry)))

    async def _watch(self) -> None:
        self.watch(time.monotonic())

    def watch(self, now: float) -> list[ReplicaState]:
        """Eject the replicas that are wedged now; returns them."""
        s = self.settings
        # Counters move only as often as they are scraped: judge progress over
        # at least three scrapes.
        progress_after = max(s.wedge_after_s, 3 * s.metrics_interval_s)
        replicas = list(self.registry)
        ejected = []
        for r in replicas:
            if not r.healthy or r.wedged is not None:
                continue
            reason = wedge_reason(r, now, s.wedge_after_s, progress_after)
            if reason is None:
                continue
            if not _has_stand_in(r, replicas):
                continue  # the last routable replica of its models: nowhere better to send its clients
            r.wedged = reason
            r.healthy = False
            r.consecutive_ok = 0
            r.last_error = f"wedged: {reason} for {s.wedge_after_s:g}s+"
            log.warning("replica wedged: out of rotation", extra={"fields": {"replica": r.name, "reason": reason}})
            ejected.append(r)
            if self.on_wedged is not None:
                self.on_wedged(r, reason)
        return ejected

    async def stop(self) -> None:
        await self._loops.stop()
        await self._client.aclose()
