"""specgate's one settings tree: `SPECGATE_*` environment variables plus an
optional YAML file (`SPECGATE_CONFIG=path` or `--config path`).

    replicas, tenants, admin_key, redis_url, redis_prefix, log_level   shared
    gateway:     the data plane (timeouts, failover, health, routing, budgets, tracing)
    controller:  the control plane (tick, leadership, cost model)
      decision:      the pure decision's margins, hysteresis and grids (and the fleet drafter)
      restart_gate:  when a recommended profile change pays back a restart, and who applies it
    sim:         simulated replicas (`specgate up`, `specgate sim-replica`)

Every default is stated once, here. Nested settings are reached from the
environment with `__` (`SPECGATE_GATEWAY__READ_TIMEOUT_S=60`,
`SPECGATE_CONTROLLER__DECISION__MIN_DWELL_S=10`) and from YAML as nested
mappings. Precedence (highest first): explicit keyword arguments, the
environment, the YAML file, defaults. docs/configuration.md is generated
from this module (`specgate config-doc`) and a test keeps the two equal.

Invalid configuration fails at start-up with `ConfigError`, whose message
names every offending field by its dotted path (`tenants.1.requests_per_minute:
...`), because a process that starts with a half-understood config silently
misroutes or unlimits tenants. Replica profiles are parsed by the one label
parser (`contract.profiles`), so the gateway and the controller reject an
unsupported profile alike.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .knobs import schedule_problem
from .policy import SpeculationPolicy
from .capture import CaptureTarget
from .profiles import DRAFTER_METHODS, LABEL_PATTERNS, parse_profile

# The cost-model preset every part falls back to (drafters.costmodel names).
DEFAULT_GPU = "h200"
DEFAULT_MODEL = "qwen3-8b"


class ConfigError(ValueError):
    """Start-up configuration is invalid; the message names the fields."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaConfig(_Strict):
    """One vLLM replica. `model` None = learn the served model(s) from its /v1/models."""

    url: str
    name: str | None = None
    model: str | None = None
    profile: str | None = Field(
        default=None, description=f"speculation profile label: {LABEL_PATTERNS}"
    )
    drafter: str | None = Field(
        default=None,
        min_length=1,
        description="id of a tenant-specialized drafter this replica serves (drafters/training): it then serves only "
        "the tenants whose policy names that drafter (promoted or canary); None = the fleet's shared drafter",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
        return value.rstrip("/")

    @field_validator("profile", mode="before")
    @classmethod
    def _profile(cls, value: Any) -> str | None:
        if value is None:
            return None
        if value is False:  # YAML reads an unquoted `off` as false
            return "off"
        return parse_profile(value).label  # ValueError names the accepted labels

    @model_validator(mode="after")
    def _default_name(self) -> "ReplicaConfig":
        if not self.name:
            parts = urlsplit(self.url)
            self.name = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        return self


class TenantConfig(_Strict):
    """A tenant. Only the SHA-256 of its API key is stored (`specgate hash-key` prints it)."""

    id: str = Field(min_length=1)
    api_key_sha256: str
    requests_per_minute: int = Field(default=0, ge=0, description="0 = unlimited")
    tokens_per_minute: int = Field(default=0, ge=0, description="prompt + completion tokens; 0 = unlimited")
    tpot_target_ms: float | None = Field(default=None, gt=0)
    speculation: SpeculationPolicy | None = Field(
        default=None, description="config default speculation policy (the controller's policy overrides it)"
    )

    @field_validator("api_key_sha256")
    @classmethod
    def _hash(cls, value: str) -> str:
        value = value.strip().lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("must be the 64-hex-digit SHA-256 of the API key, not the key itself")
        return value


class TracingConfig(_Strict):
    enabled: bool = False
    exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = None
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0, description="share of new traces recorded (parent decision wins)")
    service_name: str = "specgate-gateway"


# Below vLLM's own 5 s keep-alive (see GatewaySettings.upstream_keepalive_s).
UPSTREAM_KEEPALIVE_S = 4.0


