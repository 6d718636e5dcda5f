"""The per-tenant speculation policy: written by the controller (or an admin
default), read by every gateway instance on every request.

It is the core of the contract between the decision side (`controller/`) and
the data plane (`gateway/`): the controller never talks to a gateway
directly, it publishes a versioned policy set through the store, and each
gateway applies the newest version it has seen (pub/sub for speed, polling as
a fallback). Only the controller package writes it (`publish_policies`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from .knobs import SCHEDULE_KEY, Schedule, cap_at, flat_schedule, schedule_envelope, schedule_problem

from .keys import POLICIES_CHANNEL, POLICIES_KEY, POLICIES_VERSION_KEY
from .store import Store

DEFAULT_TENANT = "*"  # policy applied to tenants that have none of their own
# The tenant every caller is served as when no tenants are configured and
# `gateway.allow_anonymous` is on (gateway.auth); the admin API and /metrics name it too.
ANONYMOUS_TENANT = "anonymous"


def served_tenants(settings: Any) -> list[str]:
    """The tenant ids requests can be attributed to (`settings`: a
    `contract.settings.Settings`, untyped here because that module imports
    this one): the configured tenants,
    or `anonymous` when none are and the gateway serves callers without a key.
    Why one function: the admin API (404 for anyone else) and the gateway's
    per-tenant gauges must agree on who exists."""
    if settings.tenants:
        return [t.id for t in settings.tenants]
    return [ANONYMOUS_TENANT] if settings.gateway.allow_anonymous else []


# The fields that decide what a tenant's requests get (`SpeculationPolicy.behaviour`).
BEHAVIOUR_FIELDS = (
    "enabled", "preferred_profile", "max_draft", "min_confidence", "max_batch", "schedule", "drafter", "canary",
    "capture", "probe", "placement",
)
# What makes a published policy a change: its behaviour, or who set it (an admin pin
# replacing an identical controller choice must show as `admin`); the reason is bookkeeping.
MATERIAL_FIELDS = (*BEHAVIOUR_FIELDS, "source")


def policy_changes(before: "SpeculationPolicy | None", after: "SpeculationPolicy") -> dict[str, list]:
    """What differs materially between two policies: field -> [before, after]
    (`MATERIAL_FIELDS`; everything when there was none before). Empty = no
    change: the controller publishes no new version, and the decision history
    records no entry."""
    old = before.model_dump(mode="json") if before is not None else {}
    new = after.model_dump(mode="json")
    return {f: [old.get(f), new[f]] for f in MATERIAL_FIELDS if before is None or old.get(f) != new[f]}


def checked_schedule(schedule: Schedule) -> Schedule:
    """`schedule`, or the ValueError (naming the rule it breaks) that a policy or probe field reports."""
    problem = schedule_problem(schedule)
    if problem:
        raise ValueError(f"schedule {problem}")
    return schedule


class CaptureSpec(BaseModel, frozen=True):
    """Mirror a sample of this tenant's finished requests to the capture replica
    (vLLM `extract_hidden_states`), whose target hidden states train the
    tenant's own drafter (drafters/training). Opt-in only: a tenant without a
    `capture` block is never captured. The mirror runs after the tenant's
    response is complete and never changes it."""

    fraction: float = Field(ge=0.0, le=1.0, description="share of finished requests mirrored")
    max_per_hour: int = Field(default=600, ge=0, description="at most this many captures per hour per gateway instance")


class CanarySpec(BaseModel, frozen=True):
    """A candidate tenant drafter on probation: `share` of the tenant's requests
    go to the replicas serving drafter `drafter`, the rest to the incumbent; the
    controller compares the two arms (controller/decision/rollout.py) and
    promotes (`SpeculationPolicy.drafter` := drafter) or rolls back."""

    drafter: str = Field(min_length=1, description="drafter id of the candidate's replicas (ReplicaConfig.drafter)")
    share: float = Field(default=0.25, gt=0.0, lt=1.0, description="share of the tenant's requests sent to the candidate")


class ProbeSpec(BaseModel, frozen=True):
    """A small random share of the tenant's requests follows `schedule`
    instead of the policy's caps (`SpeculationPolicy.probe_arm`): while the
    tenant does not draft, a share that drafts where it is cheap (evidence
    the controller would otherwise never gather); while it drafts, optionally
    a share that does not (a hold-out). Drawn per request by the gateway, so
    both arms share the replicas and their steps: the ratio of their time per
    output token is the tenant's measured gain from drafting
    (controller/decision/probe.py)."""

    share: float = Field(gt=0.0, le=0.5, description="share of the tenant's requests sent as the probe arm")
    schedule: Schedule = Field(description="the probe arm's batch -> draft length, as `SpeculationPolicy.schedule`")
    profile: str | None = Field(
        default=None,
        description="replica profile the probe arm prefers (an exploring request must reach a replica that drafts); "
        "None: the policy's own preference",
    )

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, schedule: Schedule) -> Schedule:
        return checked_schedule(schedule)


class SpeculationPolicy(BaseModel):
    """What a tenant's requests should get from speculation right now.

    enabled=False means "no speculation for this tenant": the gateway prefers
    replicas with profile `off` and sends `specgate_max_draft=0` to replicas
    that honour the per-request knobs.
    """

    enabled: bool = True
    preferred_profile: str | None = Field(
        default=None, description="replica profile label to prefer, e.g. 'dspark-b8' or 'off'"
    )
    max_draft: int | None = Field(default=None, ge=0, description="per-request draft cap")
    min_confidence: float | None = Field(
        default=None, ge=0.0, le=1.0, description="per-request cumulative-confidence floor"
    )
    max_batch: int | None = Field(
        default=None, ge=0,
        description="draft only while the replica's step batch is at most this (the engine applies it every step)",
    )
    schedule: Schedule | None = Field(
        default=None,
        description="batch -> draft length, [[max_batch, max_draft], ...] with max_batch rising: in an engine step "
                    "of b requests draft at most the max_draft of the first pair with max_batch >= b, none above "
                    "the last (the engine applies it every step; contract.knobs)",
    )
    drafter: str | None = Field(
        default=None,
        description="the tenant's own drafter (ReplicaConfig.drafter): prefer the replicas serving it; None = the fleet's drafter",
    )
    placement: tuple[str, ...] | None = Field(
        default=None,
        description="replica names this tenant's requests prefer: the controller's placement of tenants apart, "
                    "where sharing engine steps costs more than balance gains (a preference after drafter and "
                    "profile fit; any other replica serves when these are down); None = no placement",
    )
    canary: CanarySpec | None = Field(default=None, description="a candidate drafter under test on a share of the traffic")
    capture: CaptureSpec | None = Field(default=None, description="opt-in: mirror a sample of requests for drafter training")
    probe: ProbeSpec | None = Field(
        default=None, description="a random share of requests under another schedule: exploration or a hold-out"
    )
    reason: str = ""
    source: str = "default"  # "default" | "config" | "controller" | "admin"

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, schedule: Schedule | None) -> Schedule | None:
        return None if schedule is None else checked_schedule(schedule)

    def probe_arm(self) -> "SpeculationPolicy":
        """What a request drawn into the probe arm follows: the probe's
        schedule in place of this policy's caps, routed to the probe's
        profile when it names one (an exploring request must reach a replica
        that drafts), else as this policy routes. (Without a probe: this policy.)"""
        probe = self.probe
        if probe is None:
            return self
        return self.model_copy(update={
            "enabled": True, "max_draft": None, "max_batch": None, "schedule": probe.schedule, "probe": None,
            "preferred_profile": probe.profile or (None if self.preferred_profile == "off" else self.preferred_profile),
        })

    def draw(self, u: float) -> "tuple[SpeculationPolicy, str | None]":
        """(what one request follows, its arm) for a uniform draw `u` in
        [0, 1): the probe arm below the probe's share ("probe"), else this
        policy ("policy"; None when there is no probe). Per request, so the
        arms share the replicas and their steps (the gateway's route stage
        and the simulator's admission draw alike)."""
        if self.probe is None:
            return self, None
        return (self.probe_arm(), "probe") if u < self.probe.share else (self, "policy")

    def cap_at(self, batch: int) -> int | None:
        """The draft cap this policy gives a request in an engine step of
        `batch` requests (0 when off; None = uncapped, the replica's block):
        the lookup the plugin does every step (`contract.knobs.cap_at`), for
        the controller to price and account the policy in force at a batch."""
        if not self.enabled:
            return 0
        return cap_at(self.max_draft, self.max_batch, batch, self.schedule)

    def behaviour(self) -> tuple:
        """What requests actually get; two policies equal here act the same
        (reason and source are bookkeeping)."""
        return tuple(getattr(self, f) for f in BEHAVIOUR_FIELDS)

    def vllm_xargs(self) -> dict[str, int | float | list[int]]:
        """The per-request knobs this policy implies for a knob-capable replica.

        A schedule goes out with its one-pair envelope folded into max_draft /
        max_batch: the envelope never caps below the schedule, so a replica that
        honours schedules drafts exactly by it, and one whose plugin predates them
        (it is sent only the knobs it advertises) still stops where the schedule
        stops and never drafts longer than its longest entry."""
        xargs: dict[str, int | float | list[int]] = {}
        if not self.enabled:
            xargs["specgate_max_draft"] = 0
            return xargs
        max_draft, max_batch = self.max_draft, self.max_batch
        if self.schedule is not None:
            env_draft, env_batch = schedule_envelope(self.schedule)
            max_draft = env_draft if max_draft is None else min(max_draft, env_draft)
            max_batch = env_batch if max_batch is None else min(max_batch, env_batch)
        if max_draft is not None:
            xargs["specgate_max_draft"] = int(max_draft)
        if self.min_confidence is not None:
            xargs["specgate_min_confidence"] = float(self.min_confidence)
        if max_batch is not None:
            xargs["specgate_max_batch"] = int(max_batch)
        if self.schedule is not None:
            xargs[SCHEDULE_KEY] = flat_schedule(self.schedule)
        return xargs


class PolicySet(BaseModel):
    version: int = 0
    policies: dict[str, SpeculationPolicy] = Field(default_factory=dict)

    def for_tenant(self, tenant: str) -> SpeculationPolicy:
        return self.policies.get(tenant) or self.policies.get(DEFAULT_TENANT) or SpeculationPolicy()


def resolve_policy(tenant: str, published: PolicySet, configured: dict[str, SpeculationPolicy]) -> SpeculationPolicy:
    """The policy a tenant's requests get. Precedence, lowest first: built-in
    default (speculate, no caps) -> the tenant's `speculation:` block in the
    config -> the published set's entry for the tenant; the published `*`
    entry applies only to tenants that neither the published set nor the
    config names."""
    if tenant in published.policies:
        return published.policies[tenant]
    if tenant in configured:
        return configured[tenant]
    if DEFAULT_TENANT in published.policies:
        return published.policies[DEFAULT_TENANT]
    return configured.get(DEFAULT_TENANT) or SpeculationPolicy()


async def load_policies(store: Store) -> PolicySet:
    raw: Any = await store.get_json(POLICIES_KEY)
    return PolicySet.model_validate(raw) if raw else PolicySet()


async def publish_policies(store: Store, policies: dict[str, SpeculationPolicy]) -> PolicySet:
    """Write a new version and notify subscribers. Returns what was written."""
    version = await store.incr(POLICIES_VERSION_KEY)
    policy_set = PolicySet(version=version, policies=policies)
    await store.set_json(POLICIES_KEY, policy_set.model_dump(mode="json"))
    await store.publish(POLICIES_CHANNEL, {"version": version})
    return policy_set
