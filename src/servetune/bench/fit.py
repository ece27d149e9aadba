"""Shape mode: replay a trace's rate curve at a fraction of what this server can serve.

A cloud trace's absolute rate means nothing on a small box. The server's capacity is measured first, in closed
loop at concurrency 1, 2, 4, ... (a short run each) until the throughput stops rising by more than 5%; the
schedule's peak (``Schedule.peak_rps``: its busiest 10 s, or 1 s for a schedule under a minute) is then scaled to
``fraction`` of that capacity, keeping the curve's shape (``Schedule.rate_scaled``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from servetune._exceptions import BenchError, ConfigError
from servetune.bench.runner import run_bench
from servetune.bench.schedule import Schedule
from servetune.bench.spec import BenchSpec

RISE = 0.05


@dataclass(frozen=True)
class Capacity:
    rps: float  # the highest closed-loop throughput seen
    concurrency: int  # at this many clients
    probes: tuple[tuple[int, float], ...]  # (concurrency, req/s) of every probe

    def describe(self) -> str:
        steps = ", ".join(f"c={c}: {rps:.1f}" for c, rps in self.probes)
        return f"{self.rps:.1f} req/s at concurrency {self.concurrency} (closed loop; {steps})"


def measure_capacity(spec: BenchSpec, seconds: float = 2.0, max_concurrency: int = 256) -> Capacity:
    """The server's capacity for ``spec``'s request (see the module docstring)."""
    probes: list[tuple[int, float]] = []
    concurrency = 1
    best = (0.0, 1)
    while concurrency <= max_concurrency:
        probe = dataclasses.replace(
            spec, concurrency=concurrency, rate=None, schedule=None, requests=None, duration=seconds,
            warmup_requests=0, warmup_seconds=0.5, slo=None,
        )  # fmt: skip
        result = run_bench(probe)
        if result.error_rate > 0.5:
            raise BenchError(f"capacity: {result.failed} of {result.sent} requests failed at concurrency {concurrency}")
        probes.append((concurrency, result.throughput_rps))
        if result.throughput_rps <= best[0] * (1.0 + RISE):
            break
        best = (result.throughput_rps, concurrency)
        concurrency *= 2
    return Capacity(best[0], best[1], tuple(probes))


def fit(schedule: Schedule, capacity_rps: float, fraction: float, seed: int = 0) -> Schedule:
    """``schedule`` with its peak rate scaled to ``fraction`` x ``capacity_rps``."""
    if not (0 < fraction) or fraction != fraction:
        raise ConfigError(f"capacity fraction={fraction!r}: expected a number > 0 (0.8: the peak at 80% of capacity)")
    peak = schedule.peak_rps()
    if peak <= 0 or capacity_rps <= 0:
        raise BenchError(f"cannot shape {schedule.name!r}: peak {peak:g} req/s, capacity {capacity_rps:g} req/s")
    factor = fraction * capacity_rps / peak
    note = (
        f"shape mode: peak {peak:.1f} req/s scaled to {fraction:g} x capacity {capacity_rps:.1f} req/s "
        f"= {fraction * capacity_rps:.1f} req/s (rate x {factor:.4g})"
    )
    return schedule.rate_scaled(factor, seed).with_note(note)