class GatewaySettings(_Strict):
    """The data plane."""

    allow_anonymous: bool = Field(
        default=True,
        description="with NO tenants configured, serve every caller as tenant 'anonymous' (like vLLM without --api-key); "
        "ignored as soon as one tenant is configured",
    )
    # Upstream timeouts (seconds). They are backstops: a replica that stops
    # making progress is caught sooner by `wedge_after_s`. Before the first
    # byte reaches the client a timed-out attempt fails over.
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_byte_timeout_s: float = Field(
        default=30.0, gt=0, description="streams: until the replica's response headers (vLLM sends them before queueing and prefill)"
    )
    response_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="non-streaming: until the whole response (its headers come with its end, so a long completion is not a hang)",
    )
    read_timeout_s: float = Field(default=120.0, gt=0, description="max gap between upstream body chunks")
    wedge_after_s: float = Field(
        default=3.0,
        gt=0,
        description="a replica that answers neither /health nor /metrics, or whose token counters stand still while it has "
        "running requests, this long is taken out of rotation: requests it has not answered yet are retried elsewhere",
    )
    # Client-side limits (one hostile client must not stall the instance).
    max_header_bytes: int = Field(
        default=60 * 1024, ge=1024, description="request line + headers; larger -> 431 (Envoy's max_request_headers_kb is 60)"
    )
    header_timeout_s: float = Field(default=10.0, gt=0, description="complete request headers within this, else 408 and closed")
    body_timeout_s: float = Field(default=30.0, gt=0, description="the whole request body within this after its headers, else 408")
    max_connections: int = Field(
        default=4096, ge=1,
        description="open client connections per instance; at it a new one takes the slot of the kept-alive connection idle "
                    "longest, or, with none idle, is closed at once (503)",
    )
    keep_alive_timeout_s: float = Field(
        default=75.0, gt=0,
        description="an idle kept-alive client connection is closed after this long; keep it above the idle timeout of "
                    "whatever pools connections to the gateway (AWS ALB, ingress-nginx: 60 s; the OpenAI SDK: 5 s), or "
                    "the gateway can close a connection as a request is sent on it (a 502 at the load balancer)",
    )
    max_inflight_requests: int = Field(
        default=2048, ge=1, description="completion requests in progress per instance; beyond it 503 + Retry-After"
    )
    # Drain on SIGTERM (pre + deadline stays below Kubernetes' 30 s grace period).
    drain_pre_s: float = Field(
        default=5.0, ge=0, description="after SIGTERM /ready answers 503 and the listener still accepts this long, so load balancers stop sending"
    )
    drain_deadline_s: float = Field(
        default=20.0, gt=0, description="then in-flight requests get this long; streams still open end with an SSE error event and [DONE]"
    )
    # Resilience.
    max_attempts: int = Field(default=3, ge=1, le=10, description="attempts across replicas before the first byte")
    max_continuations: int = Field(
        default=2,
        ge=0,
        le=10,
        description="times a stream broken after its first byte is continued on another replica (token-exact, from "
        "the token ids already sent); 0: such a stream ends with an SSE error event",
    )
    retry_backoff_base_s: float = Field(default=0.05, ge=0)
    retry_backoff_max_s: float = Field(default=1.0, ge=0)
    breaker_failures: int = Field(default=5, ge=1, description="consecutive failures that open a replica's breaker")
    breaker_open_s: float = Field(default=30.0, gt=0)
    # Health and load.
    health_interval_s: float = Field(default=2.0, gt=0, description="liveness checks (/health, /v1/models)")
    health_unhealthy_interval_s: float = Field(
        default=0.5, gt=0, description="an unhealthy replica is checked this often instead, so a restarted one is back within it (Envoy's unhealthy_interval)"
    )
    health_timeout_s: float = Field(default=2.0, gt=0)
    health_fail_threshold: int = Field(default=3, ge=1)
    health_success_threshold: int = Field(
        default=1, ge=1, description="consecutive good checks that put an unhealthy replica back (a good check also closes its breaker)"
    )
    metrics_interval_s: float = Field(
        default=1.0, gt=0, description="replica /metrics scrape (routing load; also the embedded controller's input)"
    )
    policy_poll_s: float = Field(default=1.0, gt=0, description="policy version poll (pub/sub is the fast path)")
    # Routing.
    routing: Literal["least_load", "prefix_affinity", "session_affinity"] = "least_load"
    session_header: str = "x-session-id"
    prefix_chars: int = Field(default=256, ge=16)
    # Admission.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    default_max_tokens: int = Field(default=256, ge=1, description="completion estimate when max_tokens is absent")
    budget_window_s: int = Field(default=60, ge=1)
    budget_lease_fraction: float = Field(
        default=0.01,
        ge=0,
        le=0.25,
        description="largest share of a tenant's per-minute limits one instance may pre-reserve in Redis and admit from "
        "locally (0 = a Redis round trip for every request); tenants whose limits are too small to lease are decided per request",
    )
    budget_lease_s: float = Field(default=1.0, gt=0, le=10, description="a budget lease covers about this much traffic and is returned after this long unused")
    budget_failure_mode: Literal["deny", "allow", "local"] = Field(
        default="local",
        description="while the budget store is down: deny budgeted tenants (503), allow them unmetered, or enforce each "
        "instance's share of every limit locally (limit / live instances) and reconcile when the store returns",
    )
    budget_store_timeout_s: float = Field(default=0.5, gt=0, description="one budget store call; past it the store counts as down")
    budget_store_retry_s: float = Field(
        default=2.0, gt=0, description="after a store failure budget calls fail fast this long, then one call probes it"
    )
    instance_heartbeat_s: float = Field(
        default=2.0, gt=0, description="each instance's heartbeat in the store (live instances size the local budget share)"
    )
    # Observability.
    metrics_top_tenants: int = Field(default=20, ge=1, description="tenants with their own metric label; the rest are 'other'")
    metrics_tenant_labels: bool = Field(default=True, description="false: every tenant is labelled 'other' on /metrics (no tenant ids exposed)")
    metrics_token: str | None = Field(default=None, description="bearer token /metrics requires (None: open, as Prometheus scrapes expect)")
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="serve /metrics on this separate (internal) port instead of the main listener"
    )
    docs: bool = Field(default=True, description="serve /docs (Swagger UI) beside /openapi.json")
    telemetry_flush_s: float = Field(default=0.5, gt=0, description="how often per-request telemetry is flushed to the store")
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    access_log: bool = Field(default=False, description="one JSON line per request (never keys or prompts)")
    # Upstream HTTP client.
    upstream_pool_size: int = Field(default=256, ge=1)
    upstream_client: Literal["aiohttp", "httpx"] = "aiohttp"
    upstream_keepalive_s: float = Field(
        default=UPSTREAM_KEEPALIVE_S, gt=0,
        description="idle upstream connections are dropped after this long; keep it below the replicas' own "
                    "keep-alive (vLLM's uvicorn: 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE), or a request can be sent on a "
                    "connection the replica is closing, fail and wait out a retry backoff",
    )
    # Drafter training data (contract.capture): where opted-in tenants' requests are mirrored.
    capture: CaptureTarget = Field(default_factory=CaptureTarget)


