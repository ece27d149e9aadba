"""Statistics over the exact sample set: nearest-rank percentiles and a distribution-free CI for a quantile.

Percentiles use the nearest-rank definition (the smallest sample with at least p% of samples at or below it), so
every reported figure is a latency that some request actually saw. The confidence interval for a quantile uses
order statistics: the number of samples below the true p-quantile is Binomial(n, p), whatever the latency
distribution, so ranks (l, u) with P(l <= B < u) >= confidence bound it (Hahn & Meeker, ch. 5). The one-sided
upper bound is the same idea (MLPerf LoadGen's early stopping): X_(u) with P(B < u) >= confidence is above the
true quantile with that confidence; for P99 at 95% it needs 299 samples.

Intervals for a rate and for a ratio of means come from independent batches (sub-windows of a run, or repeated
runs): mean +- t(n-1) x standard error, Student's t at 95%.
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


def quantile_upper_rank(n: int, q: float, confidence: float = 0.95) -> int | None:
    """1-based rank u with P(xi_q <= X_(u)) >= confidence (the smallest such), or None when n is too small."""
    if n < 1:
        return None
    lo, cdf = _binomial_cdf(n, q)
    for i, c in enumerate(cdf):
        if c >= confidence:  # P(B <= k) >= confidence  ->  u = k + 1
            u = lo + i + 1
            return u if u <= n else None
    return None


def quantile_upper(sorted_values: FloatArray, q: float, confidence: float = 0.95) -> float | None:
    """Distribution-free one-sided upper confidence bound for the q-quantile, or None with too few samples."""
    rank = quantile_upper_rank(len(sorted_values), q, confidence)
    return None if rank is None else float(sorted_values[rank - 1])


def quantile_lower(sorted_values: FloatArray, q: float, confidence: float = 0.95) -> float | None:
    """Distribution-free one-sided lower confidence bound for the q-quantile: X_(l) for the largest l with
    P(B <= l - 1) <= 1 - confidence; None when even the smallest sample is not below it with that confidence."""
    n = len(sorted_values)
    if n < 1:
        return None
    lo, cdf = _binomial_cdf(n, q)
    rank = 0
    for i, c in enumerate(cdf):
        if c <= 1.0 - confidence:
            rank = lo + i + 1
        else:
            break
    if lo > 0 and rank == 0:
        rank = lo  # the window starts above 0: every rank below it qualifies
    return float(sorted_values[min(rank, n) - 1]) if rank >= 1 else None


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(B <= k) for B ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lo, cdf = _binomial_cdf(n, p)
    if k < lo:
        return 0.0
    if k - lo >= len(cdf):
        return 1.0
    return min(1.0, cdf[k - lo])


def attainment_lower_bound(good: int, sent: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound for a success share: the p at which ``good`` or more successes of
    ``sent`` would happen with probability 1 - confidence."""
    if sent <= 0 or good <= 0:
        return 0.0
    alpha = 1.0 - confidence
    low, high = 0.0, good / sent
    for _ in range(60):  # P(B >= good | p) rises with p: bisect for the p where it equals alpha
        mid = (low + high) / 2.0
        if 1.0 - binomial_cdf(good - 1, sent, mid) < alpha:
            low = mid
        else:
            high = mid
    return low


# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; 1.96 beyond the table.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError("t quantile needs df >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.96 + 2.4 / df  # within 0.3% of the exact value for df > 30


def mean_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): a 95% confidence interval for the mean of independent values; None for fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def rate_interval(end_s: FloatArray, start_s: float, duration_s: float, parts: int = 10) -> tuple[float, float] | None:
    """A 95% interval for a rate (events/s) from the event times ``end_s`` in [start_s, start_s + duration_s): the
    window cut into ``parts`` sub-windows whose rates are taken as independent (batch means). None when the window
    is too short or holds too few events (fewer than 5 per part)."""
    if duration_s <= 0 or parts < 2 or len(end_s) < 5 * parts:
        return None
    width = duration_s / parts
    index = np.floor((np.asarray(end_s) - start_s) / width).astype(np.int64)
    counts = np.bincount(index[(index >= 0) & (index < parts)], minlength=parts)
    interval = mean_interval([float(c) / width for c in counts])
    if interval is None:
        return None
    return max(0.0, interval[1]), interval[2]
