"""The Azure Functions invocation trace 2021 (``AzureFunctionsInvocationTraceForTwoWeeksJan2021``): CSV rows
``app,func,end_timestamp,duration`` in seconds. A request arrives when its invocation started: end - duration.
``app=HASH`` and/or ``func=HASH`` keep one application's or one function's invocations (a prefix of the hash is
enough); times are shifted so that the first arrival is at 0."""

from __future__ import annotations

import csv
from pathlib import Path

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule, from_times
from servetune.bench.traces.options import TraceOptions


def read(path: Path, options: TraceOptions) -> Schedule:
    app, func = options.text("app"), options.text("func")
    starts: list[float] = []
    models: list[str] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"app", "func", "end_timestamp", "duration"} - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(f"trace {str(path)!r}: columns {sorted(missing)} missing (azure-functions-2021)")
        for number, row in enumerate(reader, start=2):
            if (app and not row["app"].startswith(app)) or (func and not row["func"].startswith(func)):
                continue
            try:
                end, duration = float(row["end_timestamp"]), float(row["duration"])
            except ValueError:
                raise ConfigError(
                    f"trace {str(path)!r} line {number}: end_timestamp={row['end_timestamp']!r}, "
                    f"duration={row['duration']!r}: expected seconds"
                ) from None
            starts.append(end - duration)
            models.append(row["func"][:8])
    what = ", ".join(f"{k}={v}" for k, v in (("app", app), ("func", func)) if v) or "every function"
    return from_times(starts, name=f"arrival = end - duration, {what}", shift=True, models=models)
