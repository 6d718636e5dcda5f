"""Per-request speculation telemetry, accumulated as monotonic counters.

The gateway adds each finished request's `metrics.speculative_decoding`
(and usage) to counters keyed by (tenant, replica); the controller reads the
counters and differentiates them itself, exactly as it does with vLLM's
Prometheus counters. Counters (not events) keep the store bounded and make
several gateway instances add up without coordination.

Two groups of counters exist so two arms of a canary (controller/rollout.py)
can be compared *with a variance*, not just a ratio of sums:

* acceptance-length sufficient statistics, for requests that ran at least one
  speculation step: `al_requests` (n), `al_sum` (sum of a), `al_sumsq` (sum of
  a^2), with a = 1 + accepted / steps per request. Mean and sample variance of
  the per-request acceptance length follow from these three sums, and sums add
  across gateways and replicas like every other counter;
* request timing, only for requests whose `duration_s` the gateway set (the
  time from sending the request upstream to its last byte): `timed_requests`,
  `timed_seconds`, `timed_completion_tokens`, so an arm's goodput is its timed
  completion tokens per request-second, unbiased by untimed requests.

A third group measures *how often and how much* a request drafts, which a
drafter that may not propose (ngram prompt lookup finds no match in most
steps of sampled text) makes far from "every step, a full block". Counted
only for requests whose knobs allowed drafting (`draft_allowance` > 0, see
`RequestSpecStats`): `allowed_decode_steps` (engine steps after the first
token: completion tokens - accepted drafts - 1), `allowed_spec_steps` (those
with a proposal), `allowed_draft_tokens` (tokens proposed) and
`allowed_full_tokens` (spec steps x the allowance: what full-length
proposals would have drafted). The controller's proposal rate is
spec / decode steps, its fill drafted / full tokens (`controller.estimators`).
Both read low where a step capped the request below its allowance (a
schedule's batch rule); per-request metrics cannot tell such a step from one
without a proposal.

A fifth group is the survival curve per draft position, from vLLM's
per-request `acceptance_histogram` (steps that accepted exactly j drafts).
For each position i up to the request's `draft_allowance` (at most
`SURVIVAL_POSITIONS`): `survival_reach_{i}`, its proposal steps that accepted
at least i-1 drafts (all of them for i = 1), and `survival_accepted_{i}`,
those that accepted at least i. Their ratio is the conditional survival
q_i = P(accepted >= i | accepted >= i-1, a proposal, allowance >= i), and
the product of q_1..q_i the share of proposals that reach position i
(`controller.estimators`): measured where the geometric model only assumed
a shape, and only from requests that could have drafted position i, so a
tenant capped at 4 says nothing about position 6. A proposal shorter than i
counts as not reaching i (ngram's short copies included); a step a schedule
capped below the allowance reads the same (as for the proposal rate).

A fourth group compares a probe's two arms (`contract.policy.ProbeSpec`):
for requests whose tenant policy carried a probe, the engine's decode time
(`metrics.generation_time_ms`, vLLM `--enable-per-request-metrics`: first to
last output token) and the tokens after the first, split by whether the
request was allowed to draft: `probed_drafting_tokens|seconds`,
`probed_plain_tokens|seconds`. Both arms ran on the same replica in the same
steps, so per (tenant, replica) plain seconds per token over drafting seconds
per token is the tenant's measured gain from drafting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .keys import TELEMETRY_INDEX_KEY as INDEX_KEY
from .keys import telemetry_counters_key as counters_key
from .keys import telemetry_seq_key as seq_key
from .knobs import RequestKnobs
from .store import Store

COUNTER_FIELDS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "spec_requests",  # requests that carried metrics.speculative_decoding
    "num_spec_steps",  # verification steps (drafts) across those requests
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "al_requests",  # requests with num_spec_steps > 0 (per-request acceptance length a = 1 + accepted / steps)
    "al_sum",  # sum of a over those requests
    "al_sumsq",  # sum of a^2 over those requests
    "timed_requests",  # requests with a duration_s (set by the gateway)
    "timed_seconds",  # sum of their duration_s
    "timed_completion_tokens",  # their completion tokens
    "allowed_decode_steps",  # decode steps of requests allowed to draft (draft_allowance > 0)
    "allowed_spec_steps",  # their steps with a proposal
    "allowed_draft_tokens",  # their proposed draft tokens
    "allowed_full_tokens",  # their spec steps x draft_allowance
    "probed_drafting_tokens",  # under a probe: output tokens after the first of requests allowed to draft
    "probed_drafting_seconds",  # their engine decode time
    "probed_plain_tokens",  # under a probe: the same for requests not allowed to draft
    "probed_plain_seconds",
)
def acceptance_length(accepted: float, spec_steps: float) -> float | None:
    """A tenant's acceptance length: tokens per verification step, 1 +
    accepted draft tokens / speculation steps (None without a step). The one
    definition behind the gateway's `specgate_tenant_acceptance_length` and
    the controller's `specgate_controller_tenant_acceptance_length`, which
    apply it to the same per-response counters decayed with the same
    half-life (`controller.half_life_s`), so an operator reads one number."""
    return 1.0 + accepted / spec_steps if spec_steps > 0 else None


# Draft positions with survival counters (`survival_reach_{i}`, `survival_accepted_{i}`, i = 1..this).
SURVIVAL_POSITIONS = 16


def survival_reach_field(position: int) -> str:
    return f"survival_reach_{position}"


def survival_accepted_field(position: int) -> str:
    return f"survival_accepted_{position}"


# [i-1]: position i's field names (built once: the gateway adds them per request).
SURVIVAL_REACH = tuple(survival_reach_field(i) for i in range(1, SURVIVAL_POSITIONS + 1))
SURVIVAL_ACCEPTED = tuple(survival_accepted_field(i) for i in range(1, SURVIVAL_POSITIONS + 1))
COUNTER_FIELDS += tuple(name for pair in zip(SURVIVAL_REACH, SURVIVAL_ACCEPTED) for name in pair)


@dataclass(frozen=True)
class RequestSpecStats:
    """One finished request, as the gateway saw it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    num_spec_steps: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_draft_tokens: int | None = None
    # Seconds from sending the request upstream to its last byte (the gateway
    # measures it; None = not timed, which adds to no timing counter).
    duration_s: float | None = None
    # The most draft tokens the request could propose in one step: the
    # replica's K (`num_spec_tokens`) bounded by the request's knobs' largest
    # cap. None = not known (no knobs or K reported): no proposal-rate counters.
    draft_allowance: int | None = None
    # The engine's decode time (first to last output token, seconds; None:
    # not reported) and whether the tenant's policy carried a probe when the
    # request was routed (then it is one of the two arms compared).
    decode_s: float | None = None
    probed: bool = False
    # vLLM's `acceptance_histogram`: [j] = proposal steps that accepted exactly j drafts (None: not reported).
    acceptance_histogram: tuple[int, ...] | None = None

    @property
    def decode_steps(self) -> int:
        """Engine steps that emitted this request's tokens after the first
        (which the prefill step emits): each emits its accepted drafts plus one."""
        return max(self.completion_tokens - (self.num_accepted_draft_tokens or 0) - 1, self.num_spec_steps or 0, 0)

    @property
    def acceptance_length(self) -> float | None:
        """This request's acceptance length 1 + accepted / steps (None without a step)."""
        if not self.num_spec_steps:
            return None
        return 1.0 + (self.num_accepted_draft_tokens or 0) / self.num_spec_steps

    @classmethod
    def from_response(
        cls, usage: Any, metrics: Any, duration_s: Any = None, knobs: RequestKnobs | None = None, probed: bool = False
    ) -> "RequestSpecStats":
        """Build from an OpenAI `usage` object and vLLM's `metrics` object
        (and, optionally, the gateway's own measure of the request's duration
        and the knobs it sent: with them and the replica's K the request's
        `draft_allowance` is known).

        Replica data is untrusted: a field of the wrong type or sign counts as
        absent rather than failing the request after its response was sent.
        Accepted drafts above the drafted count (impossible from a sane
        replica) are clamped to it, so one bad response cannot push an arm's
        acceptance statistics past what was drafted.
        """
        usage = usage if isinstance(usage, dict) else {}
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        steps = _count(spec.get("num_spec_steps"))
        drafted = _count(spec.get("num_draft_tokens"))
        accepted = _count(spec.get("num_accepted_draft_tokens"))
        if steps is None and drafted is not None:
            # Older summaries: derive steps from the mean acceptance length.
            mal = spec.get("mean_acceptance_length")
            if isinstance(mal, (int, float)) and mal > 1 and accepted is not None:
                steps = round(accepted / (mal - 1))
        if accepted is not None and drafted is not None and accepted > drafted:
            accepted = drafted
        allowance = None
        k = _count(spec.get("num_spec_tokens"))
        if knobs is not None and k is not None:
            cap = knobs.largest_cap()
            allowance = k if cap is None else min(k, cap)
        elif knobs is not None and isinstance(metrics, dict) and not spec:
            allowance = 0  # a replica that does not speculate: the request could not draft
        generation_ms = _seconds(metrics.get("generation_time_ms")) if isinstance(metrics, dict) else None
        return cls(
            prompt_tokens=_count(usage.get("prompt_tokens")) or 0,
            completion_tokens=_count(usage.get("completion_tokens")) or 0,
            num_spec_steps=steps,
            num_draft_tokens=drafted,
            num_accepted_draft_tokens=accepted,
            duration_s=_seconds(duration_s),
            draft_allowance=allowance,
            decode_s=None if generation_ms is None else generation_ms / 1000.0,
            probed=probed,
            acceptance_histogram=_histogram(spec.get("acceptance_histogram"), steps),
        )


