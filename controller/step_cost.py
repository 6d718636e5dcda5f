"""A replica's step time, learned from its own /metrics: the curve the
goodput model prices every choice with.

Why learn it: whether speculation pays is a question of where a replica's
step turns compute-bound (its *knee*, in tokens per forward step), and that
differs tenfold between an H200 serving an 8B model (hundreds of tokens) and
a CPU serving a small one (a handful). A named roofline preset describes only
the hardware it was fitted to; the engine itself says how long its steps take
at the load it is carrying. vLLM 0.32 exports no step duration, but every
scrape interval gives one averaged point (see
`shared/notes/step-cost-from-vllm-metrics.md`):

* steps S = d(`iteration_tokens_total` count),
* mean step time t = interval / S (the engine is busy the whole interval
  while requests run),
* forward tokens per step N = (d generation - d accepted + d draft tokens +
  d prompt tokens computed) / S -- the verify work *including rejected
  drafts*, which `iteration_tokens` leaves out -- of which the prompt tokens
  arrive in bursts (see `StepPoint`),
* the share of steps that draft at all, phi = min(1, d drafts / S), and the
  requests the drafter proposes for per step, D = phi x decoding requests per
  step (vLLM drafts batch-wide: a request whose drafts were not scheduled
  still paid for them; see `ReplicaEstimator.update`).

Where the replica runs the specgate extension, its engine steps are timed in
the worker instead (drafters/vllm_ext/step_timing.py): per (batch, tokens,
drafting) cell, exact per-step means with no idle time, so each scrape adds
several points at known batch sizes (`observe_cells`); the interval estimate
above is the fallback for replicas without it.

The model is flat-then-linear in forward tokens, plus a part per scheduled
request (its own sampling, bookkeeping and KV reads: what makes one request
verifying nine tokens cheaper than nine requests), plus the drafter's pass (a
fixed part -- its weights are read once per step -- and a part per drafting
request):

    t(N, R, D) = flat + request * R + slope * max(0, N - knee) + draft_fixed * phi + draft * D

(flat-then-linear fitted the CPU bed's 12 measured points to 7% median
error; the roofline is the same shape). Points are kept in bins of N and of
the drafting share, as decayed ratio sums (total time / total steps), so a
steady load adds evidence to one point instead of flooding the fit, memory is
bounded, and a machine whose speed drifts (a co-tenant) is followed within a
few half-lives. Each refit scans a grid of knees and solves a small weighted
least-squares problem (relative error) for (flat, slope, draft_fixed,
draft, request) per knee.

The prior -- a roofline preset's curve when `--gpu/--model` are given, a
generic shape otherwise -- enters only as weak ridge terms on the curve's
*shape* (knee, slope x knee / flat, the drafter's costs / flat), never on its level: one
observed point sets the level, and points at two or more N pin the knee. With
no data at all the prior itself is the curve.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from contract.vllm_metrics import StepCell

# A knee is searched on this geometric grid (tokens per step), from 4: no
# engine is compute-bound at a handful of tokens per step (the slowest
# measured here, the CPU bed, bends at 7.7), and a knee allowed below that
# fits noise. At light load every scrape interval sits at 1-2 forward tokens
# (prefill shares and idle edges move them a little, their times scatter by
# 2x); a knee at 1 token put a slope through such points that priced a
# drafting request at 10-30x an idle step, and on the real bed switched a
# tenant off that gained 1.8x from drafting ("k full->0: predicted goodput
# +1279 %" at rho 0.05).
KNEE_GRID: tuple[float, ...] = tuple(round(2 ** (i / 4), 3) for i in range(8, 4 * 14 + 1))  # 4 .. 16384


@dataclass(frozen=True)
class StepCurve:
    """t(N, R, D) = flat + request * R + slope * max(0, N - knee) + draft_fixed * phi + draft * D (seconds)."""

    flat_s: float
    knee_tokens: float
    slope_s: float  # seconds per forward token above the knee
    draft_s: float = 0.0  # seconds per drafting request in the step (the drafter's pass)
    draft_fixed_s: float = 0.0  # seconds per step in which anyone drafts
    request_s: float = 0.0  # seconds per scheduled request

    def step_time_s(self, tokens: float, drafting: float = 0.0, share: float | None = None, requests: float = 0.0) -> float:
        """`share`: fraction of steps that draft (default: all when `drafting` > 0);
        `requests`: scheduled requests in the step (0: the request term left out)."""
        phi = (1.0 if drafting > 0 else 0.0) if share is None else min(max(share, 0.0), 1.0)
        return (
            self.flat_s + self.request_s * max(requests, 0.0) + self.slope_s * max(0.0, tokens - self.knee_tokens)
            + self.draft_fixed_s * phi + self.draft_s * max(drafting, 0.0)
        )

    @property
    def shape(self) -> float:
        """slope x knee / flat: 1 for a roofline (time proportional to tokens
        above the knee); below 1 where a fixed per-step overhead dominates."""
        return self.slope_s * self.knee_tokens / self.flat_s if self.flat_s > 0 else 0.0


@dataclass(frozen=True)
class StepPoint:
    """One averaged observation: mean step time at N forward tokens with D drafting requests.

    With chunked prefill the steps are not alike: a share `burst_share` of
    them carries a prompt chunk of `burst_tokens` on top of the `tokens`
    every step verifies. Where the curve bends (at and above the knee) the
    mean of such a mixture lies above the curve at the mean token count, so
    the point is compared with the mixture's mean (`over_knee`), the same
    burst model the goodput model prices with (decision.goodput). A point
    with no burst share is a plain average.
    """

    tokens: float
    step_s: float
    drafting: float = 0.0
    share: float = 0.0  # fraction of steps with any drafting
    weight: float = 1.0  # seconds of engine time behind it
    burst_tokens: float = 0.0  # prompt tokens in a step that carries a prefill chunk
    burst_share: float = 0.0  # fraction of steps that carry one
    requests: float = 0.0  # scheduled requests per step (0: unknown, the request term is not fitted on it)

    def over_knee(self, knee: float) -> float:
        """Mean forward tokens above `knee` per step (the slope's regressor)."""
        q = min(max(self.burst_share, 0.0), 1.0)
        plain = max(0.0, self.tokens - knee)
        return plain if q <= 0 else (1.0 - q) * plain + q * max(0.0, self.tokens + self.burst_tokens - knee)

    @property
    def mean_tokens(self) -> float:
        return self.tokens + min(max(self.burst_share, 0.0), 1.0) * self.burst_tokens

    def predicted_s(self, curve: StepCurve) -> float:
        """The mean step time `curve` predicts for this point's mix of steps."""
        plain = curve.step_time_s(self.tokens, self.drafting, self.share, self.requests)
        q = min(max(self.burst_share, 0.0), 1.0)
        if q <= 0:
            return plain
        return (1.0 - q) * plain + q * curve.step_time_s(self.tokens + self.burst_tokens, self.drafting, self.share,
                                                         self.requests)


@dataclass(frozen=True)
class Prior:
    """The shape the fit leans on where the data cannot tell."""

    curve: StepCurve
    label: str = "generic"
    knee_strength: float = 0.02  # ridge weight on ln(knee / prior knee)^2
    shape_strength: float = 0.05  # ridge weight on (slope*knee - shape*flat)^2 / flat_ref^2
    draft_strength: float = 0.05  # ridge weight on the drafter's two costs relative to flat (as for shape)
    request_strength: float = 0.05  # ridge weight on the per-request cost relative to flat (as for shape)
    # The drafter's pass per drafting request in target forward tokens (its
    # share of the target's work per token x the slots it proposes). When > 0
    # the per-request cost leans on slope x this instead of on the flat level:
    # a replica that always drafts cannot tell its drafter's pass from its flat
    # level, and a prior of "free" would price every step without speculation
    # as paying for it (seen on the simulator at c=256: `off` priced at 2.4x
    # its cost, speculation kept on where it lost 26 %).
    draft_work_tokens: float = 0.0


# No preset: a roofline-shaped guess with a mid-range knee (between a CPU's
# handful of tokens and a datacenter GPU's hundreds). Its level (25 ms) only
# matters until the first observed point; its knee only while every
# observation sits at one N.
GENERIC_PRIOR = Prior(StepCurve(flat_s=0.025, knee_tokens=64.0, slope_s=0.025 / 64.0, draft_s=0.0))


def _solve(rows: np.ndarray, rhs: np.ndarray, free: Sequence[int]) -> np.ndarray | None:
    sol, *_ = np.linalg.lstsq(rows[:, list(free)], rhs, rcond=None)
    theta = np.zeros(rows.shape[1])
    theta[list(free)] = sol
    return theta if np.all(np.isfinite(theta)) else None


# Parameter subsets, largest first (flat always free); the others are pinned at 0.
# Columns: flat, slope, draft_fixed, draft, request.
_ACTIVE_SETS = tuple(
    (0, *rest) for size in range(4, -1, -1) for rest in itertools.combinations((1, 2, 3, 4), size)
)


def _fit_at_knee(points: Sequence[StepPoint], knee: float, prior: Prior, weight_cap: float) -> tuple[float, StepCurve] | None:
    """Weighted least squares (relative error) for (flat, slope, draft_fixed, draft, request) at a fixed knee."""
    pc = prior.curve
    flat_ref = float(np.median([p.step_s for p in points]))
    d_ref = max((p.drafting for p in points), default=0.0) or 8.0
    r_ref = max((p.requests for p in points), default=0.0) or 8.0
    fixed_ratio = pc.draft_fixed_s / pc.flat_s if pc.flat_s > 0 else 0.0
    draft_ratio = pc.draft_s / pc.flat_s if pc.flat_s > 0 else 0.0
    request_ratio = pc.request_s / pc.flat_s if pc.flat_s > 0 else 0.0
    rows: list[list[float]] = []
    rhs: list[float] = []
    for p in points:
        w = math.sqrt(min(p.weight, weight_cap)) / p.step_s
        rows.append([w, w * p.over_knee(knee), w * p.share, w * p.drafting, w * p.requests])
        rhs.append(w * p.step_s)
    sb = math.sqrt(prior.shape_strength) / flat_ref
    rows.append([-sb * pc.shape, sb * knee, 0.0, 0.0, 0.0])
    sg = math.sqrt(prior.draft_strength) / flat_ref
    rows.append([-sg * fixed_ratio, 0.0, sg, 0.0, 0.0])
    if prior.draft_work_tokens > 0:
        rows.append([0.0, -sg * prior.draft_work_tokens * d_ref, 0.0, sg * d_ref, 0.0])
    else:
        rows.append([-sg * draft_ratio * d_ref, 0.0, 0.0, sg * d_ref, 0.0])
    sr = math.sqrt(prior.request_strength) / flat_ref
    rows.append([-sr * request_ratio * r_ref, 0.0, 0.0, 0.0, sr * r_ref])
    rhs += [0.0, 0.0, 0.0, 0.0]
    a, y = np.asarray(rows, dtype=float), np.asarray(rhs, dtype=float)
    best: tuple[float, StepCurve] | None = None
    for free in _ACTIVE_SETS:
        # Non-negative least squares by enumeration (four parameters): the
        # best feasible subset, not the first -- pinning the drafter's cost
        # at 0 because a fit with it free made the fixed part negative would
        # silently price the drafter as free.
        theta = _solve(a, y, free)
        if theta is None or theta[0] <= 0 or np.any(theta[1:] < 0):
            continue
        resid = a @ theta - y
        cost = float(resid @ resid) + prior.knee_strength * math.log(knee / pc.knee_tokens) ** 2
        if best is None or cost < best[0] - 1e-15:
            best = cost, StepCurve(float(theta[0]), knee, float(theta[1]), float(theta[3]), float(theta[2]),
                                   float(theta[4]))
        if len(free) == 5:
            break  # the unconstrained optimum is feasible: nothing can beat it
    return best


# Robust refit: a point whose step time is off the fitted curve by a factor
# e^r is down-weighted by 1 / (1 + (r / OUTLIER_LOG_SCALE)^2) (Cauchy weights
# on the log residual), over OUTLIER_PASSES refits.
OUTLIER_LOG_SCALE = 0.5
OUTLIER_PASSES = 2


def _best_over_knees(points: Sequence[StepPoint], prior: Prior, weight_cap: float) -> StepCurve | None:
    best: tuple[float, StepCurve] | None = None
    for knee in KNEE_GRID:
        fitted = _fit_at_knee(points, knee, prior, weight_cap)
        if fitted is not None and (best is None or fitted[0] < best[0]):
            best = fitted
    return None if best is None else best[1]


def fit_step_curve(points: Iterable[StepPoint], prior: Prior = GENERIC_PRIOR, weight_cap: float = 30.0) -> StepCurve:
    """PURE: the curve that best explains `points` (relative error), leaning on `prior`'s shape.

    `weight_cap` (seconds) bounds any one point's weight, so a long steady
    phase cannot outvote the few points that locate the knee. No usable points
    -> the prior's curve.

    Why robust: an interval in which the engine stalled (a flood of arrivals
    on the server's event loop, a preemption, a co-tenant's burst) reads as
    steps many times slower than the curve, and one such point of a second or
    so would otherwise lift the flat level and erase the drafter's cost (seen
    in the end-to-end tests: a 605 ms "step" at 12 tokens next to 11 ms ones).
    Ordinary scatter (tens of percent) keeps nearly its full weight.
    """
    pts = [p for p in points if p.step_s > 0 and p.tokens > 0 and p.weight > 0]
    if not pts:
        return prior.curve
    curve = _best_over_knees(pts, prior, weight_cap)
    for _ in range(OUTLIER_PASSES if len(pts) >= 3 else 0):
        if curve is None:
            break
        logs = [math.log(max(p.predicted_s(curve), 1e-12) / p.step_s) for p in pts]
        if max(abs(r) for r in logs) < OUTLIER_LOG_SCALE / 2:
            break  # every weight would stay above 0.8: nothing to down-weight
        reweighted = [
            replace(p, weight=min(p.weight, weight_cap) / (1.0 + (r / OUTLIER_LOG_SCALE) ** 2)) for p, r in zip(pts, logs)
        ]
        curve = _best_over_knees(reweighted, prior, weight_cap) or curve
    return prior.curve if curve is None else curve


@dataclass
class _Bin:
    seconds: float = 0.0  # decayed engine time
    steps: float = 0.0
    tokens: float = 0.0
    drafting: float = 0.0
    drafting_steps: float = 0.0
    prompt: float = 0.0  # prefill tokens (not in `tokens`)
    burst_steps: float = 0.0  # steps that carried them
    requests: float = 0.0  # scheduled requests, summed over the steps

    def scale(self, factor: float) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) * factor)


