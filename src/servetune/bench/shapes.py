"""Synthetic load shapes: steps, ramps, bursts and a daily curve, as seeded schedules.

A shape is a list of segments, each a rate curve over its own seconds and an arrival process (constant, Poisson,
or Gamma with a coefficient of variation); the segments play one after the other. Each segment's arrivals are drawn
by the time-change method of ``schedule.py`` with a seed derived from the shape's seed and the segment's index, so a
shape and a seed always give the same schedule, and changing one segment leaves the others' arrivals alone.

    steps = shape([Segment(30, 20.0), Segment(30, 50.0)], seed=1)                # a 2.5x step
    day = shape([Segment(600, diurnal=(10.0, 90.0))], process="poisson")        # one period of a daily curve
    burst = shape([Segment(60, 30.0, burst=Burst(at_s=20, seconds=5, rate=120.0))])
    bursty = shape([Segment(60, 40.0, process="gamma", cv=2.0)])                 # burstier than Poisson
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servetune._exceptions import ConfigError
from servetune.bench.schedule import PROCESSES, FloatArray, Process, Schedule, describe_process, unit_renewal

_GRID_S = 0.005  # the rate curve is integrated on this grid (the rate is piecewise linear between knots)


@dataclass(frozen=True)
class Burst:
    """``rate`` req/s on top of the segment's own rate, from ``at_s`` for ``seconds``."""

    at_s: float
    seconds: float
    rate: float


@dataclass(frozen=True)
class Segment:
    """``seconds`` of load: a constant ``rate``, a linear ramp (``rate`` to ``end_rate``), or one period of a daily
    curve between ``diurnal = (low, high)`` (low at the start and end, high in the middle), plus an optional burst.
    ``process``/``cv`` override the shape's arrival process for this segment."""

    seconds: float
    rate: float = 0.0
    end_rate: float | None = None
    diurnal: tuple[float, float] | None = None
    burst: Burst | None = None
    process: Process | None = None
    cv: float | None = None

    def check(self, where: str) -> None:
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ConfigError(f"{where}.seconds={self.seconds!r}: expected a number of seconds > 0")
        rates = [self.rate] + ([self.end_rate] if self.end_rate is not None else [])
        rates += list(self.diurnal or ())
        for value in rates:
            if isinstance(value, bool) or not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{where}: rate {value!r}: expected requests per second >= 0")
        if self.diurnal is not None and (self.end_rate is not None or self.rate):
            raise ConfigError(f"{where}: give a rate (and end_rate) or a diurnal (low, high), not both")
        if self.burst is not None:
            b = self.burst
            if not (0 <= b.at_s < self.seconds and b.seconds > 0 and b.rate >= 0):
                raise ConfigError(f"{where}.burst={b!r}: expected at_s within the segment, seconds > 0, rate >= 0")
        if self.process is not None and self.process not in PROCESSES:
            raise ConfigError(f"{where}.arrival={self.process!r}: expected one of {', '.join(PROCESSES)}")

    def rate_at(self, t: FloatArray) -> FloatArray:
        """The segment's rate (req/s) at times ``t`` (seconds from its start)."""
        if self.diurnal is not None:
            low, high = self.diurnal
            rate = low + (high - low) * (1.0 - np.cos(2.0 * math.pi * t / self.seconds)) / 2.0
        elif self.end_rate is not None:
            rate = self.rate + (self.end_rate - self.rate) * t / self.seconds
        else:
            rate = np.full_like(t, self.rate)
        if self.burst is not None:
            b = self.burst
            rate = rate + np.where((t >= b.at_s) & (t < b.at_s + b.seconds), b.rate, 0.0)
        return np.asarray(rate, dtype=np.float64)

    def describe(self) -> str:
        if self.diurnal is not None:
            text = f"{self.seconds:g} s daily curve {self.diurnal[0]:g}-{self.diurnal[1]:g} req/s"
        elif self.end_rate is not None:
            text = f"{self.seconds:g} s ramp {self.rate:g}->{self.end_rate:g} req/s"
        else:
            text = f"{self.seconds:g} s at {self.rate:g} req/s"
        if self.burst is not None:
            text += f" (+{self.burst.rate:g} req/s for {self.burst.seconds:g} s at {self.burst.at_s:g} s)"
        return text


def curve_arrivals(
    seconds: float, rate_at: FloatArray | None, process: Process, cv: float, seed: int, grid: FloatArray | None = None
) -> FloatArray:
    """Send times in [0, seconds) of a rate curve sampled as ``rate_at`` on ``grid`` (piecewise linear between)."""
    assert grid is not None and rate_at is not None
    # Operational time: the integral of the rate (trapezoids on the grid).
    ops = np.concatenate([[0.0], np.cumsum((rate_at[1:] + rate_at[:-1]) / 2.0 * np.diff(grid))])
    total = float(ops[-1])
    if total <= 0:
        return np.zeros(0)
    units = unit_renewal(process, cv, seed, 0, until=total)
    # Where the rate is 0 the integral is flat: take the first time it reaches each value.
    keep = np.concatenate([[True], np.diff(ops) > 0])
    times: FloatArray = np.asarray(np.interp(units, ops[keep], grid[keep]), dtype=np.float64)
    return times[times < seconds]


def shape(segments: Sequence[Segment], *, process: Process = "poisson", cv: float = 1.0, seed: int = 0,
          name: str = "") -> Schedule:  # fmt: skip
    """The schedule of ``segments`` played in order (see the module's docstring)."""
    if not segments:
        raise ConfigError("shape: expected at least one segment")
    parts: list[FloatArray] = []
    start = 0.0
    for i, segment in enumerate(segments):
        segment.check(f"segments[{i}]")
        grid = np.linspace(0.0, segment.seconds, max(2, math.ceil(segment.seconds / _GRID_S) + 1))
        own = segment.process or process
        times = curve_arrivals(segment.seconds, segment.rate_at(grid), own, segment.cv or cv, seed * 1000 + i, grid)
        parts.append(times + start)
        start += segment.seconds
    label = name or "; ".join(s.describe() for s in segments)
    what = describe_process(process, cv)
    return Schedule(np.concatenate(parts), name=f"{label} ({what})", seconds=start)
