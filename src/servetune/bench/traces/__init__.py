"""Traces: one importer per format behind one name -> ``"module:attr"`` registry, all into one :class:`Schedule`.

The internal schema is a trace's rows ``t_ms[, size][, model][, stage]``: an intended send time in milliseconds
and what the source says about each request. Each importer reads its public format into that schema:

| format | what is read | send time |
|---|---|---|
| ``csv``, ``jsonl`` | servetune's own: ``t_ms`` (``size``, ``model``, ``stage``), or a number a line | ``t_ms`` |
| ``perf-analyzer`` | perf_analyzer's ``--request-intervals`` file: one interval in µs per line | running sum |
| ``azure-functions-2019`` | ``invocations_per_function_md.anon.dNN.csv``: invocations per minute | synthesised |
| ``azure-functions-2021`` | ``app,func,end_timestamp,duration`` (seconds) | end - duration |
| ``burstgpt`` | BurstGPT's CSV (``Timestamp`` s, ``Model``, ``Request tokens``, ...) | ``Timestamp`` |
| ``mooncake`` | Mooncake's JSONL (``timestamp`` ms, ``input_length``, ...) | ``timestamp`` |
| ``shape`` | a YAML list of synthetic segments (``shapes.py``) | generated |

The format is told from the file where it can be (:func:`detect_format`), else given (``--trace-format``). Options
(``--trace-opt KEY=VALUE``) are read by the importer that owns them; ``repeat=N`` (play the trace N times) is
everyone's. Errors name the file, the line or key, and what was expected.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule
from servetune.bench.traces.options import TraceOptions

TRACE_FORMATS: dict[str, str] = {
    "csv": "servetune.bench.traces.plain:read_csv",
    "jsonl": "servetune.bench.traces.plain:read_jsonl",
    "perf-analyzer": "servetune.bench.traces.perf_analyzer:read",
    "azure-functions-2019": "servetune.bench.traces.azure2019:read",
    "azure-functions-2021": "servetune.bench.traces.azure2021:read",
    "burstgpt": "servetune.bench.traces.burstgpt:read",
    "mooncake": "servetune.bench.traces.mooncake:read",
    "shape": "servetune.bench.traces.shape:read",
}

Importer = Callable[[Path, TraceOptions], Schedule]


def get_importer(name: str) -> Importer:
    target = TRACE_FORMATS.get(name)
    if target is None:
        raise ConfigError(f"trace format {name!r}: expected one of {', '.join(TRACE_FORMATS)}")
    module_name, attr = target.split(":")
    importer: Importer = getattr(importlib.import_module(module_name), attr)
    return importer


def read_trace(path: Path, trace_format: str | None = None, options: Mapping[str, Any] | None = None) -> Schedule:
    """The schedule a trace file describes, in its format (detected when ``trace_format`` is None)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trace {str(path)!r}: no such file")
    name = trace_format or detect_format(path)
    opts = TraceOptions(str(path), dict(options or {}))
    repeat = opts.integer("repeat", 1)
    schedule = get_importer(name)(path, opts)
    opts.check_used()
    if not len(schedule):
        raise ConfigError(f"trace {str(path)!r} ({name}): no request in it")
    label = f"{path.name} ({name})"
    schedule = schedule.with_name(f"{label}: {schedule.name}" if schedule.name else label)
    return schedule.repeated(repeat) if repeat > 1 else schedule


def detect_format(path: Path) -> str:
    """The format of a trace file, from its name and its first line; ConfigError when it cannot be told."""
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "shape"
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            first = handle.readline().strip()
            while first.startswith("#"):
                first = handle.readline().strip()
    except OSError as exc:
        raise ConfigError(f"trace {str(path)!r}: cannot read it: {exc.strerror}") from None
    if first.startswith("{"):
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            row = {}
        if isinstance(row, dict) and "t_ms" in row:
            return "jsonl"
        if isinstance(row, dict) and "timestamp" in row:
            return "mooncake"
    header = {cell.strip().strip('"') for cell in first.split(",")}
    if {"HashFunction", "Trigger"} <= header:
        return "azure-functions-2019"
    if {"end_timestamp", "duration"} <= header:
        return "azure-functions-2021"
    if {"Timestamp", "Request tokens"} <= header:
        return "burstgpt"
    if "t_ms" in header:
        return "csv"
    raise ConfigError(
        f"trace {str(path)!r}: cannot tell its format from its first line ({first[:60]!r}); give it with "
        f"--trace-format (one of {', '.join(TRACE_FORMATS)}; a file of bare numbers is either perf-analyzer "
        "(intervals in µs) or csv (send times in ms))"
    )


__all__ = ["TRACE_FORMATS", "TraceOptions", "detect_format", "get_importer", "read_trace"]
