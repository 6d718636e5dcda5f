"""Background replica checks: liveness (/health + /v1/models) with fail and
success thresholds, and the process's one scrape of each replica's /metrics
(`contract.vllm_metrics`): the snapshot feeds routing (load gauges, advertised
knobs) and, in a single-node process, the embedded controller
(`Registry.snapshots()`), so no replica is scraped twice by one process.

A replica turns unhealthy after `health_fail_threshold` consecutive failed
checks and healthy again after `health_success_threshold` consecutive good
ones, so one slow probe neither drops a replica nor does one good probe
re-admit a flapping one. The very first check admits on one success, so a
gateway that starts next to running replicas serves immediately.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from contract.settings import GatewaySettings as Settings
from contract.vllm_metrics import fetch_metrics

from .periodic import Loops, every
from .replicas import Registry, ReplicaState

log = logging.getLogger("specgate.gateway.health")


async def check_replica(client: httpx.AsyncClient, replica: ReplicaState, settings: Settings, *, first: bool = False) -> None:
    ok = False
    error = None
    try:
        health = await client.get(replica.url + "/health", timeout=settings.health_timeout_s)
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
        ok = True
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    replica.last_check = time.monotonic()
    if ok:
        replica.consecutive_ok += 1
        replica.consecutive_fail = 0
        replica.last_error = None
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
    replica.observe_metrics(await fetch_metrics(client, replica.url, settings.health_timeout_s), time.monotonic())


class HealthMonitor:
    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self._client = httpx.AsyncClient(timeout=settings.health_timeout_s)
        self._loops = Loops()

    async def check_all(self, first: bool = False) -> None:
        replicas = list(self.registry)
        await asyncio.gather(*(check_replica(self._client, r, self.settings, first=first) for r in replicas))
        await asyncio.gather(*(scrape_metrics(self._client, r, self.settings) for r in replicas))

    async def start(self) -> None:
        await self.check_all(first=True)
        self._loops.start(
            every(self.settings.health_interval_s, self._health_round, log, "health round"),
            every(self.settings.metrics_interval_s, self._metrics_round, log, "metrics round"),
        )

    async def _health_round(self) -> None:
        await asyncio.gather(*(check_replica(self._client, r, self.settings) for r in list(self.registry)))

    async def _metrics_round(self) -> None:
        await asyncio.gather(*(scrape_metrics(self._client, r, self.settings) for r in list(self.registry)))

    async def stop(self) -> None:
        await self._loops.stop()
        await self._client.aclose()
