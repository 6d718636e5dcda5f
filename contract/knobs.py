"""Per-request speculation knobs (`vllm_xargs.specgate_*`): their names, the
one strict parser for client input (the gateway answers 400), the one lenient
parser for the engine side (the vLLM plugin and the simulator never fail a
request), the merge of a client's knobs with the tenant's policy, and the
per-step rules (`cap_at`, `schedule_cap`, `step_draft_len`).

The gateway puts the knobs into `vllm_xargs` (which vLLM copies verbatim into
`SamplingParams.extra_args`); the plugin reads them in the engine core (draft
cap, load threshold) and in the model-runner worker (confidence floor).
Everything here is pure and imports nothing beyond the standard library,
because the plugin loads this module inside vLLM's own environment.

WHY lenient-but-safe parsing: the gateway already rejects bad values with a 400,
but a client talking to the replica directly (or an old gateway) may still send
junk. Junk must never crash the engine core -- a crash there kills every request
on the replica -- so an invalid value is reported and ignored, and the request
runs exactly as stock vLLM would run it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol

MAX_DRAFT_KEY = "specgate_max_draft"
MIN_CONFIDENCE_KEY = "specgate_min_confidence"
MAX_BATCH_KEY = "specgate_max_batch"
SCHEDULE_KEY = "specgate_schedule"
KNOB_NAMES = ("max_draft", "min_confidence", "max_batch", "schedule")
KEYS = (MAX_DRAFT_KEY, MIN_CONFIDENCE_KEY, MAX_BATCH_KEY, SCHEDULE_KEY)
KEY_PREFIX = "specgate_"

MAX_DRAFT_LIMIT = 64  # no DSpark profile drafts more than 16; 64 leaves headroom for other drafters
MAX_BATCH_LIMIT = 1 << 16
MAX_SCHEDULE_PAIRS = 64

# A batch -> draft-length schedule: ((max_batch, max_draft), ...), max_batch strictly
# ascending. In a step that schedules `b` requests a request may draft the max_draft of
# the first pair whose max_batch >= b, and nothing above the last pair's max_batch -- the
# lookup vLLM's `num_speculative_tokens_per_batch_size` table does for the whole engine,
# here per request (so per tenant). On the wire (`vllm_xargs`, whose values may be
# scalars or flat lists of them) it is the flat list [B1, K1, B2, K2, ...].
Schedule = tuple[tuple[int, int], ...]
# Integer knobs: their upper bound for client input; a smaller value means less speculation.
INTEGER_KNOBS = {MAX_DRAFT_KEY: MAX_DRAFT_LIMIT, MAX_BATCH_KEY: MAX_BATCH_LIMIT}


@dataclass(frozen=True)
class RequestKnobs:
    """What one request asked for; None = key absent or invalid (= stock behaviour)."""

    max_draft: int | None = None
    min_confidence: float | None = None
    # Draft only while the step's batch (requests scheduled together) is at
    # most this: the controller's per-tenant "compute-bound above B" verdict,
    # applied by the engine at every step -- also to requests already in
    # flight when a load step arrives, which a per-request cap set at
    # admission cannot reach.
    max_batch: int | None = None
    # The per-step schedule (`Schedule`); max_draft / max_batch are its one-pair case and,
    # when sent beside it, further caps (the smallest cap wins).
    schedule: Schedule | None = None
    errors: tuple[str, ...] = field(default=())

    @property
    def is_stock(self) -> bool:
        return self.max_draft is None and self.min_confidence is None and self.max_batch is None and self.schedule is None

    def cap_at(self, batch: int) -> int | None:
        """The draft cap in a step of `batch` requests (None = uncapped)."""
        return cap_at(self.max_draft, self.max_batch, batch, self.schedule)

    def largest_cap(self) -> int | None:
        """The most draft tokens these knobs allow in any step (None = uncapped):
        what a request's proposals are measured against when its proposal rate
        and length are estimated (`contract.telemetry`)."""
        if self.max_batch is not None and self.max_batch < 1:
            return 0
        caps = [k for k in (self.max_draft, max((k for _, k in self.schedule), default=0) if self.schedule else None) if k is not None]
        return min(caps) if caps else None


def schedule_cap(schedule: Schedule, batch: int) -> int:
    """A schedule's draft length in a step of `batch` requests: the first pair
    whose max_batch is at least `batch`, 0 above the last."""
    for max_batch, max_draft in schedule:
        if batch <= max_batch:
            return max_draft
    return 0


def cap_at(max_draft: int | None, max_batch: int | None, batch: int, schedule: Schedule | None = None) -> int | None:
    """A request's draft cap in a step of `batch` requests: 0 above its
    `max_batch`, else the smaller of its `max_draft` and its schedule's entry
    for `batch` (None = uncapped). Shared by the plugin and the simulator
    (drafters.sim)."""
    if max_batch is not None and batch > max_batch:
        return 0
    if schedule is None:
        return max_draft
    k = schedule_cap(schedule, batch)
    return k if max_draft is None else min(k, max_draft)


def schedule_problem(schedule: Any) -> str | None:
    """Why `schedule` (pairs) is not a valid `Schedule`, or None. The one rule
    set behind the gateway's 400, the engine's lenient parse and the policy model."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        return "must hold at least one (max_batch, max_draft) pair"
    if len(schedule) > MAX_SCHEDULE_PAIRS:
        return f"must hold at most {MAX_SCHEDULE_PAIRS} pairs, got {len(schedule)}"
    previous = 0
    for i, pair in enumerate(schedule):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return f"entry {i} must be a (max_batch, max_draft) pair, got {pair!r}"
        max_batch, max_draft = pair
        for name, value, low, high in (("max_batch", max_batch, 1, MAX_BATCH_LIMIT),
                                       ("max_draft", max_draft, 0, MAX_DRAFT_LIMIT)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int):
                return f"pair {i}: {name} must be an integer, got {value!r}"
            if not low <= value <= high:
                return f"pair {i}: {name} must be between {low} and {high}, got {value}"
        if max_batch <= previous:
            return f"max_batch must rise strictly from pair to pair; pair {i} has {max_batch} after {previous}"
        previous = max_batch
    return None