class DrafterSettings(_Strict):
    """The drafter checkpoint every replica can load when the fleet plan restarts it.

    Why: a fleet-plan restart must never ask for a profile the replica cannot
    serve. vLLM refuses a profile that drafts more tokens than its checkpoint
    proposes (drafters/checkpoint.py), and an `off` replica has no drafter at
    all. Unset (the default), the plan re-profiles a drafting replica only
    within what its own profile proves about its checkpoint (same method, a
    draft no longer than today's) and never turns an `off` replica into a
    drafting one. Set it when every replica (on Kubernetes: every pool) can
    load this checkpoint; `specgate checkpoint validate` prints its
    `speculative_tokens`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str | None = Field(
        default=None, description=f"the checkpoint's speculation method ({', '.join(sorted(DRAFTER_METHODS))}); null = no fleet-wide drafter"
    )
    speculative_tokens: int | None = Field(
        default=None, ge=1, description="draft tokens the checkpoint proposes per step; profiles drafting more are never recommended"
    )

    @field_validator("method")
    @classmethod
    def _method(cls, value: str | None) -> str | None:
        if value is not None and value not in DRAFTER_METHODS:
            raise ValueError(f"must be a drafter method ({', '.join(sorted(DRAFTER_METHODS))}); "
                             "ngram needs no checkpoint, off drafts nothing")
        return value

    @model_validator(mode="after")
    def _pair(self) -> "DrafterSettings":
        if (self.method is None) != (self.speculative_tokens is None):
            raise ValueError("method and speculative_tokens describe one checkpoint together: set both or neither")
        return self


class DecisionSettings(_Strict):
    """The pure decision's margins, hysteresis and search grids (controller/decision)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    draft_caps: tuple[int, ...] = Field(default=(2, 4, 8, 16), description="per-request draft caps the optimizer tries")
    on_margin: float = Field(default=0.05, ge=0, description="predicted gain needed to turn speculation on")
    off_margin: float = Field(default=0.03, ge=0, description="predicted gain of 'off' needed to turn speculation off")
    keep_margin: float = Field(
        default=0.02, ge=0,
        description="a drafting tenant whose best drafting cap gains it less than this over off turns off "
        "(a near-tie is resolved for off; never above on_margin; not on thin evidence, an SLO's or an admin's cap)",
    )
    retune_margin: float = Field(
        default=0.05, ge=0,
        description="predicted gain needed to change the draft cap, or a drafting tenant's schedule where it acts now",
    )
    strong_margin: float = Field(default=0.15, ge=0, description="a gain this large acts after strong_ticks, bypassing dwell")
    confirm_ticks: int = Field(default=3, ge=1, description="consecutive ticks a change must win before it is made")
    min_dwell_s: float = Field(default=30.0, ge=0, description="seconds a policy stays before a normal change")
    slo_budget: float = Field(default=0.10, ge=0, description="share of a TPOT target kept as headroom")
    large_draft: int = Field(default=8, ge=1, description="drafts longer than this only while rho < large_draft_rho")
    large_draft_rho: float = Field(default=0.5, ge=0)
    theta_step: float = Field(default=0.05, gt=0, description="confidence floors are published on this grid")
    theta_max: float = Field(default=0.9, ge=0, le=1)
    theta_min_change: float = Field(default=0.2, ge=0, description="re-publish a floor only when it moves this much (or k changes)")
    theta_min_gain: float = Field(default=0.01, description="publish a floor only when it beats no floor by this much (predicted; negative = always)")
    thin_evidence_steps: float = Field(default=200.0, ge=0, description="below this many effective steps, margins widen")
    thin_extra_margin: float = Field(default=0.05, ge=0)
    min_batch: float = Field(default=1.0, gt=0)
    plan_margin: float = Field(default=0.02, ge=0, description="predicted gain per converted replica before the fleet plan recommends a profile")
    drafter: DrafterSettings = Field(
        default_factory=DrafterSettings,
        description="the drafter checkpoint every replica can load on a restart (fleet plan safety)",
    )
    plan_configured_profiles_only: bool = Field(
        default=False,
        description="recommend only profiles some configured replica runs (on Kubernetes: the pools that exist); "
        "false: any profile the replica's drafter can serve (a restart may change its launch arguments)",
    )
    strong_ticks: int = Field(default=2, ge=1, description="consecutive strong ticks that bypass smoothing (and, to turn off, dwell)")
    smoothing: float = Field(default=0.2, gt=0, le=1, description="EMA weight of the newest tick in the candidates' relative goodput")
    max_batch_grid: tuple[int, ...] | None = Field(
        default=(4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
        description="grid of the per-tenant load threshold (specgate_max_batch); null disables it",
    )
    schedule_grid: tuple[int, ...] | None = Field(
        default=(1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
        description="batch sizes of the per-tenant batch -> draft-length schedule (specgate_schedule); "
        "null: no schedules, one cap per tenant",
    )
    explore_share: float = Field(
        default=0.05, ge=0, le=0.5,
        description="share of a non-drafting tenant's requests that draft while its evidence is thin (exploration; 0: never)",
    )
    explore_evidence_steps: float = Field(
        default=200.0, ge=0,
        description="a non-drafting tenant explores while its acceptance estimate rests on fewer speculation "
        "steps than this (decayed: they fade while it does not draft)",
    )
    holdout_share: float = Field(
        default=0.0, ge=0, le=0.5,
        description="share of a drafting tenant's requests that do not draft, to measure its gain (0: no hold-out)",
    )
    schedule_dwell_s: float = Field(
        default=60.0, ge=0,
        description="seconds after a tenant's last policy change before a changed schedule replaces the one in "
        "force (at once when the tenant turns on or off, an admin pins it, or it gains strong_margin where it acts now; "
        "past it where it gains retune_margin where it acts now, or strong_margin at any one batch)",
    )

    placement: bool = Field(
        default=False,
        description="place tenants apart on the speculative replicas (SpeculationPolicy.placement) where the model "
        "prices one group per set of replicas above the tenants sharing every step; off by default: in simulation "
        "the model priced placements the simulator did not reward (docs/controller.md, Tenants placed apart)",
    )
    placement_margin: float = Field(
        default=0.05, ge=0,
        description="predicted fleet gain a placement (tenants apart, or back together) needs over the one in force",
    )
    placement_dwell_s: float = Field(
        default=60.0, ge=0,
        description="seconds a placement stays before another replaces it (a placement whose replicas are gone "
        "ends at once)",
    )

    @field_validator("schedule_grid")
    @classmethod
    def _grid_fits_a_schedule(cls, grid: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Every published schedule must pass the knobs' own rules (contract.knobs), or
        every tick's policy would fail to validate."""
        if grid is None:
            return None
        problem = schedule_problem([(b, 0) for b in sorted(set(grid))])
        if problem:
            raise ValueError(f"schedule_grid: {problem.replace('pairs', 'entries').replace('pair', 'entry')}")
        return grid


class KubernetesActuatorSettings(_Strict):
    """Where the `kubernetes` fleet actuator scales the per-profile pools (controller/kube_scaling.py).

    Each profile's pool is a StatefulSet `<pool_prefix><profile>` (`vllm-dspark-b8`,
    `vllm-off`) whose pods are the replicas `<pool_prefix><profile>-<ordinal>`."""

    namespace: str | None = Field(
        default=None,
        description="namespace of the pools; null = the pod's service-account namespace, else the kubeconfig context's",
    )
    pool_prefix: str = Field(default="vllm-", min_length=1, description="a profile's pool is the StatefulSet named this prefix + the profile label (vllm-dspark-b8)")
    request_timeout_s: float = Field(default=10.0, gt=0, description="one Kubernetes API call")
    converge_timeout_s: float = Field(
        default=900.0, gt=0, description="a scaled pool not ready within this stops holding the gate (and is reported)"
    )


class RestartGateSettings(_Strict):
    """When a recommended profile change pays back its restart (controller/actuation.py PlanGate),
    and what carries the restart out (`actuator`)."""

    restart_s: float = Field(default=30.0, gt=0, description="a replica's downtime for one restart")
    payback: float = Field(default=1.0, gt=0, description="multiple of the downtime the streak's credit must reach, each way: "
                           "the restart and the one back when the regime ends")
    min_gain: float = Field(default=1.05, ge=1, description="mean predicted gain over the streak")
    min_interval_s: float = Field(default=120.0, ge=0, description="no replica restarted again within this")
    min_confirm_s: float = Field(default=30.0, ge=0, description="shortest streak that may trigger a restart")
    min_loss: float = Field(default=0.8, ge=0, le=1, description="floor of the downtime's charged share of goodput")
    grace_s: float = Field(default=15.0, ge=0, description="dips shorter than this do not end a streak")
    actuator: Literal["recommend", "kubernetes"] = Field(
        default="recommend",
        description="recommend: publish the restart the gate would make (/admin/fleet-plan), change nothing; "
        "kubernetes: scale the per-profile StatefulSets (restart_gate.kubernetes)",
    )
    kubernetes: KubernetesActuatorSettings = Field(default_factory=KubernetesActuatorSettings)


class RolloutSettings(_Strict):
    """When a tenant's candidate drafter (a canary, contract.policy.CanarySpec) is
    promoted or rolled back (controller/decision/rollout.py)."""

    enabled: bool = Field(default=True, description="start canaries for new tenant drafters and decide them")
    share: float = Field(default=0.25, gt=0, lt=1, description="share of the tenant's requests the candidate gets")
    min_requests: int = Field(default=30, ge=2, description="finished drafting requests per arm before any verdict")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="one-sided confidence of the acceptance comparison")
    min_gain: float = Field(default=0.0, ge=0, description="acceptance length the candidate must gain over the incumbent to be promoted")
    max_goodput_loss: float = Field(
        default=0.10, ge=0, le=1, description="promotion also needs the candidate's tokens/s per request within this share of the incumbent's"
    )
    max_duration_s: float = Field(default=3600.0, gt=0, description="a canary still undecided after this is rolled back")


class TrainingSettings(_Strict):
    """Controller-triggered drafter training (controller/training.py): when an
    opted-in tenant has captured enough new samples, the leader runs
    `specgate drafter train` for it where the capture store is mounted. Off by
    default: it needs the store, the target's weights and an interpreter with
    torch on the controller's host."""

    enabled: bool = Field(default=False, description="train tenants' drafters when enough new samples were captured")
    store_root: str = Field(default="/dev/shm/specgate-capture", description="the capture store the capture replica writes: a directory or mooncake://MASTER/NS?index=redis://... (drafters.capture.backends.open_store)")
    target: str = Field(default="", description="target model directory the trainer reads (required when enabled)")
    out_root: str = Field(default="/var/lib/specgate/drafters", description="checkpoints go to OUT_ROOT/<tenant>-<job id>")
    init_from: str | None = Field(default=None, description="the fleet drafter's checkpoint: warm start of a tenant's first drafter")
    python: str | None = Field(default=None, description="interpreter with torch + speculators (default: SPECGATE_VLLM_VENV or .venv-vllm)")
    min_new_samples: int = Field(default=200, ge=1, description="samples captured since the tenant's last job before another one")
    min_interval_s: float = Field(default=6 * 3600.0, ge=0, description="seconds between two jobs of one tenant")
    max_minutes: float = Field(default=30.0, gt=0, description="training wall time per job")
    max_steps: int = Field(default=300, ge=1, description="optimizer steps per job")
    train_args: list[str] = Field(default_factory=list, description="more `specgate drafter train` flags (e.g. --loss ce --lr 1e-2)")

    @model_validator(mode="after")
    def _target_when_enabled(self) -> "TrainingSettings":
        if self.enabled and not self.target:
            raise ValueError("controller.training.target: the target model directory is required when training is enabled")
        return self


class ControllerSettings(_Strict):
    """The control plane."""

    tick_s: float = Field(default=1.0, gt=0, description="seconds between decisions")
    lock_ttl_s: float | None = Field(default=None, gt=0, description="leader lock TTL; default 3 ticks (min 1 s)")
    instance_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        description="this instance's leader-lock identity (default host-pid-random)",
    )
    gpu: str | None = Field(
        default=None,
        description="optional step-cost prior: GPU preset (drafters.costmodel: h100, h200, ...); the curve is learned from each replica's /metrics either way",
    )
    model: str | None = Field(
        default=None, description="optional step-cost prior: target preset (qwen3-8b, qwen3-14b, ...); used with gpu"
    )
    scrape_timeout_s: float = Field(default=1.0, gt=0, description="standalone controller's replica /metrics timeout")
    dcgm_url: str | None = Field(default=None, description="dcgm-exporter base URL whose gauges overlay every replica")
    half_life_s: float = Field(default=300.0, gt=0, description="half-life of the per-tenant acceptance estimates")
    step_cost_half_life_s: float = Field(
        default=300.0, gt=0, description="half-life of the evidence behind each replica's learned step-time curve"
    )
    top_tenants: int = Field(default=20, ge=1, description="tenants with their own controller metric label")
    unhealthy_after_failures: int = Field(default=3, ge=1, description="consecutive failed scrapes that mark a replica unhealthy")
    decision: DecisionSettings = Field(default_factory=DecisionSettings)
    restart_gate: RestartGateSettings = Field(default_factory=RestartGateSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)

    @model_validator(mode="after")
    def _prior_pair(self) -> "ControllerSettings":
        if (self.gpu is None) != (self.model is None):
            raise ValueError("controller.gpu and controller.model name one step-cost prior together: set both or neither")
        return self

    @property
    def ttl_s(self) -> float:
        return self.lock_ttl_s or max(1.0, 3 * self.tick_s)


class SimSettings(_Strict):
    """Simulated replicas (drafters/sim): the defaults of `specgate sim-replica` and of `specgate up`'s fleet."""

    gpu: str = Field(default=DEFAULT_GPU, description="simulated GPU preset")
    model: str = Field(default=DEFAULT_MODEL, description="simulated target preset")
    time_scale: float = Field(default=1.0, gt=0, description="wall seconds per simulated second (2.0 = twice as slow)")
    default_workload: str = Field(default="chat", description="workload of requests that name none")
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    max_model_len: int = Field(default=32768, ge=1)
    default_output_mean: float = Field(default=200.0, gt=0, description="natural output length (lognormal mean) when max_tokens does not pin it")
    seed: int = 0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECGATE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    replicas: list[ReplicaConfig] = Field(default_factory=list)
    tenants: list[TenantConfig] = Field(default_factory=list)
    admin_key: str | None = Field(default=None, description="bearer key for /admin; None closes the admin API")
    redis_url: str | None = Field(default=None, description="None -> embedded in-memory store (one process)")
    redis_prefix: str = "specgate:"
    log_level: str = "INFO"
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    sim: SimSettings = Field(default_factory=SimSettings)

    @model_validator(mode="after")
    def _unique(self) -> "Settings":
        names = [r.name for r in self.replicas]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"replica names must be unique, duplicated: {sorted(dup)}")
        ids = [t.id for t in self.tenants]
        if len(set(ids)) != len(ids):
            raise ValueError("tenant ids must be unique")
        hashes = [t.api_key_sha256 for t in self.tenants]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two tenants share one api_key_sha256")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML named by SPECGATE_CONFIG (set by `--config`)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("SPECGATE_CONFIG")
        if not path:
            return {}
        return read_yaml(path)


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of setting names")
    return data


