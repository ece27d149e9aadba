"""Statistics over the exact sample set: nearest-rank percentiles and a distribution-free CI for a quantile.

Percentiles use the nearest-rank definition (the smallest sample with at least p% of samples at or below it), so
every reported figure is a latency that some request actually saw. The confidence interval for a quantile uses
order statistics: the number of samples below the true p-quantile is Binomial(n, p), whatever the latency
distribution, so ranks (l, u) with P(l <= B < u) >= confidence bound it (Hahn & Meeker, ch. 5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def as_sorted(values: Sequence[float] | FloatArray) -> FloatArray:
    return np.sort(np.asarray(values, dtype=np.float64))


def percentile(sorted_values: FloatArray, p: float) -> float:
    """Nearest-rank p-th percentile (0 < p <= 100) of an ascending array."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sample set")
    rank = max(1, math.ceil(p / 100.0 * n - 1e-9))
    return float(sorted_values[min(rank, n) - 1])


def quantile_ci_ranks(n: int, q: float, confidence: float = 0.95) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(X_(l) <= xi_q <= X_(u)) >= confidence, or None when n is too small."""
    if n < 1:
        return None
    alpha = (1.0 - confidence) / 2.0
    lo, cdf = _binomial_cdf(n, q)
    # B = number of samples below the quantile. X_(l) <= xi_q  <=>  B >= l;  xi_q < X_(u)  <=>  B <= u - 1.
    lower = 0  # largest l with P(B <= l - 1) <= alpha
    upper = n + 1  # smallest u with P(B <= u - 1) >= 1 - alpha
    for i, c in enumerate(cdf):
        k = lo + i
        if c <= alpha:
            lower = k + 1
        if c >= 1.0 - alpha:
            upper = k + 1
            break
    if lower < 1 or upper > n:
        return None
    return lower, upper


def quantile_ci(sorted_values: FloatArray, q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval for the q-quantile (0 < q < 1), or None with too few samples."""
    ranks = quantile_ci_ranks(len(sorted_values), q, confidence)
    if ranks is None:
        return None
    return float(sorted_values[ranks[0] - 1]), float(sorted_values[ranks[1] - 1])


def _binomial_cdf(n: int, q: float) -> tuple[int, list[float]]:
    """P(B <= k) for k in [lo, hi], a window of +-12 standard deviations (the mass outside is < 1e-30)."""
    sd = math.sqrt(n * q * (1.0 - q))
    lo = max(0, math.floor(n * q - 12 * sd - 12))
    hi = min(n, math.ceil(n * q + 12 * sd + 12))
    log_q, log_1q, log_nf = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    total = 0.0
    cdf = []
    for k in range(lo, hi + 1):
        total += math.exp(log_nf - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q + (n - k) * log_1q)
        cdf.append(total)
    return lo, cdf