def schedule_pairs(flat: Any) -> list | Any:
    """The wire form [B1, K1, B2, K2, ...] as pairs (a value that is not an even-length
    list is returned as it is, for `schedule_problem` to name)."""
    if isinstance(flat, (list, tuple)) and len(flat) % 2 == 0 and all(not isinstance(v, (list, tuple)) for v in flat):
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    return flat


def flat_schedule(schedule: Schedule) -> list[int]:
    """A schedule in its wire form [B1, K1, B2, K2, ...]."""
    return [v for pair in schedule for v in pair]


def compact_schedule(schedule: Iterable[tuple[int, int]]) -> Schedule:
    """The same step function with the fewest pairs: neighbours with the same
    draft length merge (the larger max_batch stays), trailing zeros go (0 is what
    lies above the last pair anyway), keeping at least one pair."""
    out: list[tuple[int, int]] = []
    for max_batch, max_draft in schedule:
        if out and out[-1][1] == max_draft:
            out[-1] = (max_batch, max_draft)
        else:
            out.append((max_batch, max_draft))
    while len(out) > 1 and out[-1][1] == 0:
        out.pop()
    return tuple(out)


def lower_schedule(a: Schedule, b: Schedule) -> Schedule:
    """The pointwise minimum of two schedules (what a request gets when both
    apply): defined at every max_batch either names."""
    bounds = sorted({max_batch for max_batch, _ in a} | {max_batch for max_batch, _ in b})
    return compact_schedule((bound, min(schedule_cap(a, bound), schedule_cap(b, bound))) for bound in bounds)


def schedule_envelope(schedule: Schedule) -> tuple[int, int]:
    """The one-pair (max_draft, max_batch) that never caps below `schedule`: its
    largest draft length, up to its last max_batch that drafts. What a replica
    that knows only max_draft / max_batch is sent in its place."""
    max_draft = max(k for _, k in schedule)
    drafting = [b for b, k in schedule if k > 0]
    return max_draft, (drafting[-1] if drafting else 0)


STOCK = RequestKnobs()

# Knobs the plugin cuts in vLLM's scheduler, so every speculative method honours them.
STEP_KNOBS = ("max_draft", "max_batch", "schedule")


def honoured_knobs(speculates: bool, confidences: bool) -> tuple[str, ...]:
    """The knobs a replica honours (what it advertises in `specgate_ext_info`): the
    scheduler's when it speculates, plus `min_confidence` where the engine computes
    draft confidences (DSpark under adaptive verification). The one rule behind the
    plugin's discovery and the profiles (`contract.profiles.Profile.knobs`)."""
    if not speculates:
        return ()
    return STEP_KNOBS + (("min_confidence",) if confidences else ())


