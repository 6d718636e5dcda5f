"""The controller loop: I/O at the edges around the pure decision.

Each tick (leader only): scrape replicas -> interval samples -> estimators;
read the gateway's telemetry counters -> deltas -> tenant estimator; read
admin overrides and the pause flag; judge running drafter canaries
(`controller/rollout.py`: promote / roll back, written to the store and the
audit log); start a due drafter training job (`controller/training.py`, when
configured) and carry each tenant's drafter, canary and capture opt-in into
its policy; `decide()`; publish changed policies;
store the per-tenant last decision, the bounded change history, replica
regimes and the fleet plan for the admin API; update /metrics.

Leadership: several instances may run; the one holding the store's TTL lock
(`controller:leader`, renewed every tick, TTL ~3 ticks) acts, the others
stand by and retry every tick. A new leader seeds its hysteresis state from
the currently published policies, so a failover does not flip anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import httpx

from contract.keys import (
    HISTORY_KEY,
    HISTORY_MAX,
    LAST_DECISIONS_KEY,
    LEADER_KEY,
    REPLICAS_KEY,
    STATUS_KEY,
)
from contract.overrides import load_overrides
from contract.policy import SpeculationPolicy, load_policies, policy_changes, served_tenants
from contract.settings import Settings
from contract.store import Store
from contract.telemetry import read_all
from contract.vllm_metrics import VllmMetricsSnapshot, fetch_metrics

from . import rollout
from .actuation import Actuator, default_actuator, publish_if_changed, regime_dict, store_fleet_plan
from .audit import audit, is_paused
from .core import ControlCore
from .costs import ReplicaCost
from .decision import Decision
from .metrics import ControllerMetrics
from .signals import merge_gpu_gauges, scrape_all
from .training import TrainingJobs

log = logging.getLogger("specgate.controller")


SnapshotSource = Callable[[], "dict[str, tuple[float, VllmMetricsSnapshot | None]]"]


class Controller:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        actuator: Actuator | None = None,
        metrics: ControllerMetrics | None = None,
        on_tick: "Callable[[Decision], None] | None" = None,
        snapshots: SnapshotSource | None = None,
    ) -> None:
        """`snapshots`: the host process's latest /metrics scrape of every
        replica (`gateway.replicas.Registry.snapshots` when embedded), so one
        process scrapes each replica once; None = scrape them here.
        `actuator`: acts on the fleet plan; default: `PlanGate` (settings
        `controller.restart_gate`) in front of `NoopRestart`, which records
        the restart the gate would make (`/admin/fleet-plan`) and makes none."""
        self.settings = settings
        self.store = store
        self.config = settings.controller
        self.snapshots = snapshots
        self._seen_at: dict[str, float] = {}
        self.actuator = actuator or default_actuator(self.config.restart_gate)
        self.metrics = metrics or ControllerMetrics(top_n=self.config.top_tenants)
        self._tpot = {t.id: t.tpot_target_ms for t in settings.tenants}
        self._served = set(served_tenants(settings))
        # The config's speculation block per tenant: its capture opt-in (and
        # drafter) ride on every policy this controller publishes.
        self._configured = {t.id: t.speculation for t in settings.tenants}
        self.core = ControlCore(
            self.config.decision,
            cost_factory=lambda name, profile: ReplicaCost.for_names(
                self.config.gpu, self.config.model, profile, self.config.step_cost_half_life_s
            ),
            half_life_s=self.config.half_life_s,
            tpot_targets=self._tpot,
            unhealthy_after_failures=self.config.unhealthy_after_failures,
        )
        # Controller-triggered drafter training (controller/training.py): off unless configured.
        self.training = (
            TrainingJobs(self.config.training, store, self.owner, self.metrics) if self.config.training.enabled else None
        )
        self.is_leader = False
        self.last_decision: Decision | None = None
        self.ticks = 0
        self._last_tick: float | None = None
        self._client: httpx.AsyncClient | None = None
        self.on_tick = on_tick  # observer hook (tests, embedding): called after each leader tick

    @property
    def owner(self) -> str:
        return self.config.instance_id

    # -- leadership ---------------------------------------------------
    async def _lead(self) -> bool:
        got = await self.store.acquire_lock(LEADER_KEY, self.owner, self.config.ttl_s)
        if got and not self.is_leader:
            log.info("controller %s became leader", self.owner)
            await self._seed_state()
        if not got and self.is_leader:
            log.warning("controller %s lost leadership", self.owner)
        self.is_leader = got
        self.metrics.leader.set(1 if got else 0)
        return got

    async def _seed_state(self) -> None:
        """Adopt the published policies as hysteresis state (no flip on failover)."""
        current = await load_policies(self.store)
        self.core.seed(current.policies, time.monotonic())

    # -- one tick -----------------------------------------------------
    def _decide(self, now: float, overrides, carried) -> Decision:
        """`ControlCore.decide`, timed: wall and this thread's CPU, because an
        embedded controller shares its cores with the gateway (and, on a
        small bed, with the engines)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        decision = self.core.decide(now, overrides, None, carried)
        self.metrics.decide_seconds.observe(time.perf_counter() - t0)
        self.metrics.decide_cpu.inc(time.thread_time() - c0)
        return decision

    async def tick(self) -> Decision | None:
        if not await self._lead():
            return None
        now = time.monotonic()
        dt = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        client = self._http()

        scraped = await self._scrape(client)
        dcgm = await fetch_metrics(client, self.config.dcgm_url, self.config.scrape_timeout_s) if self.config.dcgm_url else None
        for rc in self.settings.replicas:
            if rc.name not in scraped:
                continue  # the host has not scraped it since the last tick
            at, snap = scraped[rc.name]
            if snap is None:
                self.metrics.scrape_failures.labels(rc.name).inc()
            self.core.observe_replica(rc.name, rc.profile or "off", at, merge_gpu_gauges(snap, dcgm) if snap else None)
        counters = await read_all(self.store)
        self.core.observe_telemetry(counters, dt)

        overrides = await load_overrides(self.store)
        paused = await is_paused(self.store)
        docs = await self._rollouts(counters, paused)
        # Configured tenants always (their capture opt-in), others (`anonymous`) once they have a drafter story.
        carried = rollout.carried([*self._configured, *(t for t in docs if t in self._served and t not in self._configured)],
                                  docs, self._configured)
        if self.training is not None and not paused:
            await self._train([t for t, c in carried.items() if c.capture is not None], docs)
        self.metrics.canaries_running.set(sum(1 for d in docs.values() if d.rollout is not None and d.rollout.running))
        self.metrics.training_running.set(1 if self.training is not None and self.training.running else 0)
        # The decision is pure CPU work (seconds for large fleets x many
        # tenants): in a worker thread, so an embedding gateway's event loop
        # keeps serving requests meanwhile. Nothing else touches the core
        # during a tick.
        decision = await asyncio.to_thread(self._decide, now, overrides, carried)
        # The lock was renewed at the start of the tick; scraping and deciding
        # take time, so confirm leadership again before writing anything, or a
        # standby that took over meanwhile and this instance would both publish.
        if not await self._lead():
            return None
        if await load_overrides(self.store) != overrides:
            # An admin pinned or released a tenant while this tick decided; the
            # admin API has published that pin already, and publishing this
            # decision (made without it) would undo it until the next tick.
            log.info("overrides changed while the controller decided; this tick's decision is not published")
            return None
        await self._actuate(decision, paused, now)
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(decision)
        return decision

    async def _rollouts(self, counters: list, paused: bool) -> dict[str, rollout.TenantDrafters]:
        """Judge running canaries (`controller.rollout`) and write their verdicts;
        returns the rollout documents the policies carry this tick. Paused:
        nothing is decided (the canary keeps running, its clock too)."""
        docs = await rollout.load(self.store)
        if paused or not any(d.rollout is not None and d.rollout.running for d in docs.values()):
            return docs
        by = f"controller:{self.owner}"
        judged = docs
        plan = rollout.step(judged, counters, self.settings.replicas, self.config.rollout, time.time(), by, self._served)
        for tenant, ended in plan.ended.items():
            # Re-read: an admin may have aborted (or replaced) the canary while
            # it was judged; the admin's write wins and this verdict is dropped.
            current = await rollout.load(self.store)
            if not rollout.same_canary(current.get(tenant), judged.get(tenant)):
                log.info("canary of %s changed while judged; verdict dropped", tenant)
                docs = current
                continue
            await rollout.save_one(self.store, tenant, ended)
            docs = {**current, tenant: ended}
            verdict = plan.verdicts[tenant]
            action = "canary_promote" if verdict.verdict == "promote" else "canary_rollback"
            self.metrics.canary_verdicts.labels(verdict.verdict).inc()
            log.info("%s %s drafter %s: %s", action, tenant, ended.rollout.drafter, verdict.reason)
            await audit(self.store, by, action, tenant,
                        {"drafter": ended.rollout.drafter, "reason": verdict.reason, "numbers": verdict.numbers})
        return docs

    async def _train(self, opted_in: list[str], docs: dict[str, rollout.TenantDrafters]) -> None:
        """Start a tenant's drafter training when it is due; a failure here
        (store directory unreadable, trainer missing) never stops the control loop."""
        try:
            await self.training.tick(opted_in, docs)
        except Exception:  # noqa: BLE001 -- logged; training is optional, decisions are not
            log.warning("drafter training check failed", exc_info=True)

    async def _scrape(self, client: httpx.AsyncClient) -> dict[str, tuple[float, VllmMetricsSnapshot | None]]:
        """This tick's new scrapes: our own, or the host's that we have not seen yet."""
        if self.snapshots is None:
            return await scrape_all(client, {r.name: r.url for r in self.settings.replicas}, self.config.scrape_timeout_s)
        fresh = {}
        for name, (at, snap) in self.snapshots().items():
            if at > self._seen_at.get(name, 0.0):
                self._seen_at[name] = at
                fresh[name] = (at, snap)
        return fresh

    async def _actuate(self, decision: Decision, paused: bool, now: float) -> None:
        traffic = self.core.traffic()
        self.metrics.paused.set(1 if paused else 0)
        wall = time.time()
        if paused:
            published = (await load_policies(self.store)).policies
            last = {r.tenant: _record_json(r, wall, note="paused: not applied") for r in decision.records}
        else:
            self.core.commit(decision)
            published = decision.policies
            current = await load_policies(self.store)
            before = current.policies
            result = await publish_if_changed(self.store, decision.policies, current)
            if result is not None:
                self.metrics.publishes.inc()
                self.metrics.policy_version.set(result.version)
                entries = []
                for r in decision.records:
                    entry = history_entry(r.tenant, before.get(r.tenant), r.policy, r.reason, wall,
                                          version=result.version, by=self.owner, numbers=r.numbers)
                    if entry is not None:
                        entries.append(entry)
                self.metrics.count_changes([e["tenant"] for e in entries], traffic)
                for entry in entries:
                    await self.store.push_capped(HISTORY_KEY, entry, HISTORY_MAX)
            last = {r.tenant: _record_json(r, wall) for r in decision.records}
        self.last_decision = decision
        await self.store.set_json(LAST_DECISIONS_KEY, last)
        replicas = {}
        for name, reg in decision.replicas.items():
            est = self.core.replicas.replicas.get(name)
            replicas[name] = {
                **regime_dict(reg),
                "waiting": est.waiting if est else None,
                "kv_usage": est.kv_usage if est else None,
                "per_position_acceptance": {str(k): round(v, 4) for k, v in sorted((est.per_position if est else {}).items())},
                "gpu_util": est.gpu_util if est else None,
                "tensor_active": est.tensor_active if est else None,
                "dram_active": est.dram_active if est else None,
                "healthy": True,
                "supports_knobs": est.supports_knobs if est else None,
                "engine_fixes": sorted(est.engine_fixes) if est and est.engine_fixes is not None else None,
                "step_cost": est.cost.describe() if est else None,
            }
        for name, est in self.core.replicas.replicas.items():
            if name not in replicas:
                replicas[name] = {"name": name, "profile": est.profile, "healthy": False}
        await self.store.set_json(REPLICAS_KEY, replicas)
        await store_fleet_plan(self.store, decision.replicas, self.actuator, now, hold=paused)
        await self.store.set_json(
            STATUS_KEY,
            {"leader": self.owner, "at": wall, "tick_s": self.config.tick_s, "paused": paused, "ticks": self.ticks + 1},
            ttl_s=self.config.ttl_s * 2,
        )
        self.metrics.observe(decision, published, traffic)
        self.metrics.observe_step_costs(
            {name: r["step_cost"] for name, r in replicas.items() if r.get("step_cost")}
        )

    # -- loop -----------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.config.scrape_timeout_s)
        return self._client

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.tick()
                except Exception:  # one bad tick (store blip, odd metrics) must not kill the loop
                    log.exception("controller tick failed")
                delay = max(0.0, self.config.tick_s - (time.monotonic() - started))
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.close()

    async def close(self) -> None:
        if self.training is not None:
            await self.training.close()
        if self.is_leader:
            try:
                await self.store.release_lock(LEADER_KEY, self.owner)
            except Exception:  # pragma: no cover - store gone at shutdown
                log.warning("could not release leader lock")
            self.is_leader = False
            self.metrics.leader.set(0)
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def history_entry(
    tenant: str, before: SpeculationPolicy | None, after: SpeculationPolicy, reason: str, wall: float, *,
    version: int, by: str, numbers: dict | None = None,
) -> dict | None:
    """One entry of the decision history (`HISTORY_KEY`), or None when the
    published policy did not change: the history lists changes only, each
    with what changed, so a 'holding' draft-cap reason on an entry always
    comes with the floor or threshold change that made it an entry."""
    changes = policy_changes(before, after)
    if not changes:
        return None
    return {
        "tenant": tenant, "at": wall, "changed": True, "changes": changes, "policy": after.model_dump(mode="json"),
        "reason": reason, "numbers": numbers or {}, "version": version, "by": by,
    }


def _record_json(record: Any, wall: float, note: str | None = None) -> dict:
    return {
        "tenant": record.tenant,
        "at": wall,
        "changed": record.changed and note is None,
        "applied": note is None,  # paused: decided, not published
        "policy": record.policy.model_dump(mode="json"),
        "reason": record.reason if note is None else f"{note}; would: {record.reason}",
        "numbers": record.numbers,
    }


__all__ = ["Controller", "SnapshotSource", "history_entry"]
