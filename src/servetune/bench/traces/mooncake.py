"""Mooncake's JSONL trace: one object per request, ``timestamp`` (its arrival in ms since the first request),
``input_length`` (its size, in tokens), ``output_length``, ``hash_ids``; only the time and the size are used."""

from __future__ import annotations

import json
from pathlib import Path

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule, from_times
from servetune.bench.traces.options import TraceOptions


def read(path: Path, options: TraceOptions) -> Schedule:
    times: list[float] = []
    sizes: list[int] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                times.append(float(row["timestamp"]) / 1000.0)
                sizes.append(int(row.get("input_length", 0)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"trace {str(path)!r} line {number}: expected an object with a numeric timestamp (ms)"
                ) from None
    return from_times(times, name="timestamps", shift=True, sizes=sizes)
