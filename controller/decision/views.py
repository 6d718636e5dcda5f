"""What the decision reads and writes: plain, frozen records.

Why a module of its own: every stage (goodput model, optimizer, hysteresis,
assembly, fleet plan) speaks in these types, and the estimators
(`controller/estimators.py`) build the inputs without needing any stage.
Inputs: `ReplicaInput` (one replica as the estimators see it this tick),
`TenantView` (one tenant's acceptance and targets), `TenantState` (what
hysteresis remembers between ticks). Outputs: `Decision` with its
`DecisionRecord`s (one per tenant: policy, reason, numbers) and
`ReplicaRegime`s (one per replica: regime and fleet-plan recommendation),
and the `Placement` of tenants apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from contract.policy import CanarySpec, CaptureSpec, SpeculationPolicy
from contract.profiles import parse_profile

from ..acceptance_fit import Proposal


class CostFn(Protocol):
    """Step time of one replica (seconds) — see controller/costs.py."""

    def step_time_s(
        self, batch: float, verify_tokens: float, draft_len: int, context_tokens: float, drafting_batch: float | None = None
    ) -> float: ...

    def knee_tokens(self, batch: float, context_tokens: float) -> float: ...


FULL = 1 << 20  # draft cap meaning "no cap": the replica's whole block


def method_of(profile: str | None) -> str:
    """Speculation method of a profile label; an unparsable label counts as
    the method its replica cannot be priced for, "off"."""
    try:
        return parse_profile(profile or "off").method
    except ValueError:
        return "off"


def cap_label(k: int) -> str:
    """A draft cap as records and reasons print it (`full` = no cap)."""
    return "full" if k >= FULL else str(k)


@dataclass(frozen=True)
class ReplicaInput:
    """One replica as the estimators see it this tick (the decision's input;
    not the simulator's live `drafters.sim.policy.ReplicaView`)."""

    name: str
    profile: str
    block: int  # drafter block size gamma; 0 = no speculation
    adaptive: bool
    supports_knobs: bool
    cost: CostFn
    batch: float  # running requests (smoothed)
    waiting: float = 0.0
    context_tokens: float = 1024.0
    healthy: bool = True
    tokens_per_step: float | None = None  # measured forward tokens per step (verify work + prefill)
    acceptance_length: float | None = None  # measured (vLLM spec counters)
    mix: dict[str, float] = field(default_factory=dict)  # tenant -> share of this replica's traffic
    # Prompt tokens prefilled per generated token: in steady state every output
    # token "brings" this much prefill into the same steps, so a policy that
    # emits more tokens per step also prefills more per step.
    prefill_ratio: float = 0.0
    prompt_tokens: float = 512.0  # mean prompt length (prefill chunk size)
    # A step whose requests are all capped at 0 skips the drafter's pass
    # (contract.knobs.k0_skips_drafter: the method and the skips the replica reports).
    k0_skips_pass: bool = True

    @property
    def method(self) -> str:
        """The speculation method of the replica's profile ("off" for none)."""
        return method_of(self.profile)


@dataclass(frozen=True)
class MeasuredGain:
    """A tenant's gain from drafting as a probe's two arms measured it
    (`TenantEstimator.measured_gain`): the non-drafting arm's engine time per
    output token over the drafting arm's, and the (decayed) tokens behind each."""

    gain: float
    drafting_tokens: float
    plain_tokens: float


@dataclass(frozen=True)
class TenantView:
    tenant: str
    acceptance: float  # conditional per-position acceptance a (shrunk estimate)
    evidence_steps: float = 0.0  # effective (decayed) verification steps behind the estimate
    tpot_target_ms: float | None = None
    shares: dict[str, float] = field(default_factory=dict)  # replica -> share of this tenant's traffic
    # Speculation method (ngram, eagle3, dflash, dspark) -> acceptance measured on
    # that method's replicas: an ngram lookup and a trained drafter accept very
    # different shares of one tenant's tokens. Methods without data fall back to
    # `acceptance`.
    by_method: dict[str, float] = field(default_factory=dict)
    # Method -> how often and how fully the tenant proposes there, for methods
    # that may not propose (ngram); measured in its decode steps
    # (`TenantEstimator.method_proposal`). Missing: the method's prior.
    proposal: dict[str, Proposal] = field(default_factory=dict)
    measured_gain: MeasuredGain | None = None  # from a probe's arms; None without one
    # Speculation steps (decayed) behind `acceptance`: how far the estimate still leans on the
    # method's prior; a tenant that does not draft explores while they are few (decision/probe.py).
    acceptance_steps: float = 0.0
    # `contract.telemetry.acceptance_length` of the tenant's decayed sums: the measured tokens per
    # verification step, the same number as the gateways' gauge (None before a speculative response).
    acceptance_length: float | None = None


@dataclass(frozen=True)
class Carried:
    """What a tenant's published policy carries that the decision does not choose.

    The decision picks caps, floors, thresholds and routing from measurements;
    which drafter serves the tenant (promoted by a rollout, or configured),
    the canary under test, and the tenant's capture opt-in (its config's
    `speculation.capture`) are facts it must publish unchanged -- the gateway
    reads them only from the published policy, which replaces the config's.
    `note`: the rollout's latest step (why drafter/canary are what they are);
    it joins the policy's reason when they change, so the decision history
    says why a drafter was promoted or a canary ended."""

    drafter: str | None = None
    canary: CanarySpec | None = None
    capture: CaptureSpec | None = None
    note: str = ""


@dataclass(frozen=True)
class TenantState:
    """What hysteresis needs to remember about one tenant between ticks."""

    k: int = -1  # current draft cap; -1 = never decided
    theta: float | None = None
    since: float = float("-inf")
    pending_k: int | None = None
    pending_count: int = 0
    policy: SpeculationPolicy | None = None
    smoothed: tuple[tuple[int, float], ...] = ()  # EMA of normalised predicted goodput per candidate k
    strong_k: int | None = None  # candidate of the current run of strong signals
    strong_count: int = 0
    theta_ema: float | None = None  # smoothed confidence floor before gridding
    provisional: bool = False  # last change rested on thin evidence: dwell does not protect it


Groups = tuple[tuple[str, tuple[str, ...]], ...]  # (tenant, its replicas' names), sorted; () = together


@dataclass(frozen=True)
class Placement:
    """Tenants placed apart (`decision/apart.py`): the placement in force and
    the hysteresis' memory of its challenger; the next tick starts from it."""

    groups: Groups = ()
    since: float = -math.inf
    gain: float = 0.0  # predicted fleet gain over every tenant together, at the last tick
    pending: Groups | None = None  # the candidate that beat the one in force on the last ticks
    pending_count: int = 0

    def of(self, tenant: str) -> tuple[str, ...] | None:
        """The replicas `tenant`'s requests prefer (None: not placed)."""
        return dict(self.groups).get(tenant)

    @classmethod
    def from_policies(cls, policies: Mapping[str, SpeculationPolicy], now: float) -> "Placement":
        """The placement published policies carry (a controller taking over adopts it)."""
        groups = tuple(sorted((t, tuple(p.placement)) for t, p in policies.items() if p.placement))
        return cls(groups, since=now if groups else -math.inf)


@dataclass(frozen=True)
class DecisionRecord:
    tenant: str
    at: float
    changed: bool
    policy: SpeculationPolicy
    reason: str
    numbers: dict


@dataclass(frozen=True)
class ReplicaRegime:
    name: str
    profile: str
    batch: float
    tokens_per_step: float
    knee: float
    rho: float
    regime: str
    acceptance_length: float | None
    predicted_goodput_tok_s: float
    recommended_profile: str
    recommended_gain: float
    # Share of this replica's goodput the fleet loses while it restarts (the
    # others absorb its requests): what a restart costs per second of downtime.
    downtime_loss: float = 1.0


@dataclass(frozen=True)
class Decision:
    policies: dict[str, SpeculationPolicy]
    state: dict[str, TenantState]
    records: list[DecisionRecord]
    replicas: dict[str, ReplicaRegime]
    placement: Placement = field(default_factory=Placement)  # tenants placed apart (decision/apart.py)

    @property
    def changes(self) -> list[DecisionRecord]:
        return [r for r in self.records if r.changed]
