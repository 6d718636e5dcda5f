"""ControlCore: estimators + hysteresis state around the pure `decide()`.

This is everything the controller does between "I have a replica metrics
snapshot / telemetry counters" and "here are the policies", with no I/O. The
live controller (`service.py`) feeds it from HTTP scrapes and the store; the
benchmark (`bench/control_sweep.py`) feeds it from the discrete-event
simulator's views. Same code, same decisions.
"""

from __future__ import annotations

from typing import Callable

from contract.overrides import TenantOverride
from contract.policy import SpeculationPolicy
from contract.telemetry import TelemetryCounters
from contract.vllm_metrics import VllmMetricsSnapshot

from .costs import ReplicaCost
from .decision import FULL, Carried, Decision, DecisionConfig, Placement, TenantState, decide
from .decision.probe import drafts
from .decision.views import method_of
from .estimators import ReplicaEstimator, TenantEstimator, cap_reach_steps, capped_request_steps, replica_views
from .signals import ReplicaDeltaTracker, TelemetryDeltaTracker


class ControlCore:
    def __init__(
        self,
        decision_config: DecisionConfig | None = None,
        cost_factory: Callable[[str, str], ReplicaCost] | None = None,
        half_life_s: float = 300.0,
        tpot_targets: dict[str, float | None] | None = None,
        unhealthy_after_failures: int = 3,
    ) -> None:
        self.decision_config = decision_config or DecisionConfig()
        self.cost_factory = cost_factory or (lambda name, profile: ReplicaCost.for_names(profile=profile))
        self.replicas = ReplicaEstimator()
        self._scrape_failures: dict[str, int] = {}
        self.unhealthy_after_failures = unhealthy_after_failures
        self.tenants = TenantEstimator(half_life_s=half_life_s)
        self.replica_tracker = ReplicaDeltaTracker()
        self.telemetry_tracker = TelemetryDeltaTracker()
        self.tpot_targets = dict(tpot_targets or {})
        self.state: dict[str, TenantState] = {}
        self.placement = Placement()  # tenants placed apart, as the last committed decision left it
        self._costs: dict[str, ReplicaCost] = {}

    # -- inputs ---------------------------------------------------------
    def observe_replica(self, name: str, profile: str, at: float, snap: VllmMetricsSnapshot | None) -> None:
        cost = self._costs.get(name)
        if cost is None:
            cost = self._costs[name] = self.cost_factory(name, profile)
        est = self.replicas.ensure(name, profile, cost)
        if snap is None:
            # Like the gateway's health checks: only consecutive failures mark a
            # replica unhealthy, so one slow scrape cannot flip policies.
            failures = self._scrape_failures[name] = self._scrape_failures.get(name, 0) + 1
            if failures >= self.unhealthy_after_failures:
                self.replicas.mark_unhealthy(name)
                self.replica_tracker.forget(name)
            return
        self._scrape_failures.pop(name, None)
        sample = self.replica_tracker.update(name, at, snap)
        if sample is not None:
            self.replicas.update(sample, self.tenants.context_tokens(), self.tenants.prompt_tokens())
            if sample.engine_steps:
                self._observe_capped(name, method_of(est.profile), sample.engine_steps, est.block)
        else:
            est.healthy = True
            est.supports_knobs = snap.supports_knobs
            est.engine_fixes = snap.ext_engine_fixes
            if est.samples == 0:
                est.batch = snap.num_requests_running

    def _observe_capped(self, name: str, method: str, cells, block: int) -> None:
        """Per tenant on replica `name`, the interval's request-steps its
        policy in force capped at 0 (the probe's arm while it explores: those
        are its drafting requests), and those whose cap allowed each draft
        position, weighted by its share of the replica: the proposal rate
        leaves the first out, the fill and the survival are read against the
        second (`TenantEstimator.method_proposal`)."""
        if method == "off":
            return
        mix = self.tenants.replica_mix().get(name, {})
        for tenant, st in self.state.items():
            share, policy = mix.get(tenant, 0.0), st.policy
            if share <= 0 or policy is None:
                continue
            arm = policy.probe_arm() if policy.probe is not None and not drafts(policy) else policy
            capped, counted = capped_request_steps(cells, arm.cap_at)
            if counted > 0:
                reach = [share * v for v in cap_reach_steps(cells, arm.cap_at, block)]
                self.tenants.observe_capped(tenant, method, share * capped, share * counted, reach)

    def observe_telemetry(self, counters: list[TelemetryCounters], dt_s: float) -> None:
        samples = self.telemetry_tracker.update(counters)
        self.tenants.decay(dt_s, serving={smp.replica for smp in samples if smp.get("completion_tokens") > 0})
        # Acceptance is fitted on vLLM's own accepted/drafted, also under
        # adaptive verification (where drafts it trimmed count as rejected):
        # the verified slots are the *most promising* ones, so acceptance over
        # them would overstate what longer drafts get.
        methods = {name: method_of(est.profile) for name, est in self.replicas.replicas.items()}
        self.tenants.update(samples, methods=methods)

    def seed(self, policies: dict[str, SpeculationPolicy], now: float) -> None:
        """Adopt already-published policies as hysteresis state (failover)."""
        self.state = {}
        for tenant, p in policies.items():
            k = 0 if not p.enabled else (p.max_draft if p.max_draft is not None else FULL)
            self.state[tenant] = TenantState(k=k, theta=p.min_confidence, since=now, policy=p)
        self.placement = Placement.from_policies(policies, now)
        self.replica_tracker = ReplicaDeltaTracker()
        self.telemetry_tracker = TelemetryDeltaTracker()

    # -- decision -------------------------------------------------------
    def decide(
        self, now: float, overrides: dict[str, TenantOverride] | None = None, extra_tenants: set[str] | None = None,
        carried: "dict[str, Carried] | None" = None,
    ) -> Decision:
        """`carried`: per tenant, the drafter / canary / capture its policy carries (`decision.Carried`)."""
        overrides = overrides or {}
        carried = carried or {}
        tenants = set(self.tpot_targets) | set(overrides) | (extra_tenants or set()) | set(carried)
        return decide(
            replica_views(self.replicas, self.tenants.replica_mix(), self.tenants.prompt_tokens(), self.tenants.prefill_ratio()),
            self.tenants.views(tenants, self.tpot_targets),
            self.state,
            overrides,
            now,
            self.decision_config,
            carried,
            self.placement,
        )

    def commit(self, decision: Decision) -> None:
        self.state = decision.state
        self.placement = decision.placement

    def traffic(self) -> dict[str, float]:
        return {t: s.completion for t, s in self.tenants.sums.items()}