def _bin_key(tokens_per_step: float, drafting_share: float, requests_per_step: float) -> tuple[int, int, int]:
    """Quarter-octave bins of N; drafting share none / some / all; octaves of the batch."""
    share = 0 if drafting_share <= 0.05 else (2 if drafting_share >= 0.95 else 1)
    return (int(round(4 * math.log2(max(tokens_per_step, 1.0)))), share,
            int(round(math.log2(max(requests_per_step, 1.0)))))  # fmt: skip


@dataclass
class StepCostLearner:
    """Online, bounded-memory form of `fit_step_curve` for one replica."""

    prior: Prior = GENERIC_PRIOR
    half_life_s: float = 300.0
    floor_s: float = 1.0  # an old bin's weight decays to this, not to zero
    min_steps: float = 1.0  # an interval without a whole step says nothing (slow steps: 2-3 per scrape on a CPU)
    bins: dict[tuple[int, int, int], _Bin] = field(default_factory=dict)
    observations: int = 0
    curve: StepCurve | None = None
    timed: bool = False  # fitted on engine-timed steps (observe_cells) rather than scrape intervals
    # Seconds of observations between refits. A refit scans the knee grid (~25 ms of CPU with 45
    # points); at one scrape a second per replica that was most of an embedded controller's CPU,
    # taken from the engines on a shared host, while the curve moves with a 300 s half-life.
    refit_s: float = 5.0
    stale_s: float = 0.0  # observed seconds since the last refit

    def _refit(self, dt_s: float) -> None:
        """Refit on the first observation and then every `refit_s` of observations."""
        self.stale_s += max(dt_s, 0.0)
        if self.curve is None or self.stale_s >= self.refit_s:
            self.curve = fit_step_curve(self.points(), self.prior)
            self.stale_s = 0.0

    def _decay(self, dt_s: float) -> None:
        decay = 0.5 ** (dt_s / self.half_life_s) if self.half_life_s > 0 else 0.0
        for b in self.bins.values():
            # Old evidence fades toward a floor instead of vanishing: a load
            # region not visited for many half-lives (light load during a long
            # heavy phase) still pins the curve there, weakly, and new evidence
            # in the same bin outweighs it at once. (Memory stays bounded: the
            # bins are a fixed grid.)
            b.scale(decay if b.seconds * decay >= self.floor_s else min(1.0, self.floor_s / b.seconds))

    def observe(self, dt_s: float, steps: float, forward_tokens: float, drafting_requests: float, batch: float,
                prompt_tokens: float = 0.0, prompt_chunk: float | None = None) -> bool:
        """Fold one busy scrape interval in; returns True when it was kept.

        `forward_tokens` and `drafting_requests` are the interval's totals;
        `batch` (requests per step) decides the drafting share's bin and is
        the step's request count.
        `prompt_tokens` (of the forward tokens, those prefilled) arrive in
        chunks of `prompt_chunk` (the mean prompt; None: unknown, read as
        spread evenly over the steps), so a share prompt / (steps x chunk) of
        the steps carries one.
        """
        if dt_s <= 0 or steps < self.min_steps or forward_tokens <= 0:
            return False
        prompt = min(max(prompt_tokens, 0.0), forward_tokens)
        burst_steps = steps if not prompt_chunk or prompt_chunk <= 0 else min(steps, prompt / prompt_chunk)
        self._decay(dt_s)
        n = forward_tokens / steps
        share = (drafting_requests / steps) / max(batch, 1.0)
        b = self.bins.setdefault(_bin_key(n, share, batch), _Bin())
        b.seconds += dt_s
        b.steps += steps
        b.tokens += forward_tokens - prompt
        b.drafting += drafting_requests
        b.drafting_steps += min(share, 1.0) * steps
        b.requests += max(batch, 1.0) * steps
        if prompt > 0:
            b.prompt += prompt
            b.burst_steps += burst_steps
        self.observations += 1
        self._refit(dt_s)
        return True

    def observe_cells(self, dt_s: float, cells: Mapping[tuple[int, int, int], StepCell]) -> bool:
        """Fold in one scrape interval's engine-timed steps (`contract.vllm_metrics.StepCell` per
        (batch, tokens, drafting) cell): each cell is a set of steps of known shape and summed
        worker time, so it enters as it is (no idle time, no burst model: its tokens are the
        steps' own, prefill included). A drafting cell's requests all count as drafting (vLLM
        drafts batch-wide). Returns True when any step was kept."""
        cells = {k: c for k, c in cells.items() if c.steps > 0 and c.seconds > 0 and c.tokens > 0}
        if not cells:
            return False
        self._decay(max(dt_s, 0.0))
        for (_, _, drafting), c in cells.items():
            n, r = c.tokens / c.steps, c.requests / c.steps
            b = self.bins.setdefault(_bin_key(n, 1.0 if drafting else 0.0, r), _Bin())
            b.seconds += c.seconds
            b.steps += c.steps
            b.tokens += c.tokens
            b.requests += c.requests
            if drafting:
                b.drafting += c.requests
                b.drafting_steps += c.steps
        self.observations += 1
        self.timed = True
        self._refit(dt_s)
        return True

    def points(self) -> list[StepPoint]:
        return [
            StepPoint(
                b.tokens / b.steps, b.seconds / b.steps, b.drafting / b.steps, b.drafting_steps / b.steps, b.seconds,
                b.prompt / b.burst_steps if b.burst_steps > 0 else 0.0, min(1.0, b.burst_steps / b.steps),
                b.requests / b.steps,
            )
            for b in self.bins.values()
            if b.steps > 0
        ]

    def current(self) -> StepCurve:
        return self.curve or self.prior.curve

    def describe(self, grid: Sequence[float] | None = None) -> dict:
        """JSON-ready state for /admin and the benchmark: the fitted curve,
        sampled on `grid` (default: 1 .. 2x the largest observed N)."""
        c = self.current()
        pts = sorted(self.points(), key=lambda p: p.mean_tokens)
        top = max((p.mean_tokens for p in pts), default=c.knee_tokens * 4)
        if grid is None:
            grid = sorted({1.0, *(2.0**i for i in range(0, 15) if 2.0**i <= 2 * top), round(c.knee_tokens, 1)})
        return {
            "model": "flat + request*R + slope*max(0, N - knee) + draft_fixed*phi + draft*D",
            "prior": self.prior.label,
            "learned": self.curve is not None,
            "source": "engine-timed steps" if self.timed else "scrape intervals",
            "flat_ms": round(c.flat_s * 1e3, 3),
            "knee_tokens": round(c.knee_tokens, 2),
            "slope_ms_per_token": round(c.slope_s * 1e3, 4),
            "draft_ms_per_request": round(c.draft_s * 1e3, 4),
            "draft_fixed_ms": round(c.draft_fixed_s * 1e3, 4),
            "request_ms": round(c.request_s * 1e3, 4),
            "points": len(pts),
            "observations": self.observations,
            # [tokens per step (prefill included), ms per step, drafting requests per step, drafting share,
            #  seconds of evidence, prefill chunk, share of steps carrying one, requests per step]
            "observed": [
                [round(p.mean_tokens, 2), round(p.step_s * 1e3, 2), round(p.drafting, 2), round(p.share, 2),
                 round(p.weight, 1), round(p.burst_tokens, 1), round(p.burst_share, 3), round(p.requests, 2)]
                for p in pts
            ],
            "curve": [[n, round(c.step_time_s(n, requests=n) * 1e3, 2)] for n in grid],  # N requests of a token each
        }


def described_curve(described: Mapping) -> StepCurve:
    """The curve a `StepCostLearner.describe()` wrote (the benchmarks read it back from
    /admin/replicas). Terms an older export lacks count as 0."""
    return StepCurve(
        described["flat_ms"] / 1e3, described["knee_tokens"], described["slope_ms_per_token"] / 1e3,
        described.get("draft_ms_per_request", 0.0) / 1e3, described.get("draft_fixed_ms", 0.0) / 1e3,
        described.get("request_ms", 0.0) / 1e3,
    )  # fmt: skip


def described_points(described: Mapping) -> list[StepPoint]:
    """The binned points a `describe()` wrote under "observed" (rounded as written there):
    its mean tokens per step, prefill bursts included, back to the tokens every step verifies."""
    out = []
    for tokens, ms, drafting, share, weight, burst, burst_share, requests in described.get("observed", []):
        q = min(max(burst_share, 0.0), 1.0)
        out.append(StepPoint(tokens - q * burst, ms / 1e3, drafting, share, weight, burst, burst_share, requests))
    return out
