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
  among all replicas.  ``max_draft`` None = the replica's profile decides;
  0 = no verified drafts for that request (the replica's drafter still runs
  batch-wide, so this is not free -- route to an ``off`` replica for that).
  ``min_confidence`` None = no cut; honoured only by ``-av`` replicas (the
  only ones that compute draft confidences), ignored elsewhere.
* ``ClusterView.replicas``: name -> ``ReplicaView`` (live, read-only):
  ``profile``, ``running``, ``waiting``, ``kv_usage``, ``mean_context``,
  ``counters`` (cumulative vLLM-style: num_drafts, num_draft_tokens,
  num_accepted_tokens, generation_tokens, prompt_tokens, steps, busy_s,
  iteration_tokens_sum, verified_draft_tokens), ``accepted_per_pos``,
  ``last_step_tokens``/``last_step_batch``/``last_step_s``, ``gauges``
  (DCGM_* from the cost model), and ``gpu``/``model`` specs for the cost model.
* ``ClusterView.tenant_counters``: (tenant, replica) -> cumulative counters of
  *finished* requests with the field names of ``gateway.spec_telemetry``
  (requests, prompt_tokens, completion_tokens, spec_requests, num_spec_steps,
  num_draft_tokens, num_accepted_draft_tokens) plus ttft_sum_s, tpot_sum_s,
  tpot_count.  Policies differentiate counters themselves (as the controller
  does with Redis telemetry).

Built-ins: ``StaticPolicy`` (fixed knobs, optional per-tenant knobs/replicas,
least-loaded routing) and ``ModelOraclePolicy`` (knows each tenant's true
workload preset; picks the draft cap that maximises predicted goodput at the
replica's current batch -- an upper-bound reference, not deployable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .. import acceptance as acc
from .. import costmodel as cm

if TYPE_CHECKING:  # pragma: no cover
    from .engine import ReplicaEngine
    from .trace import TraceRequest


@dataclass(frozen=True)
class Admission:
    replica: str | None = None
    max_draft: int | None = None
    min_confidence: float | None = None
    max_batch: int | None = None  # specgate_max_batch: no drafting in steps with more requests


class ReplicaView:
    """Live read-only view of one simulated replica."""

    __slots__ = ("_eng",)

    def __init__(self, engine: "ReplicaEngine"):
        self._eng = engine

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
    def load(self) -> int:
        return self._eng.num_running + self._eng.num_waiting

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
        cands = [self.replicas[n] for n in (names or list(self.replicas))]
        return min(cands, key=lambda r: (r.load / max(r.max_num_seqs, 1), r.name)).name


class Policy(Protocol):
    def admit(self, request: "TraceRequest", view: ClusterView) -> Admission: ...

    def tick(self, view: ClusterView) -> None: ...


class BasePolicy:
    """No-op policy: least-loaded routing, replica profiles decide speculation."""

    name = "base"

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
    advance); it bounds what a controller could reach.
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