def _count(value: Any) -> int | None:
    """A non-negative integer count, or None for anything else (bools included)."""
    if type(value) is int:  # what JSON gives (bool is not `int` here); the rest, per request, only when odd
        return value if value >= 0 else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None  # (an infinite count would make int() raise)
    return int(value)


def _histogram(value: Any, steps: int | None) -> tuple[int, ...] | None:
    """vLLM's acceptance histogram as counts, or None where it is absent, malformed or
    disagrees with the summary's own step count (untrusted replica data)."""
    if type(value) is not list or not 0 < len(value) <= 1 + 4 * SURVIVAL_POSITIONS:
        return None
    if set(map(type, value)) != {int} or min(value) < 0:  # (bool is not `int` here)
        return None
    if steps is not None and sum(value) != steps:
        return None
    return tuple(value)


def _seconds(value: Any) -> float | None:
    """A finite, non-negative duration in seconds, or None for anything else."""
    if type(value) is float and 0 <= value < math.inf:  # the gateway's own timing, per request (NaN fails the compare)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


@dataclass
class TelemetryCounters:
    tenant: str
    replica: str
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)

    @property
    def acceptance_length(self) -> float | None:
        steps = self.get("num_spec_steps")
        return 1.0 + self.get("num_accepted_draft_tokens") / steps if steps else None


