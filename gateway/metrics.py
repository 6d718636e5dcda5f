"""Prometheus metrics of one gateway app (`specgate_` prefix, own registry).

Each app gets its own CollectorRegistry so several gateway apps can live in
one process (tests, embedded stacks) without clashing. Tenant labels are
bounded: the first `top_n` tenants seen get their own label value, the rest
are reported as `other` (all of them with `tenant_labels=False`, so a scrape
names no tenant). The families every request updates are `hot_metrics`'
plain-dict ones (a labelled prometheus_client child cost ~1 µs per update);
the others' label children are cached because `.labels()` is a measurable
share of the per-request budget too.

Per-tenant speculation state (`specgate_tenant_speculation_*`,
`specgate_tenant_acceptance_length`) is on every gateway's /metrics, in
every mode (embedded controller or Redis-backed fleet), because it is what
the gateway itself applies and measures: the policy it routes by, and the
acceptance its responses' `metrics.speculative_decoding` report. Those
gauges cover the tenants the gateway serves (configured, hence bounded),
at most `top_n` of them, none with tenant labels off.
"""

from __future__ import annotations

import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from contract.telemetry import acceptance_length

from .hot_metrics import HotCounter, HotHistogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_SPLICE_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2.5, 5, 10)
_AL_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0)
# Default half-life of the per-tenant acceptance-length gauge; the app passes
# `controller.half_life_s`, the controller's own acceptance window, so the
# gauge and the controller's estimate are one number.
ACCEPTANCE_HALF_LIFE_S = 300.0


class DecayedAcceptance:
    """Per-tenant acceptance length over recent responses: accepted draft
    tokens and verification steps, each decayed with the same half-life, so
    their ratio weighs a response by its steps and forgets old ones."""

    def __init__(self, half_life_s: float = ACCEPTANCE_HALF_LIFE_S, clock=time.monotonic) -> None:
        self.half_life_s = half_life_s
        self.clock = clock
        self._sums: dict[str, list[float]] = {}  # tenant -> [accepted, steps, at]

    def add(self, tenant: str, accepted: float, steps: float) -> None:
        now = self.clock()
        s = self._sums.get(tenant)
        if s is None:
            self._sums[tenant] = [accepted, steps, now]
            return
        decay = math.exp2(-(now - s[2]) / self.half_life_s)
        s[0] = s[0] * decay + accepted
        s[1] = s[1] * decay + steps
        s[2] = now

    def value(self, tenant: str) -> float | None:
        """`contract.telemetry.acceptance_length` of the decayed sums, None before any speculative response."""
        s = self._sums.get(tenant)
        return acceptance_length(s[0], s[1]) if s else None


