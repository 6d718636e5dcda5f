"""Prometheus metrics of one gateway app (`specgate_` prefix, own registry).

Each app gets its own CollectorRegistry so several gateway apps can live in
one process (tests, embedded stacks) without clashing. Tenant labels are
bounded: the first `top_n` tenants seen get their own label value, the rest
are reported as `other` (all of them with `tenant_labels=False`, so a scrape
names no tenant). Label children are cached because `.labels()` is a
measurable share of the per-request budget.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_SPLICE_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2.5, 5, 10)
_AL_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 17.0)


class GatewayMetrics:
    def __init__(self, top_n: int = 20, tenant_labels: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.top_n = top_n if tenant_labels else 0  # 0: every tenant is `other`
        self._tenants: set[str] = set()
        r = self.registry
        self.requests = Counter(
            "specgate_requests", "Requests finished by the gateway", ["tenant", "replica", "endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "specgate_request_duration_seconds",
            "End-to-end request latency seen by the gateway",
            ["tenant", "replica", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "specgate_gateway_overhead_seconds",
            "Latency the gateway adds (time in the gateway minus time waiting for the replica; "
            "for streams, up to the first byte)",
            ["endpoint", "stream"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "specgate_upstream_ttft_seconds", "Replica time to first body byte", ["replica"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokens = Counter("specgate_tokens", "Tokens accounted per tenant", ["tenant", "kind"], registry=r)
        self.rejections = Counter("specgate_budget_rejections", "Requests denied by a tenant budget", ["tenant", "limit"], registry=r)
        self.attempts = Counter("specgate_upstream_attempts", "Upstream attempts by outcome", ["replica", "outcome"], registry=r)
        self.drafted = Counter("specgate_spec_draft_tokens", "Draft tokens proposed (per-request metrics)", ["tenant", "replica"], registry=r)
        self.accepted = Counter("specgate_spec_accepted_tokens", "Draft tokens accepted (per-request metrics)", ["tenant", "replica"], registry=r)
        self.spec_steps = Counter("specgate_spec_steps", "Verification steps (per-request metrics)", ["tenant", "replica"], registry=r)
        self.acceptance_length = Histogram(
            "specgate_spec_acceptance_length",
            "Per-request mean acceptance length (tokens per verification step)",
            ["tenant", "replica"],
            buckets=_AL_BUCKETS,
            registry=r,
        )
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
        # -- stream continuation (gateway.splice) --
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
        self._children: dict[tuple, object] = {}
        # -- budget store health (gateway.budget_guard) --
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

    def child(self, metric, *labels: str):
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def render(self) -> bytes:
        return generate_latest(self.registry)