def increments_for(stats: RequestSpecStats) -> dict[str, float]:
    """The counter increments one finished request contributes."""
    return add_increments({}, stats)


def add_increments(acc: dict[str, float], stats: RequestSpecStats) -> dict[str, float]:
    """Add one finished request's counter increments to `acc` (sums per
    counter, as `increments_for` would give them) and return it. In place,
    because the gateway sums every request's telemetry between flushes: no
    increments dict built per request only to be merged."""
    get = acc.get
    acc["requests"] = get("requests", 0) + 1
    acc["prompt_tokens"] = get("prompt_tokens", 0) + stats.prompt_tokens
    acc["completion_tokens"] = get("completion_tokens", 0) + stats.completion_tokens
    drafted = stats.num_draft_tokens
    if drafted is not None:
        steps = stats.num_spec_steps or 0
        accepted = stats.num_accepted_draft_tokens or 0
        acc["spec_requests"] = get("spec_requests", 0) + 1
        acc["num_spec_steps"] = get("num_spec_steps", 0) + steps
        acc["num_draft_tokens"] = get("num_draft_tokens", 0) + drafted
        acc["num_accepted_draft_tokens"] = get("num_accepted_draft_tokens", 0) + accepted
        if steps:  # (a subset of spec_requests: those that ran at least one step)
            a = 1.0 + accepted / steps  # = stats.acceptance_length
            acc["al_requests"] = get("al_requests", 0) + 1
            acc["al_sum"] = get("al_sum", 0) + a
            acc["al_sumsq"] = get("al_sumsq", 0) + a * a
        allowance = stats.draft_allowance
        if allowance:
            acc["allowed_decode_steps"] = get("allowed_decode_steps", 0) + stats.decode_steps
            acc["allowed_spec_steps"] = get("allowed_spec_steps", 0) + steps
            acc["allowed_draft_tokens"] = get("allowed_draft_tokens", 0) + drafted
            acc["allowed_full_tokens"] = get("allowed_full_tokens", 0) + steps * allowance
            if stats.acceptance_histogram and steps:
                _add_survival(acc, stats.acceptance_histogram, allowance)
    if stats.probed and stats.decode_s is not None and stats.draft_allowance is not None and stats.completion_tokens > 1:
        arm = "probed_drafting" if stats.draft_allowance > 0 else "probed_plain"
        acc[f"{arm}_tokens"] = get(f"{arm}_tokens", 0) + stats.completion_tokens - 1
        acc[f"{arm}_seconds"] = get(f"{arm}_seconds", 0) + stats.decode_s
    d = stats.duration_s
    if d is not None and math.isfinite(d) and d >= 0:
        acc["timed_requests"] = get("timed_requests", 0) + 1
        acc["timed_seconds"] = get("timed_seconds", 0) + d
        acc["timed_completion_tokens"] = get("timed_completion_tokens", 0) + stats.completion_tokens
    return acc


