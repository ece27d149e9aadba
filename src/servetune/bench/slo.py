"""A latency SLO (the tuner's SLA) and what a run achieved against it: goodput, attainment, 10-second windows.

The field's conventions (AIPerf, vLLM's benchmarks, DistServe): a request is *good* when it was answered
successfully inside every per-request constraint of the SLO; errors, 503s and timeouts are never good. Here the
per-request constraint is the SLO's deadline: its tightest percentile limit (``p95_ms`` when both are set, else
``p99_ms``), or ``mean_ms`` when that is the only limit.

- **goodput**: good requests per second of the measured window;
- **attainment**: good requests / all requests sent (the measured ones), with a one-sided 95% lower bound
  (Clopper-Pearson);
- **windows**: the measured run cut into windows of ``window_s`` (10 s by default) by intended send time; a window
  is inside the SLO when the SLO holds on its requests alone, a failed request counting as slower than any limit
  (P99 <= L means at least 99% of the window's requests were answered within L), and its errors stay within
  ``max_error_rate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from servetune._exceptions import ConfigError
from servetune.bench.stats import FloatArray, attainment_lower_bound, percentile

_LABEL = {"p99_ms": "P99", "p95_ms": "P95", "mean_ms": "mean"}
_QUANTILE = {"p99_ms": 0.99, "p95_ms": 0.95}
SLO_KEYS = ("p99_ms", "p95_ms", "mean_ms", "max_error_rate")


@dataclass(frozen=True)
class Slo:
    """Latency limits (ms) a config must meet, and the share of failed requests it may have."""

    p99_ms: float | None = None
    p95_ms: float | None = None
    mean_ms: float | None = None
    max_error_rate: float = 0.001

    def limits(self) -> list[tuple[str, float]]:
        """``(LatencySummary attribute, limit)`` for every limit set."""
        return [(name, value) for name in ("p99_ms", "p95_ms", "mean_ms") if (value := getattr(self, name)) is not None]

    @property
    def empty(self) -> bool:
        return not self.limits()

    @property
    def deadline_ms(self) -> float | None:
        """The per-request limit a good request is answered within (module docstring)."""
        percentiles = [value for key, value in self.limits() if key in _QUANTILE]
        if percentiles:
            return min(percentiles)
        return self.mean_ms

    def describe(self) -> str:
        if self.empty:
            return "no latency SLA"
        return ", ".join(f"{_LABEL[name]} <= {value:g} ms" for name, value in self.limits())

    def holds(self, latency_ms: FloatArray, failed: int) -> bool:
        """Whether the SLO holds on these successful latencies with ``failed`` more requests that failed."""
        sent = len(latency_ms) + failed
        if sent == 0:
            return True
        if failed > self.max_error_rate * sent:
            return False
        for key, limit in self.limits():
            if key in _QUANTILE:
                if int(np.count_nonzero(latency_ms <= limit)) < math.ceil(_QUANTILE[key] * sent - 1e-9):
                    return False
            elif len(latency_ms) and float(latency_ms.mean()) > limit:
                return False
        return True


def parse_slo(pairs: Iterable[str], where: str = "--slo") -> Slo | None:
    """``["p99_ms=100", "max_error_rate=0.01"]`` -> Slo; None when no pair is given."""
    values: dict[str, float] = {}
    for pair in pairs:
        key, found, value = pair.partition("=")
        key = key.strip()
        if not found or key not in SLO_KEYS:
            raise ConfigError(f"{where}={pair!r}: expected KEY=VALUE with KEY one of {', '.join(SLO_KEYS)}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{where}={pair!r}: expected a number after '='") from None
        if not (math.isfinite(number) and number > 0) or (key == "max_error_rate" and number >= 1):
            expected = "a fraction between 0 and 1" if key == "max_error_rate" else "milliseconds > 0"
            raise ConfigError(f"{where}={pair!r}: expected {expected}")
        values[key] = number
    if not values:
        return None
    slo = Slo(**values)  # type: ignore[arg-type]
    if slo.empty:
        raise ConfigError(f"{where}: give a latency limit (p99_ms, p95_ms or mean_ms)")
    return slo


@dataclass(frozen=True)
class Window:
    """One window of the measured run (by intended send time): its requests and whether the SLO held on them."""

    start_s: float
    sent: int
    succeeded: int
    good: int
    p99_ms: float | None  # of its successful requests
    inside: bool


@dataclass(frozen=True)
class SloFigures:
    """What a run achieved against its SLO (module docstring)."""

    slo: Slo
    deadline_ms: float
    sent: int
    good: int
    goodput_rps: float
    attainment: float
    attainment_low: float  # one-sided 95% lower bound
    window_s: float
    windows: list[Window] = field(default_factory=list)

    @property
    def windows_inside(self) -> int:
        return sum(w.inside for w in self.windows)

    @property
    def windows_share(self) -> float:
        """Share of the (non-empty) windows inside the SLO."""
        return self.windows_inside / len(self.windows) if self.windows else 0.0

    def describe(self) -> str:
        return (
            f"goodput {self.goodput_rps:.2f} req/s, attainment {100 * self.attainment:.2f}% "
            f"(>= {100 * self.attainment_low:.2f}% at 95%), {self.windows_inside}/{len(self.windows)} "
            f"{self.window_s:g} s windows inside"
        )


def slo_figures(
    slo: Slo,
    start_s: FloatArray,
    latency_ms: FloatArray,
    ok: np.ndarray,  # type: ignore[type-arg]
    window_s: float,
    duration_s: float,
) -> SloFigures:
    """Goodput, attainment and windows of one run: per request its intended send time (s from the start of the
    measured part), its latency (ms) and whether it succeeded."""
    deadline = slo.deadline_ms
    if deadline is None:
        raise ConfigError("an SLO needs a latency limit (p99_ms, p95_ms or mean_ms)")
    good_mask = ok & (latency_ms <= deadline)
    sent, good = len(start_s), int(good_mask.sum())
    windows = []
    if sent:
        index = np.floor(start_s / window_s).astype(np.int64)
        for w in range(int(index.max()) + 1):
            mine = index == w
            count = int(mine.sum())
            if not count:
                continue
            own_ok = latency_ms[mine & ok]
            p99 = percentile(np.sort(own_ok), 99.0) if len(own_ok) else None
            windows.append(Window(w * window_s, count, len(own_ok), int((good_mask & mine).sum()), p99,
                                  slo.holds(own_ok, count - len(own_ok))))  # fmt: skip
    return SloFigures(
        slo=slo,
        deadline_ms=deadline,
        sent=sent,
        good=good,
        goodput_rps=good / duration_s if duration_s > 0 else 0.0,
        attainment=good / sent if sent else 0.0,
        attainment_low=attainment_lower_bound(good, sent),
        window_s=window_s,
        windows=windows,
    )