# What a step capped at K=0 still runs. The scheduler hook makes such a step a plain
# decode step on every runner, but the drafter's pass after it is the drafter's own
# business (docs/vllm_ext.md, "K=0: what still runs"): EAGLE's first forward always
# runs (it writes the draft KV), while the prompt-lookup search and DFlash/DSpark's
# query pass are skipped only where the plugin's `draft_skip` patched them or the
# engine skips natively (vLLM 0.33's V2 DSpark). A replica names the skips in force in
# its workers among `specgate_ext_info{engine_fixes}`; the controller prices a step
# whose requests are all capped at 0 without the drafter's pass only where the
# replica's method has one of them (`k0_skips_drafter`).
K0_SKIP_NGRAM = "k0_skip_ngram"  # V1 NgramProposer: no prompt lookup at K=0
K0_SKIP_V1_DFLASH = "k0_skip_v1_dflash"  # V1 DFlashProposer: context pass only
K0_SKIP_V2_DFLASH = "k0_skip_v2_dflash"  # V2 DFlash/DSpark speculator: context pass only (patched or native)
K0_SKIPS: dict[str, str] = {"ngram": K0_SKIP_NGRAM, "dflash": K0_SKIP_V1_DFLASH, "dspark": K0_SKIP_V2_DFLASH}


def k0_skips_drafter(method: str | None, engine_fixes: Iterable[str] | None) -> bool:
    """Does a step whose requests are all capped at 0 skip the drafter's pass on a
    replica running `method` with these engine fixes? `engine_fixes` None: the
    replica reports none (no label: a simulated or older replica), taken as the
    plugin's skip in force where one exists for the method. No speculation: nothing
    to skip, True. EAGLE-3 (and any method without a skip site): never."""
    if not method or method == "off":
        return True
    site = K0_SKIPS.get(method)
    if site is None:
        return False
    return engine_fixes is None or site in set(engine_fixes)


def _parse_count(key: str, value: Any) -> tuple[int | None, str | None]:
    """A non-negative integer (int, integral float or digit string)."""
    if isinstance(value, bool):  # bool is an int subclass; True is not a count
        return None, f"{key} must be an integer >= 0, got boolean {value!r}"
    if isinstance(value, int):
        parsed = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None, f"{key} must be an integer >= 0, got {value!r}"
        parsed = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text.lstrip("+").isdigit():
            return None, f"{key} must be an integer >= 0, got {value!r}"
        parsed = int(text)
    else:
        return None, f"{key} must be an integer >= 0, got {type(value).__name__}"
    if parsed < 0:
        return None, f"{key} must be an integer >= 0, got {parsed}"
    return parsed, None


def _parse_min_confidence(value: Any) -> tuple[float | None, str | None]:
    if isinstance(value, bool):
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got boolean {value!r}"
    if isinstance(value, (int, float)):
        parsed = float(value)
    elif isinstance(value, str):
        try:
            parsed = float(value.strip())
        except ValueError:
            return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {value!r}"
    else:
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {type(value).__name__}"
    if not math.isfinite(parsed) or not 0.0 <= parsed <= 1.0:
        return None, f"{MIN_CONFIDENCE_KEY} must be a number in [0, 1], got {value!r}"
    return parsed, None


def _parse_schedule(value: Any) -> tuple[Schedule | None, str | None]:
    """The wire form, with the integer leniency of `_parse_count` (vLLM keeps a list's
    items as the client sent them: numbers or digit strings)."""
    if not isinstance(value, (list, tuple)) or len(value) % 2:
        return None, f"{SCHEDULE_KEY} must be a flat list [max_batch, max_draft, ...] of even length, got {value!r}"
    counts = []
    for item in value:
        parsed, err = _parse_count(SCHEDULE_KEY, item)
        if err:
            return None, err
        counts.append(parsed)
    pairs = schedule_pairs(counts)
    problem = schedule_problem(pairs)
    if problem:
        return None, f"{SCHEDULE_KEY} {problem}"
    return tuple(pairs), None


def parse_knobs(extra_args: Mapping[str, Any] | None) -> RequestKnobs:
    """Read the specgate keys from a request's extra_args. Never raises."""
    if not extra_args or not isinstance(extra_args, Mapping):
        return STOCK
    if not any(key in extra_args for key in KEYS):
        return STOCK
    errors: list[str] = []
    max_draft = min_confidence = max_batch = schedule = None
    if MAX_DRAFT_KEY in extra_args:
        max_draft, err = _parse_count(MAX_DRAFT_KEY, extra_args[MAX_DRAFT_KEY])
        if err:
            errors.append(err)
    if MIN_CONFIDENCE_KEY in extra_args:
        min_confidence, err = _parse_min_confidence(extra_args[MIN_CONFIDENCE_KEY])
        if err:
            errors.append(err)
    if MAX_BATCH_KEY in extra_args:
        max_batch, err = _parse_count(MAX_BATCH_KEY, extra_args[MAX_BATCH_KEY])
        if err:
            errors.append(err)
    if SCHEDULE_KEY in extra_args:
        schedule, err = _parse_schedule(extra_args[SCHEDULE_KEY])
        if err:
            errors.append(err)
    return RequestKnobs(max_draft=max_draft, min_confidence=min_confidence, max_batch=max_batch, schedule=schedule,
                        errors=tuple(errors))  # fmt: skip


