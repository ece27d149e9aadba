"""servetune's own trace schema as CSV or JSONL: ``t_ms`` (the intended send time in ms) and, optionally,
``size``, ``model`` and ``stage`` per request. A CSV has a header naming those columns; a file with one number per
line and no header is read as send times in ms (``--trace-format csv``).

    t_ms,size,model
    0,512,resnet18
    12.5,512,resnet18

    {"t_ms": 0, "size": 512}
    {"t_ms": 12.5}
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule, from_times
from servetune.bench.traces.options import TraceOptions

COLUMNS = ("t_ms", "size", "model", "stage")


def read_csv(path: Path, options: TraceOptions) -> Schedule:
    with path.open(newline="", encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return from_times([], name="csv")
    first = [cell.strip() for cell in lines[0].split(",")]
    if "t_ms" not in first:
        return _bare(path, lines)
    rows = []
    for number, row in enumerate(csv.DictReader(lines), start=2):
        rows.append(_row(path, number, row))
    return _schedule(path, rows, "csv")


def read_jsonl(path: Path, options: TraceOptions) -> Schedule:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"trace {str(path)!r} line {number}: not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise ConfigError(f"trace {str(path)!r} line {number}: expected an object with t_ms")
            rows.append(_row(path, number, row))
    return _schedule(path, rows, "jsonl")


def _bare(path: Path, lines: list[str]) -> Schedule:
    times = []
    for number, line in enumerate(lines, start=1):
        times.append(_number(path, number, "t_ms", line.strip()))
    return from_times([t / 1000.0 for t in times], name="send times in ms")


def _number(path: Path, number: int, key: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"trace {str(path)!r} line {number}: {key}={value!r}: expected a number") from None
    if out != out or out < 0:
        raise ConfigError(f"trace {str(path)!r} line {number}: {key}={value!r}: expected a number >= 0")
    return out


def _row(path: Path, number: int, row: dict[str, Any]) -> dict[str, Any]:
    unknown = [key for key in row if key not in COLUMNS]
    if unknown:
        raise ConfigError(f"trace {str(path)!r} line {number}: column {unknown[0]!r}: expected {', '.join(COLUMNS)}")
    if row.get("t_ms") in (None, ""):
        raise ConfigError(f"trace {str(path)!r} line {number}: t_ms missing")
    out: dict[str, Any] = {"t_ms": _number(path, number, "t_ms", row["t_ms"])}
    if row.get("size") not in (None, ""):
        out["size"] = int(_number(path, number, "size", row["size"]))
    for key in ("model", "stage"):
        if row.get(key) not in (None, ""):
            out[key] = str(row[key])
    return out


def _schedule(path: Path, rows: list[dict[str, Any]], name: str) -> Schedule:
    def column(key: str) -> list[Any] | None:
        if not rows or not all(key in row for row in rows):
            if any(key in row for row in rows):
                raise ConfigError(f"trace {str(path)!r}: {key} is given on some rows only: give it on every row")
            return None
        return [row[key] for row in rows]

    return from_times(
        [row["t_ms"] / 1000.0 for row in rows], name=name, sizes=column("size"), models=column("model"),
        stages=column("stage"),
    )  # fmt: skip
