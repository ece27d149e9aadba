"""Percentiles and the order-statistic confidence interval, checked against definitions and by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servetune.bench.stats import as_sorted, percentile, quantile_ci, quantile_ci_ranks


def test_nearest_rank_percentiles_are_observed_samples() -> None:
    values = as_sorted(np.arange(1, 101, dtype=np.float64))  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.9) == 100.0
    assert percentile(values, 100) == 100.0
    small = as_sorted([5.0, 1.0, 3.0])
    assert percentile(small, 50) == 3.0  # rank ceil(1.5) = 2
    assert percentile(small, 1) == 1.0
    with pytest.raises(ValueError):
        percentile(as_sorted([]), 50)


def test_ci_ranks_need_enough_samples() -> None:
    # P(no sample above the true P99) = 0.99**n must be <= 2.5% for an upper bound to exist: n >= 368.
    assert quantile_ci_ranks(300, 0.99) is None
    assert quantile_ci_ranks(367, 0.99) is None
    assert quantile_ci_ranks(368, 0.99) is not None
    low, high = quantile_ci_ranks(10_000, 0.99)  # type: ignore[misc]
    # Normal approximation: 9900 -+ 1.96 * sqrt(10000 * .99 * .01) = 9900 -+ 19.5
    assert 9878 <= low <= 9882 and 9919 <= high <= 9922


def test_ci_ranks_are_the_tightest_equal_tailed_pair() -> None:
    from math import comb

    n, q = 1000, 0.99

    def cdf(k: int) -> float:  # P(B <= k), B ~ Binomial(n, q) = samples below the true quantile
        return sum(comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))

    low, high = quantile_ci_ranks(n, q)  # type: ignore[misc]
    assert cdf(low - 1) <= 0.025 < cdf(low)  # lower tail: as high a rank as the guarantee allows
    assert cdf(high - 2) < 0.975 <= cdf(high - 1)  # upper tail: as low a rank as the guarantee allows
    assert cdf(high - 1) - cdf(low - 1) >= 0.95


def test_ci_covers_the_true_p99_in_simulation() -> None:
    rng = np.random.default_rng(7)
    true_p99 = -math.log(0.01)  # exponential(1)
    trials, hits = 400, 0
    for _ in range(trials):
        ci = quantile_ci(as_sorted(rng.exponential(size=2000)), 0.99)
        assert ci is not None
        hits += ci[0] <= true_p99 <= ci[1]
    assert 0.92 <= hits / trials <= 0.995