def _add_survival(acc: dict[str, float], histogram: tuple[int, ...], allowance: int) -> None:
    """Position i's reach (steps that accepted >= i-1 drafts) and survivors (>= i), for the
    positions the request could draft. (A histogram may stop at its largest count, as the
    simulator's does; vLLM pads it to K+1: past its end no step reaches a position.)"""
    get = acc.get
    at_least = sum(histogram)  # steps that accepted >= i drafts, i = 0 first
    for i in range(min(allowance, SURVIVAL_POSITIONS, len(histogram))):  # position i + 1
        if not at_least:
            break  # no step reaches this position or any later one: nothing to add
        reach, accepted = SURVIVAL_REACH[i], SURVIVAL_ACCEPTED[i]
        acc[reach] = get(reach, 0) + at_least
        at_least -= histogram[i]
        acc[accepted] = get(accepted, 0) + at_least


async def record_increments(store: Store, tenant: str, replica: str, increments: Mapping[str, float]) -> None:
    """Add pre-summed increments (a gateway batching many requests between flushes)."""
    await store.sadd(INDEX_KEY, f"{tenant}|{replica}")
    await store.hincr(counters_key(tenant, replica), increments)


# How long the store keeps a writer's last flush seq after its last flush: it
# must outlive any outage a resent flush waits through (`record_flush`).
FLUSH_SEQ_TTL_S = 86400.0


async def record_flush(store: Store, writer: str, seq: int, batch: Mapping[tuple[str, str], Mapping[str, float]]) -> bool:
    """Add one flush of pre-summed increments, (tenant, replica) -> increments,
    in one atomic call; False when the store had applied this (writer, seq)
    already. Why: a flush that timed out may have landed, so its writer sends
    the same batch again under the same seq instead of merging it into the
    next one, and it counts once."""
    await store.sadd(INDEX_KEY, *(f"{tenant}|{replica}" for tenant, replica in batch))
    increments = {counters_key(tenant, replica): inc for (tenant, replica), inc in batch.items()}
    return await store.hincr_once(seq_key(writer), seq, increments, FLUSH_SEQ_TTL_S)


async def record_request(store: Store, tenant: str, replica: str, stats: RequestSpecStats) -> None:
    await record_increments(store, tenant, replica, increments_for(stats))


async def read_all(store: Store) -> list[TelemetryCounters]:
    result = []
    for member in sorted(await store.smembers(INDEX_KEY)):
        tenant, _, replica = member.partition("|")
        result.append(TelemetryCounters(tenant, replica, await store.hgetall(counters_key(tenant, replica))))
    return result
