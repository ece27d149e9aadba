"""What an open-loop run sends, and when: a :class:`Schedule`, the one type every open-loop load is made of.

A schedule is a finite, ascending array of intended send times (seconds from the start of the run) with optional
per-request fields (``size``, ``model``, ``stage``: the trace schema ``t_ms[, size][, model][, stage]``). Constant
and Poisson rates, Gamma arrivals of a given burstiness, synthetic shapes (``shapes.py``) and imported traces
(``traces/``) all become one; a schedule is built once, before the run, and is the same for every policy replayed
against it: everything random in it comes from a seed.

Arrivals of a varying rate r(t) are drawn by the time-change theorem: a renewal process of rate 1 (intervals of
mean 1: all 1 for ``constant``, exponential for ``poisson``, Gamma with coefficient of variation ``cv`` for
``gamma``) is laid out in operational time Λ(t) = ∫ r and mapped back through Λ⁻¹. So the local rate follows the
curve and the burstiness is the process's, whatever the rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from servetune._exceptions import ConfigError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Process = Literal["constant", "poisson", "gamma"]
PROCESSES: tuple[Process, ...] = ("constant", "poisson", "gamma")

# Most requests one schedule may hold (a day of an Azure trace at full rate can hold tens of millions).
MAX_REQUESTS = 50_000_000


@dataclass(frozen=True, eq=False)
class Schedule:
    """Intended send times ``offsets_s`` (seconds from the start, ascending, >= 0) and per-request fields.

    ``seconds`` is the schedule's nominal length (a trace may end after its last arrival); by default the last
    offset. ``name`` says where it came from (shown in reports).
    """

    offsets_s: FloatArray
    sizes: IntArray | None = None
    models: tuple[str, ...] | None = None
    stages: tuple[str, ...] | None = None
    name: str = ""
    seconds: float | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        offsets = np.ascontiguousarray(self.offsets_s, dtype=np.float64)
        if offsets.ndim != 1:
            raise ConfigError(f"schedule {self.name!r}: expected one send time per request")
        if len(offsets) > MAX_REQUESTS:
            raise ConfigError(
                f"schedule {self.name!r}: {len(offsets)} requests; at most {MAX_REQUESTS} (scale its rate or cut it)"
            )
        if len(offsets) and not (np.isfinite(offsets).all() and offsets[0] >= 0.0):
            raise ConfigError(f"schedule {self.name!r}: send times must be finite and >= 0")
        if len(offsets) > 1 and (np.diff(offsets) < 0).any():
            raise ConfigError(f"schedule {self.name!r}: send times must be in ascending order")
        object.__setattr__(self, "offsets_s", offsets)
        if self.sizes is not None:
            object.__setattr__(self, "sizes", np.ascontiguousarray(self.sizes, dtype=np.int64))
        for key in ("sizes", "models", "stages"):
            column = getattr(self, key)
            if column is not None and len(column) != len(offsets):
                raise ConfigError(f"schedule {self.name!r}: {key} has {len(column)} entries for {len(offsets)} sends")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ConfigError(f"schedule {self.name!r}: seconds={self.seconds!r}: expected a length >= 0")

    def __len__(self) -> int:
        return len(self.offsets_s)

    @property
    def duration_s(self) -> float:
        """The nominal length: ``seconds``, or the last send time."""
        if self.seconds is not None:
            return max(self.seconds, float(self.offsets_s[-1]) if len(self) else 0.0)
        return float(self.offsets_s[-1]) if len(self) else 0.0

    @property
    def mean_rps(self) -> float:
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0

    def counts(self, bin_s: float = 1.0, start_s: float = 0.0, end_s: float | None = None) -> IntArray:
        """Sends per bin of ``bin_s`` seconds over [start_s, end_s) (default: the whole schedule)."""
        end = self.duration_s if end_s is None else end_s
        bins = max(1, math.ceil((end - start_s) / bin_s - 1e-9))
        index = np.floor((self.offsets_s - start_s) / bin_s).astype(np.int64)
        index = index[(index >= 0) & (index < bins)]
        return np.bincount(index, minlength=bins).astype(np.int64)

    def peak_rps(self, bin_s: float | None = None) -> float:
        """The highest rate of the schedule's rate curve: sends per ``bin_s`` (default: 10 s bins, or 1 s ones for a
        schedule shorter than a minute), per second; never under the mean (a last bin cut short by the schedule's
        end counts as a whole one: 60 sends over 2.1 s read 20 a second in each of three bins, against 28.6 on
        average)."""
        if not len(self):
            return 0.0
        if bin_s is None:
            bin_s = 10.0 if self.duration_s >= 60.0 else 1.0
        bin_s = min(bin_s, max(self.duration_s, 1e-3))
        return max(float(self.counts(bin_s).max()) / bin_s, self.mean_rps)

    # ---- transforms (each returns a new schedule) ---------------------------------------------------------

    def _take(
        self, keep: npt.NDArray[np.bool_] | npt.NDArray[np.int64], offsets: FloatArray, **changes: object
    ) -> Schedule:
        def pick(column: tuple[str, ...] | None) -> tuple[str, ...] | None:
            return None if column is None else tuple(np.asarray(column, dtype=object)[keep])

        values: dict[str, object] = {
            "offsets_s": offsets,
            "sizes": None if self.sizes is None else self.sizes[keep],
            "models": pick(self.models),
            "stages": pick(self.stages),
            "name": self.name,
            "seconds": self.seconds,
            "notes": self.notes,
        }
        values.update(changes)
        return Schedule(**values)  # type: ignore[arg-type]

    def head(self, seconds: float | None = None, requests: int | None = None) -> Schedule:
        """The first ``seconds`` and/or the first ``requests`` sends."""
        n = len(self)
        length = self.duration_s
        if seconds is not None:
            n = min(n, int(np.searchsorted(self.offsets_s, seconds - 1e-9, side="left")))
            length = min(length, seconds)
        if requests is not None:
            n = min(n, requests)
        keep = np.arange(n)
        return self._take(keep, self.offsets_s[:n], seconds=length)

    def between(self, start_s: float, end_s: float) -> Schedule:
        """The sends in [start_s, end_s), shifted to start at 0."""
        lo = int(np.searchsorted(self.offsets_s, start_s - 1e-9, side="left"))
        hi = int(np.searchsorted(self.offsets_s, end_s - 1e-9, side="left"))
        keep = np.arange(lo, hi)
        return self._take(keep, self.offsets_s[lo:hi] - start_s, seconds=max(0.0, end_s - start_s))

    def time_scaled(self, factor: float) -> Schedule:
        """Every send time multiplied by ``factor`` (0.01 plays a day in 14.4 minutes, at 100 times its rate)."""
        _positive("time_scale", factor)
        keep = np.arange(len(self))
        seconds = None if self.seconds is None else self.seconds * factor
        return self._take(keep, self.offsets_s * factor, seconds=seconds)

    def rate_scaled(self, factor: float, seed: int = 0) -> Schedule:
        """The same rate curve at ``factor`` times the rate. Below 1 each send is kept with probability ``factor``;
        above 1 each is sent ⌊factor⌋ or ⌈factor⌉ times (the fraction drawn per send), its copies spread evenly over
        the gap to the next send, so bursts stay bursts. Seeded: the same seed gives the same schedule."""
        _positive("rate_scale", factor)
        if factor == 1.0 or not len(self):
            return self
        rng = np.random.default_rng(seed)
        whole = math.floor(factor)
        copies = whole + (rng.random(len(self)) < factor - whole).astype(np.int64)
        index = np.repeat(np.arange(len(self)), copies)
        if not len(index):
            return self._take(index, np.zeros(0))
        rank = np.arange(len(index)) - np.repeat(np.cumsum(copies) - copies, copies)
        gaps = np.diff(self.offsets_s, append=self.duration_s)
        offsets = self.offsets_s[index] + gaps[index] * rank / np.maximum(copies[index], 1)
        return self._take(index, offsets)

    def repeated(self, times: int) -> Schedule:
        """The schedule played ``times`` times in a row."""
        if times < 1:
            raise ConfigError(f"repeat={times!r}: expected a whole number >= 1")
        out = self
        for _ in range(times - 1):
            out = out.then(self)
        return out

    def then(self, other: Schedule, gap_s: float = 0.0) -> Schedule:
        """This schedule, then ``other`` starting ``gap_s`` after this one's end. Per-request fields are kept when
        both sides have them."""
        start = self.duration_s + gap_s
        offsets = np.concatenate([self.offsets_s, other.offsets_s + start])

        def join(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
            return None if a is None or b is None else a + b

        sizes = None if self.sizes is None or other.sizes is None else np.concatenate([self.sizes, other.sizes])
        name = " then ".join(n for n in (self.name, other.name) if n)
        return Schedule(offsets, sizes, join(self.models, other.models), join(self.stages, other.stages), name,
                        start + other.duration_s, self.notes + other.notes)  # fmt: skip

    def with_name(self, name: str) -> Schedule:
        return self._take(np.arange(len(self)), self.offsets_s, name=name)

    def with_note(self, note: str) -> Schedule:
        return self._take(np.arange(len(self)), self.offsets_s, notes=(*self.notes, note))

    # ---- constructors -------------------------------------------------------------------------------------

    @classmethod
    def steady(
        cls,
        rate: float,
        process: Process = "constant",
        *,
        seconds: float | None = None,
        requests: int | None = None,
        cv: float = 1.0,
        seed: int = 0,
    ) -> Schedule:
        """``rate`` req/s for ``seconds`` and/or ``requests`` (whichever ends first), spaced by ``process``."""
        _positive("rate", rate)
        if seconds is None and requests is None:
            raise ConfigError("a steady schedule needs seconds or requests")
        expected = requests if requests is not None else math.ceil(rate * (seconds or 0.0))
        if seconds is not None and requests is not None:
            expected = min(requests, math.ceil(rate * seconds))
        units = unit_renewal(process, cv, seed, max(1, expected + 1), until=None if seconds is None else rate * seconds)
        offsets = units / rate
        schedule = cls(offsets, name=describe_process(process, cv, rate), seconds=seconds)
        return schedule.head(seconds, requests)


def describe_process(process: Process, cv: float, rate: float | None = None) -> str:
    what = f"Gamma (CV {cv:g})" if process == "gamma" else process
    return f"{rate:g} req/s {what}" if rate is not None else what


def unit_renewal(process: Process, cv: float, seed: int, count: int, until: float | None = None) -> FloatArray:
    """Arrival times of a rate-1 renewal process starting at 0: ``count`` of them, or all before ``until``.

    Intervals: all 1 (``constant``), exponential (``poisson``), or Gamma with shape 1/cv² and mean 1 (``gamma``;
    cv 1 is Poisson, larger is burstier)."""
    if process not in PROCESSES:
        raise ConfigError(f"arrival={process!r}: expected one of {', '.join(PROCESSES)}")
    if process == "gamma" and not (cv > 0 and math.isfinite(cv)):
        raise ConfigError(f"cv={cv!r}: expected a coefficient of variation > 0")
    rng = np.random.default_rng(seed)
    chunks: list[FloatArray] = []
    total, start = 0, 0.0
    want = count if until is None else max(16, int(until * 1.1) + 16)
    while True:
        if process == "constant":
            gaps = np.ones(want)
        elif process == "poisson":
            gaps = rng.exponential(1.0, want)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / shape, want)
        times = start + np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        start = float(times[-1] + gaps[-1])
        chunks.append(times)
        total += len(times)
        if until is None and total >= count:
            break
        if until is not None and start >= until:
            break
        if total > MAX_REQUESTS:
            raise ConfigError(f"a schedule of more than {MAX_REQUESTS} requests: scale its rate or cut it")
    out = np.concatenate(chunks)
    return out[:count] if until is None else out[out < until - 1e-12]


def from_times(
    times_s: Sequence[float] | FloatArray, *, name: str = "", shift: bool = False, **columns: object
) -> Schedule:
    """A schedule from send times in seconds, sorted (with their per-request fields); ``shift`` moves the first to 0."""
    times = np.asarray(times_s, dtype=np.float64)
    if len(times) and not np.isfinite(times).all():
        raise ConfigError(f"trace {name!r}: a send time is not a number")
    order = np.argsort(times, kind="stable")
    times = times[order]
    if shift and len(times):
        times = times - times[0]
    picked: dict[str, object] = {}
    for key, column in columns.items():
        if column is None:
            picked[key] = None
        elif key == "sizes":
            picked[key] = np.asarray(column, dtype=np.int64)[order]
        else:
            picked[key] = tuple(np.asarray(column, dtype=object)[order])
    return Schedule(times, name=name, **picked)  # type: ignore[arg-type]


def _positive(key: str, value: float) -> None:
    if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key}={value!r}: expected a number > 0")
