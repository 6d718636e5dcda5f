"""Percentiles, one convention for every figure the benches and `specgate load` print.

The convention: the q-th percentile (q in 0..100) of the defined values (None
and NaN dropped), linearly interpolated between the two closest ranks at
position (n - 1) * q / 100 of the sorted values -- numpy's default
(`method="linear"`), so a p99 here is what `np.percentile(values, 99)` gives.
None when no value is defined. Why one: the benches used to mix this with a
nearest-rank rule, so two p99s printed side by side were not computed alike
(on 50 latencies the two differ by up to a whole gap between the top values).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile (0..100, linear interpolation) of the defined values; None if none."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q}")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
