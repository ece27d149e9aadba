"""A synthetic shape as a trace file (YAML): segments played in order, each a rate, a ramp, a daily curve and/or a
burst, with a seeded arrival process (``shapes.py``).

    arrival: poisson          # constant, poisson or gamma (default poisson)
    cv: 2                     # gamma only
    seed: 0
    segments:
      - {seconds: 30, rate: 200}                  # constant
      - {seconds: 30, rate: 500}                  # a 2.5x step
      - {seconds: 60, rate: 200, end_rate: 800}   # a ramp
      - {seconds: 600, diurnal: [100, 900]}       # one period of a daily curve (low at the ends)
      - {seconds: 60, rate: 300, burst: {at: 20, seconds: 5, rate: 600}}
      - {seconds: 60, rate: 400, arrival: gamma, cv: 2}   # a burstier segment
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servetune._exceptions import ConfigError
from servetune.bench.schedule import PROCESSES, Process, Schedule
from servetune.bench.shapes import Burst, Segment, shape
from servetune.bench.traces.options import TraceOptions

SEGMENT_KEYS = ("seconds", "rate", "end_rate", "diurnal", "burst", "arrival", "cv")
TOP_KEYS = ("arrival", "cv", "seed", "segments")


def read(path: Path, options: TraceOptions) -> Schedule:
    where = f"trace {str(path)!r}"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    if isinstance(raw, list):
        raw = {"segments": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with segments, or a list of segments")
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{where}: {key}: unknown key; expected one of {', '.join(TOP_KEYS)}")
    process = _process(where, "arrival", raw.get("arrival", "poisson"))
    cv = _number(where, "cv", raw.get("cv", 1.0))
    seed = options.integer("seed", int(raw.get("seed", 0)), minimum=0)
    items = raw.get("segments")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{where}: segments={items!r}: expected a list of segments")
    return shape([_segment(f"{where} segments[{i}]", item) for i, item in enumerate(items)], process=process, cv=cv,
                 seed=seed, name=path.stem)  # fmt: skip


def _segment(where: str, item: Any) -> Segment:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}={item!r}: expected a mapping (seconds, rate, ...)")
    for key in item:
        if key not in SEGMENT_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of {', '.join(SEGMENT_KEYS)}")
    if "seconds" not in item:
        raise ConfigError(f"{where}.seconds: missing; expected the segment's length in seconds")
    diurnal = item.get("diurnal")
    if diurnal is not None and (not isinstance(diurnal, list) or len(diurnal) != 2):
        raise ConfigError(f"{where}.diurnal={diurnal!r}: expected [low, high] in req/s")
    burst = item.get("burst")
    if burst is not None:
        if not isinstance(burst, dict) or set(burst) != {"at", "seconds", "rate"}:
            raise ConfigError(f"{where}.burst={burst!r}: expected {{at, seconds, rate}}")
        burst = Burst(
            _number(where, "burst.at", burst["at"], zero=True),
            _number(where, "burst.seconds", burst["seconds"]),
            _number(where, "burst.rate", burst["rate"], zero=True),
        )
    segment = Segment(
        seconds=_number(where, "seconds", item["seconds"]),
        rate=_number(where, "rate", item.get("rate", 0.0), zero=True),
        end_rate=_number(where, "end_rate", item["end_rate"], zero=True) if "end_rate" in item else None,
        diurnal=(
            _number(where, "diurnal[0]", diurnal[0], zero=True),
            _number(where, "diurnal[1]", diurnal[1], zero=True),
        )
        if diurnal is not None
        else None,
        burst=burst,
        process=_process(where, "arrival", item["arrival"]) if "arrival" in item else None,
        cv=_number(where, "cv", item["cv"]) if "cv" in item else None,
    )
    segment.check(where)
    return segment


def _process(where: str, key: str, value: Any) -> Process:
    if value not in PROCESSES:
        raise ConfigError(f"{where}.{key}={value!r}: expected one of {', '.join(PROCESSES)}")
    process: Process = value
    return process


def _number(where: str, key: str, value: Any, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        raise ConfigError(f"{where}.{key}={value!r}: expected a number {'>=' if zero else '>'} 0")
    return float(value)