def effective_draft_len(scheduled: int, knobs: RequestKnobs, batch: int = 1) -> int:
    """How many of `scheduled` draft tokens a request may keep under its cap in a step of `batch` requests."""
    cap = knobs.cap_at(batch)
    if cap is None:
        return scheduled
    return min(scheduled, cap)


def step_draft_len(caps: Iterable[int | None], stock_k: int) -> int:
    """The K a step drafts with under per-request caps: the largest cap among
    the step's requests, `stock_k` as soon as one of them is uncapped (None).
    0 -- every request capped at 0 -- means the drafter is not run at all.
    Shared by the plugin's scheduler hook and the simulator (drafters.sim)."""
    if stock_k <= 0:
        return stock_k
    k = 0
    for cap in caps:
        if cap is None or cap >= stock_k:
            return stock_k
        k = max(k, cap)
    return k


# -- client side: strict --------------------------------------------------


class KnobError(ValueError):
    """A client's knob is invalid; `param` names it for the OpenAI error body."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def validate_client_xargs(xargs: Any) -> dict[str, Any] | None:
    """Check `vllm_xargs` from a client; raise KnobError naming the bad key.

    Stricter than `parse_knobs` on purpose: a client that sends junk is told
    so (400) instead of silently getting stock behaviour. Keys without the
    `specgate_` prefix belong to other extensions and pass untouched.
    """
    if xargs is None:
        return None
    if not isinstance(xargs, dict):
        raise KnobError("'vllm_xargs' must be an object", "vllm_xargs")
    for key, value in xargs.items():
        if not key.startswith(KEY_PREFIX):
            continue
        param = f"vllm_xargs.{key}"
        if key in INTEGER_KNOBS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise KnobError(f"'{param}' must be an integer", param)
            if not 0 <= value <= INTEGER_KNOBS[key]:
                raise KnobError(f"'{param}' must be between 0 and {INTEGER_KNOBS[key]}", param)
        elif key == MIN_CONFIDENCE_KEY:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KnobError(f"'{param}' must be a number", param)
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise KnobError(f"'{param}' must be between 0 and 1", param)
        elif key == SCHEDULE_KEY:
            if not isinstance(value, list) or len(value) % 2:
                raise KnobError(f"'{param}' must be a flat list [max_batch, max_draft, ...] of even length", param)
            problem = schedule_problem(schedule_pairs(value))
            if problem:
                raise KnobError(f"'{param}' {problem}", param)
        else:
            raise KnobError(f"unknown specgate knob '{param}'; known: {', '.join(KEYS)}", param)
    return xargs


# -- the merge -----------------------------------------------------------


class KnobPolicy(Protocol):
    """What the merge needs of a tenant policy (`contract.policy.SpeculationPolicy`)."""

    def vllm_xargs(self) -> dict[str, int | float | list[int]]: ...


def merged_xargs(
    client: dict[str, Any] | None, policy: KnobPolicy, replica_knobs: frozenset[str]
) -> dict[str, Any] | None:
    """The `vllm_xargs` to send to one replica (None = leave the field absent).

    The tenant policy is a *cap*: a client may ask for less speculation than
    its policy allows (smaller `specgate_max_draft`, higher
    `specgate_min_confidence`, smaller `specgate_max_batch`, a schedule lower
    at some batch sizes: the two schedules' pointwise minimum), never more.
    `replica_knobs` is what the replica advertises in `specgate_ext_info`
    (`max_draft`, `max_batch`, `schedule`, `min_confidence`); the policy only
    adds knobs the replica honours, so a replica without adaptive verification
    is never sent a confidence floor it would ignore, a replica whose plugin
    predates schedules gets the policy's `max_draft`/`max_batch`, which
    `SpeculationPolicy.vllm_xargs` bounds by the schedule's envelope, and a
    replica without the extension gets the client's `vllm_xargs` untouched.
    """
    if "max_draft" not in replica_knobs:
        return client
    wanted = {k: v for k, v in policy.vllm_xargs().items() if k.removeprefix(KEY_PREFIX) in replica_knobs}
    if not wanted:
        return client
    out = dict(client) if client else {}
    for key, limit in wanted.items():
        asked = out.get(key)
        if asked is None:
            out[key] = limit
        elif key == SCHEDULE_KEY:  # validated: a flat list of pairs on both sides
            out[key] = flat_schedule(lower_schedule(tuple(schedule_pairs(asked)), tuple(schedule_pairs(limit))))
        elif key in INTEGER_KNOBS:  # a smaller cap / threshold is less speculation
            out[key] = min(int(asked), int(limit))
        else:  # specgate_min_confidence: a higher floor is less speculation
            out[key] = max(float(asked), float(limit))
    return out
