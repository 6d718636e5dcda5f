"""The controller's own Prometheus metrics (prefix `specgate_controller_`).

Tenant-labelled series are limited to the top-N tenants by recent traffic
(the rest are folded into `other` or omitted) so a fleet with thousands of
tenants does not explode the scrape.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from contract.knobs import MAX_BATCH_KEY
from contract.policy import SpeculationPolicy

from .decision import Decision

# A tick is 1 s by default: a decision past a tenth of it is worth seeing.
_DECIDE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def stop_batch(policy: SpeculationPolicy) -> int:
    """The batch above which a tenant stops drafting (-1 = none): its load threshold,
    or where its schedule stops -- what `vllm_xargs` sends as max_batch."""
    return int(policy.vllm_xargs().get(MAX_BATCH_KEY, -1))


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, top_n: int = 20) -> None:
        self.registry = registry or CollectorRegistry()
        self.top_n = top_n
        self._shown: dict[Gauge, set[tuple[str, ...]]] = {}  # the series `_publish` last set, per gauge
        # Registered in this order (the exposition and docs/operations.md follow it).
        for group in (self._loop, self._policies, self._tenants, self._replicas, self._jobs):
            group(self.registry)

    def _loop(self, r: CollectorRegistry) -> None:
        self.ticks = Counter("specgate_controller_ticks", "Controller ticks run as leader", registry=r)
        self.decisions = Counter(
            "specgate_controller_decisions", "Per-tenant decisions by outcome", ["outcome"], registry=r
        )
        self.changes = Counter(
            "specgate_controller_policy_changes", "Published per-tenant policy changes", ["tenant"], registry=r
        )
        self.publishes = Counter("specgate_controller_publishes", "Policy versions published", registry=r)
        self.decide_seconds = Histogram(
            "specgate_controller_decide_seconds", "Wall time of one tick's decision (ControlCore.decide, in a worker thread)",
            buckets=_DECIDE_BUCKETS, registry=r,
        )
        self.decide_cpu = Counter(
            "specgate_controller_decide_cpu_seconds",
            "CPU time the decisions took (their thread's): what an embedded controller takes from the cores it shares",
            registry=r,
        )
        self.leader = Gauge("specgate_controller_is_leader", "1 when this instance holds the leader lock", registry=r)
        self.paused = Gauge("specgate_controller_paused", "1 when paused by an admin", registry=r)
        self.policy_version = Gauge("specgate_controller_policy_version", "Last published policy version", registry=r)

    def _policies(self, r: CollectorRegistry) -> None:
        self.enabled = Gauge("specgate_controller_policy_enabled", "Speculation enabled per tenant", ["tenant"], registry=r)
        self.max_draft = Gauge(
            "specgate_controller_policy_max_draft", "Draft cap per tenant (0 = off; -1 = no cap: the replica's whole block)",
            ["tenant"], registry=r,
        )
        self.max_batch = Gauge(
            "specgate_controller_policy_max_batch", "Batch above which a tenant stops drafting (-1 = none): its load threshold or where its schedule stops", ["tenant"],
            registry=r,
        )
        self.schedule = Gauge(
            "specgate_controller_policy_schedule",
            "A tenant's batch -> draft-length schedule: the draft length up to each max_batch (none above the last)",
            ["tenant", "max_batch"], registry=r,
        )
        self.min_conf = Gauge(
            "specgate_controller_policy_min_confidence", "Confidence floor per tenant", ["tenant"], registry=r
        )

    def _tenants(self, r: CollectorRegistry) -> None:
        self.acceptance = Gauge(
            "specgate_controller_tenant_acceptance",
            "The model's conditional per-position acceptance a (shrunk toward the method's prior; top-N tenants)",
            ["tenant"],
            registry=r,
        )
        self.acceptance_length = Gauge(
            "specgate_controller_tenant_acceptance_length",
            "Measured acceptance length (tokens per verification step) of the tenant's responses across the fleet, "
            "decayed with controller.half_life_s: the gateways' specgate_tenant_acceptance_length over all of them (top-N tenants)",
            ["tenant"], registry=r,
        )
        self.measured_gain = Gauge(
            "specgate_controller_tenant_measured_gain",
            "A tenant's gain from drafting as its probe's two arms measured it: non-drafting over drafting engine "
            "time per output token, same replicas and steps (top-N tenants with a probe and enough tokens in both arms)",
            ["tenant"], registry=r,
        )
        self.predicted_gain = Gauge(
            "specgate_controller_tenant_predicted_gain",
            "The model's prediction of specgate_controller_tenant_measured_gain: tokens per step of a request "
            "drafting at the arm's cap",
            ["tenant"], registry=r,
        )

    def _replicas(self, r: CollectorRegistry) -> None:
        self.rho = Gauge("specgate_controller_replica_rho", "Compute-bound index tokens/step / knee", ["replica"], registry=r)
        self.batch = Gauge("specgate_controller_replica_batch", "Smoothed running requests", ["replica"], registry=r)
        self.al = Gauge("specgate_controller_replica_acceptance_length", "Measured acceptance length", ["replica"], registry=r)
        self.goodput = Gauge(
            "specgate_controller_replica_predicted_goodput", "Predicted output tokens/s", ["replica"], registry=r
        )
        self.plan = Gauge(
            "specgate_controller_fleet_plan",
            "Recommended launch profile per replica (1 on the recommended label)",
            ["replica", "current", "recommended"],
            registry=r,
        )
        self.plan_gain = Gauge(
            "specgate_controller_fleet_plan_gain", "Predicted gain of the recommended profile", ["replica"], registry=r
        )
        self.step_flat = Gauge(
            "specgate_controller_replica_step_flat_seconds",
            "Learned step time below the knee (see docs/controller.md, step cost)", ["replica"], registry=r,
        )
        self.step_knee = Gauge(
            "specgate_controller_replica_step_knee_tokens",
            "Learned knee: forward tokens per step where the step turns compute-bound", ["replica"], registry=r,
        )
        self.step_slope = Gauge(
            "specgate_controller_replica_step_slope_seconds_per_token",
            "Learned step time per forward token above the knee", ["replica"], registry=r,
        )
        self.step_draft = Gauge(
            "specgate_controller_replica_step_draft_seconds",
            "Learned drafter cost per drafting request in a step", ["replica"], registry=r,
        )
        self.step_request = Gauge(
            "specgate_controller_replica_step_request_seconds",
            "Learned cost of one scheduled request in a step, beyond its tokens", ["replica"], registry=r,
        )
        self.step_points = Gauge(
            "specgate_controller_replica_step_cost_points",
            "Distinct load points behind the learned step curve (0 = prior only)", ["replica"], registry=r,
        )

    def _jobs(self, r: CollectorRegistry) -> None:
        self.canary_verdicts = Counter(
            "specgate_controller_canary_verdicts", "Canary verdicts this instance wrote (promote, rollback)", ["verdict"],
            registry=r,
        )
        self.canaries_running = Gauge("specgate_controller_canaries_running", "Tenants with a canary running", registry=r)
        self.training_jobs = Counter(
            "specgate_controller_training_jobs",
            "Drafter training jobs of this instance by outcome (started, succeeded, failed; a job given up counts as failed)",
            ["outcome"], registry=r,
        )
        self.training_running = Gauge(
            "specgate_controller_training_running", "1 while this instance runs a drafter training job", registry=r
        )
        self.scrape_failures = Counter(
            "specgate_controller_scrape_failures", "Failed replica /metrics scrapes", ["replica"], registry=r
        )

    def observe(self, decision: Decision, policies: dict[str, SpeculationPolicy], traffic: dict[str, float]) -> None:
        self.ticks.inc()
        for rec in decision.records:
            p = rec.policy
            outcome = "hold" if not rec.changed else ("on" if p.enabled else "off")
            self.decisions.labels(outcome).inc()
        top = set(sorted(traffic, key=lambda t: -traffic[t])[: self.top_n]) | {"*"}
        tenant_gauges = (self.enabled, self.max_draft, self.max_batch, self.schedule, self.min_conf, self.acceptance,
                         self.acceptance_length, self.measured_gain, self.predicted_gain)
        values: dict[Gauge, dict[tuple[str, ...], float]] = {g: {} for g in tenant_gauges}
        for rec in decision.records:
            if rec.tenant not in top:
                continue
            t = (rec.tenant,)
            p = policies.get(rec.tenant, rec.policy)
            values[self.enabled][t] = 1 if p.enabled else 0
            values[self.max_draft][t] = p.max_draft if p.max_draft is not None else -1
            values[self.min_conf][t] = p.min_confidence or 0.0
            values[self.max_batch][t] = stop_batch(p)
            for max_batch, draft in p.schedule or ():
                values[self.schedule][(rec.tenant, str(max_batch))] = draft
            values[self.acceptance][t] = rec.numbers.get("acceptance") or 0.0
            if rec.numbers.get("acceptance_length") is not None:
                values[self.acceptance_length][t] = rec.numbers["acceptance_length"]
            gain = rec.numbers.get("measured_gain")
            if gain:
                values[self.measured_gain][t] = gain["measured"]
                if gain["predicted"] is not None:
                    values[self.predicted_gain][t] = gain["predicted"]
        replica_gauges = (self.rho, self.batch, self.al, self.goodput, self.plan, self.plan_gain)
        values.update({g: {} for g in replica_gauges})
        for name, reg in decision.replicas.items():
            values[self.rho][(name,)] = reg.rho
            values[self.batch][(name,)] = reg.batch
            if reg.acceptance_length is not None:
                values[self.al][(name,)] = reg.acceptance_length
            values[self.goodput][(name,)] = reg.predicted_goodput_tok_s
            values[self.plan][(name, reg.profile, reg.recommended_profile)] = 1
            values[self.plan_gain][(name,)] = reg.recommended_gain
        self._publish(values)

    def observe_step_costs(self, curves: dict[str, dict]) -> None:
        """`curves`: replica -> `StepCostLearner.describe()`."""
        fields = ((self.step_flat, "flat_ms", 1e3), (self.step_knee, "knee_tokens", 1),
                  (self.step_slope, "slope_ms_per_token", 1e3), (self.step_draft, "draft_ms_per_request", 1e3),
                  (self.step_request, "request_ms", 1e3), (self.step_points, "points", 1))
        self._publish({gauge: {(name,): c[key] / per for name, c in curves.items()} for gauge, key, per in fields})

    def _publish(self, values: dict[Gauge, dict[tuple[str, ...], float]]) -> None:
        """Make each gauge's series exactly `values`: the new values set first, then the
        series no longer shown removed. Why not clear-then-set: prometheus_client collects
        in the scraping thread, and a scrape between the two sees a series missing, which
        Prometheus marks stale (a dashboard panel then shows no data)."""
        for gauge, series in values.items():
            for labels, value in series.items():
                gauge.labels(*labels).set(value)
            for labels in self._shown.get(gauge, set()) - series.keys():
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass
            self._shown[gauge] = set(series)

    def count_changes(self, tenants: list[str], traffic: dict[str, float]) -> None:
        top = set(sorted(traffic, key=lambda t: -traffic[t])[: self.top_n]) | {"*"}
        for t in tenants:
            self.changes.labels(t if t in top else "other").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
