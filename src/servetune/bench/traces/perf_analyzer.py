"""perf_analyzer's ``--request-intervals`` file: one time interval in microseconds per line, the gap before each
request. Requests leave at the running sum of the intervals (100000, 200000, 500000 -> 0.1 s, 0.3 s, 0.8 s);
perf_analyzer loops over the file for as long as it measures: ``repeat=N`` plays it N times."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule
from servetune.bench.traces.options import TraceOptions


def read(path: Path, options: TraceOptions) -> Schedule:
    intervals = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(
                    f"trace {str(path)!r} line {number}: {text!r}: expected an interval in whole microseconds"
                ) from None
            if value < 0:
                raise ConfigError(f"trace {str(path)!r} line {number}: {value}: expected an interval >= 0 µs")
            intervals.append(value)
    offsets = np.cumsum(np.asarray(intervals, dtype=np.float64)) / 1e6
    return Schedule(offsets, name=f"{len(intervals)} intervals")
