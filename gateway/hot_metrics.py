"""Counters and histograms updated on every request, kept as plain dicts and
exposed through prometheus_client's collector API.

Why not prometheus_client's own `Counter`/`Histogram` here: each update of
a labelled child costs a child lookup, a method, an observability check and
a locked value (a histogram also walks its bucket bounds in Python), which
for the ten updates of one finished request measured ~12.7 µs against
~3.1 µs for the same updates as dict arithmetic and a `bisect`: ~3 % of the
gateway's CPU per request. The exposition is still prometheus_client's
(`CounterMetricFamily`/`HistogramMetricFamily` from a registered
collector), so the families, their samples and `/metrics` are unchanged,
except that these series carry no `_created` sample.

Updates come from the event loop's thread only (the request path); a
scrape copies the dict before it reads it. Label values are strings, in
the order of `labelnames`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class HotMetric:
    """A metric family with a fixed label set (what the metrics reference reads)."""

    type = ""
    __slots__ = ("documentation", "labelnames", "name", "values")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict = {}
        registry.register(self)

    def describe(self) -> list:
        return [self._family()]

    def _family(self):
        raise NotImplementedError


class HotCounter(HotMetric):
    """`inc(labels, amount)`: a counter series per label tuple (`name_total`)."""

    type = "counter"
    __slots__ = ()

    def inc(self, labels: tuple[str, ...], amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def value(self, *labels: str) -> float:
        return self.values.get(labels, 0)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> list[CounterMetricFamily]:
        family = self._family()
        for labels, value in list(self.values.items()):
            family.add_metric(labels, float(value))
        return [family]


class HotHistogram(HotMetric):
    """`observe(labels, amount)`: per label tuple, the count in each bucket
    (not cumulative; the last bucket is +Inf) followed by the sum."""

    type = "histogram"
    __slots__ = ("_le", "bounds")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry)

    def observe(self, labels: tuple[str, ...], amount: float) -> None:
        bounds = self.bounds
        counts = self.values.get(labels)
        if counts is None:
            counts = self.values[labels] = [0] * len(bounds) + [0.0]
        if amount <= bounds[-1]:  # all but NaN (<= +Inf); NaN falls in no bucket, as in prometheus_client, only in the sum
            counts[bisect_left(bounds, amount)] += 1
        counts[-1] += amount

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> list[HistogramMetricFamily]:
        family = self._family()
        for labels, counts in list(self.values.items()):
            cumulative, acc = [], 0
            for le, n in zip(self._le, counts):
                acc += n
                cumulative.append((le, float(acc)))
            family.add_metric(labels, cumulative, counts[-1])
        return [family]