class GatewayMetrics:
    def __init__(self, top_n: int = 20, tenant_labels: bool = True, acceptance_half_life_s: float = ACCEPTANCE_HALF_LIFE_S) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.top_n = top_n if tenant_labels else 0  # 0: every tenant is `other`
        self._tenants: set[str] = set()
        self._children: dict[tuple, object] = {}
        self.recent_acceptance = DecayedAcceptance(acceptance_half_life_s)
        r = self.registry
        # Registered in this order (the order /metrics and docs/operations.md list them).
        self._per_request(r)
        self._fleet(r)
        self._continuation(r)
        self._capture(r)
        self._tenant_state(r)
        self._budget_store(r)

    def _per_request(self, r: CollectorRegistry) -> None:
        """Updated on every request: plain-dict families (gateway.hot_metrics)."""
        self.requests = HotCounter("specgate_requests", "Requests finished by the gateway", ["tenant", "replica", "endpoint", "status"], r)
        self.latency = HotHistogram(
            "specgate_request_duration_seconds", "End-to-end request latency seen by the gateway", ["tenant", "replica", "status"], r,
            _LATENCY_BUCKETS,
        )
        self.overhead = HotHistogram(
            "specgate_gateway_overhead_seconds",
            "Latency the gateway adds (time in the gateway minus time waiting for the replica; "
            "for streams, up to the first byte)",
            ["endpoint", "stream"],
            r,
            _OVERHEAD_BUCKETS,
        )
        self.ttft = HotHistogram("specgate_upstream_ttft_seconds", "Replica time to first body byte", ["replica"], r, _LATENCY_BUCKETS)
        self.tokens = HotCounter("specgate_tokens", "Tokens accounted per tenant", ["tenant", "kind"], r)
        self.rejections = HotCounter("specgate_budget_rejections", "Requests denied by a tenant budget", ["tenant", "limit"], r)
        self.attempts = HotCounter("specgate_upstream_attempts", "Upstream attempts by outcome", ["replica", "outcome"], r)
        self.drafted = HotCounter("specgate_spec_draft_tokens", "Draft tokens proposed (per-request metrics)", ["tenant", "replica"], r)
        self.accepted = HotCounter("specgate_spec_accepted_tokens", "Draft tokens accepted (per-request metrics)", ["tenant", "replica"], r)
        self.spec_steps = HotCounter("specgate_spec_steps", "Verification steps (per-request metrics)", ["tenant", "replica"], r)
        self.acceptance_length = HotHistogram(
            "specgate_spec_acceptance_length", "Per-request mean acceptance length (tokens per verification step)", ["tenant", "replica"], r,
            _AL_BUCKETS,
        )

    def _fleet(self, r: CollectorRegistry) -> None:
        """Replicas and the instance; these and the rest change rarely: prometheus_client's own metrics."""
        self.replica_healthy = Gauge("specgate_replica_healthy", "1 if the replica is routable", ["replica", "profile"], registry=r)
        self.replica_inflight = Gauge("specgate_replica_inflight", "Requests the gateway has in flight", ["replica"], registry=r)
        self.replica_breaker_open = Gauge("specgate_replica_breaker_open", "1 while the circuit breaker is open", ["replica"], registry=r)
        self.policy_version = Gauge("specgate_policy_version", "Version of the speculation policy set in use", registry=r)
        self.overloaded = Counter(
            "specgate_overloaded", "Completion requests refused with 503 at the instance's in-flight cap", registry=r
        )
        self.ejections = Counter(
            "specgate_replica_ejections", "Replicas taken out of rotation by the gateway, by reason", ["replica", "reason"], registry=r
        )
        self.aborted = Counter(
            "specgate_requests_aborted", "Requests the gateway ended itself, by reason and outcome", ["reason", "outcome"], registry=r
        )

    def _continuation(self, r: CollectorRegistry) -> None:
        """Stream continuation (gateway.stream.splice)."""
        self.continuations = Counter(
            "specgate_continuations",
            "Streams broken after their first byte, by what the gateway did: continued (spliced from another "
            "replica), exhausted (max_continuations reached), unsupported (a request that cannot be continued "
            "exactly), failed (no replica could take the continuation)",
            ["outcome"],
            registry=r,
        )
        self.continuation_prefill = Counter(
            "specgate_continuation_prefill_tokens",
            "Prompt tokens the continuations re-prefilled (original prompt + tokens already sent); not billed",
            registry=r,
        )
        self.splice_latency = Histogram(
            "specgate_continuation_splice_seconds",
            "From a stream breaking to the continuation's first byte reaching the client",
            buckets=_SPLICE_BUCKETS,
            registry=r,
        )

    def _capture(self, r: CollectorRegistry) -> None:
        """The capture mirror (gateway.capture_mirror)."""
        self.capture_requests = Counter(
            "specgate_capture_requests",
            "Sampled requests of tenants that opted in to capture, by outcome: sent (the capture replica took it), "
            "failed (it answered an error, or not within capture.timeout_s), dropped_queue (the capture queue was "
            "full), dropped_budget (the tenant's max_per_hour was reached), too_long (over max_tokens_per_sample)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.capture_tokens = Counter(
            "specgate_capture_tokens", "Tokens (prompt + completion) of the captures the capture replica took", ["tenant"],
            registry=r,
        )
        self.capture_queue_depth = Gauge(
            "specgate_capture_queue_depth", "Captures waiting to be sent to the capture replica", registry=r
        )

    def _tenant_state(self, r: CollectorRegistry) -> None:
        """Per-tenant speculation state (set at scrape time: metrics_exposure.render)."""
        self.tenant_enabled = Gauge(
            "specgate_tenant_speculation_enabled",
            "1 while the tenant's policy in force on this gateway lets its requests speculate", ["tenant"], registry=r,
        )
        self.tenant_max_draft = Gauge(
            "specgate_tenant_speculation_max_draft",
            "Draft cap the gateway sends with the tenant's requests (0 = speculation off; -1 = no cap: the replica's "
            "whole draft block)", ["tenant"], registry=r,
        )
        self.tenant_acceptance_length = Gauge(
            "specgate_tenant_acceptance_length",
            "Acceptance length (tokens per verification step) of the tenant's recent responses on this gateway, from "
            "their metrics.speculative_decoding, decayed with controller.half_life_s (the controller's "
            "specgate_controller_tenant_acceptance_length over the same window); absent before the first speculative response",
            ["tenant"], registry=r,
        )

    def _budget_store(self, r: CollectorRegistry) -> None:
        """Budget store health (gateway.budget_guard)."""
        self.budget_store_up = Gauge("specgate_budget_store_up", "1 while the budget store answers budget calls", registry=r)
        self.budget_store_up.set(1)
        self.gateway_instances = Gauge(
            "specgate_gateway_instances", "Live gateway instances seen in the store's heartbeats (sizes the local budget share)", registry=r
        )
        self.budget_store_down_decisions = Counter(
            "specgate_budget_store_down_decisions",
            "Budget decisions taken while the budget store was down, by budget_failure_mode and outcome",
            ["mode", "outcome"],
            registry=r,
        )
        self.budget_writes_voided = Counter(
            "specgate_budget_writes_voided",
            "Budget writes that failed after they were sent (a timeout), voided when the store answered again; "
            "landed: whether the store had applied the write (it was then undone, not counted twice)",
            ["landed"],
            registry=r,
        )

    def tenant_label(self, tenant: str) -> str:
        """The tenant's label value: its id for the first `top_n` tenants seen,
        else `other` (always `other` with `metrics_tenant_labels: false`, so a
        scrape exposes no tenant ids)."""
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self.top_n:
            self._tenants.add(tenant)
            return tenant
        return "other"

    def tenant_gauge_ids(self, served: list[str]) -> list[str]:
        """The tenants with per-tenant speculation gauges: the served ones, at
        most `top_n` (none when tenant labels are off)."""
        return served[: self.top_n]

    def child(self, metric, *labels: str):
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def render(self) -> bytes:
        return generate_latest(self.registry)
