"""Tenant drafters: the rollout state, its transitions, and what policies carry.

"Prove and promote": an admin starts a canary for a tenant's new drafter
(`POST /admin/tenants/{t}/canary`); every controller tick judges running
canaries with the pure rule (`controller/decision/rollout.py`) on the
telemetry counters gathered since the canary started, and the tenant's
published policy carries `canary` while it runs, `drafter` once promoted
(for good: across ticks, restarts and leader failover, since the state lives
in the store), and neither after a rollback. A rolled-back drafter id is
never tried again for that tenant.

The state is one store document (`contract.keys.ROLLOUTS_KEY`),
`{tenant: TenantDrafters}`:

* `drafter`: the tenant's promoted drafter in force (None: the fleet's);
* `rolled_back`: drafter ids that lost a canary (refused for a new one);
* `rollout`: the latest canary -- `drafter`, `share`, `state`
  (canary | promoted | rolled_back | aborted), `started_at`/`decided_at`
  (epoch s), who started and decided it, `baseline` (the tenant's telemetry
  counters per replica when it started: the arms are counted from there),
  `reason` and `stats` (the verdict's numbers);
* `past`: earlier rollouts, newest first (bounded).

Arms: the *candidate* is the tenant's counters on the replicas whose
configured `drafter` is the canary's; the *incumbent* is the tenant's
counters on all its other replicas. Both are deltas from `baseline`.

Everything here but `load`/`save` is pure, so the admin API, the tick and
the tests share one definition of a start, an abort and a verdict.
Read-modify-write of one JSON document, as with overrides: admin writes are
human-paced and the tick writes only on a verdict, after re-reading the
document and checking the canary it judged is still the one running (an
abort in between wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from pydantic import BaseModel, Field

from contract.keys import ROLLOUTS_KEY
from contract.policy import CanarySpec, CaptureSpec, SpeculationPolicy
from contract.settings import ReplicaConfig, RolloutSettings
from contract.store import Store
from contract.store.tenant_docs import load_docs, save_doc
from contract.telemetry import TelemetryCounters

from .decision.rollout import ARM_FIELDS, ArmStats, RolloutVerdict, judge
from .decision.views import Carried

PAST_MAX = 20  # earlier rollouts kept per tenant

State = Literal["canary", "promoted", "rolled_back", "aborted"]


class Rollout(BaseModel):
    """One canary of one tenant's candidate drafter."""

    drafter: str = Field(min_length=1)
    share: float = Field(gt=0.0, lt=1.0)
    state: State = "canary"
    started_at: float
    started_by: str = ""
    decided_at: float | None = None
    decided_by: str | None = None
    baseline: dict[str, dict[str, float]] = Field(default_factory=dict)  # replica -> ARM_FIELDS at the start
    reason: str = ""
    stats: dict | None = None  # numbers of the verdict that ended it

    @property
    def running(self) -> bool:
        return self.state == "canary"


class TenantDrafters(BaseModel):
    """A tenant's drafter in force, the ids it must not retry, and its rollouts."""

    drafter: str | None = None
    rolled_back: list[str] = Field(default_factory=list)
    rollout: Rollout | None = None
    past: list[Rollout] = Field(default_factory=list)

    @property
    def canary(self) -> CanarySpec | None:
        r = self.rollout
        return CanarySpec(drafter=r.drafter, share=r.share) if r is not None and r.running else None

    @property
    def note(self) -> str:
        """The latest step, as the decision history's reason reads it."""
        r = self.rollout
        if r is None:
            return ""
        if r.running:
            return f"canary {r.drafter} (share {r.share:g}) started by {r.started_by or '?'}"
        if r.state == "promoted":
            return f"drafter {r.drafter} promoted: {r.reason}"
        if r.state == "rolled_back":
            return f"canary {r.drafter} rolled back: {r.reason}"
        return f"canary {r.drafter} {r.reason or 'aborted'}"


