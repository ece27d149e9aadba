"""BurstGPT's CSV (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``): ``Timestamp`` is the
request's arrival in seconds, ``Request tokens`` its size, ``Model`` its model. ``model=ChatGPT`` and/or
``log_type=...`` keep some rows; ``failed=false`` drops those with 0 response tokens (BurstGPT's failed requests).
Times are shifted so that the first arrival is at 0."""

from __future__ import annotations

import csv
from pathlib import Path

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule, from_times
from servetune.bench.traces.options import TraceOptions


def read(path: Path, options: TraceOptions) -> Schedule:
    model, log_type = options.text("model"), options.text("log_type")
    failed = options.choice("failed", "true", ("true", "false")) == "true"
    times: list[float] = []
    sizes: list[int] = []
    models: list[str] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"Timestamp", "Model", "Request tokens", "Response tokens"} - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(f"trace {str(path)!r}: columns {sorted(missing)} missing (burstgpt)")
        for number, row in enumerate(reader, start=2):
            if (model and row["Model"] != model) or (log_type and row.get("Log Type") != log_type):
                continue
            try:
                t, tokens, answer = float(row["Timestamp"]), int(row["Request tokens"]), int(row["Response tokens"])
            except ValueError:
                raise ConfigError(
                    f"trace {str(path)!r} line {number}: expected numbers in Timestamp and tokens"
                ) from None
            if not failed and answer == 0:
                continue
            times.append(t)
            sizes.append(tokens)
            models.append(row["Model"])
    what = ", ".join(f"{k}={v}" for k, v in (("model", model), ("log_type", log_type)) if v) or "every row"
    return from_times(times, name=what, shift=True, sizes=sizes, models=models)
