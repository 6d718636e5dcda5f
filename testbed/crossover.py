"""A policy's ratio to baselines with 95 % intervals, from A/B crossover blocks.

Why this design (`bench/real_ab.py` runs it): on a shared 2-core machine the same
policy, measured minutes apart, moved by -17 % to +9 %, more than the effects being
judged. A block therefore runs the policy on one replica and a baseline on the other
at the same time, each behind its own gateway with identical load, so whatever the
machine does in that minute hits both. The two replicas are not alike (the same
model and core binding measured 31-39 ms against 47-59 ms a light step one day), so
the blocks alternate the sides. A block observes

    y = log(policy / baseline) = delta_b + rho * side + noise,

`side` +1 when the policy ran on the first replica, -1 on the second. One least
squares fit over every block of a segment gives each baseline its delta and one rho
shared by all of them (the replicas are the same pair in every block), and pools the
residual variance, so each comparison gains degrees of freedom from the others. The
interval is Student's t on the residual degrees of freedom; a ratio is exp(delta)
and its interval exp(delta +- t * se). With no residual degree of freedom there is
an estimate and no interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Block:
    """One block: the policy's and the baseline's figure (tok/s, say) over the same window."""

    baseline: str
    side: int  # +1: the policy ran on the first replica; -1: on the second
    policy: float
    reference: float


@dataclass(frozen=True)
class Ratio:
    """policy / baseline: the estimate and its 95 % interval (None without residual freedom)."""

    baseline: str
    ratio: float
    low: float | None
    high: float | None
    blocks: int
    df: int
    log_ratio: float
    log_se: float | None


def _usable(blocks: Iterable[Block]) -> list[Block]:
    return [b for b in blocks if b.policy > 0 and b.reference > 0 and b.side in (1, -1)]


def crossover_ratios(blocks: Sequence[Block], level: float = 0.95) -> dict[str, Ratio]:
    """Each baseline's ratio, fitted jointly with one replica effect (see the module doc)."""
    usable = _usable(blocks)
    names = sorted({b.baseline for b in usable})
    if not names:
        return {}
    y = np.array([math.log(b.policy / b.reference) for b in usable])
    columns = [[1.0 if b.baseline == n else 0.0 for b in usable] for n in names]
    sides = [float(b.side) for b in usable]
    if len(set(sides)) > 1:  # the replica effect is identifiable only when both sides ran
        columns.append(sides)
    x = np.array(columns).T
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = len(usable) - int(rank)
    residual = y - x @ coef
    sigma2 = float(residual @ residual) / df if df > 0 else None
    cov = np.linalg.pinv(x.T @ x)
    t = float(stats.t.ppf(0.5 + level / 2, df)) if df > 0 else None
    out = {}
    for i, name in enumerate(names):
        delta = float(coef[i])
        se = math.sqrt(max(sigma2 * float(cov[i, i]), 0.0)) if sigma2 is not None else None
        low = math.exp(delta - t * se) if se is not None else None
        high = math.exp(delta + t * se) if se is not None else None
        n = sum(1 for b in usable if b.baseline == name)
        out[name] = Ratio(name, math.exp(delta), low, high, n, df, delta, se)
    return out


def worst_case(ratios: dict[str, Ratio], among: Iterable[str]) -> Ratio | None:
    """policy / the best of several baselines: the smallest of its ratios to them (the
    baseline it compares worst against), with that comparison's interval."""
    picked = [ratios[n] for n in among if n in ratios]
    return min(picked, key=lambda r: r.ratio) if picked else None


def geometric_mean(ratios: Sequence[Ratio], level: float = 0.95) -> Ratio | None:
    """The geometric mean of ratios fitted on separate segments (independent fits): the mean
    of their log ratios, its standard error from theirs, t on the smallest df among them."""
    if not ratios:
        return None
    mean = sum(r.log_ratio for r in ratios) / len(ratios)
    ses = [r.log_se for r in ratios]
    df = min(r.df for r in ratios)
    if any(se is None for se in ses) or df <= 0:
        return Ratio(ratios[0].baseline, math.exp(mean), None, None, sum(r.blocks for r in ratios), df, mean, None)
    se = math.sqrt(sum(s * s for s in ses)) / len(ratios)
    t = float(stats.t.ppf(0.5 + level / 2, df))
    return Ratio(
        ratios[0].baseline, math.exp(mean), math.exp(mean - t * se), math.exp(mean + t * se),
        sum(r.blocks for r in ratios), df, mean, se,
    )  # fmt: skip


def fmt_ratio(r: Ratio | None, digits: int = 3) -> str:
    """`1.049 [0.961..1.145]`, or the estimate alone without an interval."""
    if r is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.ratio:.{digits}f} (no interval, df {r.df})"
    return f"{r.ratio:.{digits}f} [{r.low:.{digits}f}..{r.high:.{digits}f}]"
