"""The Azure Functions trace 2019 (``invocations_per_function_md.anon.dNN.csv``): per function (``HashOwner,
HashApp, HashFunction, Trigger``), the number of invocations in each minute of a day (columns ``1`` .. ``1440``).

The trace gives counts, not times: the arrivals within each minute are synthesised, seeded (``seed=N``, default
0): ``arrival=poisson`` (the default) places a minute's n arrivals as a Poisson process conditioned on n (n uniform
points); ``arrival=gamma`` with ``cv=C`` as a Gamma renewal process of that coefficient of variation (C > 1:
burstier), stretched to fill the minute. ``function=HASH`` (a prefix of HashFunction) replays one function's row,
``row=N`` the N-th row, ``trigger=http`` keeps the rows of one trigger; without a choice every kept row is summed.
A day is 1440 minutes: ``--time-scale 0.01`` plays it in 14.4 minutes at 100 times its rate (``--rate-scale`` or a
capacity-shaped run brings the rate back)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from servetune._exceptions import ConfigError
from servetune.bench.schedule import Schedule
from servetune.bench.traces.options import TraceOptions

MINUTE_S = 60.0


def read(path: Path, options: TraceOptions) -> Schedule:
    function, trigger = options.text("function"), options.text("trigger")
    row_number = options.integer("row", 0, minimum=0)
    arrival = options.choice("arrival", "poisson", ("poisson", "gamma"))
    cv = options.number("cv", 1.0) if arrival == "gamma" else 1.0
    seed = options.integer("seed", 0, minimum=0)
    if function and row_number:
        raise ConfigError(f"trace {str(path)!r}: options function and row: give one")
    counts, chosen = _counts(path, function, trigger, row_number)
    times = minute_arrivals(counts, arrival, cv, seed)
    process = f"Gamma CV {cv:g}" if arrival == "gamma" else "Poisson"
    return Schedule(times, name=f"{chosen}, {process} within each minute (seed {seed})", seconds=len(counts) * MINUTE_S)


def _counts(path: Path, function: str | None, trigger: str | None, row_number: int) -> tuple[np.ndarray, str]:  # type: ignore[type-arg]
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or "HashFunction" not in header:
            raise ConfigError(f"trace {str(path)!r}: expected a header with HashFunction (azure-functions-2019)")
        minutes = [i for i, name in enumerate(header) if name.strip().isdigit()]
        if not minutes:
            raise ConfigError(f"trace {str(path)!r}: no minute columns (1 .. 1440)")
        at_function, at_trigger = header.index("HashFunction"), header.index("Trigger") if "Trigger" in header else -1
        total = np.zeros(len(minutes), dtype=np.int64)
        kept: list[str] = []
        for number, row in enumerate(reader, start=2):
            if not row:
                continue
            if row_number and number - 1 != row_number:
                continue
            if function and not row[at_function].startswith(function):
                continue
            if trigger and (at_trigger < 0 or row[at_trigger] != trigger):
                continue
            try:
                total += np.asarray([int(row[i]) for i in minutes], dtype=np.int64)
            except (ValueError, IndexError):
                raise ConfigError(
                    f"trace {str(path)!r} line {number}: expected a whole number for every minute"
                ) from None
            kept.append(row[at_function][:8])
    if not kept:
        wanted = f"function={function}" if function else f"row={row_number}" if row_number else f"trigger={trigger}"
        raise ConfigError(f"trace {str(path)!r}: no row matches {wanted}")
    if function and len(kept) > 1:
        raise ConfigError(f"trace {str(path)!r}: function={function} matches {len(kept)} rows; give more of the hash")
    chosen = f"function {kept[0]}" if len(kept) == 1 else f"{len(kept)} functions summed"
    return total, chosen


def minute_arrivals(counts: np.ndarray, arrival: str, cv: float, seed: int) -> np.ndarray:  # type: ignore[type-arg]
    """Send times (s) with ``counts[m]`` arrivals in minute m, placed within each minute as the docstring says."""
    rng = np.random.default_rng(seed)
    total = int(counts.sum())
    minute = np.repeat(np.arange(len(counts), dtype=np.float64), counts)
    if arrival == "poisson":
        within = rng.random(total)
        order = np.lexsort((within, minute))
        return (minute[order] + within[order]) * MINUTE_S
    # Gamma renewal within each minute: n + 1 gaps, their running sum scaled so the (n+1)-th lands on the minute's end.
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0, total + len(counts))
    slots = np.repeat(np.arange(len(counts)), counts + 1)
    sums = np.bincount(slots, weights=gaps, minlength=len(counts))
    starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
    running = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[starts] - gaps[starts], counts + 1)
    last = np.cumsum(counts + 1) - 1
    keep = np.ones(len(gaps), dtype=bool)
    keep[last] = False
    within = np.minimum((running / sums[slots])[keep], 1.0 - 1e-9)  # a vanishing last gap must not leave the minute
    times: np.ndarray = (np.repeat(np.arange(len(counts), dtype=np.float64), counts) + within) * MINUTE_S  # type: ignore[type-arg]
    return times
