"""testbed.stats: the one percentile convention, checked against numpy's default."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from testbed.stats import percentile


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 99.9, 100])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 50, 101])
def test_it_is_numpys_linear_percentile(n, q):
    rng = random.Random(n * 1000 + int(q * 10))
    values = [rng.expovariate(1.0) for _ in range(n)]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-15)


def test_undefined_values_are_dropped_and_none_means_no_value():
    assert percentile([None, 1.0, math.nan, 3.0], 50) == 2.0
    assert percentile([], 99) is None
    assert percentile([None, math.nan], 50) is None
    assert percentile([None, 10.0, math.nan], 99) == 10.0
    assert percentile([None], 50) is None


def test_interpolates_between_the_two_closest_ranks():
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9)  # nearest rank would say 20
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)


def test_a_q_outside_0_to_100_is_an_error():
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], 0.99 - 1)
