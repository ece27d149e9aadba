"""Capacity search: the highest open-loop request rate at which a config still meets the SLA.

A closed-loop run with enough clients to saturate the config gives its top throughput T. Open-loop runs then
bracket the capacity: the first at 0.8 T; after a pass the next rate is halfway to the lowest failing one (at
first 1.1 T), after a failure halfway down to the highest passing one (or half the rate while none has passed).
A handful of runs pins the capacity to a few percent of T; the search stops early once the bracket is that tight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servetune.bench.result import BenchResult
from servetune.tune.trial import Probe

FIRST = 0.8
CEILING = 1.1
TIGHT = 0.05


@dataclass(frozen=True)
class Capacity:
    result: BenchResult  # the highest passing rate's run; the lowest rate tried when none passed
    rate: float  # 0 when no rate met the SLA
    probes: tuple[Probe, ...]


def search(
    closed: Callable[[int], BenchResult],
    opened: Callable[[float], BenchResult],
    passes: Callable[[BenchResult], bool],
    clients: int,
    steps: int,
) -> Capacity:
    saturated = closed(clients)
    probes = [_probe(saturated, None, clients, passes(saturated))]
    top = saturated.throughput_rps
    if top <= 0:
        return Capacity(saturated, 0.0, tuple(probes))
    low, high = 0.0, top * CEILING
    best: tuple[float, BenchResult] | None = None
    lowest: tuple[float, BenchResult] | None = None
    rate = top * FIRST
    for _ in range(steps):
        result = opened(rate)
        ok = passes(result)
        probes.append(_probe(result, rate, None, ok))
        if lowest is None or rate < lowest[0]:
            lowest = (rate, result)
        if ok:
            low = rate
            if best is None or rate > best[0]:
                best = (rate, result)
        else:
            high = rate
        if best is not None and (high - low) <= TIGHT * top:
            break
        rate = (low + high) / 2 if low > 0 else high / 2
    if best is None:
        assert lowest is not None
        return Capacity(lowest[1], 0.0, tuple(probes))
    return Capacity(best[1], best[0], tuple(probes))


def _probe(result: BenchResult, rate: float | None, clients: int | None, ok: bool) -> Probe:
    p99 = result.latency.p99_ms if result.latency else None
    return Probe(rate, clients, result.throughput_rps, p99, result.error_rate, ok)
