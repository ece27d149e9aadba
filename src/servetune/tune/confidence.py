"""When a load run has measured enough: its bounds decide the trial, so easy trials end early and close calls run on.

While a trial's load runs, about twice a second (``RunHooks.enough``), the figures so far are tested:

1. **Against the SLA.** For each percentile limit, distribution-free one-sided 95% bounds of that percentile (order
   statistics, ``bench/stats.py``): a lower bound above the limit is a clear miss (stop: more samples will not save
   it; a few dozen samples can show it); an upper bound within it a clear pass (that takes 299 samples for P99);
   otherwise undecided (run on). A mean limit uses the interval of the mean of
   ten consecutive chunks of requests. Errors far beyond the allowed rate (ten of them, and ten times the rate) are a
   clear miss too.
2. **Against the best config so far** (once the SLA clearly holds): the throughput's 95% interval from sub-windows of
   the run; entirely below the best objective, it cannot win (stop); otherwise the run goes on until the interval's
   half-width is within ``precision`` (3%) of its middle, so that later comparisons rest on a tight figure.

A run stops at the earliest after half the study's duration (and never before 3 s, or its whole duration when
that is shorter: ``measure.min_seconds``), and at the latest at the study's ``max_duration`` (its duration unless
set longer): an undecided trial gets the whole budget.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from servetune.bench.recording import UNKNOWN, Recording
from servetune.bench.stats import mean_interval, quantile_lower, quantile_upper, rate_interval
from servetune.tune.study import Sla

PRECISION = 0.03
_QUANTILE = {"p99_ms": 0.99, "p95_ms": 0.95}
_CHUNKS = 10


def sla_decided(sla: Sla, latency_ms: np.ndarray, sent: int, failed: int) -> str | None:  # type: ignore[type-arg]
    """``"miss"`` or ``"pass"`` when the figures so far decide the SLA at 95%, None while they do not."""
    if failed >= 10 and failed > 10 * sla.max_error_rate * sent:
        return "miss"
    ordered = np.sort(latency_ms)
    verdict = "pass"
    for key, limit in sla.limits():
        low: float | None
        high: float | None
        if key in _QUANTILE:
            low, high = quantile_lower(ordered, _QUANTILE[key]), quantile_upper(ordered, _QUANTILE[key])
        else:
            chunks = [float(c.mean()) for c in np.array_split(latency_ms, _CHUNKS) if len(c)]
            interval = mean_interval(chunks) if len(latency_ms) >= 5 * _CHUNKS else None
            low, high = (interval[1], interval[2]) if interval else (None, None)
        if low is not None and low > limit:
            return "miss"
        if high is None or high > limit:
            verdict = "undecided"
    return "pass" if verdict == "pass" else None


def decider(sla: Sla, best_rps: float | None, precision: float = PRECISION) -> Callable[[Recording, float], bool]:
    """``RunHooks.enough`` for a trial: True once the run's figures decide it (module docstring)."""

    def enough(rec: Recording, seconds: float) -> bool:
        status = np.array(rec.status, dtype=np.int32)  # copies: the recording grows while the run goes on
        latency = np.array(rec.latency_ms, dtype=np.float64)
        start = np.array(rec.start_s, dtype=np.float64)
        n = min(len(status), len(latency), len(start))
        status, latency, start = status[:n], latency[:n], start[:n]
        ok = ((status >= 200) & (status < 300)) | (status == UNKNOWN)
        if ok.sum() < 30:
            return False
        verdict = sla_decided(sla, latency[ok], n, int(n - ok.sum())) if not sla.empty else "pass"
        if verdict != "pass":
            return verdict == "miss"
        interval = rate_interval(start[ok] + latency[ok] / 1e3, 0.0, seconds)
        if interval is None:
            return False
        low, high = interval
        if best_rps is not None and high < best_rps:
            return True  # clearly below the best: it cannot win
        middle = (low + high) / 2.0
        return middle > 0 and (high - low) / 2.0 <= precision * middle

    return enough
