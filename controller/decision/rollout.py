"""The rollout rule: promote a tenant's candidate drafter, roll it back, or wait. PURE.

A canary (`contract.policy.CanarySpec`) sends a share of one tenant's
requests to the replicas serving the candidate drafter; the rest stay with
the incumbent. This module compares the two arms from their telemetry
counter deltas since the canary started (`contract.telemetry`: the
per-request acceptance-length sums `al_requests`, `al_sum`, `al_sumsq` and
the timing sums `timed_requests`, `timed_seconds`, `timed_completion_tokens`)
and says what to do, with a one-line reason carrying the numbers.

The rule (settings `controller.rollout`, `contract.settings.RolloutSettings`):

* **No verdict before `min_requests`** drafting requests (requests that ran at
  least one speculation step) on *each* arm -- except that a canary older than
  `max_duration_s` is rolled back whatever it has gathered.
* **Acceptance: Welch's one-sided comparison** of the mean per-request
  acceptance length a = 1 + accepted / steps. With means m, sample variances
  s^2 and counts n per arm, d = m_cand - m_inc, se = sqrt(s_c^2/n_c + s_i^2/n_i),
  Welch-Satterthwaite degrees of freedom, and t = the Student-t quantile at
  `confidence`: lower = d - t se, upper = d + t se (each a one-sided bound at
  `confidence`).
* **Goodput**: an arm's completion tokens per request-second (timed counters:
  sum of completion tokens / sum of request durations of the timed requests).
  It is *measured* once both arms have `min_requests` timed requests; when
  neither arm has any timed request (a gateway that does not time requests)
  it is *not measured* and does not block a promotion; in between it is
  *pending* (no promotion yet).
* **Promote** when lower > `min_gain` and the candidate's goodput is at least
  (1 - `max_goodput_loss`) x the incumbent's (or not measured).
* **Roll back** when upper < `min_gain` (significantly not better), or the
  measured goodput is below that allowance, or the canary is older than
  `max_duration_s` (undecided).
* Otherwise **wait**.

Why this shape: acceptance length is noisy per request (prompt to prompt it
varies far more than between two drafters that differ by a few percent), so
a ratio of sums would promote on luck; Welch's test does not assume the two
arms share a variance (a specialised drafter is often *more* variable: great
on its tenant's common prompts, no better on the rest). Goodput guards
against a drafter that is accepted more but costs more (a bigger drafter, a
slower canary replica): acceptance alone would promote it. `min_gain`
requires the gain to matter, not just to exist.

The Student-t quantile: scipy is not a dependency, so `t_quantile` uses the
Cornish-Fisher expansion of t in the normal quantile (Abramowitz & Stegun
26.7.5, the normal quantile from `statistics.NormalDist`) for df >= 3, and
the exact closed forms for df = 1 and 2, taken at floor(df) below 3 (a
larger quantile: conservative). Against tabulated values it is within 0.4 %
for confidence <= 0.99 at df = 3 (2.7 % low at 0.999), and within 0.02 % from
df = 10 (`tests/controller/decision/test_rollout.py`); with the default
`min_requests` (30) Welch's df is at least 29.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Literal, Mapping

from contract.settings import RolloutSettings

ARM_FIELDS = (
    "requests", "al_requests", "al_sum", "al_sumsq", "timed_requests", "timed_seconds", "timed_completion_tokens",
)

Verdict = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True)
class ArmStats:
    """One arm's telemetry counter deltas since the canary started (summed over its replicas)."""

    requests: float = 0.0  # every finished request of the tenant on the arm
    al_requests: float = 0.0  # those that ran at least one speculation step
    al_sum: float = 0.0
    al_sumsq: float = 0.0
    timed_requests: float = 0.0
    timed_seconds: float = 0.0
    timed_completion_tokens: float = 0.0

    @classmethod
    def from_counters(cls, values: Mapping[str, float]) -> "ArmStats":
        return cls(**{f: float(values.get(f, 0.0) or 0.0) for f in ARM_FIELDS})

    def __add__(self, other: "ArmStats") -> "ArmStats":
        return ArmStats(**{f: getattr(self, f) + getattr(other, f) for f in ARM_FIELDS})

    @property
    def n(self) -> int:
        return int(round(self.al_requests))

    @property
    def mean(self) -> float | None:
        """Mean per-request acceptance length."""
        return self.al_sum / self.al_requests if self.al_requests > 0 else None

    @property
    def variance(self) -> float | None:
        """Sample variance of the per-request acceptance length (n - 1 in the denominator)."""
        if self.al_requests < 2:
            return None
        # (Clamped: float cancellation on near-constant samples can go a hair below zero.)
        return max(0.0, (self.al_sumsq - self.al_sum**2 / self.al_requests) / (self.al_requests - 1))

    @property
    def goodput(self) -> float | None:
        """Completion tokens per request-second over the timed requests."""
        return self.timed_completion_tokens / self.timed_seconds if self.timed_seconds > 0 else None

    def to_json(self) -> dict:
        out = {k: round(v, 6) for k, v in asdict(self).items()}
        out.update(
            mean_acceptance=None if self.mean is None else round(self.mean, 4),
            sd_acceptance=None if self.variance is None else round(math.sqrt(self.variance), 4),
            goodput_tok_s=None if self.goodput is None else round(self.goodput, 3),
        )
        return out


