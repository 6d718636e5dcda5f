"""The simulator's policy hook: what a speculation controller can decide, and what it can see.

Why a hook: the controller under test must be the *same decision code* in the
simulator as in production.  In production it sees replica /metrics and
per-(tenant, replica) telemetry counters, and acts by routing and by the
per-request knobs ``specgate_max_draft`` / ``specgate_min_confidence``; the
hook gives it exactly those views and actions, in virtual time.

Hook API (implement both methods; ``BasePolicy`` gives no-op defaults)::

    class MyPolicy(BasePolicy):
        def admit(self, request: TraceRequest, view: ClusterView) -> Admission:
            # called once per request at arrival (virtual time view.now)
            return Admission(replica="spec-0", max_draft=4, min_confidence=0.3)
        def tick(self, view: ClusterView) -> None:
            # called every `tick_s` simulated seconds (default 1.0) with fresh measurements
            ...

* ``Admission.replica``: replica name, or None = least loaded (running+waiting)
  among the available replicas (not draining or restarting).  The knobs
  reach the replica as ``vllm_xargs`` (``Admission.vllm_xargs``: e.g. the
  gateway's ``contract.knobs.merged_xargs``; the fields ``max_draft`` /
  ``min_confidence`` / ``max_batch`` are shorthand for the same keys) and
  are parsed on the engine side by the lenient ``contract.knobs.parse_knobs``,
  as the vLLM plugin and the HTTP sim replica do.  ``max_draft`` None = the
  replica's profile decides;
  0 = no verified drafts for that request (the replica's drafter still runs
  batch-wide, so this is not free -- route to an ``off`` replica for that).
  ``min_confidence`` None = no cut; honoured only by ``-av`` replicas (the
  only ones that compute draft confidences), ignored elsewhere.
* ``ClusterView.replicas``: name -> ``ReplicaView`` (live, read-only):
  ``status`` ("ready", "draining", "down": see ``Simulation.restart_replica``),
  ``available``, ``advertised_knobs`` (what the replica lists in
  ``specgate_ext_info``), ``snapshot()`` (the ``VllmMetricsSnapshot`` a
  controller would parse from its /metrics; None while down), ``profile``, ``running``, ``waiting``, ``kv_usage``, ``mean_context``,
  ``counters`` (cumulative vLLM-style: num_drafts, num_draft_tokens,
  num_accepted_tokens, generation_tokens, prompt_tokens, steps, busy_s,
  iteration_tokens_sum, verified_draft_tokens), ``accepted_per_pos``,
  ``last_step_tokens``/``last_step_batch``/``last_step_s``, ``gauges``
  (DCGM_* from the cost model), and ``gpu``/``model`` specs for the cost model.
* ``ClusterView.tenant_counters``: (tenant, replica) -> cumulative counters of
  *finished* requests, exactly the gateway's (``contract.telemetry``:
  ``COUNTER_FIELDS``, added through ``increments_for`` of the request's
  ``RequestSpecStats``; ``spec_requests`` counts every request on a
  speculative replica, which reports ``metrics.speculative_decoding`` even
  when the request drafted nothing).  Policies differentiate counters
  themselves (as the controller does with the store's telemetry).
* ``attach(sim)``: called once by ``Simulation`` with itself, for policies that
  act beyond admission (``Simulation.restart_replica``); ``BasePolicy`` ignores it.

Built-ins: ``StaticPolicy`` (fixed knobs, optional per-tenant knobs/replicas,
least-loaded routing) and ``ModelOraclePolicy`` (knows each tenant's true
workload preset; picks the draft cap that maximises predicted goodput at the
replica's current batch -- an upper-bound reference, not deployable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from contract.knobs import MAX_BATCH_KEY, MAX_DRAFT_KEY, MIN_CONFIDENCE_KEY
from contract.vllm_metrics import VllmMetricsSnapshot

from .. import acceptance as acc
from .. import costmodel as cm
from ..vllm_ext.discovery import advertised_knobs

if TYPE_CHECKING:  # pragma: no cover
    from .engine import ReplicaEngine
    from .trace import TraceRequest

EXT_VERSION = "sim"  # specgate_ext_info's version label on simulated replicas


class SimulationHandle(Protocol):
    """What a policy may do to the simulation it runs in (`des.Simulation`),
    named here so that the policy API does not import the simulation."""

    @property
    def now(self) -> float: ...

    def replica_views(self) -> dict[str, "ReplicaView"]: ...

    def snapshot(self, name: str) -> VllmMetricsSnapshot | None: ...

    def restarting(self) -> set[str]: ...

    def submit(self, request: "TraceRequest", replica: str | None = None, vllm_xargs: dict | None = None) -> str: ...

    def restart_replica(self, name: str, profile: str, downtime_s: float) -> None: ...


@dataclass(frozen=True)
class Admission:
    replica: str | None = None
    max_draft: int | None = None
    min_confidence: float | None = None
    max_batch: int | None = None  # specgate_max_batch: no drafting in steps with more requests
    vllm_xargs: dict | None = None  # the request's vllm_xargs as sent to the replica

    def xargs(self) -> dict | None:
        """What the replica receives: ``vllm_xargs``, plus the shorthand fields for keys it lacks."""
        out = dict(self.vllm_xargs or {})
        for key, value in ((MAX_DRAFT_KEY, self.max_draft), (MIN_CONFIDENCE_KEY, self.min_confidence),
                           (MAX_BATCH_KEY, self.max_batch)):
            if value is not None:
                out.setdefault(key, value)
        return out or None


class ReplicaView:
    """Live read-only view of one simulated replica (``status`` is set by the simulator)."""

    __slots__ = ("_eng", "status")

    def __init__(self, engine: "ReplicaEngine", status: str = "ready"):
        self._eng = engine
        self.status = status  # "ready" | "draining" (no new requests) | "down" (restarting)

    name = property(lambda self: self._eng.config.name)
    profile = property(lambda self: self._eng.config.profile)
    profile_obj = property(lambda self: self._eng.profile)
    gpu = property(lambda self: self._eng.gpu)
    model = property(lambda self: self._eng.model)
    running = property(lambda self: self._eng.num_running)
    waiting = property(lambda self: self._eng.num_waiting)
    kv_usage = property(lambda self: self._eng.kv_usage)
    mean_context = property(lambda self: self._eng.mean_context())
    max_num_seqs = property(lambda self: self._eng.config.max_num_seqs)

    @property
    def available(self) -> bool:
        """Takes new requests (not draining for a restart, not down)."""
        return self.status == "ready"

    @property
    def load(self) -> int:
        return self._eng.num_running + self._eng.num_waiting

    @property
    def advertised_knobs(self) -> tuple[str, ...]:
        """The knobs this replica lists in ``specgate_ext_info`` (as the vLLM plugin would)."""
        prof = self._eng.profile
        return advertised_knobs(prof.method if prof.speculative else None, prof.adaptive)

    def snapshot(self) -> VllmMetricsSnapshot | None:
        """The /metrics snapshot a controller (or gateway) would parse from this replica; None while it is down."""
        if self.status == "down":
            return None
        c = self.counters
        speculative = self._eng.profile.speculative
        gauges = self.gauges
        return VllmMetricsSnapshot(
            num_requests_running=self.running,
            num_requests_waiting=self.waiting,
            kv_cache_usage_perc=self.kv_usage,
            spec_num_drafts=c["num_drafts"] if speculative else None,
            spec_num_draft_tokens=c["num_draft_tokens"] if speculative else None,
            spec_num_accepted_tokens=c["num_accepted_tokens"] if speculative else None,
            spec_accepted_per_pos={i: float(v) for i, v in enumerate(self.accepted_per_pos)} if speculative else {},
            iteration_tokens_sum=c["iteration_tokens_sum"],
            iteration_tokens_count=c["steps"],
            generation_tokens=c["generation_tokens"],
            prompt_tokens=c["prompt_tokens"],
            gpu_util=gauges.get("DCGM_FI_DEV_GPU_UTIL"),
            tensor_active=gauges.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
            dram_active=gauges.get("DCGM_FI_PROF_DRAM_ACTIVE"),
            ext_version=EXT_VERSION,
            ext_knobs=frozenset(self.advertised_knobs),
            ext_engine_fixes=self._eng.engine_fixes(),
            engine_steps=self._eng.counters.engine_steps(),
        )

    @property
    def counters(self) -> dict[str, float]:
        return self._eng.counters.snapshot()

    @property
    def accepted_per_pos(self) -> list[int]:
        return self._eng.counters.accepted_per_pos.tolist()

    @property
    def last_step_tokens(self) -> int:
        s = self._eng.last_step
        return s.num_tokens if s else 0

    @property
    def last_step_batch(self) -> int:
        s = self._eng.last_step
        return s.batch if s else 0

    @property
    def last_step_s(self) -> float:
        s = self._eng.last_step
        return s.duration_s if s else 0.0

    @property
    def gauges(self) -> dict[str, float]:
        return cm.dcgm_gauges(self._eng.last_cost, 1.0 if self._eng.has_work() else 0.0)


@dataclass
class ClusterView:
    now: float
    replicas: dict[str, ReplicaView]
    tenant_counters: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)

    def least_loaded(self, names: list[str] | None = None) -> str:
        """Least loaded of ``names`` (default: the available replicas, else all)."""
        names = names or [n for n, r in self.replicas.items() if r.available] or list(self.replicas)
        cands = [self.replicas[n] for n in names]
        return min(cands, key=lambda r: (r.load / max(r.max_num_seqs, 1), r.name)).name


class Policy(Protocol):
    def admit(self, request: "TraceRequest", view: ClusterView) -> Admission: ...

    def tick(self, view: ClusterView) -> None: ...


class BasePolicy:
    """No-op policy: least-loaded routing, replica profiles decide speculation."""

    name = "base"

    def attach(self, sim: SimulationHandle) -> None:
        """Called once by the simulation it runs in (for policies that restart replicas)."""
        return None

    def admit(self, request: "TraceRequest", view: ClusterView) -> Admission:
        return Admission()

    def tick(self, view: ClusterView) -> None:
        return None


class StaticPolicy(BasePolicy):
    """Fixed knobs (global or per tenant) and optional tenant -> replica pinning (list = least loaded of)."""

    def __init__(self, max_draft: int | None = None, min_confidence: float | None = None,
                 per_tenant: dict[str, tuple[int | None, float | None]] | None = None,
                 replicas_by_tenant: dict[str, list[str]] | None = None, name: str = "static"):
        self.max_draft, self.min_confidence = max_draft, min_confidence
        self.per_tenant = per_tenant or {}
        self.replicas_by_tenant = replicas_by_tenant or {}
        self.name = name

    def admit(self, request: "TraceRequest", view: ClusterView) -> Admission:
        md, mc = self.per_tenant.get(request.tenant, (self.max_draft, self.min_confidence))
        names = self.replicas_by_tenant.get(request.tenant) or self.replicas_by_tenant.get("*")
        return Admission(replica=view.least_loaded(names), max_draft=md, min_confidence=mc)


class ModelOraclePolicy(BasePolicy):
    """Reference 'oracle': true workload presets + cost model, per-request best draft cap.

    For each replica, with batch B = its load + 1 and its mean context, it
    evaluates caps k in {0, 1, 2, 3, 4, 6, 8, ..., block} assuming the batch
    drafts like this request, and picks the (replica, k) with the highest
    predicted goodput per request.  Not deployable (it knows acceptance in
    advance); it bounds what a controller could reach on DSpark replicas (it
    prices every replica with ``drafters.acceptance`` and the drafter's pass,
    so it is no bound on ngram ones).
    """

    name = "oracle"

    def admit(self, request: "TraceRequest", view: ClusterView) -> Admission:
        best = (-1.0, None, None)
        for r in view.replicas.values():
            b = max(1, min(r.load + 1, r.max_num_seqs))
            ctx = r.mean_context or 500.0
            block = r.profile_obj.block_size
            preset = acc.get_preset(request.workload)
            # on a speculative replica the drafter runs for the whole batch even when this request has k=0
            d0 = cm.drafter_time_s(r.gpu, r.model, b, block, ctx) if block else 0.0
            base = 1.0 / (d0 + cm.step_time_s(r.gpu, r.model, b, b, ctx))
            cand = (base * (1.0 - 0.05 * r.waiting / max(r.max_num_seqs, 1)), r.name, 0)
            for k in sorted({k for k in (1, 2, 3, 4, 6, 8, 12, 16) if k <= block} | ({block} if block else set())):
                tau = acc.expected_tokens_per_step(preset, k)
                g = tau / cm.spec_step_time_s(r.gpu, r.model, b, k, ctx)
                g *= (1.0 - 0.05 * r.waiting / max(r.max_num_seqs, 1))
                if g > cand[0]:
                    cand = (g, r.name, k)
            if cand[0] > best[0]:
                best = cand
        return Admission(replica=best[1], max_draft=best[2])


__all__ = ["Admission", "ReplicaView", "ClusterView", "Policy", "BasePolicy", "StaticPolicy", "ModelOraclePolicy"]