class RolloutRefused(ValueError):
    """A canary that may not start or end now; `status` is the HTTP status the admin API answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- arms ----------------------------------------------------------------------
def serving(replicas: Iterable[ReplicaConfig], drafter: str) -> list[str]:
    """Names of the configured replicas that serve `drafter`."""
    return [r.name for r in replicas if r.drafter == drafter and r.name]


def baseline_of(counters: Iterable[TelemetryCounters], tenant: str) -> dict[str, dict[str, float]]:
    """The tenant's arm counters per replica now: a canary counts from here."""
    return {c.replica: {f: c.get(f) for f in ARM_FIELDS} for c in counters if c.tenant == tenant}


def _since(values: Mapping[str, float], base: Mapping[str, float] | None) -> ArmStats:
    now = ArmStats.from_counters(values)
    if not base:
        return now
    then = ArmStats.from_counters(base)
    # A counter below its baseline means the counters were reset (the store
    # lost them): all of the current value is new, as in signals.counter_delta.
    if any(getattr(now, f) < getattr(then, f) for f in ARM_FIELDS):
        return now
    return ArmStats(**{f: getattr(now, f) - getattr(then, f) for f in ARM_FIELDS})


def arms(
    rollout: Rollout, tenant: str, counters: Iterable[TelemetryCounters], replicas: Iterable[ReplicaConfig]
) -> tuple[ArmStats, ArmStats]:
    """(candidate, incumbent): the tenant's counter deltas since the canary
    started, on the replicas serving the candidate and on all the others."""
    candidate_replicas = set(serving(replicas, rollout.drafter))
    candidate, incumbent = ArmStats(), ArmStats()
    for c in counters:
        if c.tenant != tenant:
            continue
        delta = _since(c.values, rollout.baseline.get(c.replica))
        if c.replica in candidate_replicas:
            candidate = candidate + delta
        else:
            incumbent = incumbent + delta
    return candidate, incumbent


def verdict_for(
    doc: TenantDrafters, tenant: str, counters: Iterable[TelemetryCounters], replicas: Iterable[ReplicaConfig],
    cfg: RolloutSettings, now: float,
) -> RolloutVerdict | None:
    """The rule's verdict on the tenant's running canary (None: none runs)."""
    r = doc.rollout
    if r is None or not r.running:
        return None
    candidate, incumbent = arms(r, tenant, counters, list(replicas))
    return judge(candidate, incumbent, cfg, max(0.0, now - r.started_at))


# -- transitions (pure: document in, document out) -------------------------------
def start(
    doc: TenantDrafters, drafter: str, share: float, *, now: float, by: str, replicas: Iterable[ReplicaConfig],
    baseline: dict[str, dict[str, float]],
) -> TenantDrafters:
    """A new canary, or `RolloutRefused` (409: one runs; 400: no replica serves
    the drafter, it was rolled back for this tenant, or it is already in force)."""
    if doc.rollout is not None and doc.rollout.running:
        raise RolloutRefused(409, f"canary {doc.rollout.drafter} is running: abort it first (POST .../canary/abort)")
    if drafter in doc.rolled_back:
        raise RolloutRefused(400, f"drafter {drafter!r} was rolled back for this tenant and is not retried")
    if drafter == doc.drafter:
        raise RolloutRefused(400, f"drafter {drafter!r} is already this tenant's drafter")
    if not serving(replicas, drafter):
        raise RolloutRefused(400, f"no configured replica serves drafter {drafter!r} (replicas[].drafter)")
    rollout = Rollout(drafter=drafter, share=share, started_at=now, started_by=by, baseline=baseline)
    return _with(doc, rollout)


def abort(doc: TenantDrafters, *, now: float, by: str, note: str = "") -> TenantDrafters:
    """End the running canary without a verdict (its drafter may be tried again); 409 when none runs."""
    r = doc.rollout
    if r is None or not r.running:
        raise RolloutRefused(409, "no canary is running for this tenant")
    reason = f"aborted by {by}" + (f": {note}" if note else "")
    return doc.model_copy(update={"rollout": r.model_copy(update={
        "state": "aborted", "decided_at": now, "decided_by": by, "reason": reason})})