@dataclass(frozen=True)
class RolloutVerdict:
    verdict: Verdict
    reason: str  # one line, with the numbers
    numbers: dict


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom.

    df >= 3: Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5) around the
    normal quantile; df < 3: the exact quantile at floor(df) (1 or 2), which is
    at least the true one. df = inf: the normal quantile."""
    if not 0.5 < p < 1.0:
        raise ValueError("p must lie in (0.5, 1)")
    if df < 1:
        raise ValueError("df must be at least 1")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if df < 2:
        return math.tan(math.pi * (p - 0.5))
    if df < 3:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Comparison:
    """Welch's comparison of the candidate's mean acceptance length with the incumbent's."""

    diff: float
    se: float
    df: float
    t: float

    @property
    def lower(self) -> float:
        return self.diff - self.t * self.se

    @property
    def upper(self) -> float:
        return self.diff + self.t * self.se


def welch(candidate: ArmStats, incumbent: ArmStats, confidence: float) -> Comparison:
    """Both arms need >= 2 drafting requests (a variance each)."""
    mc, mi = candidate.mean, incumbent.mean
    vc, vi = candidate.variance, incumbent.variance
    if mc is None or mi is None or vc is None or vi is None:
        raise ValueError("each arm needs at least two drafting requests")
    qc, qi = vc / candidate.al_requests, vi / incumbent.al_requests
    se2 = qc + qi
    if se2 <= 0:  # both arms constant: the difference is known exactly
        return Comparison(mc - mi, 0.0, math.inf, 0.0)
    denom = (qc**2 / (candidate.al_requests - 1) if qc else 0.0) + (qi**2 / (incumbent.al_requests - 1) if qi else 0.0)
    df = se2**2 / denom if denom > 0 else math.inf
    # Welch's df lies between min(n) - 1 and n_c + n_i - 2; float noise aside, keep it there.
    df = max(df, min(candidate.al_requests, incumbent.al_requests) - 1)
    return Comparison(mc - mi, math.sqrt(se2), df, t_quantile(confidence, df))


def judge(candidate: ArmStats, incumbent: ArmStats, cfg: RolloutSettings, elapsed_s: float) -> RolloutVerdict:
    """The verdict on one canary (see the module docstring for the rule)."""
    numbers: dict = {
        "elapsed_s": round(elapsed_s, 1),
        "candidate": candidate.to_json(),
        "incumbent": incumbent.to_json(),
        "min_requests": cfg.min_requests,
        "confidence": cfg.confidence,
        "min_gain": cfg.min_gain,
        "max_goodput_loss": cfg.max_goodput_loss,
        "max_duration_s": cfg.max_duration_s,
    }
    overdue = elapsed_s > cfg.max_duration_s
    arms = f"n={candidate.n}/{incumbent.n}"
    if candidate.n < cfg.min_requests or incumbent.n < cfg.min_requests:
        short = f"drafting requests {arms} (candidate/incumbent), need {cfg.min_requests} per arm"
        if overdue:
            return RolloutVerdict("rollback", f"undecided after {elapsed_s:.0f} s > max_duration {cfg.max_duration_s:.0f} s: {short}", numbers)
        return RolloutVerdict("wait", f"gathering evidence: {short}", numbers)

    cmp = welch(candidate, incumbent, cfg.confidence)
    numbers.update(
        diff=round(cmp.diff, 4), se=round(cmp.se, 4), df=None if math.isinf(cmp.df) else round(cmp.df, 1),
        t=round(cmp.t, 4), lower=round(cmp.lower, 4), upper=round(cmp.upper, 4),
    )
    pct = f"{cfg.confidence:.0%}"
    acc = (f"acceptance {candidate.mean:.3f} vs {incumbent.mean:.3f} ({arms}), diff {cmp.diff:+.3f}, "
           f"{pct} bounds [{cmp.lower:+.3f}, {cmp.upper:+.3f}] vs min_gain {cfg.min_gain:g}")

    floor = 1.0 - cfg.max_goodput_loss
    gc, gi = candidate.goodput, incumbent.goodput
    timed = min(candidate.timed_requests, incumbent.timed_requests)
    if candidate.timed_requests == 0 and incumbent.timed_requests == 0:
        goodput_state, good = "unmeasured", "goodput not measured (no timed requests)"
    elif timed < cfg.min_requests or gc is None or gi is None:
        goodput_state = "pending"
        good = f"goodput pending: timed requests {candidate.timed_requests:.0f}/{incumbent.timed_requests:.0f}, need {cfg.min_requests} per arm"
    else:
        ratio = gc / gi if gi > 0 else (math.inf if gc > 0 else 1.0)
        numbers["goodput_ratio"] = None if math.isinf(ratio) else round(ratio, 4)
        goodput_state = "ok" if ratio >= floor else "worse"
        good = (f"goodput {gc:.1f} vs {gi:.1f} tok/s per request ({ratio:.2f}x "
                f"{'>=' if goodput_state == 'ok' else '<'} {floor:.2f}x allowed)")
    numbers["goodput"] = goodput_state

    if cmp.lower > cfg.min_gain and goodput_state in ("ok", "unmeasured"):
        return RolloutVerdict("promote", f"candidate better: {acc}; {good}", numbers)
    if cmp.upper < cfg.min_gain:
        return RolloutVerdict("rollback", f"candidate not better: {acc}; {good}", numbers)
    if goodput_state == "worse":
        return RolloutVerdict("rollback", f"candidate's goodput too low: {good}; {acc}", numbers)
    if overdue:
        return RolloutVerdict("rollback", f"undecided after {elapsed_s:.0f} s > max_duration {cfg.max_duration_s:.0f} s: {acc}; {good}", numbers)
    return RolloutVerdict("wait", f"not yet significant: {acc}; {good}", numbers)


__all__ = ["ARM_FIELDS", "ArmStats", "Comparison", "RolloutVerdict", "judge", "t_quantile", "welch"]