def _yaml_bool_hint(err: Any) -> str | None:
    """Why a text setting got a boolean: YAML 1.1 (PyYAML) reads unquoted
    off/no/false as false and on/yes/true as true, so `profile: off` arrives
    as False and the error alone ('Input should be a valid string') does not
    say why. Only where a boolean was not wanted (a bool field takes it)."""
    value = err.get("input")
    if not isinstance(value, bool) or err["type"] in ("bool_type", "bool_parsing"):
        return None
    field = next((str(p) for p in reversed(err["loc"]) if isinstance(p, str)), "the setting")
    if value:
        return f'YAML reads unquoted on, yes and true as the boolean true: quote the value you meant, {field}: "..."'
    return f'YAML reads unquoted off, no and false as the boolean false: write {field}: "off"'


def describe_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (check the spelling and the section: gateway, controller, controller.decision, sim)"
        hint = _yaml_bool_hint(err)
        lines.append(f"  {loc}: {msg}" + (f" ({hint})" if hint else ""))
    return "invalid specgate configuration:\n" + "\n".join(lines)


def load_settings(config_path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from env + YAML (+ overrides); raise ConfigError naming bad fields."""
    old = os.environ.get("SPECGATE_CONFIG")
    try:
        if config_path is not None:
            os.environ["SPECGATE_CONFIG"] = str(config_path)
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc)) from None
    finally:
        if config_path is not None:
            if old is None:
                os.environ.pop("SPECGATE_CONFIG", None)
            else:
                os.environ["SPECGATE_CONFIG"] = old


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()
