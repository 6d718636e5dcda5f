"""Replica state as the gateway knows it (no I/O here).

Health checks and /metrics scraping (`health.py`) write into these objects;
the router reads them; the relay stage (`inflight.UpstreamAttempt`) updates `open_attempts`, and the breaker.
`Registry.snapshots()` hands the latest scrape of every replica to an
embedded controller, so one process reads each /metrics once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from contract.settings import GatewaySettings, ReplicaConfig, Settings
from contract.vllm_metrics import VllmMetricsSnapshot

from .breaker import CircuitBreaker


@dataclass
class ReplicaState:
    name: str
    url: str
    profile: str | None
    configured_model: str | None = None
    # The tenant drafter this replica serves (ReplicaConfig.drafter): reserved
    # to the tenants whose policy names it (gateway.routing); None = shared.
    drafter: str | None = None
    models: frozenset[str] = frozenset()
    model_cards: list[dict[str, Any]] = field(default_factory=list)
    # {model: its context length} as the replica's /v1/models card gives it
    # (vLLM's `max_model_len`): what `max_tokens` can at most fill.
    context_lengths: dict[str, int] = field(default_factory=dict)
    healthy: bool = False
    consecutive_ok: int = 0
    consecutive_fail: int = 0
    last_error: str | None = None
    last_check: float = 0.0
    # Load: the replica's own gauges plus the gateway's in-flight count.
    open_attempts: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    metrics_at: float = 0.0
    open_attempts_at_scrape: int = 0  # this gateway's open attempts when the gauges were read
    ext_knobs: frozenset[str] = frozenset()
    ext_engine_fixes: frozenset[str] | None = None  # vLLM fixes the replica's plugin put in force; None: not reported
    # The latest /metrics scrape (None = it failed) and when it was taken (monotonic).
    snapshot: VllmMetricsSnapshot | None = None
    snapshot_at: float = 0.0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    # Wedge detection (health.Watchdog): since when a probe (/health,
    # /v1/models or /metrics) has gone unanswered (None: the last one
    # answered); since when the token counters have stood still while the
    # replica reported running requests; why it is out of rotation, if wedged.
    unanswered_since: float | None = None
    frozen_since: float | None = None
    progress_mark: float | None = None
    wedged: str | None = None

    @property
    def supports_knobs(self) -> bool:
        return "max_draft" in self.ext_knobs

    def observe_metrics(self, snap: VllmMetricsSnapshot | None, at: float) -> None:
        """Record one scrape; a failed one keeps the last load gauges for routing."""
        self.snapshot, self.snapshot_at = snap, at
        if snap is None:
            return
        self.running = snap.num_requests_running
        self.waiting = snap.num_requests_waiting
        self.kv_usage = snap.kv_cache_usage_perc
        self.open_attempts_at_scrape = self.open_attempts
        self.ext_knobs = snap.ext_knobs
        self.ext_engine_fixes = snap.ext_engine_fixes
        self.metrics_at = at

    def serves(self, model: str) -> bool:
        return model in self.models or model == self.configured_model

    @property
    def load(self) -> float:
        """Work ahead of a new request here: this gateway's in-flight count
        (exact, instant), plus what the replica's gauges held beyond it at the
        last scrape (other gateways' requests), plus the queue and KV
        pressure. Our own requests are in the gauges too; counting them twice
        made the lagging gauge steer: a replica that looked busier one scrape
        ago was starved until the next (16 closed-loop clients on two
        simulated replicas settled at 11 / 5)."""
        others = max(0.0, self.running + self.waiting - self.open_attempts_at_scrape)
        return self.open_attempts + others + self.waiting + 4.0 * self.kv_usage

    def describe(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        return {
            "name": self.name,
            "url": self.url,
            "profile": self.profile,
            "drafter": self.drafter,
            "models": sorted(self.models | ({self.configured_model} if self.configured_model else set())),
            "healthy": self.healthy,
            "breaker": self.breaker.state(now),
            "inflight": self.open_attempts,
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_usage,
            "ext_knobs": sorted(self.ext_knobs),
            "engine_fixes": sorted(self.ext_engine_fixes or ()),
            "last_error": self.last_error,
            "wedged": self.wedged,
        }


class Registry:
    """The set of replicas, keyed by name (order = config order)."""

    def __init__(self, replicas: list[ReplicaState]) -> None:
        self.replicas: dict[str, ReplicaState] = {r.name: r for r in replicas}

    @classmethod
    def from_settings(cls, settings: Settings) -> "Registry":
        return cls([replica_from_config(r, settings.gateway) for r in settings.replicas])

    def __iter__(self):
        return iter(self.replicas.values())

    def get(self, name: str) -> ReplicaState | None:
        return self.replicas.get(name)

    def add(self, state: ReplicaState) -> None:
        self.replicas[state.name] = state

    def remove(self, name: str) -> None:
        self.replicas.pop(name, None)

    def snapshots(self) -> dict[str, tuple[float, VllmMetricsSnapshot | None]]:
        """{replica name: (monotonic time, latest scrape | None)} for replicas scraped at least once."""
        return {r.name: (r.snapshot_at, r.snapshot) for r in self.replicas.values() if r.snapshot_at}

    def model_cards(self) -> list[dict[str, Any]]:
        """/v1/models entries: the healthy replicas' cards first (first card
        per id wins), then those of replicas that are down: the cards they
        listed when last reached, and their configured `model`. Why down
        replicas count: their models are not gone, only unavailable for a
        moment (a request gets a retryable 503 `no_healthy_replica`), and a
        model list that flaps with every replica restart breaks clients that
        pick a model from it."""
        seen: dict[str, dict[str, Any]] = {}
        replicas = sorted(self.replicas.values(), key=lambda r: not r.healthy)  # stable: config order within each group
        for r in replicas:
            for card in r.model_cards:
                seen.setdefault(card.get("id"), card)
            if r.configured_model and r.configured_model not in seen:
                seen[r.configured_model] = {"id": r.configured_model, "object": "model", "owned_by": "specgate"}
        return list(seen.values())


def replica_from_config(cfg: ReplicaConfig, settings: GatewaySettings) -> ReplicaState:
    return ReplicaState(
        name=cfg.name or cfg.url,
        url=cfg.url,
        profile=cfg.profile,
        configured_model=cfg.model,
        drafter=cfg.drafter,
        breaker=CircuitBreaker(failures=settings.breaker_failures, open_s=settings.breaker_open_s),
    )