def conclude(doc: TenantDrafters, verdict: RolloutVerdict, *, now: float, by: str) -> TenantDrafters:
    """Apply a promote or rollback verdict to the running canary (wait: unchanged)."""
    r = doc.rollout
    if verdict.verdict == "wait" or r is None or not r.running:
        return doc
    ended = r.model_copy(update={
        "state": "promoted" if verdict.verdict == "promote" else "rolled_back",
        "decided_at": now, "decided_by": by, "reason": verdict.reason, "stats": verdict.numbers,
    })
    if verdict.verdict == "promote":
        return doc.model_copy(update={"drafter": r.drafter, "rollout": ended})
    rolled_back = doc.rolled_back if r.drafter in doc.rolled_back else [*doc.rolled_back, r.drafter]
    return doc.model_copy(update={"rolled_back": rolled_back, "rollout": ended})


def _with(doc: TenantDrafters, rollout: Rollout) -> TenantDrafters:
    past = ([doc.rollout] if doc.rollout is not None else []) + list(doc.past)
    return doc.model_copy(update={"rollout": rollout, "past": past[:PAST_MAX]})


def same_canary(a: TenantDrafters | None, b: TenantDrafters | None) -> bool:
    """Whether both documents hold the same running canary (what the tick re-checks before writing)."""
    ra, rb = (a.rollout if a else None), (b.rollout if b else None)
    return (ra is not None and rb is not None and ra.running and rb.running
            and (ra.drafter, ra.started_at) == (rb.drafter, rb.started_at))


# -- what policies carry ---------------------------------------------------------
def carried(
    tenants: Iterable[str], docs: Mapping[str, TenantDrafters], configured: Mapping[str, SpeculationPolicy | None]
) -> dict[str, Carried]:
    """Per tenant, the drafter / canary / capture its published policy carries:
    the rollout state's drafter (else the config's `speculation.drafter`) and
    running canary, and the config's `speculation.capture` opt-in."""
    out = {}
    for t in tenants:
        doc, cfg = docs.get(t), configured.get(t)
        drafter = doc.drafter if doc is not None and doc.drafter else (cfg.drafter if cfg is not None else None)
        capture: CaptureSpec | None = cfg.capture if cfg is not None else None
        out[t] = Carried(drafter=drafter, canary=doc.canary if doc else None, capture=capture,
                         note=doc.note if doc else "")
    return out


@dataclass(frozen=True)
class Step:
    """One tick's rollout work: the documents after the verdicts, and what changed."""

    docs: dict[str, TenantDrafters]
    verdicts: dict[str, RolloutVerdict]  # tenant -> verdict on its running canary (wait included)
    ended: dict[str, TenantDrafters]  # tenant -> document after a promote / rollback


def step(
    docs: Mapping[str, TenantDrafters], counters: list[TelemetryCounters], replicas: list[ReplicaConfig],
    cfg: RolloutSettings, now: float, by: str, tenants: Iterable[str],
) -> Step:
    """Judge every running canary of the given tenants (pure)."""
    out, verdicts, ended = dict(docs), {}, {}
    if cfg.enabled:
        for t in sorted(tenants):
            doc = docs.get(t)
            if doc is None:
                continue
            v = verdict_for(doc, t, counters, replicas, cfg, now)
            if v is None:
                continue
            verdicts[t] = v
            if v.verdict != "wait":
                out[t] = ended[t] = conclude(doc, v, now=now, by=by)
    return Step(out, verdicts, ended)


# -- the store document ----------------------------------------------------------
async def load(store: Store) -> dict[str, TenantDrafters]:
    """The rollout document; an entry that no longer validates is skipped with a warning."""
    return await load_docs(store, ROLLOUTS_KEY, TenantDrafters)


async def save_one(store: Store, tenant: str, doc: TenantDrafters) -> None:
    """Replace one tenant's entry (re-reading the rest, so other tenants' writes stand)."""
    await save_doc(store, ROLLOUTS_KEY, TenantDrafters, tenant, doc)


__all__ = [
    "PAST_MAX", "Rollout", "RolloutRefused", "Step", "TenantDrafters", "abort", "arms", "baseline_of", "carried",
    "conclude", "load", "same_canary", "save_one", "serving", "start", "step", "verdict_for",
]
