"""A figure over repeated runs, and a verdict against a target that refuses to pick a median when runs disagree.

The benchmarks that compare against a baseline (``benchmarks/serve_overhead.py``, ``vs_torchserve.py``,
``tune_adaptive_vs_grid.py``, ``tune_repeatability.py``) run each measurement several times on a machine that may
be shared. A median of runs that straddle a target says nothing: one run at 1.98 and one at 0.40 around a target
of 0.95 have a median that depends on the third run. So:

- every figure is reported as its mean, median and *tail* (the worst run: the lowest when higher is better), with
  the min-max and the number of runs;
- a verdict is **met** when every run meets the target, **NOT met** when none does, and **no verdict** when they
  disagree; runs measured under contention (other processes used the machine: ``host.py``) are left out of the
  verdict when at least two clean runs remain, and the verdict says how many were left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Runs of one figure: ``higher_is_better`` says which end is the tail."""

    values: tuple[float, ...]
    higher_is_better: bool = True

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def tail(self) -> float:
        return min(self.values) if self.higher_is_better else max(self.values)

    @property
    def ratio(self) -> float:
        """max / min of the runs: how far apart they are."""
        low = min(self.values)
        return max(self.values) / low if low > 0 else float("inf")

    def describe(self, digits: int = 2, unit: str = "") -> str:
        f = f"{{:.{digits}f}}"
        return (
            f"mean {f.format(self.mean)}{unit}, median {f.format(self.median)}{unit}, tail {f.format(self.tail)}{unit} "
            f"(min-max {f.format(min(self.values))}-{f.format(max(self.values))}, {len(self.values)} runs)"
        )


def spread(values: Sequence[float], higher_is_better: bool = True) -> Spread:
    if not values:
        raise ValueError("a spread of no runs")
    return Spread(tuple(float(v) for v in values), higher_is_better)


def verdict(
    values: Sequence[float], target: float, *, higher_is_better: bool = True, contended: Sequence[bool] | None = None
) -> str:
    """``"met"``, ``"NOT met"`` or ``"no verdict (...)"`` for runs against ``target`` (module docstring)."""
    flags = list(contended) if contended is not None else [False] * len(values)
    clean = [v for v, c in zip(values, flags, strict=True) if not c]
    judged, note = (clean, "") if len(clean) >= 2 else (list(values), "")
    left_out = len(values) - len(judged)
    if left_out:
        note = f"; {left_out} contended run{'s' if left_out > 1 else ''} left out"
    elif any(flags):
        note = "; fewer than 2 clean runs: contended runs judged too"
    if not judged:
        return "no verdict (no run)"
    meets = [v >= target if higher_is_better else v <= target for v in judged]
    if all(meets):
        return f"met{note}"
    if not any(meets):
        return f"NOT met{note}"
    return f"no verdict (the runs disagree: {sum(meets)} of {len(judged)} meet the target{note})"
